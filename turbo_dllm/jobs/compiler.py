"""Compile a RunSpec and launch options into a JobPlan.

The compiler decides everything a launch needs before anything runs: the backend, the process
layout and its world size (checked against the topology's product, so a mismatch fails here and
not in rank 0's log), the device mesh and each rank's coordinates, how processes meet, the
worker environment and the exact command lines. It is a pure function of its inputs (spec,
options, host view, run dir), which is what makes a plan printable by `--dry-run` and
replayable from a manifest.
"""

from __future__ import annotations

import sys
from pathlib import Path

from turbo_dllm.config.runspec import RunSpec
from turbo_dllm.config.topology import MESH_DIMS, ParallelLayout, world_size_fixes
from turbo_dllm.config.validate import check
from turbo_dllm.errors import DllmError
from turbo_dllm.host.view import HostView
from turbo_dllm.jobs.backends import slurm as slurm_backend
from turbo_dllm.jobs.backends import torchrun as torchrun_backend
from turbo_dllm.jobs.options import LaunchOptions
from turbo_dllm.jobs.plan import Command, JobPlan, MeshAxis, RankRole, Rendezvous

__all__ = ["DEFAULT_PORT", "WORKER_MODULE", "compile_plan", "worker_command"]

DEFAULT_PORT = 29500
HASH_SEEDS = 1 << 32  # PYTHONHASHSEED's range: 0 .. 2**32 - 1
WORKER_MODULE = "turbo_dllm.jobs.worker"  # reads the run's manifest: spec, plan and layout


def compile_plan(
    spec: RunSpec,
    options: LaunchOptions,
    host: HostView,
    *,
    run_dir: Path,
    cwd: Path | None = None,
    python: str | None = None,
    source: str = "RunSpec",
) -> JobPlan:
    """`source` names the spec in its problems (the config file, as `dllm config validate`
    names it; a replay's manifest)."""
    python = python or sys.executable
    cwd = (cwd or Path.cwd()).resolve()
    run_dir = Path(run_dir).resolve()
    nnodes = options.nnodes
    if options.backend == "slurm":
        nproc = _nproc_per_node(spec, options, options.slurm.gpus_per_node or len(host.gpus))
        gpus_per_node = _slurm_gpus_per_node(options, host, nproc)
    else:
        gpus_per_node = len(host.gpus)
        nproc = _nproc_per_node(spec, options, gpus_per_node)
    device = "cuda" if gpus_per_node else "cpu"

    elastic_axis = None
    if nnodes.elastic:
        elastic_axis, world_sizes = _elastic_world_sizes(
            spec, nproc, nnodes.min, nnodes.max, source
        )
    else:
        world_sizes = [nproc * nnodes.min]
        _check_world_size(spec, world_sizes[0], nproc, nnodes.min, source)
    backend = _choose_backend(options, world_sizes)
    _check_backend_options(options, backend)

    if backend == "local" and world_sizes != [1]:
        # An elastic job's sizes: "this job has 1" (of 1:2 nodes) read as no conflict at all.
        count = (
            str(world_sizes[0])
            if len(world_sizes) == 1
            else f"{world_sizes[0]} to {world_sizes[-1]} (an elastic {nnodes}-node job)"
        )
        raise DllmError(
            f"the local backend runs one process, but this job has {count}",
            hint="use --backend torchrun (or leave --backend at auto)",
        )
    if backend == "local" and options.max_restarts:
        raise DllmError(
            "--max-restarts needs a supervisor that restarts workers",
            hint="use --backend torchrun (or leave --backend at auto)",
        )

    layout = spec.topology.layout
    first = layout.resized(elastic_axis, world_sizes[0]) if elastic_axis else layout
    mesh = [MeshAxis(name=n, degree=d) for n, d in zip(MESH_DIMS, first.mesh_shape, strict=True)]
    ranks = None if nnodes.elastic else _rank_roles(layout, nproc)
    rendezvous = _rendezvous(options, backend, run_dir.name)
    node_rank = _node_rank(options, backend, rendezvous)
    dist_backend = None if world_sizes == [1] else ("nccl" if device == "cuda" else "gloo")
    cpus = _cpus_per_node(options, backend, host, nproc)
    env = _worker_env(spec, backend, run_dir, cpus, nproc, options)
    worker = worker_command(python, run_dir)

    notes: list[str] = []
    if options.max_restarts and options.master_addr and not nnodes.elastic:
        notes.append(
            "restarts: the master address serves a c10d rendezvous (node ranks assigned when "
            "nodes join), since a static rendezvous cannot restart workers"
        )
    if elastic_axis:
        notes.append(
            f"elastic: topology.{elastic_axis} follows the node count "
            f"({', '.join(str(w) for w in world_sizes)} processes); the global batch scales with it"
        )
    if layout.tp > 1 and nnodes.max > 1 and nproc % layout.tp:
        # tp groups are tp neighbouring ranks, a node nproc of them: a tp that does not divide
        # nproc puts a group on two nodes, whose all-reduces (every layer) cross the network
        notes.append(
            f"tp: a tensor-parallel group of tp={layout.tp} spans nodes ({nproc} process(es) "
            "per node); tp all-reduces activations in every layer, so across nodes each step is "
            "very slow. Keep tp inside a node (tp <= --nproc-per-node and dividing it"
            f"{_tp_inside_a_node(layout.tp, nproc, world_sizes[0])}), and split the work over "
            "nodes by dp, fsdp or cp instead"
        )
    if device == "cpu" and world_sizes[0] > 1 and nproc > host.cpu_count and backend != "slurm":
        notes.append(f"{nproc} processes on {host.cpu_count} CPU cores will oversubscribe them")
    if backend == "slurm" and not gpus_per_node:
        notes.append(
            "slurm: no GPU on this host, so the job asks for CPUs only (gloo); "
            "pass --gpus-per-node G to run on GPU nodes"
        )

    plan_fields = dict(
        run_id=run_dir.name,
        run_dir=str(run_dir),
        cwd=str(cwd),
        device=device,
        dist_backend=dist_backend,
        nnodes_min=nnodes.min,
        nnodes_max=nnodes.max,
        nproc_per_node=nproc,
        node_rank=node_rank,
        world_sizes=world_sizes,
        elastic_axis=elastic_axis,
        layout=layout.to_dict(),
        mesh=mesh,
        ranks=ranks,
        rendezvous=rendezvous,
        max_restarts=options.max_restarts,
        env=env,
        worker=worker,
        notes=notes,
    )
    if backend == "local":
        commands = [Command(where="this process (in-process)", argv=worker)]
        return JobPlan(backend="local", commands=commands, **plan_fields)
    if backend == "torchrun":
        commands = torchrun_backend.node_commands(
            python=python,
            worker=worker,
            nnodes=str(nnodes),
            nproc_per_node=nproc,
            rendezvous=rendezvous,
            node_rank=node_rank,
            max_restarts=options.max_restarts,
            log_dir=str(run_dir / TORCHRUN_LOG_DIR),
        )
        return JobPlan(backend="torchrun", commands=commands, **plan_fields)
    job = slurm_backend.slurm_job(run_dir, nnodes, gpus_per_node, cpus, options.slurm)
    commands = [
        Command(where="submit host", argv=job.submit),
        Command(
            where="every node (srun)",
            argv=slurm_backend.srun_torchrun_argv(
                python,
                worker,
                str(nnodes),
                nproc,
                options.max_restarts,
                rendezvous,
                cpus,
                str(run_dir / TORCHRUN_LOG_DIR),
            ),
        ),
    ]
    return JobPlan(backend="slurm", commands=commands, slurm=job, **plan_fields)


# torchrun's own logs and the workers' error files (it would otherwise use a temp folder).
TORCHRUN_LOG_DIR = "torchelastic"


def worker_command(python: str, run_dir: Path) -> list[str]:
    """The command every worker runs: it reads the spec and its layout from the run manifest."""
    return [python, "-m", WORKER_MODULE, "--manifest", str(run_dir / "manifest.json")]


# --- layout ------------------------------------------------------------------------------------


def _choose_backend(options: LaunchOptions, world_sizes: list[int]) -> str:
    """auto: one process in-process; anything more (or restarts, or a rendezvous) via torchrun."""
    if options.backend != "auto":
        return options.backend
    distributed = options.max_restarts or options.master_addr or options.rdzv_endpoint
    return "local" if world_sizes == [1] and not distributed else "torchrun"


def _check_backend_options(options: LaunchOptions, backend: str) -> None:
    """Refuse the flags the chosen backend has no use for: they were dropped without a word
    (`--partition` on a torchrun launch, `--master-addr` on a SLURM job)."""
    slurm = options.slurm
    if backend != "slurm":
        given = [
            flag
            for flag, value in (
                ("--gpus-per-node", slurm.gpus_per_node),
                ("--cpus-per-task", slurm.cpus_per_task),
                ("--partition", slurm.partition),
                ("--account", slurm.account),
                ("--time", slurm.time),
                ("--sbatch", slurm.extra or None),
            )
            if value is not None
        ]
        if given:
            raise DllmError(
                f"this launch runs {'in this process' if backend == 'local' else 'under torchrun'}"
                f" (backend {backend}), which has no use for {', '.join(given)}: SLURM options "
                "apply to a SLURM job only",
                hint="add --backend slurm to write (--submit: submit) a SLURM job, or drop them",
            )
    if backend not in ("local", "slurm"):
        return  # torchrun meets through these
    meet = [
        ("--master-addr", options.master_addr),
        ("--rdzv-endpoint", options.rdzv_endpoint),
        ("--rdzv-id", options.rdzv_id),
    ]
    if backend == "local":
        meet.append(("--master-port", options.master_port))
    elif backend == "slurm":
        meet.append(("--node-rank", options.node_rank))
    given = [flag for flag, value in meet if value is not None]
    if given and backend == "local":
        raise DllmError(
            "the local backend runs one process in this one, which has no use for "
            f"{', '.join(given)} (where processes meet)",
            # Auto chose local (one process; --master-port and --rdzv-id alone do not make it
            # torchrun): "or leave --backend at auto" was no way on, it is at auto.
            hint="use --backend torchrun"
            + (" (or leave --backend at auto)" if options.backend != "auto" else "")
            + ", or drop them",
        )
    if given:
        raise DllmError(
            f"a SLURM job has no use for {', '.join(given)}: its nodes meet on the "
            "allocation's first host, with the job id as the rendezvous id, and SLURM numbers "
            "the nodes",
            hint="drop them (--master-port P pins the rendezvous port)",
        )


def _slurm_gpus_per_node(options: LaunchOptions, host: HostView, nproc: int) -> int:
    """The job runs on the allocated nodes, not here. A submit host with GPUs stands for GPU
    nodes (one GPU per process); one without asks for none: `--gpus-per-node` on a CPU-only
    cluster is an invalid gres request that sbatch refuses."""
    if options.slurm.gpus_per_node is not None:
        return options.slurm.gpus_per_node
    return nproc if host.gpus else 0


def _cpus_per_node(options: LaunchOptions, backend: str, host: HostView, nproc: int) -> int:
    """CPUs for one node's processes: this host's cores, or what the SLURM task asks for
    (--cpus-per-task, by default one per process: SLURM otherwise gives the task one CPU)."""
    if backend == "slurm":
        return options.slurm.cpus_per_task or nproc
    return host.cpu_count


def _nproc_per_node(spec: RunSpec, options: LaunchOptions, gpus_per_node: int) -> int:
    if options.nproc_per_node is not None:
        return options.nproc_per_node
    nodes = options.nnodes
    if nodes.elastic:
        if gpus_per_node:
            return gpus_per_node
        raise DllmError(
            f"an elastic launch ({nodes}) on a host without GPUs needs --nproc-per-node",
            hint="give the number of processes every node starts, e.g. --nproc-per-node 8",
        )
    world = spec.topology.world_size
    if world % nodes.min:
        raise DllmError(
            f"the topology's {world} processes do not split evenly over {nodes.min} nodes",
            hint="set --nproc-per-node, or change topology so its product is a multiple "
            "of the node count",
        )
    return world // nodes.min


def _tp_inside_a_node(tp: int, nproc: int, world: int) -> str:
    """The same processes laid out with whole tp groups on each node (", e.g. --nnodes 1
    --nproc-per-node 2"): the fewest processes per node above `nproc` that hold whole groups
    and divide the world; "" where none does."""
    for per_node in range((nproc // tp + 1) * tp, world + 1, tp):
        if world % per_node == 0:
            return f", e.g. --nnodes {world // per_node} --nproc-per-node {per_node}"
    return ""


def _check_world_size(spec: RunSpec, world: int, nproc: int, nnodes: int, source: str) -> None:
    try:
        check(spec, world_size=world, source=source)
    except DllmError as error:
        topo = spec.topology
        rest = topo.fsdp * topo.context_degree * topo.tp
        why = (
            f" ({world} is not a multiple of fsdp*max(cp,bp)*tp = {rest}: no dp fits it)"
            if world % rest
            else ""
        )
        raise DllmError(
            f"{error.message}\n  launch: {nnodes} node(s) x {nproc} process(es) = {world}",
            hint=f"make topology dp*fsdp*max(cp,bp)*tp ({topo.world_size}) equal the process "
            f"count ({world}): e.g. {' or '.join(world_size_fixes(topo, world, nproc, nnodes))}"
            f"{why}",
        ) from None


def _elastic_world_sizes(
    spec: RunSpec, nproc: int, low: int, high: int, source: str = "RunSpec"
) -> tuple[str, list[int]]:
    """The data-parallel axis absorbs the node count; every other degree stays fixed."""
    topo = spec.topology
    axis = "fsdp" if topo.fsdp > 1 else "dp"
    fixed = topo.world_size // getattr(topo, axis)
    sizes = [n * nproc for n in range(low, high + 1)]
    bad = [w for w in sizes if w % fixed]
    if bad:
        raise DllmError(
            f"elastic launch: the fixed part of the topology (max(cp,bp)*tp"
            f"{'*dp' if axis == 'fsdp' else '*fsdp'} = {fixed}) does not divide the world "
            f"size(s) {', '.join(map(str, bad))} ({low}:{high} nodes x {nproc} processes)",
            hint=f"make --nproc-per-node a multiple of {fixed}",
        )
    check(spec, world_size=None, source=source)
    return axis, sizes


def _rank_roles(layout: ParallelLayout, nproc: int) -> list[RankRole]:
    return [
        RankRole(
            rank=rank,
            node_rank=rank // nproc,
            local_rank=rank % nproc,
            coords=layout.coordinates(rank),
        )
        for rank in range(layout.world_size)
    ]


def _rendezvous(options: LaunchOptions, backend: str, run_id: str) -> Rendezvous:
    """How processes meet. Restarts need a rendezvous that gives every attempt a fresh store:
    torchrun's static rendezvous keeps one store across attempts, so restarted workers read
    the dead workers' addresses (gloo: "connectFullMesh ... Connection refused", or a hang);
    with restarts, a master address therefore becomes a c10d endpoint."""
    nodes = options.nnodes
    rdzv_id = options.rdzv_id or run_id
    conf = options.rdzv_conf
    if conf and backend == "local":
        raise DllmError(
            "--rdzv-conf applies to torchrun's c10d rendezvous, not one process",
            hint="drop --rdzv-conf, or launch under torchrun (--backend torchrun)",
        )
    if backend == "local":
        return Rendezvous(kind="none")
    if backend == "slurm":
        endpoint = slurm_backend.rendezvous_endpoint(options.master_port)
        return Rendezvous(kind="c10d", endpoint=endpoint, run_id="$SLURM_JOB_ID", conf=conf)
    if options.rdzv_endpoint:
        return Rendezvous(kind="c10d", endpoint=options.rdzv_endpoint, run_id=rdzv_id, conf=conf)
    if options.master_addr or options.master_port:
        # Only a --master-port without an address: an explicit --master-addr 127.0.0.1 (nodes
        # on one host, as --rdzv-endpoint 127.0.0.1:P is taken) was refused as "needs
        # --master-addr".
        host = options.master_addr or "127.0.0.1"
        if options.master_addr is None and nodes.max > 1:
            raise DllmError(
                "a multi-node launch needs --master-addr (the host of node 0)",
                hint="pass --master-addr HOST reachable from every node",
            )
        endpoint = f"{host}:{options.master_port or DEFAULT_PORT}"
        if nodes.elastic or options.max_restarts or conf:
            return Rendezvous(kind="c10d", endpoint=endpoint, run_id=rdzv_id, conf=conf)
        _refuse_rdzv_id(options, "static")
        return Rendezvous(kind="static", endpoint=endpoint)
    if nodes.max > 1:
        raise DllmError(
            f"a {nodes}-node launch needs a meeting point",
            hint="static: --master-addr HOST [--master-port PORT] --node-rank R on every node; "
            "elastic: --rdzv-endpoint HOST:PORT on every node; or --backend slurm",
        )
    if conf:
        raise DllmError("--rdzv-conf needs a c10d rendezvous", hint="add --rdzv-endpoint HOST:PORT")
    _refuse_rdzv_id(options, "standalone")
    return Rendezvous(kind="standalone")


def _refuse_rdzv_id(options: LaunchOptions, kind: str) -> None:
    """`--rdzv-id` names a c10d rendezvous; torchrun's standalone and static ones have no id,
    and it was dropped from the plan without a word."""
    if options.rdzv_id is not None:
        raise DllmError(
            f"--rdzv-id names a c10d rendezvous, and this launch meets through a {kind} one, "
            "which has no id",
            hint="drop --rdzv-id, or meet through c10d: --rdzv-endpoint HOST:PORT",
        )


def _node_rank(options: LaunchOptions, backend: str, rendezvous: Rendezvous) -> int | None:
    """This node's rank where the launch fixes it; None where rendezvous assigns it."""
    if backend == "slurm":
        return None
    if rendezvous.kind == "c10d":
        if options.node_rank is not None:
            # torchrun reads --node-rank for a static rendezvous only; it was dropped here
            raise DllmError(
                "--node-rank has no effect on a c10d rendezvous: it numbers the nodes as they join",
                hint="drop --node-rank and run the same command on every node",
            )
        return None
    if rendezvous.kind == "static" and options.nnodes.max > 1:
        if options.node_rank is None:
            raise DllmError(
                "a static multi-node launch needs --node-rank on every node",
                hint="run the same command on each node with --node-rank 0, 1, ...",
            )
        return options.node_rank
    return 0


def _worker_env(
    spec: RunSpec,
    backend: str,
    run_dir: Path,
    cpus: int,
    nproc: int,
    options: LaunchOptions,
) -> dict[str, str]:
    env: dict[str, str] = {}
    threads = str(max(1, cpus // nproc)) if cpus else None
    if backend == "local":
        # In-process: the interpreter (its hash seed) already exists, so no PYTHONHASHSEED,
        # which would only pretend to apply. The thread count does apply (the local backend
        # sets torch's intra-op threads from it), and is recorded as torchrun's workers' is: it
        # changes how CPU ops split their sums, and a replay runs with the recorded one.
        return {"OMP_NUM_THREADS": threads} if threads else env
    # Python takes a hash seed up to 2**32 - 1 and stops with a fatal error past it (every
    # worker, at start) where launch.seed may go to 2**63 - 1: the seed's low 32 bits.
    env["PYTHONHASHSEED"] = str(spec.launch.seed % HASH_SEEDS)
    if options.max_restarts:
        # torchrun shares one TCPStore across restart attempts by default, and the restarted
        # workers then read the dead ones' gloo/NCCL addresses from it. Opting out gives each
        # attempt a fresh store (torch.distributed.elastic.rendezvous.dynamic_rendezvous).
        env["TORCH_DISABLE_SHARE_RDZV_TCP_STORE"] = "1"
    if threads:
        env["OMP_NUM_THREADS"] = threads
    return env
