"""Trainer readiness: the attention backend fits the host (and fla's kernels, where linear
attention asks for them), the merge op suits block parallelism, the model folder loads, the
compile cache is usable, W&B exists.

Cheap checks (no weights are read): they catch the mistakes that would otherwise surface only
after the workers started.
"""

from __future__ import annotations

import shlex
from pathlib import Path

from turbo_dllm.doctor import CheckResult, DoctorContext, register_check
from turbo_dllm.doctor.host import gpus_overridden, host_fingerprint, host_view
from turbo_dllm.errors import DllmError
from turbo_dllm.fsutil import human_count

__all__ = ["turbo_on_gpus"]


def _no_spec(name: str, ctx: DoctorContext) -> CheckResult:
    return ctx.without_spec(name, "the trainer")


@register_check(order=450)
def attention_backend(ctx: DoctorContext) -> CheckResult:
    name = "attention backend"
    if ctx.spec is None:
        return _no_spec(name, ctx)
    backend = ctx.spec.model.attention
    if backend == "reference":
        return CheckResult(name, "pass", "reference (SDPA + explicit mask; fine for CPU and tests)")
    import torch

    if backend == "turbo":
        return _turbo_attention(ctx, name)
    slurm = _slurm_plan(ctx)
    if slurm is not None and slurm.device == "cuda":  # its nodes' GPUs, not this login node's
        return CheckResult(name, "pass", "flex on the SLURM job's GPUs")
    if slurm is None and gpus_overridden(ctx):
        # A login node checking for its compute nodes: their GPUs, not this process's (flex
        # failed for "no CUDA GPU" here, while the other checks judged the host described).
        gpus = host_view(ctx).gpus
        if gpus:
            return CheckResult(
                name, "pass", f"flex on the {len(gpus)} GPU(s) DLLM_OVERRIDE_GPUS describes"
            )
        return CheckResult(
            name,
            "fail",
            "flex needs a CUDA GPU, and DLLM_OVERRIDE_GPUS describes a host without one",
            fix="set model.attention: reference for CPU runs, or DLLM_OVERRIDE_GPUS to the GPUs "
            "the run gets",
        )
    if slurm is not None or not torch.cuda.is_available():
        return CheckResult(
            name,
            "fail",
            "flex needs a CUDA GPU (torch has no FlexAttention backward on CPU)",
            fix="set model.attention: reference for CPU runs, or run on a GPU host",
        )
    from torch.nn.attention import flex_attention  # noqa: F401 - present since torch 2.5

    return CheckResult(name, "pass", f"flex on {torch.cuda.get_device_name(0)}")


@register_check(order=451)
def linear_attention(ctx: DoctorContext) -> CheckResult:
    """`model.linear_attention: fla` (qwen3_8's Gated DeltaNet layers): flash-linear-attention
    installed, a CUDA GPU, a Triton fla trains with; the trainer refuses the same when it builds
    the model, this says so before a launch."""
    name = "linear attention"
    if ctx.spec is None:
        return _no_spec(name, ctx)
    kernel = ctx.spec.model.linear_attention
    if kernel != "fla":
        return CheckResult(name, "pass", f"{kernel} (no flash-linear-attention kernels asked for)")
    from turbo_dllm.families.qwen3_8.gated_delta import check_fla_usable

    slurm = _slurm_plan(ctx)
    on_job_gpus = slurm is not None and slurm.device == "cuda"  # not this login node's
    # DLLM_OVERRIDE_GPUS: the GPUs of the host the run goes to, not this process's (a login
    # node was failed for "CUDA GPUs only" while the other checks judged the host described)
    described = None if slurm is not None or not gpus_overridden(ctx) else host_view(ctx).gpus
    if described is not None and not described:
        return CheckResult(
            name,
            "fail",
            "model.linear_attention 'fla' runs on CUDA GPUs only, and DLLM_OVERRIDE_GPUS "
            "describes a host without one",
            fix="set model.linear_attention: torch for CPU runs, or DLLM_OVERRIDE_GPUS to the "
            "GPUs the run gets",
        )
    try:
        check_fla_usable(cuda=not on_job_gpus and described is None)
    except DllmError as error:
        return CheckResult(name, "fail", error.message, fix=error.hint)
    import importlib.metadata

    try:
        version = importlib.metadata.version("flash-linear-attention")
    except importlib.metadata.PackageNotFoundError:  # fla importable without its metadata
        version = "(version unknown)"
    if on_job_gpus:
        return CheckResult(name, "pass", f"fla {version}, on the SLURM job's GPUs")
    if described:
        return CheckResult(
            name,
            "pass",
            f"fla {version}, on the {len(described)} GPU(s) DLLM_OVERRIDE_GPUS describes",
        )
    import torch

    return CheckResult(name, "pass", f"fla {version} on {torch.cuda.get_device_name(0)}")


def turbo_on_gpus(ctx: DoctorContext) -> bool:
    """Whether `model.attention: turbo` would run on CUDA GPUs: the SLURM job's nodes', else
    this host's (or, with DLLM_OVERRIDE_GPUS, the host they describe)."""
    import torch

    slurm = _slurm_plan(ctx)
    if slurm is not None:
        return slurm.device == "cuda"  # its nodes' GPUs, not this login node's
    local = ctx.spec.kernels != "jit" or torch.cuda.is_available()
    return _device(ctx) == "cuda" and local


def _turbo_attention(ctx: DoctorContext, name: str) -> CheckResult:
    """turbo: our Triton op from a bundle that fits this host (no fallback to flex)."""
    from turbo_dllm.kernels.readiness import require_attention_kernels

    if not turbo_on_gpus(ctx):  # a bundle would not help (a CPU bundle has no turbo kernels)
        return CheckResult(
            name,
            "fail",
            "turbo runs Triton kernels on a CUDA GPU; none is visible here",
            fix="set model.attention: reference for CPU runs, or run on a GPU host",
        )
    try:
        # Loading it checks the real process too; with DLLM_OVERRIDE_* (a login node checking
        # for its compute nodes) only the bundle's target is compared.
        detail = require_attention_kernels(
            ctx.spec, load=_can_load(ctx), fingerprint=host_fingerprint(ctx)
        )
    except DllmError as error:
        from turbo_dllm.doctor.checks.host_bundles import explain_index

        fix = explain_index(error.hint or "see docs/bundles.md")
        return CheckResult(name, "fail", error.message, fix=fix)
    return CheckResult(name, "pass", detail)


def _slurm_plan(ctx: DoctorContext):
    """The launch's plan when it is a SLURM job: it trains on the allocation's nodes, so this
    host's GPUs (a login node's: none) do not decide."""
    plan = ctx.extras.get("job_plan")
    return plan if plan is not None and plan.backend == "slurm" else None


def _can_load(ctx: DoctorContext) -> bool:
    import os

    import torch

    overridden = any(key.startswith("DLLM_OVERRIDE_") for key in os.environ)
    return torch.cuda.is_available() and not overridden


@register_check(order=452, name="attention merge")
def partial_merge(ctx: DoctorContext) -> CheckResult:
    """Block parallelism merges two attention partials per layer: on GPUs, use the native op."""
    from turbo_dllm.train.parallel.merge_advice import slow_merge_warning

    name = "attention merge"
    if ctx.spec is None:
        return _no_spec(name, ctx)
    spec = ctx.spec
    if spec.topology.bp <= 1:
        return CheckResult(name, "pass", "no partials to merge (topology.bp = 1)")
    problem = slow_merge_warning(spec.topology.bp, spec.kernels, _device(ctx))
    if problem is None:
        return CheckResult(
            name, "pass", f"kernels: {spec.kernels}, attention: {spec.model.attention}"
        )
    return CheckResult(name, "warn", problem, fix=_native_merge_fix(ctx))


def _native_merge_fix(ctx: DoctorContext) -> str:
    """`kernels: native`, with the install command where no active bundle fits (it was "after
    `dllm bundle install --auto`", which stops at "no bundle index given" where
    DLLM_BUNDLE_INDEX is not set: the install fix names --index URL, or building here)."""
    from turbo_dllm.bundles.store import active_bundle
    from turbo_dllm.doctor.checks.host_bundles import _install_fix

    try:
        bundle = active_bundle()
        fits = bundle is not None and not bundle.target.differences(host_fingerprint(ctx))
    except DllmError:  # a damaged store, a bad override: their own checks say so
        fits = False
    if fits:
        return f"set `kernels: native` (the active bundle {bundle.bundle_id} fits this host)"
    return f"set `kernels: native` once a bundle is installed: {_install_fix()}"


def _device(ctx: DoctorContext) -> str:
    """Where the run will train: the launch plan's device, else this host's (flex means GPUs)."""
    plan = ctx.extras.get("job_plan")
    if plan is not None:
        return plan.device
    if ctx.spec is not None and ctx.spec.model.attention == "flex":
        return "cuda"
    from turbo_dllm.doctor.host import host_view

    return "cuda" if host_view(ctx).gpus else "cpu"


@register_check(order=455, name="model")
def model_source(ctx: DoctorContext) -> CheckResult:
    name = "model"
    if ctx.spec is None:
        return _no_spec(name, ctx)
    from pathlib import Path

    from turbo_dllm.registry import resolve_model_config

    model = ctx.spec.model
    try:
        config = resolve_model_config(model)
    except DllmError as error:
        if model.path is not None and not Path(model.path).is_dir():
            # (it said "model folder config not found: '<path>/config.json'", of a folder
            # that is not there at all; of a file, "cannot read '<file>/config.json': [Errno
            # 20] Not a directory")
            checkpoint = "the Hugging Face checkpoint (config.json and its safetensors weights)"
            if Path(model.path).exists():
                return CheckResult(
                    name,
                    "fail",
                    f"model.path {model.path}: a file, not a folder",
                    fix=f"set model.path to the folder that holds {checkpoint}",
                )
            return CheckResult(
                name,
                "fail",
                f"model.path {model.path}: no such folder",
                fix=f"put {checkpoint} in {shlex.quote(str(model.path))}, or set model.path to "
                "the folder that holds it",
            )
        return CheckResult(
            name, "fail", error.message, fix=error.hint or "fix model.* in the RunSpec"
        )
    kind = config.model_type if model.family != "dflash" else f"{config.model_type} drafter"
    size = f"{kind}, {human_count(config.num_params())} parameters"
    target = getattr(model.dflash, "target", None) if model.family == "dflash" else None
    if target is not None and Path(target).is_dir():  # the frozen target the drafter reads
        from turbo_dllm.train.weights import weight_index

        try:
            weight_index(target)
        except DllmError as error:
            return CheckResult(
                name, "fail", f"model.dflash.target: {error.message}", fix=error.hint
            )
    if model.path is None:
        return CheckResult(name, "pass", f"random init from {model.from_config!r} ({size})")
    folder = Path(model.path)
    if not any(
        (folder / f).is_file() for f in ("model.safetensors", "model.safetensors.index.json")
    ):
        return CheckResult(
            name,
            "fail",
            f"{folder} has config.json but no safetensors weights",
            fix="save the model with transformers' save_pretrained (safetensors) into that folder",
        )
    try:  # the trainer's refusals of the folder's weights, from the index and headers alone
        _check_weights(model, config, folder)
    except DllmError as error:
        return CheckResult(name, "fail", error.message, fix=error.hint)
    return CheckResult(name, "pass", f"{folder} ({size})")


def _check_weights(model, config, folder) -> None:
    """A tensor the folder lacks or holds in another shape (a config.json that does not match
    the weights), a shard its index names and the folder lacks, a damaged index or header: the
    built-in families' model is built on the meta device (no storage) and checked against the
    headers as the trainer loads it; a DFlash drafter or a plugin's family gets the file checks
    only (their models need more than the config, or may allocate)."""
    from turbo_dllm.registry import PLUGINS, get_family
    from turbo_dllm.train.weights import check_hf_weights, weight_index

    if model.family == "dflash" or PLUGINS.sources.get(("family", model.family)):
        weight_index(folder)
        return
    check_hf_weights(get_family(model.family).runtime().build_model(config, None), config, folder)


@register_check(order=458)
def compile_cache(ctx: DoctorContext) -> CheckResult:
    """Where compiled kernels are kept, and whether the first step will have to build them."""
    name = "compile cache"
    if ctx.spec is None:
        return _no_spec(name, ctx)
    import torch

    if gpus_overridden(ctx) and bool(host_view(ctx).gpus) != torch.cuda.is_available():
        # GPUs described for another host (a login node's check): its cache is keyed by its
        # own torch, not this process's ("nothing compiles (CPU...)" was said of a GPU run)
        return CheckResult(
            name,
            "skip",
            "not checked: DLLM_OVERRIDE_GPUS describes another host, whose own torch keys its "
            "compile cache (see the fingerprint check)",
        )
    if not (ctx.spec.training.compile or torch.cuda.is_available()):
        return CheckResult(name, "pass", "nothing compiles (CPU, training.compile: false)")
    from turbo_dllm.train.compile_cache import (
        INDUCTOR_CACHE_VARIABLE,
        cache_size_bytes,
        prepare_compile_cache,
    )

    try:  # creates the folders, as the workers will; sets nothing in this process
        folder = Path(prepare_compile_cache()[INDUCTOR_CACHE_VARIABLE])
    except DllmError as error:
        return CheckResult(name, "fail", error.message, fix=error.hint)
    from turbo_dllm.cache.key import spec_digest
    from turbo_dllm.cache.packs import fitting_pack

    # A fitting pack on offer (DLLM_PACK_PATH, a local mirror's packs/) and not installed: say so
    # (`dllm launch` prints doctor's warnings), warm cache or not: the pack may hold this recipe.
    try:
        offer = fitting_pack(host_fingerprint(ctx), spec_digest(ctx.spec))
    except DllmError:  # a damaged installed-pack record: the "compile packs" check names it;
        # a bad DLLM_OVERRIDE_* value: the "fingerprint" check
        offer = None
    size = cache_size_bytes(folder)
    if offer:
        state = f"warm ({size / 1e6:,.0f} MB)" if size else "cold"
        return CheckResult(
            name,
            "warn",
            f"{folder.parent}: {state}; a compile-cache pack made for this run fits this host "
            "and is not installed",
            # Quoted: a pack folder with a space in its path (pasted, it named no pack).
            fix=f"dllm cache install {shlex.quote(str(offer))} (the first step then skips most "
            "compiling)",
        )
    if size:
        return CheckResult(name, "pass", f"{folder.parent}: warm ({size / 1e6:,.0f} MB)")
    return CheckResult(
        name,
        "pass",
        f"{folder.parent}: cold, so the first step compiles (minutes for a 1-2B model on an "
        "H200); later runs with this torch/Triton reuse it",
    )


@register_check(order=459)
def compile_packs(ctx: DoctorContext) -> CheckResult:
    """The installed compile-cache packs' records can be read, and their files are still in
    the cache (present and of their recorded size: `dllm cache verify` hashes them too)."""
    from turbo_dllm.cache.packs import installed_packs, repair_hint, verify_pack

    name = "compile packs"
    try:
        packs = installed_packs()
    except DllmError as error:
        from turbo_dllm.doctor.folders import folder_problem
        from turbo_dllm.paths import dllm_home

        home = folder_problem(dllm_home())
        if home is not None and home.blocker is not None:
            # A file in DLLM_HOME's way: no pack record is damaged or lost ("move that file
            # aside; the packs installed before have to be installed again" was no fix).
            return CheckResult(
                name,
                "skip",
                "not checked: DLLM_HOME cannot hold them (see the cache dir check)",
            )
        return CheckResult(name, "fail", error.message, fix=error.hint)
    if not packs:
        return CheckResult(name, "pass", "none installed")
    gone = [(pack, n) for pack in packs if (n := len(verify_pack(pack, hashes=False)))]
    if gone:
        which = ", ".join(f"{pack.short_sha} ({n} files)" for pack, n in gone)
        # Each pack's own commands (the file it came from may be gone: `repair_hint` knows).
        fixes = [repair_hint(pack) for pack, _ in gone]
        if len(gone) > 1:
            fixes = [f"{pack.short_sha}: {fix}" for (pack, _), fix in zip(gone, fixes, strict=True)]
        return CheckResult(
            name,
            "warn",
            f"files of installed packs are missing or changed in the cache: {which} "
            "(dllm cache verify names them)",
            fix="; ".join(fixes),
        )
    return CheckResult(name, "pass", f"{len(packs)} installed, their files in place")


@register_check(order=460, name="wandb")
def wandb_installed(ctx: DoctorContext) -> CheckResult:
    name = "wandb"
    if ctx.spec is None:  # (was "W&B logging is off" for a RunSpec that asks for it)
        return ctx.without_spec(name, "its W&B logging")
    if ctx.spec.logging.wandb is None:
        return CheckResult(name, "pass", "W&B logging is off")
    import importlib.util

    if importlib.util.find_spec("wandb") is None:
        return CheckResult(
            name,
            "fail",
            "logging.wandb is set but wandb is not installed",
            fix="pip install 'turbo-dllm[wandb]', or remove logging.wandb",
        )
    return CheckResult(name, "pass", f"W&B project {ctx.spec.logging.wandb.project!r}")
