"""Plain-text summaries of plans and manifests for `dllm launch --dry-run` and `dllm run show`."""

from __future__ import annotations

import shlex

from turbo_dllm.jobs.manifest import RunManifest
from turbo_dllm.jobs.plan import JobPlan

__all__ = ["describe_manifest", "describe_plan", "describe_topology"]

MAX_RANKS_SHOWN = 16


def describe_plan(plan: JobPlan) -> list[str]:
    sizes = ", ".join(map(str, plan.world_sizes))
    comm = f", {plan.dist_backend}" if plan.dist_backend else ""
    lines = [
        f"backend      {plan.backend}",
        f"run dir      {plan.run_dir}",
        f"processes    {plan.nnodes} node(s) x {plan.nproc_per_node} per node = {sizes} "
        f"({plan.device}{comm})",
        "mesh         "
        + " x ".join(f"{a.name}={a.degree}" for a in plan.mesh)
        + (f"  (elastic axis: {plan.elastic_axis})" if plan.elastic_axis else ""),
        *([f"topology     {describe_topology(plan.layout)['text']}"] if plan.layout else []),
        f"rendezvous   {_rendezvous(plan)}",
        f"restarts     {plan.max_restarts}",
    ]
    if plan.node_rank is not None:
        lines.append(f"node rank    {plan.node_rank}")
    lines += [f"env          {k}={v}" for k, v in sorted(plan.env.items())]
    lines.append(f"worker       {shlex.join(plan.worker)}")
    for command in plan.commands:
        lines.append(f"command      [{command.where}]")
        lines.append(f"             {_command_line(plan, command.argv)}")
    if plan.slurm:
        job = plan.slurm
        lines.append(
            f"slurm        {job.script}: nodes={job.nodes} gpus-per-node={job.gpus_per_node} "
            f"cpus-per-task={job.cpus_per_task}"
        )
    if plan.ranks:
        # In the mesh's order: a manifest stores each rank's coords with sorted keys, so
        # `dllm run show` listed them alphabetically, unlike the dry run of the same plan.
        axes = [axis.name for axis in plan.mesh]
        for role in plan.ranks[:MAX_RANKS_SHOWN]:
            names = sorted(role.coords, key=lambda k: axes.index(k) if k in axes else len(axes))
            coords = " ".join(f"{k}{role.coords[k]}" for k in names)
            lines.append(
                f"rank {role.rank:<7} node {role.node_rank} local {role.local_rank}  {coords}"
            )
        if len(plan.ranks) > MAX_RANKS_SHOWN:
            lines.append(f"rank ...     ({len(plan.ranks) - MAX_RANKS_SHOWN} more in the plan)")
    lines += [f"note         {note}" for note in plan.notes]
    return lines


_DEGREES = ("dp", "fsdp", "tp", "sp", "cp", "bp", "ep")  # as the RunSpec's topology names them


def describe_topology(layout: dict) -> dict:
    """A plan's parallel layout (`JobPlan.layout`) as people read it: every degree that is not
    1 (sp when on), and how the context is split, by the names of docs/parallelism.md: "csbp"
    (bp > 1), "cp" (the CP baseline: cp > 1, bp 1) or "none". The mesh line alone read the same
    for CSBP at cp=2, bp=2 and the CP baseline at cp=2 (bp is no mesh axis)."""
    from turbo_dllm.config.topology import ParallelLayout

    shape = ParallelLayout.from_dict(layout)
    values = {name: getattr(shape, name) for name in _DEGREES}
    degrees = {  # sp is a switch: True is no degree (and True == 1)
        name: value
        for name, value in values.items()
        if (value is True) or (not isinstance(value, bool) and value != 1)
    }
    words = [name if value is True else f"{name}={value}" for name, value in degrees.items()]
    text = " x ".join(words) if words else "one process (every degree 1)"
    if shape.mode == "csbp":
        clean = (
            "every rank recomputes its clean prefix"
            if shape.cp == 1
            else f"the clean stream zigzag-sharded over cp={shape.cp}"
            + (f", replicated over {shape.clean_replica} groups" if shape.clean_replica > 1 else "")
        )
        text += f"; context: CSBP (noisy blocks over bp={shape.bp} ranks, {clean})"
    elif shape.mode == "cp":
        text += f"; context: CP baseline (both streams zigzag-sharded over cp={shape.cp}, bp=1)"
    return {"degrees": degrees, "context": shape.mode, "text": text}


def describe_manifest(manifest: RunManifest) -> list[str]:
    code = manifest.code
    commit = code.git_commit[:12] if code.git_commit else "not a git checkout"
    dirty = " + uncommitted changes" if code.dirty else ""
    bundle = manifest.bundle
    data = manifest.data
    name = _field(manifest, "launch", "name")
    lines = [
        f"run          {manifest.run_id}" + (f" ({name})" if name != "?" else ""),
        f"created      {manifest.created_at}",
        f"spec         sha256 {manifest.spec_sha256[:16]}  {_field(manifest, 'model', 'family')} / "
        f"{_field(manifest, 'objective', 'name')}, {_field(manifest, 'training', 'steps')} steps",
        f"code         turbo-dllm {code.package_version} @ {commit}{dirty}",
        f"packages     {len(manifest.packages)} installed"
        + (f", torch {manifest.packages['torch']}" if "torch" in manifest.packages else ""),
        "bundle       "
        + (f"{bundle.bundle_id} ({bundle.sha256[:12]})" if bundle else "none active"),
        "data         "
        + (f"{data.artifact} (fingerprint {data.fingerprint[:16]})" if data else "synthetic"),
        "seeds        " + ", ".join(f"{k}={v}" for k, v in manifest.seeds.items()),
    ]
    if manifest.replay_of:
        ref = manifest.replay_of
        lines.append(f"replay of    {ref.run_id} ({len(ref.drift)} drifted input(s))")
        lines += [f"  drift      {item}" for item in ref.drift]
    return lines


def _field(manifest: RunManifest, section: str, key: str) -> str:
    """A recorded spec field as text, "?" where the spec lacks it (another version's)."""
    value = manifest.recorded(section, key)
    return "?" if value is None or value == "" else str(value)


def _command_line(plan: JobPlan, argv: list[str]) -> str:
    """A command as bash reads it; the srun step's `$DLLM_HEAD_NODE`-style words are the batch
    script's variables, so they are shown as the script expands them, not single-quoted."""
    if plan.backend == "slurm":
        from turbo_dllm.jobs.backends.slurm import shell_line

        return shell_line(argv)
    return shlex.join(argv)


def _rendezvous(plan: JobPlan) -> str:
    rdzv = plan.rendezvous
    if rdzv.kind == "none":
        return "none (single process)"
    if rdzv.kind == "standalone":
        return "standalone (this host, free port)"
    extra = f" id={rdzv.run_id}" if rdzv.run_id else ""
    return f"{rdzv.kind} {rdzv.endpoint}{extra}"
