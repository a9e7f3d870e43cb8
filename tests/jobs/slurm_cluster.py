"""A real one-node SLURM cluster on localhost for the tests: munged, slurmctld and slurmd
started from a generated slurm.conf in a temp dir, torn down (daemons killed) at the end.

The session fixture `slurm_cluster` skips only when the SLURM or MUNGE binaries are not
installed (`apt-get install slurm-wlm munge`, which `ci/slurm_setup.sh` does in CI); when they
are installed and the cluster does not come up, it fails with the daemons' logs. Everything the
daemons write (state, spool, logs, pid files, the MUNGE key and socket) stays in the temp dir,
and they listen on free ports, so parallel sessions on one machine get separate clusters.
"""

from __future__ import annotations

import os
import pwd
import random
import shutil
import signal
import socket
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path

import pytest

__all__ = ["SlurmCluster", "slurm_cluster"]

BINARIES = ("munged", "slurmctld", "slurmd", "sbatch", "squeue", "scancel", "scontrol", "sinfo")
# The daemons live in sbin, which is not on every user's PATH.
SEARCH_PATH = os.pathsep.join([os.environ.get("PATH", ""), "/usr/sbin", "/usr/local/sbin"])
START_TIMEOUT_S = 60


@dataclass
class SlurmCluster:
    root: Path
    conf: Path
    cpus: int  # the node's CPU count, as slurmd detects it
    binaries: dict[str, str]
    daemons: list[subprocess.Popen] = field(default_factory=list)

    @property
    def env(self) -> dict[str, str]:
        """What a SLURM client command needs to talk to this cluster."""
        return {"SLURM_CONF": str(self.conf)}

    def run(self, command: str, *args: str) -> subprocess.CompletedProcess:
        return subprocess.run(
            [self.binaries[command], *args],
            env={**os.environ, **self.env},
            capture_output=True,
            text=True,
            timeout=30,
        )

    def state(self, job_id: str) -> str | None:
        proc = self.run("squeue", "--states=all", "--noheader", "--format=%T", f"--jobs={job_id}")
        if proc.returncode != 0:
            return None
        return proc.stdout.strip() or None

    def wait_for(self, job_id: str, states: set[str], timeout: float = 120) -> str:
        """Poll until the job is in one of `states`; fails with its output if it never is."""
        deadline = time.monotonic() + timeout
        state = None
        while time.monotonic() < deadline:
            state = self.state(job_id)
            if state in states:
                return state
            time.sleep(0.5)
        pytest.fail(f"SLURM job {job_id} is {state}, not {sorted(states)}, after {timeout} s")

    def logs(self) -> str:
        parts = []
        for path in sorted((self.root / "log").glob("*")):
            text = path.read_text(errors="replace").splitlines()[-30:]
            parts.append(f"--- {path.name}\n" + "\n".join(text))
        return "\n".join(parts)


def _binaries() -> dict[str, str]:
    found = {name: shutil.which(name, path=SEARCH_PATH) for name in BINARIES}
    missing = [name for name, path in found.items() if path is None]
    if missing:
        pytest.skip(
            f"SLURM is not installed (no {', '.join(missing)}): "
            "apt-get install slurm-wlm munge (ci/slurm_setup.sh) to run the SLURM tests"
        )
    return {name: str(path) for name, path in found.items()}


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _node_line(slurmd: str) -> tuple[str, int]:
    """The node as slurmd sees it (`slurmd -C`: name, real CPU count and memory)."""
    out = subprocess.run([slurmd, "-C"], capture_output=True, text=True, check=True).stdout
    line = next(x for x in out.splitlines() if x.startswith("NodeName="))
    fields = dict(word.split("=", 1) for word in line.split())
    return line, int(fields["CPUs"])


def _write_conf(root: Path, node_line: str) -> Path:
    node = node_line.split()[0].split("=", 1)[1]
    conf = root / "slurm.conf"
    conf.write_text(
        "\n".join(
            [
                "ClusterName=dllmtest",
                # Jobs take their rendezvous port from their id: clusters of parallel test
                # sessions on one machine start their ids apart so their ports differ too.
                f"FirstJobId={random.randrange(1, 1_000_000)}",
                f"SlurmctldHost={node}(127.0.0.1)",
                f"SlurmctldPort={_free_port()}",
                f"SlurmdPort={_free_port()}",
                "SlurmUser=root",
                "SlurmdUser=root",
                "AuthType=auth/munge",
                "CredType=cred/munge",
                f"AuthInfo=socket={root / 'munge' / 'munge.socket'}",
                f"StateSaveLocation={root / 'state'}",
                f"SlurmdSpoolDir={root / 'spool'}",
                f"SlurmctldPidFile={root / 'slurmctld.pid'}",
                f"SlurmdPidFile={root / 'slurmd.pid'}",
                f"SlurmctldLogFile={root / 'log' / 'slurmctld.log'}",
                f"SlurmdLogFile={root / 'log' / 'slurmd.log'}",
                # No cgroups (the tests may run in a container): plain process tracking.
                "ProctrackType=proctrack/linuxproc",
                "TaskPlugin=task/none",
                "SelectType=select/cons_tres",
                "SelectTypeParameters=CR_Core",  # CPUs are allocated, memory is not
                "SchedulerType=sched/backfill",
                "MpiDefault=none",
                "ReturnToService=2",
                "AccountingStorageType=accounting_storage/none",
                "JobAcctGatherType=jobacct_gather/none",
                "JobCompType=jobcomp/none",
                "KillWait=5",
                "InactiveLimit=0",
                f"{node_line} NodeAddr=127.0.0.1 State=UNKNOWN",
                "PartitionName=debug Nodes=ALL Default=YES MaxTime=INFINITE State=UP",
                "",
            ]
        )
    )
    return conf


def _start(argv: list[str], log: Path, env: dict[str, str]) -> subprocess.Popen:
    with open(log, "ab") as out:
        return subprocess.Popen(
            argv, stdout=out, stderr=subprocess.STDOUT, env={**os.environ, **env}
        )


def _wait(what: str, ready, cluster: SlurmCluster) -> None:
    deadline = time.monotonic() + START_TIMEOUT_S
    while time.monotonic() < deadline:
        if ready():
            return
        dead = [p.args[0] for p in cluster.daemons if p.poll() is not None]
        if dead:
            break
        time.sleep(0.25)
    _stop(cluster)
    pytest.fail(
        f"SLURM is installed but the test cluster did not come up ({what}):\n{cluster.logs()}"
    )


def _stop(cluster: SlurmCluster) -> None:
    """Cancel what is left, then end the daemons this fixture started (by their pids)."""
    if all(p.poll() is None for p in cluster.daemons[:3]):
        cluster.run("scancel", "--user", pwd.getpwuid(os.getuid()).pw_name)
        deadline = time.monotonic() + 15
        while time.monotonic() < deadline:
            left = cluster.run("squeue", "--noheader", "--format=%i")
            if left.returncode != 0 or not left.stdout.strip():
                break
            time.sleep(0.5)
    for proc in reversed(cluster.daemons):
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
    for proc in reversed(cluster.daemons):
        try:
            proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


@pytest.fixture(scope="session")
def slurm_cluster(tmp_path_factory):
    binaries = _binaries()
    root = tmp_path_factory.mktemp("slurm")
    root.chmod(0o711)  # munged wants every folder above its socket searchable
    for sub in ("state", "spool", "log"):
        (root / sub).mkdir()
    munge_dir = root / "munge"
    munge_dir.mkdir(mode=0o711)
    key = munge_dir / "munge.key"
    key.write_bytes(os.urandom(1024))
    key.chmod(0o400)
    node_line, cpus = _node_line(binaries["slurmd"])
    conf = _write_conf(root, node_line)
    cluster = SlurmCluster(root=root, conf=conf, cpus=cpus, binaries=binaries)
    socket_path = munge_dir / "munge.socket"
    cluster.daemons.append(
        _start(
            [
                binaries["munged"],
                "--foreground",
                "--force",  # root, and a key that is not in /etc/munge
                f"--socket={socket_path}",
                f"--key-file={key}",
                f"--pid-file={munge_dir / 'munged.pid'}",
                f"--seed-file={munge_dir / 'munged.seed'}",
                f"--log-file={root / 'log' / 'munged.log'}",
            ],
            root / "log" / "munged.out",
            {},
        )
    )
    _wait("munged", socket_path.exists, cluster)
    for daemon in ("slurmctld", "slurmd"):
        argv = [binaries[daemon], "-D", "-f", str(conf)]
        cluster.daemons.append(_start(argv, root / "log" / f"{daemon}.out", cluster.env))

    def node_idle() -> bool:
        proc = cluster.run("sinfo", "--noheader", "--format=%T")
        return proc.returncode == 0 and proc.stdout.strip() == "idle"

    _wait("the node never became idle", node_idle, cluster)
    try:
        yield cluster
    finally:
        _stop(cluster)
