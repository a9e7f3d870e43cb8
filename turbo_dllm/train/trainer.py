"""The training loop. Read it top to bottom: build steps, then one straight `train_step`.

    Trainer(spec, run_dir, env).build()     model -> data -> objective -> optimizer -> checkpoints
                              .run()        resume, then steps: batches, noise, forward through the
                                            chunked-CE head, backward, clip, step, log, checkpoint

Derived quantities, computed once here:
- global batch = micro_batch_size * grad_accumulation * dp_size sequences per optimizer step;
- loss = sum over the step's micro-batches and ranks of the weighted CE, divided by the GLOBAL
  supervised-token count (one all-reduce before the forward passes), so the loss, and its
  gradient, are the same however the batch is split across ranks and micro-batches;
- FSDP averages gradients over all dp x context ranks (`dims.grad_average_size`), and each
  rank's loss covers only the tokens it holds, so each rank backpropagates that many x loss;
- with cp/bp > 1 the ranks of a context group share each batch and `self.plan` gives each its
  share of the tokens (turbo_dllm.train.parallel), so counts and FLOPs are divided by its size;
- with tp > 1 the ranks of a tp group compute the same loss on the same tokens (each holds a
  slice of every layer's matmuls): sums over ranks go over `dims.loss_group()`, which holds one
  rank per tp group, so nothing is counted tp times (FLOPs per GPU divide by the whole world).
"""

from __future__ import annotations

import contextlib
import math
import shlex
import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from functools import partial
from pathlib import Path

import torch

from turbo_dllm.errors import DllmError
from turbo_dllm.fsutil import human_count
from turbo_dllm.registry import get_family, resolve_model_config
from turbo_dllm.train.attention import build_attention
from turbo_dllm.train.checkpoint import (
    Checkpointer,
    find_latest,
    model_differences,
    read_meta,
    resolve_checkpoint,
    same_model,
    steps_after,
)
from turbo_dllm.train.compile_cache import (
    INDUCTOR_CACHE_VARIABLE,
    cache_size_bytes,
    use_compile_cache,
)
from turbo_dllm.train.data import build_data
from turbo_dllm.train.distributed import (
    DistEnv,
    any_rank,
    apply_activation_checkpointing,
    apply_compile,
    apply_fsdp,
    apply_mlp_chunking,
    clip_grad_norm,
    clip_in_optimizer,
    highest_on_any_rank,
    replicate_partial_grads,
)
from turbo_dllm.train.evaluate import EVAL_STEP, LeftOff, build_eval_set
from turbo_dllm.train.export import export_sources
from turbo_dllm.train.graph_breaks import graph_break_counts, graph_break_warning
from turbo_dllm.train.memory import MemoryRecorder, out_of_memory
from turbo_dllm.train.metrics import (
    MetricsLogger,
    ProfilerWindow,
    peak_flops,
    peak_memory_gb,
)
from turbo_dllm.train.objectives import NoiseKey, build_objective, score
from turbo_dllm.train.objectives.base import to_device
from turbo_dllm.train.parallel.dims import ParallelDims
from turbo_dllm.train.parallel.ep import expert_parameters, reduce_expert_grads
from turbo_dllm.train.parallel.merge_advice import slow_merge_warning
from turbo_dllm.train.parallel.plan import build_sequence_plan, model_work
from turbo_dllm.train.schedules import build_scheduler, resume_schedule
from turbo_dllm.train.stop import EXIT_TERMINATED, Stop, TerminationRequest, stop_requested
from turbo_dllm.train.weights import materialize, named_parameters_clean

__all__ = ["StepBatches", "Trainer"]


def print0(env: DistEnv, *args) -> None:
    if env.is_main:
        import sys

        print(*args, file=sys.stderr, flush=True)


@dataclass
class StepBatches:
    """One step's micro-batches, corrupted on the host, and their supervised counts.

    `loader_state` is the loader's position before they were drawn: a checkpoint taken while
    they wait for their step resumes by drawing them again."""

    step: int
    loader_state: dict
    diffusions: list
    counts: list


@dataclass
class QueuedStep:
    """A step whose kernels are queued: its numbers arrive on the host without a device sync.

    values (loss, flops, grad_norm) are copied into pinned host memory behind the step's
    kernels and `ready` marks the copy, so reading them waits for this step only, not for
    whatever was queued after it (a plain `.tolist()` would wait for the whole queue)."""

    step: int
    values: torch.Tensor
    ready: torch.cuda.Event | None
    lr: float
    mem_gb: float
    started: float  # host clock (perf_counter) when queuing began, and when it ended
    queued: float
    begun: torch.cuda.Event | None = None  # recorded before the step's first kernel

    def result(self) -> dict[str, float]:
        if self.ready is not None:
            self.ready.synchronize()
        loss, flops, grad_norm = self.values.tolist()
        return {"loss": loss, "flops": flops, "grad_norm": grad_norm, "lr": self.lr}

    def seconds(self, previous: QueuedStep | None) -> float:
        """How long the step took, once its result is read: on the device, from the end of
        `previous` (the step just before it, None after a pause such as a checkpoint) to its
        own end, by their events, idle time included, else from its own start; computed while
        queued (CPU), the host's time likewise."""
        if self.ready is not None and self.begun is not None:
            start = previous.ready if previous is not None and previous.ready else self.begun
            return start.elapsed_time(self.ready) / 1000
        return self.queued - (previous.queued if previous is not None else self.started)


@contextlib.contextmanager
def _eval_mode(model: torch.nn.Module):
    """`model` in eval mode for the block, back in training mode after (also on an error)."""
    model.eval()
    try:
        yield
    finally:
        model.train()


class Trainer:
    def __init__(self, spec, run_dir: str | Path, env: DistEnv, layout=None) -> None:
        self.spec = spec
        self.run_dir = Path(run_dir)
        self.env = env
        self.device = env.device
        # The job plan's layout (turbo_dllm.jobs.worker), else the spec's own topology.
        self.dims = ParallelDims.from_layout(layout or spec.topology.layout, env.world_size)
        self.total_steps = spec.training.steps
        self.samples_per_step = (
            spec.training.micro_batch_size * spec.training.grad_accumulation * self.dims.dp_size
        )
        on_cuda = self.device.type == "cuda"
        self.autocast = (
            partial(torch.autocast, "cuda", dtype=torch.bfloat16)
            if on_cuda
            else contextlib.nullcontext
        )
        self.train_time_offset = 0.0
        self.resumed_from: str | None = None  # CheckpointMeta.resumed_from of this run's steps
        self._next: StepBatches | None = None  # the next step's batches, drawn ahead
        self.compile_cache: dict[str, str] = {}  # the cache variables in effect, when compiling
        self._target: dict | None = None  # a drafter's target record (rank 0; `_target_record`)

    # ============================== build steps ==============================================
    def build(self) -> Trainer:
        if self.env.is_main:
            self.run_dir.mkdir(parents=True, exist_ok=True)
        self.build_model()
        self.build_data()
        self.build_optimizer()
        self.build_checkpointer()
        self.build_logging()
        return self

    def build_model(self) -> None:
        """Meta model -> TP -> MLP chunking -> activation checkpointing -> compile -> FSDP2 -> weights.

        Everything family-specific comes from the family's runtime (turbo_dllm.registry).
        """
        spec = self.spec.model
        family = get_family(spec.family)
        runtime = family.runtime()
        self.runtime = runtime
        self.model_config = resolve_model_config(spec)
        if self.dims.tp > 1:
            runtime.check_tensor_parallel(self.model_config, self.dims.tp)  # before collectives
        # Always: importing torch._dynamo (FSDP2 and DCP do) creates inductor's cache folder, in
        # the temp folder unless pointed elsewhere. Reported only when something compiles.
        cache = use_compile_cache()
        if self.spec.training.compile or self.device.type == "cuda":  # inductor or Triton builds
            self.compile_cache = cache
        self.attention = build_attention(spec.attention, self.device, kernels=self.spec.kernels)
        if hasattr(runtime, "wrap_attention"):  # a family whose layers need their own masks
            self.attention = runtime.wrap_attention(self.attention, self.model_config)
        self.mesh = self.dims.build_mesh(self.device.type)
        # Which tokens this rank feeds the model, and how its layers attend (cp/bp: across ranks).
        if hasattr(runtime, "build_sequence_plan"):  # a family with its own inputs (drafters)
            self.plan = runtime.build_sequence_plan(
                self.dims,
                self.attention,
                spec=self.spec,
                config=self.model_config,
                device=self.device,
            )
        else:
            # Work nothing reads is skipped where the family's model can (not under sequence
            # parallelism: a tp rank's rows are a slice of the stream, not its first ones).
            trims = getattr(runtime, "STREAM_TRIMS", frozenset())
            if self.spec.topology.sp:
                trims = frozenset()
            self.plan = build_sequence_plan(
                self.dims, self.attention, merge_backend=self.spec.kernels, trims=trims
            )
        if slow_merge := slow_merge_warning(self.dims.bp, self.spec.kernels, self.device.type):
            print0(self.env, f"warning: {slow_merge} (set `kernels: native`)")
        dtype = torch.bfloat16 if spec.dtype == "bfloat16" else torch.float32
        # The RunSpec `model` fields this family's build_model takes (e.g. linear_attention).
        options = {name: getattr(spec, name) for name in family.model_options}
        model = runtime.build_model(
            self.model_config, self.plan.attention_backend, dtype, **options
        )
        # An optional runtime function: what the model's `mask` argument is, from the inputs.
        self.model_mask = getattr(runtime, "model_mask", lambda inputs: inputs.mask)
        if options:  # a kernel choice is reported, never silent
            chosen = ", ".join(f"{name} {value}" for name, value in options.items())
            print0(self.env, f"model {spec.family}: attention {spec.attention}, {chosen}")
        layers = runtime.layers(model)
        if self.dims.tp > 1:
            runtime.apply_tensor_parallel(
                model, self.dims.get_mesh("tp"), sequence_parallel=self.spec.topology.sp
            )
        expert_params = None
        if self.dims.ep > 1:  # before FSDP2, which then leaves the experts alone
            replicas = self.dims.get_mesh("ep_replica")
            runtime.apply_expert_parallel(
                model,
                self.dims.get_mesh("ep"),
                replicas.get_group() if replicas.size() > 1 else None,
                self.dims.grad_average_size,
            )
            expert_params = expert_parameters(model)
        if self.spec.training.mlp_chunks > 1:
            apply_mlp_chunking(layers, self.spec.training.mlp_chunks)
        if checkpointing := self.spec.training.activation_checkpointing:
            apply_activation_checkpointing(
                layers,
                keep_attention=checkpointing == "keep_attention",
                keep_matmuls=checkpointing == "keep_matmuls",
            )
        if self.spec.training.compile:
            apply_compile(layers)
        if self.mesh is not None:
            apply_fsdp(model, layers, self.mesh, ignored_params=expert_params)
        fill = getattr(runtime, "materialize", materialize)  # a family's own weight sources
        self.model = fill(model, self.device, seed=self.spec.launch.seed, weights_from=spec.path)
        self.model.train()

    def build_data(self) -> None:
        self.data = build_data(
            self.spec,
            model_vocab_size=self.model_config.vocab_size,
            dp_rank=self.dims.dp_rank,
            dp_size=self.dims.dp_size,
        )
        self.loader = self.data.loader
        self.objective = build_objective(
            self.spec.objective, self.data.mask_token_id, vocab_size=self.model_config.vocab_size
        )
        self.eval_set = build_eval_set(
            self.spec, dp_rank=self.dims.dp_rank, dp_size=self.dims.dp_size
        )
        self._eval_batches: list | None = None  # corrupted once, on the first evaluation
        # An objective may keep parts of the model fixed (DiffusionGemma's SFT: the routers).
        frozen = getattr(self.objective, "frozen_parameters", ())
        for name, param in named_parameters_clean(self.model):
            if frozen and any(part in name for part in frozen):
                param.requires_grad_(False)

    def build_optimizer(self) -> None:
        """AdamW (fused on CUDA); no weight decay on norms and biases (1-D parameters)."""
        opt = self.spec.optimizer
        params = [p for p in self.model.parameters() if p.requires_grad]
        groups = [
            {"params": [p for p in params if p.dim() >= 2], "weight_decay": opt.weight_decay},
            {"params": [p for p in params if p.dim() < 2], "weight_decay": 0.0},
        ]
        from torch.distributed.tensor import DTensor

        # Fused and foreach kernels take all DTensors or all plain tensors; tensor parallelism
        # without FSDP leaves the replicated parameters plain, so that mix loops per tensor.
        mixed = len({isinstance(p, DTensor) for p in params}) > 1 or (
            len({p.device_mesh for p in params if isinstance(p, DTensor)}) > 1
        )
        fused = self.device.type == "cuda" and not mixed
        # Kernel choice depends on this run's layout, not the checkpoint's: restored on resume.
        self.optimizer_kernels = {"fused": fused or None, "foreach": False if mixed else None}
        self.optimizer = torch.optim.AdamW(
            groups, lr=opt.lr, betas=tuple(opt.betas), eps=opt.eps, **self.optimizer_kernels
        )
        self.scheduler = build_scheduler(self.optimizer, self.spec.scheduler, self.total_steps)

    def build_checkpointer(self) -> None:
        ckpt = self.spec.checkpoint
        self.checkpoint_dir = Path(ckpt.dir) if ckpt.dir else self.run_dir / "checkpoints"
        self.checkpointer = Checkpointer(
            self.checkpoint_dir,
            keep_last=ckpt.keep_last,
            rank=self.env.rank,
            world_size=self.env.world_size,
        )

    def build_logging(self) -> None:
        self.metrics = MetricsLogger(
            self.run_dir,
            self.spec.logging,
            is_main=self.env.is_main,
            total_steps=self.total_steps,
            config=self.spec.model_dump(mode="json"),
        )
        self.profiler = ProfilerWindow(self.spec.profiler, self.run_dir / "profile", self.env.rank)
        self.memory = MemoryRecorder(
            self.spec.profiler, self.run_dir / "profile", self.env.rank, self.device
        )
        self.peak = peak_flops(self.device)

    # ============================== resume / save ============================================
    def _hold_checkpoints(self) -> None:
        """Rank 0 takes the checkpoint folder (`Checkpointer.acquire`: one run at a time) and
        every rank refuses with it (a vote), before anything is read or truncated."""
        refusal = None
        if self.env.is_main:
            try:
                self.checkpointer.acquire()
            except DllmError as error:
                refusal = error
        if any_rank(refusal is not None, self.env)():
            raise refusal or DllmError(
                f"rank 0 could not take {self.checkpoint_dir}", hint="rank 0's error says why"
            )

    def resume(self) -> int:
        """Restore the checkpoint `checkpoint.resume` names; returns the first step to run."""
        choice = self.spec.checkpoint.resume
        if choice == "never":
            if earlier := find_latest(self.checkpoint_dir):
                # Its steps would outrank this run's: pruned first, resumed by the next `auto`.
                raise DllmError(
                    f"checkpoint.resume is never, but {self.checkpoint_dir} holds an earlier "
                    f"run's checkpoints (newest {earlier.name})",
                    hint="train into a new run dir (--run-dir), or set checkpoint.resume: auto "
                    "to continue them",
                )
            self.metrics.truncate_after(0)
            return 0
        if choice == "auto":
            path = find_latest(self.checkpoint_dir)
            if path is None:  # an attempt that died before its first checkpoint: start over
                self.metrics.truncate_after(0)
                return 0
        else:
            path = resolve_checkpoint(choice)  # a checkpoints/ folder: its newest step
            if not (path / "checkpoint.json").is_file():
                raise DllmError(
                    f"checkpoint.resume points at {choice!r}, which is not a complete checkpoint",
                    hint="use auto, never, a checkpoints/step_<N> folder or a checkpoints/ "
                    "folder (its newest complete step)",
                )
            path = self._restart_or_refuse(path, read_meta(path).step)
        meta = read_meta(path)
        # What this run's steps descend from: a path outside its folder, else what the resumed
        # checkpoint descends from.
        outside = choice != "auto" and path.parent.resolve() != self.checkpoint_dir.resolve()
        self.resumed_from = str(path.resolve()) if outside else meta.resumed_from
        self._check_resumable(path, meta)
        self._check_target(path, meta)
        meta = self.checkpointer.load(
            path,
            model=self.model,
            optimizer=self.optimizer,
            scheduler=self.scheduler,
            loader=self.loader,
        )
        for group in self.optimizer.param_groups:  # load_state_dict took the saved flags
            group.update(self.optimizer_kernels)
        resume_schedule(self.scheduler)  # this spec's schedule (training.steps may have grown)
        self.train_time_offset = meta.train_time_s
        self.metrics.truncate_after(meta.step)
        print0(self.env, f"resumed from {path} (step {meta.step})")
        if changed := self._setting_changes(meta):
            print0(self.env, f"note: this resume changes {changed}")
        if changed := self._optimizer_changes():
            print0(
                self.env,
                f"note: the optimizer resumes with the checkpoint's settings, not this spec's "
                f"({changed}); to train with the spec's, `dllm export` it and train a new run "
                "with model.path set to the export (a fresh optimizer)",
            )
        return meta.step

    def _restart_or_refuse(self, path: Path, step: int) -> Path:
        """The checkpoint a `checkpoint.resume` path resumes when this run's checkpoint folder
        holds later steps. An earlier step of the folder itself (a rewind): that step, each later
        one replaced as this run saves it (said). Another folder's checkpoint that the later
        steps descend from (`resumed_from`: a restart of this command, or of a launched run
        that resumed from it): the newest of them, as `auto` (said). Another run's: refused,
        since its later steps would outlive this run's, as with `never` (`resume: auto` and
        `dllm export` would take them, a prune would remove this run's first, metrics.jsonl
        would mix the two)."""
        later = steps_after(self.checkpoint_dir, step)
        if not later:
            return path
        names = ", ".join(p.name for p in later)
        if path.parent.resolve() == self.checkpoint_dir.resolve():
            print0(
                self.env,
                f"note: {self.checkpoint_dir} holds checkpoints after step {step} ({names}): "
                "each is replaced when this run saves its step; until then `resume: auto` and "
                "`dllm export` take the newest of them",
            )
            return path
        newest = later[-1]
        if read_meta(newest).resumed_from == str(path.resolve()):
            print0(
                self.env,
                f"note: {self.checkpoint_dir} holds this run's later steps ({names}), which "
                f"resumed from {path}: going on from {newest.name}",
            )
            return newest
        raise DllmError(
            f"checkpoint.resume is {str(path)!r} (step {step}), but {self.checkpoint_dir} "
            f"holds later checkpoints of another run ({names}), which would outlive this "
            "run's: `resume: auto` and `dllm export` would take them",
            hint="train into a new run dir (--run-dir), or remove the step_* folders after "
            f"step {step} from {self.checkpoint_dir} to go on there",
        )

    def _check_resumable(self, path: Path, meta) -> None:
        """Refuse a checkpoint this run would not continue: another model, objective, seed or
        data stream (before any tensor is read)."""
        family, model = self.spec.model.family, self.model_config.to_hf_dict()
        fresh = "train into a new run dir (--run-dir); to start from its weights, `dllm export` it"
        if not same_model(meta.model, model):
            differs = model_differences(meta.model, model)
            if meta.family and meta.family != family:
                raise DllmError(
                    f"checkpoint {str(path)!r} holds a {meta.family} model and this RunSpec "
                    f"builds {family}: a different model shape ({differs})",
                    hint=f"set model.family: {meta.family} (and its model) to resume it, or {fresh}"
                    " and set model.path to the export",
                )
            raise DllmError(
                f"checkpoint {str(path)!r} holds a different model shape than this RunSpec "
                f"({differs})",
                hint="resume with the model the checkpoint was trained with, or " + fresh,
            )
        if meta.objective != self.objective.name:
            raise DllmError(
                f"checkpoint {str(path)!r} was trained with objective {meta.objective} and this "
                f"RunSpec's is {self.objective.name}",
                hint=f"set objective.name: {meta.objective} to resume it, or {fresh} and set "
                "model.path to the export",
            )
        if meta.seed != self.spec.launch.seed:
            raise DllmError(
                f"checkpoint {str(path)!r} was trained with launch.seed {meta.seed} and this "
                f"RunSpec has {self.spec.launch.seed} (the data order and the noise follow it)",
                hint=f"set launch.seed: {meta.seed} to resume it, or {fresh}",
            )
        saved, now = meta.data_fingerprint, self.data.fingerprint
        # Checkpoints of synthetic data from before it had a fingerprint record none.
        unrecorded = saved is None and "format" not in meta.loader and not self.spec.data.artifact
        if saved != now and not unrecorded:
            where = self.spec.data.artifact or "synthetic data"
            raise DllmError(
                f"checkpoint {str(path)!r} was trained on other data than this run reads: "
                f"data fingerprint {saved} ({meta.data_artifact or 'synthetic data'}), "
                f"now {now} ({where})",
                hint="point data at what the run was trained on (an artifact prepared again is "
                f"other data), or {fresh} and set model.path to the export",
            )

    def _check_target(self, path: Path, meta) -> None:
        """A family with a frozen target (a drafter: its runtime has `check_target`) resumes only
        against the weights the checkpoint was trained against; a checkpoint written before
        they were recorded resumes unchecked, saying so. Rank 0 checks (it may hash the
        target's files) and every rank refuses with it (a vote), before any tensor is read."""
        check = getattr(self.runtime, "check_target", None)
        if check is None:
            return
        refusal = None
        if self.env.is_main:
            if meta.target is None:
                print0(
                    self.env,
                    f"note: {path} does not record its target's weights (written by an earlier "
                    "turbo-dllm): resuming without checking them against model.dflash.target",
                )
            else:
                try:
                    self._target = check(meta.target, self.model_config, path)
                except DllmError as error:
                    refusal = error
        if any_rank(refusal is not None, self.env)():
            raise refusal or DllmError(
                f"rank 0 refused to resume {str(path)!r}", hint="rank 0's error says why"
            )

    def _target_record(self) -> dict | None:
        """What a checkpoint records of a frozen target (rank 0; once per run: a resume's
        check already made it)."""
        if not self.env.is_main or not hasattr(self.runtime, "target_record"):
            return None
        if self._target is None:
            self._target = self.runtime.target_record(self.model_config)
        return self._target

    def _settings(self) -> dict[str, object]:
        """What `_setting_changes` compares, recorded in each checkpoint (`meta.settings`)."""
        spec = self.spec
        objective = spec.objective.model_dump(mode="json", exclude={"name"})
        scheduler = spec.scheduler.model_dump(mode="json")
        return {
            "model.dtype": spec.model.dtype,
            "data.seq_len": spec.data.seq_len,
            "training.micro_batch_size": spec.training.micro_batch_size,
            "training.grad_accumulation": spec.training.grad_accumulation,
            "training.steps": spec.training.steps,
            "training.clip_grad_norm": spec.training.clip_grad_norm,
            "global_batch": self.samples_per_step,
            **{f"scheduler.{name}": value for name, value in scheduler.items()},
            **{f"objective.{name}": value for name, value in objective.items()},
            # What eval_loss measures: the held-out data (its fingerprint) and how much of it.
            **(
                {"eval.data": self.eval_set.fingerprint, "eval.sequences": self.eval_set.sequences}
                if self.eval_set is not None
                else {}
            ),
        }

    def _setting_changes(self, meta) -> str:
        """The settings this resume trains with that the checkpoint's steps did not: allowed
        (a longer run, a new batch split, a curriculum), but the loss trace is no longer the
        uninterrupted run's, so it is said."""
        # model.dtype: checkpoints recorded it as param_dtype before it was a setting.
        saved, now = {"model.dtype": meta.param_dtype, **(meta.settings or {})}, self._settings()
        changes = [
            _setting_change(name, saved[name], value)
            for name, value in now.items()
            if name in saved and saved[name] != value and name != "global_batch"
        ]
        if saved.get("global_batch", self.samples_per_step) != self.samples_per_step:
            changes.append(
                f"the global batch {saved['global_batch']} -> {self.samples_per_step} sequences"
            )
        return ", ".join(changes)

    def _optimizer_changes(self) -> str:
        """The spec's optimizer settings that a resumed optimizer did not take (its state and
        hyperparameters come from the checkpoint, as in PyTorch): said, not silently kept."""
        group, spec = self.optimizer.param_groups[0], self.spec.optimizer
        pairs = {
            "optimizer.lr": (group.get("initial_lr", group["lr"]), spec.lr),
            "optimizer.betas": (tuple(group["betas"]), tuple(spec.betas)),
            "optimizer.eps": (group["eps"], spec.eps),
            "optimizer.weight_decay": (group["weight_decay"], spec.weight_decay),
        }
        return ", ".join(
            f"{name} {saved} kept, the spec says {wanted}"
            for name, (saved, wanted) in pairs.items()
            if saved != wanted
        )

    def save(self, step: int, train_time: float) -> Path:
        return self.checkpointer.save(
            step,
            model=self.model,
            optimizer=self.optimizer,
            scheduler=self.scheduler,
            loader_state=self.loader_state(),
            meta={
                "dp_replicate": self.dims.dp_replicate,
                "dp_shard": self.dims.dp_shard,
                "seed": self.spec.launch.seed,
                "objective": self.objective.name,
                "family": self.spec.model.family,
                "model": self.model_config.to_hf_dict(),
                "param_dtype": self.spec.model.dtype,
                "data_fingerprint": self.data.fingerprint,
                "train_time_s": train_time,
                "settings": self._settings(),
                "target": self._target_record(),
                "resumed_from": self.resumed_from,
                **export_sources(self.spec, self.data.mask_token_id),
            },
        )

    # ============================== one optimizer step =======================================
    def draw(self, step: int) -> StepBatches:
        """The step's micro-batches: drawn from the loader and corrupted, all on the host."""
        spec, dims = self.spec, self.dims
        accum, micro = spec.training.grad_accumulation, spec.training.micro_batch_size
        loader_state = self.loader.state_dict()
        batches = [next(self.loader) for _ in range(accum)]
        keys = [
            NoiseKey(
                seed=spec.launch.seed,
                step=step,
                first_sample=(index * dims.dp_size + dims.dp_rank) * micro,
                samples_per_step=self.samples_per_step,
            )
            for index in range(accum)
        ]
        return StepBatches(
            step=step,
            loader_state=loader_state,
            diffusions=[self.objective.corrupt(b, k) for b, k in zip(batches, keys, strict=True)],
            counts=[
                self.objective.supervised_count(b, key=k)
                for b, k in zip(batches, keys, strict=True)
            ],
        )

    def loader_state(self) -> dict:
        """Where the loader stands for a checkpoint after the last step: before any batches
        drawn ahead for the next one."""
        if self._next is not None:
            return self._next.loader_state
        return self.loader.state_dict()

    def train_step(self, step: int) -> dict[str, float]:
        """One optimizer step, waited for: {loss, flops, grad_norm, lr}."""
        return self.queue_step(step).result()

    def queue_step(self, step: int) -> QueuedStep:
        """One optimizer step, queued: nothing here waits for the device (on one process), so
        the loop can queue the next step before it reads this one's numbers."""
        started = time.perf_counter()
        begun = None
        if self.device.type == "cuda":
            begun = torch.cuda.Event(enable_timing=True)
            begun.record()
        dims = self.dims
        accum = self.spec.training.grad_accumulation

        # -- the step's batches (usually drawn while the device ran the last step) --------------
        drawn, self._next = self._next, None
        if drawn is not None and drawn.step != step:  # drawn for another step: put them back
            self.loader.load_state_dict(drawn.loader_state)
            drawn = None
        if drawn is None:
            drawn = self.draw(step)
        denominator = self._global_counts(drawn.counts)

        # -- forward / backward per micro-batch -------------------------------------------------
        loss_sum = torch.zeros((), device=self.device)
        flops = 0.0
        for index, diffusion in enumerate(drawn.diffusions):
            flops += self.model_config.step_flops(**model_work(self.plan, diffusion))
            if self.mesh is not None:
                self.model.set_requires_gradient_sync(index == accum - 1)
            loss = self._loss(diffusion, denominator)
            (loss * dims.grad_average_size).backward()
            loss_sum += loss.detach()

        # -- clip, step ---------------------------------------------------------------------------
        grad_norm = self._clip_gradients()
        lr = self.scheduler.get_last_lr()[0]
        self.optimizer.step()
        self.scheduler.step()
        self.optimizer.zero_grad(set_to_none=True)
        # The next step's host work (loader gather, noise) overlaps this step's queued kernels:
        # the device stays busy through the step boundary instead of waiting for the host.
        if step + 1 < self.total_steps:
            self._next = self.draw(step + 1)

        flops /= self.plan.context_size  # each rank of a context group counted the whole batch
        # (torch.full, not torch.tensor: a blocking host-to-device copy would wait for the queue)
        totals = torch.stack([loss_sum.float(), torch.full((), flops, device=self.device)])
        self._all_reduce(totals)
        values = torch.cat([totals, grad_norm.reshape(1).to(totals)])
        mem_gb = peak_memory_gb(self.device)  # the allocator's count: no sync
        if values.device.type != "cuda":
            return QueuedStep(step, values, None, lr, mem_gb, started, time.perf_counter())
        host = torch.empty(values.shape, dtype=values.dtype, pin_memory=True)
        host.copy_(values, non_blocking=True)
        ready = torch.cuda.Event(enable_timing=True)
        ready.record()
        return QueuedStep(step, host, ready, lr, mem_gb, started, time.perf_counter(), begun)

    def _loss(self, diffusion, denominator) -> torch.Tensor:
        """One micro-batch's share of the loss: the model over this rank's part of `diffusion`
        (the sequence plan's), scored and divided by the global count (an objective of several
        terms, each over its own count: summed)."""
        inputs = self.plan.prepare(diffusion.to(self.device), self.device)
        with self.autocast():
            local = self.model(
                inputs.input_ids,
                inputs.positions,
                self.model_mask(inputs),
                output=inputs.output or partial(score, inputs.batch),
                **getattr(inputs.batch, "model_kwargs", {}),  # an objective's extra inputs
            )
        loss = local / denominator
        return loss.sum() if loss.dim() else loss

    def evaluate(self, stop: Callable[[], Stop] | None = None) -> dict[str, float] | LeftOff:
        """The held-out loss at the current weights (`train.evaluate`): forwards only, the same
        sequences and noise every time; every rank takes part (FSDP and the loss all-reduce).

        `stop` (this rank's reason to stop now: `train.stop.stop_requested`) is asked before
        each micro-batch and the ranks vote on it: a SIGTERM or `training.max_duration_s`
        running out (on any rank) before the last micro-batch leaves the rest off (`LeftOff`),
        so the step is saved at once (a long evaluation would outlast the scheduler's grace
        period before SIGKILL, or the time budget). Across ranks the vote taken before a forward
        is read after it, so no rank waits for the device to vote: one more forward runs."""
        started = time.perf_counter()
        evals = self.eval_set
        if self._eval_batches is None:
            keys = [
                NoiseKey(self.spec.launch.seed, EVAL_STEP, first, evals.sequences)
                for first in evals.first_samples
            ]
            self._eval_batches = [
                (self.objective.corrupt(b, k), self.objective.supervised_count(b, key=k))
                for b, k in zip(evals.batches, keys, strict=True)
            ]
            # the raw rows are read by nothing now: only their corrupted copies stay on the host
            self.eval_set = evals = replace(evals, batches=[])
        denominator = self._global_counts([count for _, count in self._eval_batches])
        loss_sum = torch.zeros((), device=self.device)
        pending = None  # across ranks: the vote taken before the last forward, read after it
        # eval mode: a family with dropout or sampled routing evaluates without it
        with torch.no_grad(), _eval_mode(self.model):
            for done, (diffusion, _) in enumerate(self._eval_batches):
                if stop is not None:
                    vote = highest_on_any_rank(stop(), self.env)
                    ready, pending = (pending, vote) if self.env.distributed else (vote, None)
                    if ready is not None and (why := Stop(ready())):
                        return LeftOff(why, done, len(self._eval_batches))
                loss_sum += self._loss(diffusion, denominator)
        total = loss_sum.float()
        self._all_reduce(total)
        return {
            "eval_loss": float(total),
            "eval_sequences": evals.sequences,
            "eval_time_s": time.perf_counter() - started,
        }

    def _global_counts(self, counts: list) -> float | torch.Tensor:
        """The loss denominator(s): the step's supervised counts summed over micro-batches and
        ranks: a float in one process, else a tensor (one count per loss term where the objective
        has several) that stays on the device, so the host never waits for the queued step."""
        per_term = isinstance(counts[0], tuple)
        if not per_term and not self.env.distributed:
            return max(float(sum(counts)), 1.0)
        columns = zip(*counts, strict=True) if per_term else [counts]
        # The ranks of a context group hold the same batches: count them once.
        summed = [float(sum(column)) / self.plan.context_size for column in columns]
        total = to_device(torch.tensor(summed), self.device)
        self._all_reduce(total)
        total = total.clamp(min=1.0)
        return total if per_term else total[0]

    def _clip_gradients(self) -> torch.Tensor:
        params = [p for p in self.model.parameters() if p.grad is not None]
        if self.dims.ep > 1:
            reduce_expert_grads(self.model)
        if self.dims.tp > 1:
            replicate_partial_grads(params)
        limit = self.spec.training.clip_grad_norm
        norm = clip_in_optimizer(self.optimizer, params, limit)
        return norm if norm is not None else clip_grad_norm(params, limit)

    def _all_reduce(self, tensor: torch.Tensor) -> None:
        """Sum over the ranks, counting each tensor-parallel group once."""
        if self.env.distributed:
            import torch.distributed as dist

            dist.all_reduce(tensor, group=self.dims.loss_group())

    # ============================== the loop =================================================
    def _model_name(self) -> str:
        """The spec's family, and a drafter's architecture (its config's model_type is the
        target's: a DFlash drafter read as `qwen3`)."""
        architecture = getattr(self.model_config, "architecture", None)
        family = self.spec.model.family
        return f"{family} {architecture}" if architecture else family

    @staticmethod
    def _stop_if_not_finite(stats: dict, done: int) -> None:
        """Stop on a step whose loss or gradient norm is not finite, naming the step."""
        if not math.isfinite(stats["loss"]):
            raise DllmError(
                f"the loss became {stats['loss']} at step {done}",
                hint="lower optimizer.lr, keep training.clip_grad_norm set, or check the data",
            )
        if not math.isfinite(stats["grad_norm"]):
            # The step's update (clipped or not) made the weights non-finite while its loss, read
            # before it, was still finite: stop before a checkpoint of them is written.
            raise DllmError(
                f"the gradient norm became {stats['grad_norm']} at step {done} (loss "
                f"{stats['loss']:.4f}): the weights are no longer finite, so no checkpoint of "
                "this step is written",
                hint="resume from the last checkpoint with a lower optimizer.lr, keep "
                "training.clip_grad_norm set, or check the data",
            )

    def _report(
        self,
        queued: QueuedStep,
        previous: QueuedStep | None,
        began: float,
        tokens: int,
        extra: dict | None = None,
    ) -> None:
        """Wait for a queued step's numbers, stop on a non-finite loss or gradient norm, log them
        (`previous`: the step read before it, where its time runs from; `extra`: an
        evaluation's numbers, in the same record)."""
        stats = queued.result()
        now = time.perf_counter()
        step_time = max(queued.seconds(previous), 1e-9)
        done = queued.step + 1
        self._stop_if_not_finite(stats, done)
        world = self.env.world_size
        self.metrics.log(
            {
                "step": done,
                "loss": stats["loss"],
                "lr": stats["lr"],
                "grad_norm": stats["grad_norm"],
                "tokens": tokens,
                "tokens_per_s": tokens / step_time,
                "mfu": stats["flops"] / (step_time * self.peak * world) if self.peak else None,
                "mem_gb": queued.mem_gb,
                "step_time_s": step_time,
                "time_s": self.train_time_offset + now - began,
                **(extra or {}),
            }
        )

    def run(self) -> int:
        self._hold_checkpoints()
        try:
            return self._run()
        finally:
            self.checkpointer.release()

    def _run(self) -> int:
        start = self.resume()
        self._target_record()  # the target as this run loaded it, before any step
        if start >= self.total_steps:
            print0(
                self.env, f"nothing to do: the checkpoint is at step {start} of {self.total_steps}"
            )
            return 0
        env = self.env
        began = time.perf_counter()
        print0(
            env,
            f"training {self._model_name()} ({human_count(self.model_config.num_params())} params) "
            f"on {env.world_size} x {self.device.type}, steps {start + 1}..{self.total_steps}, "
            f"run dir {self.run_dir}",
        )
        if self.eval_set is not None and (
            note := self.eval_set.shortfall(self.spec.eval.sequences)
        ):
            print0(env, note)
        if self.compile_cache and env.is_main:  # one rank walks the cache folder, not all
            inductor = Path(self.compile_cache[INDUCTOR_CACHE_VARIABLE])
            size = cache_size_bytes(inductor)
            state = f"warm, {size / 1e6:,.0f} MB" if size else "cold: the first step compiles"
            print0(env, f"compile cache {inductor.parent} ({state})")
        with TerminationRequest() as termination:
            return self._steps(start, began, termination)

    def _steps(self, start: int, began: float, termination: TerminationRequest) -> int:
        """The training loop from step `start`: each step queued, the one before read and
        logged, a checkpoint every `checkpoint.interval` steps and at the end, and a stop with a
        checkpoint when `training.max_duration_s` runs out or SIGTERM arrives (`train.stop`)."""
        spec, env = self.spec, self.env
        tokens_per_step = self.samples_per_step * spec.data.seq_len
        interval = spec.checkpoint.interval
        max_duration = spec.training.max_duration_s

        def stop_now() -> Stop:  # this rank's reason to stop, by its own clock
            # This attempt's time: a job stopped by its budget and resumed by the next job (of
            # the same limit) gets the whole budget again; time_s counts across resumes.
            return stop_requested(termination, time.perf_counter() - began, max_duration)

        last_saved = start
        breaks_before = graph_break_counts() if spec.training.compile else None
        # Step N's numbers are read once step N + 1 is queued, so the device never waits for
        # the host between steps; a step that saves is read before its checkpoint.
        waiting: QueuedStep | None = None
        last_read: QueuedStep | None = None  # a step's time runs from the end of this one
        vote = None  # the ranks' vote to stop, taken as the last step was queued
        stop = Stop.NONE
        for step in range(start, self.total_steps):
            if self.device.type == "cuda":
                torch.cuda.reset_peak_memory_stats(self.device)
            self.profiler.before_step(step)
            try:
                queued = self.queue_step(step)
            except torch.OutOfMemoryError:
                if waiting is not None:  # the last step finished: its numbers are not lost
                    self._report(waiting, last_read, began, tokens_per_step)
                raise out_of_memory(step, self.device, self.memory.dump()) from None
            if breaks_before is not None and step == start:  # the step that compiled the layers
                warning = graph_break_warning(
                    breaks_before,
                    graph_break_counts(),
                    checkpointing=bool(spec.training.activation_checkpointing),
                )
                if warning:
                    print0(env, f"warning: {warning}")
            self.profiler.after_step(step)
            self.memory.after_step(step)
            if waiting is not None:
                self._report(waiting, last_read, began, tokens_per_step)
                last_read = waiting
            done = step + 1
            stop = stop_now()  # why to stop here (`train.stop`)
            if env.distributed:
                # Every rank must agree: the stop leads to a collective save (see `any_rank`).
                # The vote taken at the last step is read now, so no rank waits for the step it
                # just queued: a distributed run stops one step later.
                previous, vote = vote, highest_on_any_rank(stop, env)
                stop = Stop(previous()) if previous is not None else Stop.NONE
            saving = (interval and done % interval == 0) or done == self.total_steps or stop
            # an evaluation follows its step, not a stop (SIGTERM, the time limit: save and go)
            evaluating = self.eval_set is not None and not stop
            evaluating = evaluating and self.eval_set.due(done, self.total_steps)
            left_off = None
            if saving or evaluating:
                evaluated = self.evaluate(stop_now) if evaluating else None
                if isinstance(evaluated, LeftOff):  # a stop during it: save this step now
                    left_off, evaluated = evaluated, evaluated.record()
                    stop, saving = left_off.stop, True
                elif evaluating:
                    # A stop that came during its last forward, read now (the evaluation's loss
                    # waited for the device already): saved now, not after one more step.
                    stop = Stop(highest_on_any_rank(stop_now(), env)())
                    saving = saving or bool(stop)
                self._report(queued, last_read, began, tokens_per_step, evaluated)
                waiting, last_read = None, None  # the next step's time leaves these out
                if saving:
                    self.save(done, self.train_time_offset + time.perf_counter() - began)
                    last_saved = done
            else:
                waiting = queued
            if stop == Stop.TIME_LIMIT and done == self.total_steps and left_off is None:
                stop = Stop.NONE  # the time budget ran out at the last step: finished all the same
            if stop:
                cause = "SIGTERM received" if stop == Stop.SIGTERM else f"{stop.cause} reached"
                note = f"; {left_off}" if left_off else ""
                print0(env, f"stopping after step {done}: {cause} (checkpoint saved){note}")
            if stop == Stop.SIGTERM:
                self.metrics.close()
                return EXIT_TERMINATED
            if stop:
                break
        self.metrics.close()
        if stop:  # the time budget: saved, not finished (exit 0 so the next job resumes)
            print0(
                env,
                f"not finished: step {last_saved} of {self.total_steps} saved in "
                f"{self.checkpoint_dir}; `dllm train` of the same spec with --run-dir "
                f"{shlex.quote(str(self.run_dir))} goes on from it",
            )
        else:
            print0(env, f"done: {last_saved} steps, checkpoint in {self.checkpoint_dir}")
            self._note_later_steps(last_saved)
        return 0

    def _note_later_steps(self, last_saved: int) -> None:
        """A rewound run that ended before the old run's later steps leaves them in the folder,
        where `resume: auto` and `dllm export` take the newest: "done ... checkpoint in F" read
        as if this run's last step were F's checkpoint."""
        later = steps_after(self.checkpoint_dir, last_saved)
        if later:
            names = ", ".join(p.name for p in later)
            print0(
                self.env,
                f"note: {self.checkpoint_dir} still holds the earlier run's later steps "
                f"({names}): `resume: auto` and `dllm export` take {later[-1].name}, not this "
                f"run's step {last_saved}; remove them (or pass --checkpoint "
                f"{shlex.quote(str(self.checkpoint_dir / f'step_{last_saved:08d}'))} to dllm export) "
                "to use this run's",
            )


def _setting_change(name: str, saved, now) -> str:
    """One change a resume notes (`Trainer._setting_changes`), as `field saved -> now`."""
    if name == "eval.data":  # fingerprints
        return (
            f"the held-out data (eval.artifact, fingerprint {str(saved)[:16]} -> {str(now)[:16]}: "
            "its eval_loss is not comparable with the earlier steps)"
        )
    if name == "eval.sequences":
        return (
            f"eval.sequences {saved} -> {now} (the evaluated sequences: its eval_loss is not "
            "comparable with the earlier steps)"
        )
    if name == "model.dtype" and now == "bfloat16":
        return (
            f"model.dtype {saved} -> {now} (the checkpoint's weights and optimizer state are "
            f"rounded to {now})"
        )
    return f"{name} {saved} -> {now}"
