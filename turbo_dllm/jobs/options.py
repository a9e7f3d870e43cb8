"""Launch options: what the command line adds to a RunSpec to make a job.

The RunSpec says *what* to train (including the parallel topology); the launch options say
*where*: how many nodes and processes, how they meet (rendezvous), how often they may restart
and which backend starts them. `NodeRange` is the parsed value of `--nnodes N|MIN:MAX`.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Literal

from turbo_dllm.errors import DllmError

__all__ = ["BACKENDS", "LaunchOptions", "NodeRange", "SlurmOptions"]

Backend = Literal["auto", "local", "torchrun", "slurm"]
BACKENDS: tuple[str, ...] = ("auto", "local", "torchrun", "slurm")

_NODES = re.compile(r"^\s*(\d+)\s*(?::\s*(\d+)\s*)?$")


@dataclass(frozen=True)
class NodeRange:
    """`--nnodes`: a fixed count (`2`) or an elastic range (`1:4`)."""

    min: int = 1
    max: int = 1

    def __post_init__(self) -> None:
        if self.min < 1 or self.max < self.min:
            raise DllmError(
                f"invalid node range {self.min}:{self.max}",
                hint="--nnodes takes N or MIN:MAX with 1 <= MIN <= MAX",
            )

    @classmethod
    def parse(cls, text: str | int) -> NodeRange:
        match = _NODES.match(str(text))
        if not match:
            raise DllmError(
                f"invalid --nnodes {str(text)!r}", hint="write a count (2) or a range (1:4)"
            )
        low = int(match.group(1))
        high = int(match.group(2)) if match.group(2) else low
        return cls(low, high)

    @property
    def elastic(self) -> bool:
        return self.min != self.max

    def __str__(self) -> str:
        return str(self.min) if not self.elastic else f"{self.min}:{self.max}"


@dataclass(frozen=True)
class SlurmOptions:
    """Extra `#SBATCH` lines; everything else is derived from the plan."""

    gpus_per_node: int | None = None  # default: --nproc-per-node (one GPU per process)
    partition: str | None = None
    account: str | None = None
    time: str | None = None
    cpus_per_task: int | None = None
    extra: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        # Checked here: a 0 CPU count read as "unset" fell back to the default, and a negative
        # GPU count went into the script (and made the plan a CUDA one).
        if self.gpus_per_node is not None and self.gpus_per_node < 0:
            raise DllmError(
                f"--gpus-per-node must be >= 0 (got {self.gpus_per_node})",
                hint="0 asks for no GPUs (a CPU job)",
            )
        if self.cpus_per_task is not None and self.cpus_per_task < 1:
            raise DllmError(
                f"--cpus-per-task must be >= 1 (got {self.cpus_per_task})",
                hint="give each task 1 or more CPUs, or leave --cpus-per-task out",
            )
        # Each becomes one `#SBATCH` line: a line break would end it and start a shell line
        # (and a value with white space is written double-quoted).
        for flag, value, forbidden in (
            ("--partition", self.partition, '"\n\r'),
            ("--account", self.account, '"\n\r'),
            ("--time", self.time, '"\n\r'),
            *(("--sbatch", line, "\n\r") for line in self.extra),
        ):
            if value is not None and any(c in value for c in forbidden):
                what = "a line break" if forbidden == "\n\r" else "a line break or a double quote"
                raise DllmError(
                    f"{flag} {value!r}: an #SBATCH line cannot hold {what}",
                    hint="give one #SBATCH option per --sbatch" if flag == "--sbatch" else None,
                )
        if self.time is not None and not _SLURM_TIME.match(self.time):
            # sbatch refused it ("Invalid --time specification") only once the run dir held
            # the job, which a launch with the time mended could then not use
            raise DllmError(
                f"--time {self.time!r} is not a SLURM time limit",
                hint="write MINUTES, MINUTES:SECONDS, HOURS:MINUTES:SECONDS, DAYS-HOURS, "
                "DAYS-HOURS:MINUTES or DAYS-HOURS:MINUTES:SECONDS (e.g. --time 04:00:00, "
                "--time 2-00), or UNLIMITED",
            )
        for line in self.extra:
            _check_sbatch_line(line)


# SLURM's time limit formats (sbatch --time), and no limit.
_SLURM_TIME = re.compile(
    r"^(?:\d+(?::\d+){0,2}|\d+-\d+(?::\d+){0,2}|unlimited|infinite)$", re.IGNORECASE
)
# sbatch's long options (SLURM 22.05), as getopt_long reads them: a word names the option it
# spells out, or the one option it is a prefix of (`--ntasks-per-n` is --ntasks-per-node); a
# prefix of several (`--node`: --nodefile, --nodelist, --nodes) makes sbatch refuse the script.
# Those that take their value in the next word when written without `=`:
_SBATCH_VALUED = frozenset(
    "--" + name
    for name in (
        "account acctg-freq array batch bb bbf begin chdir cluster cluster-constraint clusters "
        "comment constraint container context core-spec cores-per-socket cpu-freq cpus-per-gpu "
        "cpus-per-task deadline delay-boot dependency distribution error exclude export export-file "
        "extra-node-info gid gpu-bind gpu-freq gpus gpus-per-node gpus-per-socket gpus-per-task "
        "gres gres-flags hint input job-name kill-on-invalid-dep licenses mail-type mail-user "
        "mcs-label mem mem-bind mem-per-cpu mem-per-gpu mincpus network nodefile nodelist nodes ntasks "
        "ntasks-per-core ntasks-per-gpu ntasks-per-node ntasks-per-socket ntasks-per-tres open-mode "
        "output partition power prefer priority profile qos reservation signal sockets-per-node "
        "switches tasks-per-node thread-spec threads-per-core time time-min tmp uid wait-all-nodes "
        "wckey wrap"
    ).split()
)
# ... and those that take none there (no value, or only one written with `=`).
_SBATCH_FLAGS = frozenset(
    "--" + name
    for name in (
        "contiguous exclusive get-user-env help hold ignore-pbs nice no-kill no-requeue overcommit "
        "oversubscribe parsable propagate quiet reboot requeue spread-job test-only usage "
        "use-min-nodes verbose version wait"
    ).split()
)
_SBATCH_LONG = _SBATCH_VALUED | _SBATCH_FLAGS
# Short options: those that take a value (the rest of the word, else the next word), and those
# that take none (more letters may follow them in one word: `-vN 2` is -v -N 2). -k takes an
# optional value, only in the same word.
_SBATCH_SHORT_VALUED = frozenset("abcdeimnopqtwxABCDFGJLMNS")
_SBATCH_SHORT_FLAGS = frozenset("hsvHOQVW")
# sbatch options the plan itself sets (`#SBATCH` lines, and srun / torchrun assume them):
# sbatch takes the last of two, so an --sbatch line with one of them changed the job under a
# plan and manifest that still described the first (`--nodes=2` for a 1-node torchrun, or
# `--ntasks-per-node=8`, which started eight torchruns on every node). -> the flag for it, or
# None (drop it: one task per node, one run per run dir).
_PLANNED = {
    "--nodes": "--nnodes",
    "-N": "--nnodes",
    "--ntasks-per-node": None,
    "--tasks-per-node": None,  # sbatch's other name for --ntasks-per-node
    "--ntasks": None,
    "-n": None,
    "--cpus-per-task": "--cpus-per-task",
    "-c": "--cpus-per-task",
    "--gpus-per-node": "--gpus-per-node",
    "--partition": "--partition",
    "-p": "--partition",
    "--account": "--account",
    "-A": "--account",
    "--time": "--time",
    "-t": "--time",
    "--array": None,  # every task of an array job would run the one job in its one run dir
    "-a": None,
    # The job's name and its log (<run dir>/slurm-%j.out, stdout and stderr both), where
    # `dllm run` and the docs say they are: `--output=/elsewhere` moved the log out of the run
    # dir, `--error=...` its errors. Named by the run dir (--run-dir).
    "--job-name": "--run-dir",
    "-J": "--run-dir",
    "--output": "--run-dir",
    "-o": "--run-dir",
    "--error": "--run-dir",
    "-e": "--run-dir",
}
# What the plan makes of those, and how to choose it.
_NAMED = "names the job dllm-<run id> itself (the run id is its run dir's name)"
_LOGGED = (
    "writes the job's output and errors to <run dir>/slurm-<job id>.out itself, where dllm run "
    "and the docs say the job's log is"
)
_PLAN_SETS = {
    "--job-name": _NAMED,
    "-J": _NAMED,
    "--output": _LOGGED,
    "-o": _LOGGED,
    "--error": _LOGGED,
    "-e": _LOGGED,
}


def _check_sbatch_line(line: str) -> None:
    """One `--sbatch` value as sbatch reads the `#SBATCH` line: words split at white space
    outside quotes, each an option or the value of the option before it. A bare word
    (`exclusive`, the `b` of `--comment=a b`) made sbatch refuse the script ("Invalid
    directive") only once the run dir held it. Options are read as sbatch's getopt reads them:
    a long option's unambiguous prefix names it (`--ntasks-per-n=2` is --ntasks-per-node, which
    the plan sets), an ambiguous one (`--node=2`) is refused by sbatch, and short options may
    share a word (`-vN 2` is -v -N 2)."""
    import shlex

    try:
        words = shlex.split(line)
    except ValueError:
        raise DllmError(
            f"--sbatch {line!r}: a quote is not closed", hint="close the quote around the value"
        ) from None
    if not words:
        raise DllmError("--sbatch '': an empty #SBATCH line", hint="drop it")
    takes_value = None  # the option whose value the next word is
    for word in words:
        if takes_value in _SBATCH_VALUED or takes_value in _SHORT_NAMES:
            takes_value = None  # whatever it is, `-N` too: getopt reads it as the value
            continue
        if not word.startswith("-") or word == "-":
            if takes_value:  # one sbatch 22.05 does not know: a bare word as its value
                takes_value = None
                continue
            raise DllmError(
                f"--sbatch {line!r}: {word!r} is no sbatch option, and sbatch refuses the "
                "script for it",
                hint="write the option with its dashes (--sbatch=--exclusive), and quote a "
                "value with white space: --sbatch='--comment=\"my job\"'",
            )
        if word.startswith("--"):
            written = word.split("=", 1)[0]
            name = _sbatch_long_option(line, written)
            _refuse_planned(line, name, written)
            # `--opt value`: the next word is its value (an option sbatch 22.05 does not know,
            # maybe a later one's: as if it took one)
            valued = name in _SBATCH_VALUED or name not in _SBATCH_LONG
            takes_value = name if "=" not in word and valued else None
        else:
            takes_value = _sbatch_short_options(line, word)
    if takes_value in _SBATCH_VALUED or takes_value in _SHORT_NAMES:
        # sbatch reads all #SBATCH lines as one command line: the next line's first word
        # (another --sbatch line, or none: the script is refused) became this option's value
        raise DllmError(
            f"--sbatch {line!r}: {takes_value} takes a value, and this line gives none (sbatch "
            "would read the next #SBATCH line's first word as its value, or refuse the script)",
            hint=f"give it in the same line: --sbatch={takes_value}=VALUE"
            if takes_value.startswith("--")
            else f"give it in the same line: --sbatch='{takes_value} VALUE'",
        )


_SHORT_NAMES = frozenset("-" + letter for letter in _SBATCH_SHORT_VALUED)


def _sbatch_long_option(line: str, written: str) -> str:
    """The long option sbatch reads `written` as: itself, or the one option it abbreviates;
    a prefix of several is refused, as sbatch refuses it ("option '--node=2' is ambiguous")."""
    if written in _SBATCH_LONG:
        return written
    found = sorted(name for name in _SBATCH_LONG if name.startswith(written))
    if len(found) > 1:
        raise DllmError(
            f"--sbatch {line!r}: sbatch reads {written} as a prefix of {len(found)} options "
            f"({', '.join(found)}) and refuses the script for it",
            hint="write the option's whole name",
        )
    return found[0] if found else written


def _sbatch_short_options(line: str, word: str) -> str | None:
    """Check the short options of one word (`-N2`, `-vN`, `-J name`); returns the option whose
    value the next word is, if any."""
    for at in range(1, len(word)):
        letter = word[at]
        _refuse_planned(line, "-" + letter, word if at > 1 else None)
        if letter in _SBATCH_SHORT_VALUED:
            return None if at + 1 < len(word) else "-" + letter  # the rest is its value
        if letter not in _SBATCH_SHORT_FLAGS:
            break  # -k[value], or one sbatch does not know (it says so)
    return None


def _refuse_planned(line: str, name: str, written: str | None) -> None:
    if name not in _PLANNED:
        return
    flag = _PLANNED[name]
    read_as = f" (sbatch reads {written} as {name})" if written and written != name else ""
    if name in _PLAN_SETS:
        raise DllmError(
            f"--sbatch {line!r}: the plan {_PLAN_SETS[name]}, and sbatch would take this "
            f"{name}{read_as} instead",
            hint=f"drop it; choose the run dir (and so the job's name and log) with dllm launch "
            f"{flag}",
        )
    raise DllmError(
        f"--sbatch {line!r}: the plan sets {name} itself{read_as}, and sbatch would take this "
        "one instead, running another job than the plan and manifest describe",
        hint=f"use dllm launch {flag}"
        if flag
        else "drop it: the job runs one task per "
        "node (torchrun starts the processes) and one run per run dir",
    )


@dataclass(frozen=True)
class LaunchOptions:
    backend: Backend = "auto"
    nproc_per_node: int | None = None
    nnodes: NodeRange = field(default_factory=NodeRange)
    node_rank: int | None = None
    master_addr: str | None = None
    master_port: int | None = None
    rdzv_endpoint: str | None = None
    rdzv_id: str | None = None
    rdzv_conf: str | None = None  # torchrun --rdzv-conf, e.g. "last_call_timeout=5"
    max_restarts: int = 0
    run_root: str | None = None
    run_dir: str | None = None
    slurm: SlurmOptions = field(default_factory=SlurmOptions)

    def __post_init__(self) -> None:
        if self.backend not in BACKENDS:
            raise DllmError(
                f"unknown backend {self.backend!r}", hint=f"choose one of {', '.join(BACKENDS)}"
            )
        if self.nproc_per_node is not None and self.nproc_per_node < 1:
            raise DllmError(
                f"--nproc-per-node must be >= 1 (got {self.nproc_per_node})",
                hint="pass the processes to start on each node, or leave it out for the "
                "topology's product / nodes",
            )
        if self.max_restarts < 0:
            raise DllmError(
                f"--max-restarts must be >= 0 (got {self.max_restarts})",
                hint="0 restarts no worker group (the default)",
            )
        if self.node_rank is not None and not 0 <= self.node_rank < self.nnodes.max:
            raise DllmError(
                f"--node-rank {self.node_rank} is outside 0..{self.nnodes.max - 1}",
                hint="node ranks count from 0 to nnodes-1",
            )
        if self.master_addr is not None and not _HOST.match(self.master_addr):
            # else written into the plan, and torchrun failed to resolve it on every node
            raise DllmError(
                f"--master-addr {self.master_addr!r} is not a host name or an IP address",
                hint="pass the host of node 0 as every node reaches it, e.g. --master-addr node0 "
                "or 10.0.0.1 (an IPv6 address without brackets)",
            )
        if self.master_port is not None and not 0 < self.master_port < 65536:
            raise DllmError(
                f"--master-port {self.master_port} is not a TCP port",
                hint="pass a port from 1 to 65535 that node 0 can listen on, e.g. 29500",
            )
        if self.rdzv_endpoint and (self.master_addr or self.master_port):
            raise DllmError(
                "--rdzv-endpoint and --master-addr/--master-port are two ways to meet; pick one",
                hint="static multi-node: --master-addr HOST --master-port PORT --node-rank R; "
                "elastic: --rdzv-endpoint HOST:PORT",
            )
        for flag, value in (("--run-dir", self.run_dir), ("--run-root", self.run_root)):
            if value is not None and not value.strip():
                # `--run-dir "$DIR"` with DIR unset: it was dropped without a word (a fresh
                # runs/<stamp>-<id> instead of the folder meant)
                raise DllmError(
                    f"{flag} is empty (an unset shell variable?)",
                    hint=f"give {flag} a folder, or leave it out for a fresh runs/<stamp>-<id>",
                )
        if self.run_dir and self.run_root:
            raise DllmError(
                "give --run-dir or --run-root, not both",
                hint="--run-dir DIR is the run's own folder; --run-root ROOT holds a fresh "
                "ROOT/<stamp>-<id>",
            )
        if self.rdzv_endpoint is not None:
            _check_endpoint(self.rdzv_endpoint)
        if self.rdzv_conf is not None:
            _check_rdzv_conf(self.rdzv_conf)


# What torchrun's c10d rendezvous reads back as a host name (its parse_rendezvous_endpoint).
_HOST = re.compile(r"^[\w.:-]+$")
# The settings torchrun's c10d rendezvous reads as whole seconds or counts (> 0), or as a flag.
_RDZV_COUNTS = ("keep_alive_interval", "keep_alive_max_attempt")
_RDZV_FLAGS = {"is_host"}
_FLAG_WORDS = {"1", "true", "t", "yes", "y", "0", "false", "f", "no", "n"}


def _check_endpoint(endpoint: str) -> None:
    """`--rdzv-endpoint HOST[:PORT]` as torchrun reads it (an IPv6 address in brackets): a bad
    one was written into the plan and failed on every node only once the run dir existed (a
    non-numeric port also stopped the launch's port check with a traceback)."""
    text = endpoint.strip()
    if text.startswith("[") and "]" in text:
        host, _, rest = text[1:].partition("]")
        port = rest[1:] if rest.startswith(":") else None
        bad = rest not in ("", ":" + (port or ""))
    else:
        host, sep, port = text.rpartition(":") if ":" in text else (text, "", "")
        port = port if sep else None
        # A bare IPv6 address reads as torchrun reads it, its last `:` starting the port:
        # `fd00::1:29400` is fd00::1, port 29400; `fd00::1` would be `fd00:`, port 1.
        bad = host.endswith(":")
    if port is not None and not (port.isdigit() and len(port) <= 5 and 0 < int(port) < 65536):
        bad = True
    if bad or not host or not _HOST.match(host):
        raise DllmError(
            f"--rdzv-endpoint {endpoint!r} is not HOST:PORT",
            hint="e.g. --rdzv-endpoint node0:29400 (a port from 1 to 65535; an IPv6 address in "
            "brackets: [fd00::1]:29400), the same on every node",
        )


def _check_rdzv_conf(conf: str) -> None:
    """`--rdzv-conf K=V,...` as torchrun's c10d rendezvous reads it: a malformed one (`foo`,
    `last_call_timeout=5s`) was written into the plan, and torchrun failed with a traceback on
    every node once the run dir existed."""
    hint = (
        "write K=V pairs separated by commas, e.g. --rdzv-conf last_call_timeout=5,join_timeout=600"
    )
    if not conf.strip():
        return  # none (a replay's `--rdzv-conf ''` drops the recorded settings)
    for item in conf.split(","):
        key, sep, value = (part.strip() for part in item.partition("="))
        if not key or not sep or not value:
            raise DllmError(f"--rdzv-conf {conf!r}: {item.strip()!r} is not K=V", hint=hint)
        if key.endswith("_timeout") or key in _RDZV_COUNTS:
            if not (value.isdigit() and int(value) > 0):
                raise DllmError(
                    f"--rdzv-conf {conf!r}: {key} must be a whole number above 0 (got {value!r})",
                    hint="timeouts are whole seconds, e.g. last_call_timeout=5",
                )
        elif key in _RDZV_FLAGS and value.lower() not in _FLAG_WORDS:
            raise DllmError(
                f"--rdzv-conf {conf!r}: {key} must be true or false (got {value!r})", hint=hint
            )
