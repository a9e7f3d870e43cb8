"""Launch readiness: the real world size against the topology, GPUs against processes, busy
GPUs, and the rendezvous port.

`dllm launch` passes its compiled JobPlan in `ctx.extras["job_plan"]` (and the host view in
`ctx.extras["host_view"]`), so these checks judge the launch that is about to happen: 2 nodes x
8 processes, not one local process. Plain `dllm doctor` checks a single-node launch of
`--world-size` (default: the topology's product) processes.
"""

from __future__ import annotations

import os
import socket
from dataclasses import dataclass

from turbo_dllm.doctor import CheckResult, DoctorContext, register_check

__all__ = ["GpuProcess", "busy_gpus", "query_gpu_processes"]


def _plan(ctx: DoctorContext):
    return ctx.extras.get("job_plan")


def _host(ctx: DoctorContext):
    from turbo_dllm.doctor.host import host_view

    return host_view(ctx)


def _nproc_per_node(ctx: DoctorContext) -> int | None:
    plan = _plan(ctx)
    if plan is not None:
        return plan.nproc_per_node
    if ctx.world_size is not None:
        return ctx.world_size
    return ctx.spec.topology.world_size if ctx.spec is not None else None


@register_check(order=400, name="world size")
def topology_world_size(ctx: DoctorContext) -> CheckResult:
    name = "world size"
    if ctx.spec is None:
        return ctx.without_spec(name, "a launch")
    topo = ctx.spec.topology
    product = topo.layout.describe()
    plan = _plan(ctx)
    if plan is not None and plan.elastic_axis:
        sizes = ", ".join(map(str, plan.world_sizes))
        return CheckResult(
            name, "pass", f"elastic: topology.{plan.elastic_axis} follows the world size ({sizes})"
        )
    world = plan.world_size if plan is not None else ctx.world_size
    if world is None:
        return CheckResult(name, "pass", f"{product} (pass --world-size to check a launch)")
    if world != topo.world_size:
        from turbo_dllm.config.topology import world_size_fixes

        nproc, nnodes = (plan.nproc_per_node, plan.nnodes) if plan is not None else (world, 1)
        # Concrete values: it read `--set topology.dp=N` whatever the counts
        fixes = " or ".join(f"`{fix}`" for fix in world_size_fixes(topo, world, nproc, nnodes))
        return CheckResult(
            name,
            "fail",
            f"{product}, but the launch starts {world} processes",
            fix=f"change topology or the process count so they match, e.g. {fixes} (flags of "
            "`dllm launch`)",
        )
    return CheckResult(name, "pass", f"{product} = the launch's {world} processes")


@register_check(order=410, name="gpus")
def gpus_for_processes(ctx: DoctorContext) -> CheckResult:
    name = "gpus"
    plan = _plan(ctx)
    if plan is not None and plan.backend == "slurm":
        return CheckResult(
            name, "pass", f"SLURM allocates {plan.slurm.gpus_per_node} GPU(s) on each node"
        )
    nproc = _nproc_per_node(ctx)
    host = _host(ctx)
    gpus = len(host.gpus)
    if nproc is None:
        return CheckResult(name, "pass", f"{gpus} visible GPU(s)" if gpus else "no GPU: CPU runs")
    if gpus == 0:
        if nproc > host.cpu_count:
            return CheckResult(
                name,
                "warn",
                f"no GPU: {nproc} CPU processes on {host.cpu_count} core(s) will oversubscribe",
                fix=f"launch at most {host.cpu_count} process(es) here (`dllm launch "
                f"--nproc-per-node {host.cpu_count}` with a topology to match), or use a host "
                "with GPUs",
            )
        return CheckResult(name, "pass", f"no GPU: {nproc} CPU process(es) per node (gloo)")
    if nproc > gpus:
        return CheckResult(
            name,
            "fail",
            f"{nproc} processes per node but {gpus} visible GPU(s) ({', '.join(host.gpus)})",
            fix=f"launch {gpus} process(es) per node (`dllm launch --nproc-per-node {gpus}` "
            "with a topology to match), add nodes (--nnodes), or check CUDA_VISIBLE_DEVICES",
        )
    return CheckResult(name, "pass", f"{nproc} process(es) on {gpus} visible GPU(s)")


@dataclass(frozen=True)
class GpuProcess:
    """A user of a GPU: a process nvidia-smi names, or (pid None) memory in use by processes it
    cannot see, e.g. from another container."""

    gpu_index: int
    pid: int | None
    used_mib: float

    def __str__(self) -> str:
        who = f"pid {self.pid}" if self.pid is not None else "processes nvidia-smi cannot name"
        return f"GPU {self.gpu_index}: {who} use {self.used_mib / 1024:.1f} GiB"


# Memory in use on a GPU with no visible process above this means someone else is on it.
UNSEEN_USE_MIB = 2048.0


@register_check(order=420, name="busy gpus")
def free_gpus(ctx: DoctorContext) -> CheckResult:
    name = "busy gpus"
    plan = _plan(ctx)
    if plan is not None and plan.backend == "slurm":
        return CheckResult(name, "pass", "SLURM gives the job its own GPUs")
    host = _host(ctx)
    if not host.gpus:
        return CheckResult(name, "pass", "no GPU on this host")
    nproc = _nproc_per_node(ctx) or len(host.gpus)
    processes = query_gpu_processes()
    if processes is None:
        return CheckResult(
            name,
            "warn",
            "cannot tell whether the GPUs are free (nvidia-smi not found or failed)",
            fix="install the NVIDIA driver utilities, or check by hand with nvidia-smi",
        )
    busy = busy_gpus(processes, _visible_indices(), nproc)
    if busy:
        detail = "; ".join(str(p) for p in busy)
        return CheckResult(
            name,
            "fail",
            f"GPUs this launch needs are in use: {detail}",
            fix=_free_gpus_fix(processes, nproc),
        )
    return CheckResult(name, "pass", f"the {nproc} GPU(s) this launch uses are free")


@register_check(order=430, name="rendezvous")
def rendezvous_port(ctx: DoctorContext) -> CheckResult:
    name = "rendezvous"
    plan = _plan(ctx)
    if plan is None or plan.rendezvous.kind in ("none", "standalone"):
        return CheckResult(name, "pass", "single host: torchrun picks a free port")
    rdzv = plan.rendezvous
    if plan.backend == "slurm":
        return CheckResult(name, "pass", f"c10d on the allocation's first node ({rdzv.endpoint})")
    host, _, port_text = (rdzv.endpoint or "").rpartition(":")
    hosting = (rdzv.kind == "static" and plan.node_rank == 0) or _is_local(host)
    if not hosting:
        return CheckResult(name, "pass", f"{rdzv.kind} rendezvous at {rdzv.endpoint} (remote)")
    port = int(port_text)
    error = _bind_error(port)
    if error:
        return CheckResult(
            name,
            "fail",
            f"this node hosts the rendezvous at {rdzv.endpoint}, but port {port} is taken: {error}",
            fix="choose a free port with --master-port (or --rdzv-endpoint HOST:PORT)",
        )
    return CheckResult(name, "pass", f"{rdzv.kind} rendezvous at {rdzv.endpoint}: port is free")


def _free_gpus_fix(processes: list[GpuProcess], nproc: int) -> str:
    """Stop the users, or the CUDA_VISIBLE_DEVICES that picks free GPUs, by index (it read
    "pick free GPUs with CUDA_VISIBLE_DEVICES", naming none, where nvidia-smi had said which)."""
    rows = _smi("--query-gpu=index") or []
    indices = sorted({int(row[0]) for row in rows if row and row[0].isdigit()})
    used = {p.gpu_index for p in processes if p.pid != os.getpid()}
    free = [index for index in indices if index not in used]
    if len(free) >= nproc:
        chosen = ",".join(map(str, free[:nproc]))
        return f"stop those processes, or use free GPUs: export CUDA_VISIBLE_DEVICES={chosen}"
    if free:
        return (
            f"stop those processes; only {len(free)} GPU(s) are free for {nproc} process(es): "
            f"to launch on those, export CUDA_VISIBLE_DEVICES={','.join(map(str, free))} and "
            f"`dllm launch --nproc-per-node {len(free)}` with a topology to match"
        )
    return "stop those processes: no GPU here is free"


# --- probes -----------------------------------------------------------------------------------


def query_gpu_processes() -> list[GpuProcess] | None:
    """Who uses each GPU (by nvidia-smi index), or None when nvidia-smi can't say."""
    gpus = _smi("--query-gpu=index,uuid,memory.used")
    apps = _smi("--query-compute-apps=gpu_uuid,pid,used_memory") if gpus is not None else None
    if gpus is None or apps is None:
        return None
    try:
        index_of = {row[1]: int(row[0]) for row in gpus if len(row) >= 2}
        found = []
        for row in apps:
            if len(row) < 3 or row[0] not in index_of:
                continue
            found.append(
                GpuProcess(gpu_index=index_of[row[0]], pid=int(row[1]), used_mib=_mib(row[2]))
            )
        named = {p.gpu_index for p in found}
        for row in gpus:
            if len(row) >= 3 and int(row[0]) not in named and _mib(row[2]) > UNSEEN_USE_MIB:
                found.append(GpuProcess(gpu_index=int(row[0]), pid=None, used_mib=_mib(row[2])))
    except ValueError:  # an index or pid that is not a number: output it cannot read
        return None
    return found


def busy_gpus(
    processes: list[GpuProcess], visible: list[int] | None, nproc: int
) -> list[GpuProcess]:
    """The users (other than us) of the GPUs the launch will use: the first `nproc` visible."""
    used = visible[:nproc] if visible is not None else list(range(nproc))
    return [p for p in processes if p.gpu_index in used and p.pid != os.getpid()]


def _mib(text: str) -> float:
    try:
        return float(text)
    except ValueError:  # "[N/A]" on some MIG setups
        return 0.0


def _smi(query: str) -> list[list[str]] | None:
    """nvidia-smi's CSV rows, or None where it is missing, fails or hangs (host.probes: a
    timeout that ends what it started, and a hung nvidia-smi is not asked twice)."""
    from turbo_dllm.host.probes import run_nvidia_smi

    lines, _ = run_nvidia_smi([query, "--format=csv,noheader,nounits"])
    if lines is None:
        return None
    return [[c.strip() for c in line.split(",")] for line in lines]


def _visible_indices() -> list[int] | None:
    """CUDA_VISIBLE_DEVICES as physical indices (None: all GPUs, in order)."""
    value = os.environ.get("CUDA_VISIBLE_DEVICES")
    if value is None:
        return None
    indices = []
    for item in value.split(","):
        item = item.strip()
        if not item.isdigit():
            return None  # UUIDs or MIG names: assume the visible set is what nvidia-smi lists
        indices.append(int(item))
    return indices


def _is_local(host: str) -> bool:
    if host in ("localhost", "127.0.0.1", "::1", "0.0.0.0"):
        return True
    return host in (socket.gethostname(), socket.getfqdn())


def _bind_error(port: int) -> str | None:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind(("", port))
        except OSError as error:
            return error.strerror or str(error)
    return None
