"""Cross-field rules of a RunSpec, all collected into one report.

`problems(spec)` returns every violated rule as (field path, message); `check(spec)` raises one
`DllmError` listing them all. Rules that need the launch (world size) take it as an argument, so
`dllm config validate` and `dllm launch` share them.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from turbo_dllm.config import capabilities as caps
from turbo_dllm.config.runspec import RunSpec
from turbo_dllm.errors import DllmError

__all__ = ["Problem", "check", "problems"]

_PINNED_REVISION = re.compile(r"^[0-9a-f]{7,64}$")


@dataclass(frozen=True)
class Problem:
    path: str
    message: str

    def __str__(self) -> str:
        return f"{self.path}: {self.message}"


def problems(spec: RunSpec, world_size: int | None = None) -> list[Problem]:
    found: list[Problem] = []

    def add(path: str, message: str) -> None:
        found.append(Problem(path, message))

    model, objective, data, topo = spec.model, spec.objective, spec.data, spec.topology

    # --- capabilities of this version -------------------------------------------------------
    if model.family not in caps.AVAILABLE_FAMILIES:
        add(
            "model.family",
            f"{model.family!r} is not available in this version "
            f"(available: {', '.join(sorted(caps.AVAILABLE_FAMILIES))})",
        )
    if objective.name not in caps.AVAILABLE_OBJECTIVES:
        add(
            "objective.name",
            f"{objective.name!r} is not available in this version "
            f"(available: {', '.join(sorted(caps.AVAILABLE_OBJECTIVES))})",
        )
    for axis in ("cp", "bp", "tp", "ep"):
        if getattr(topo, axis) > 1 and axis not in caps.AVAILABLE_PARALLEL:
            add(f"topology.{axis}", f"{axis} > 1 is not available in this version")
    if topo.sp and "sp" not in caps.AVAILABLE_PARALLEL:
        add("topology.sp", "sequence parallelism is not available in this version")

    # --- model ------------------------------------------------------------------------------
    if (model.path is None) == (model.from_config is None):
        add("model", "set exactly one of model.path (a local HF folder) or model.from_config")
    if objective.name not in caps.OBJECTIVES_FOR_FAMILY[model.family]:
        allowed = ", ".join(sorted(caps.OBJECTIVES_FOR_FAMILY[model.family]))
        add(
            "objective.name",
            f"{objective.name!r} cannot train model family {model.family!r} (allowed: {allowed})",
        )

    # --- objective and data shapes ---------------------------------------------------------
    if objective.eps_min > objective.eps_max:
        add("objective.eps_min", f"must be <= objective.eps_max ({objective.eps_max})")
    if data.seq_len % objective.block_size:
        add(
            "data.seq_len",
            f"{data.seq_len} is not a multiple of objective.block_size ({objective.block_size})",
        )
    if (data.artifact is None) == (data.synthetic is None):
        add("data", "set exactly one of data.artifact (a prepared folder) or data.synthetic")
    if data.synthetic is not None and objective.mask_token_id is not None:
        if objective.mask_token_id >= data.synthetic.vocab_size:
            add(
                "objective.mask_token_id",
                f"{objective.mask_token_id} is outside the synthetic "
                f"vocabulary (size {data.synthetic.vocab_size})",
            )

    # --- topology ---------------------------------------------------------------------------
    if topo.sp:
        context = max(topo.cp, topo.bp)
        if topo.tp <= 1:
            add("topology.sp", "sequence parallelism needs topology.tp > 1")
        elif data.seq_len % (context * topo.tp):
            add(
                "topology.sp",
                f"sequence parallelism splits each rank's tokens over tp: data.seq_len "
                f"({data.seq_len}) must be a multiple of max(cp, bp) x tp = {context * topo.tp}",
            )
    if topo.ep > 1 and model.family not in caps.MOE_FAMILIES:
        add(
            "topology.ep",
            f"expert parallelism needs a mixture-of-experts family "
            f"({', '.join(sorted(caps.MOE_FAMILIES))}), not {model.family!r}",
        )
    if topo.cp > 1 and topo.bp > 1 and (topo.bp < topo.cp or topo.bp % topo.cp):
        add(
            "topology.bp",
            f"fused CP+BP needs bp >= cp and bp % cp == 0 (got cp={topo.cp}, bp={topo.bp}): "
            f"the bp ranks that own noisy blocks form bp/cp groups of cp ranks, each group "
            f"holding one copy of the clean stream sharded over its cp ranks",
        )
    if topo.cp > 1 and data.seq_len % (2 * topo.cp * objective.block_size):
        add(
            "data.seq_len",
            f"context parallelism shards the sequence zigzag into 2*cp chunks of "
            f"whole blocks: seq_len must be a multiple of {2 * topo.cp * objective.block_size}",
        )
    if topo.bp > 1 and data.seq_len // objective.block_size < 2 * topo.bp:
        add(
            "data.seq_len",
            f"block parallelism gives each rank a pair of blocks: needs at least "
            f"{2 * topo.bp} blocks, got {data.seq_len // objective.block_size}",
        )
    if topo.tp > 1:
        for message in _tensor_parallel_problems(spec):
            add("topology.tp", message)
    if world_size is not None and topo.world_size != world_size:
        add(
            "topology",
            f"dp*fsdp*max(cp,bp)*tp = {topo.world_size} but the launch has {world_size} processes",
        )

    # --- production rules -------------------------------------------------------------------
    if spec.launch.kind == "prod":
        if data.artifact is None:
            add("data.artifact", "prod runs need a prepared dataset, not synthetic data")
        if model.path is not None and not (
            model.revision and _PINNED_REVISION.match(model.revision)
        ):
            add("model.revision", "prod runs need the model pinned to a commit hash")
        if model.path is None:
            add("model.path", "prod runs train a real checkpoint (model.path), not a random init")
        if spec.kernels == "jit":
            add(
                "kernels",
                "prod runs use prebuilt, verified kernels: 'native' or 'reference', not 'jit'",
            )

    # --- training ---------------------------------------------------------------------------
    if (
        spec.profiler.enabled
        and spec.profiler.start_step + spec.profiler.num_steps > spec.training.steps
    ):
        add(
            "profiler",
            f"window ends at step {spec.profiler.start_step + spec.profiler.num_steps} "
            f"but training.steps is {spec.training.steps}",
        )
    if spec.scheduler.warmup_steps > spec.training.steps:
        add(
            "scheduler.warmup_steps",
            f"{spec.scheduler.warmup_steps} exceeds training.steps ({spec.training.steps})",
        )
    return found


def _tensor_parallel_problems(spec: RunSpec) -> list[str]:
    """tp must divide the heads, key/value heads and MLP width of the model the spec names.

    The shape is read from the preset or the local config.json; a model that cannot be read here
    is left to the other rules (and the trainer checks again when it builds the model).
    """
    from turbo_dllm.train.models.config import resolve_model_config
    from turbo_dllm.train.parallel.tensor import tensor_parallel_problems

    model = spec.model
    try:
        config = resolve_model_config(
            path=model.path,
            from_config=None if model.path else model.from_config,
            overrides=dict(model.config_overrides),
        )
        return tensor_parallel_problems(config, spec.topology.tp)
    except (DllmError, OSError, ValueError, KeyError, TypeError, AttributeError):
        return []


def check(spec: RunSpec, world_size: int | None = None, source: str = "RunSpec") -> RunSpec:
    """Raise one DllmError listing every problem, or return the spec unchanged."""
    found = problems(spec, world_size)
    if found:
        lines = "\n".join(f"  - {p}" for p in found)
        raise DllmError(
            f"{source} has {len(found)} problem{'s' if len(found) > 1 else ''}:\n{lines}",
            hint="fix the fields above; `dllm config schema` lists every field and its type",
        )
    return spec
