"""How a process ends (`turbo_dllm.train.entry.end_process`): a rank that joined a process group
ends without the interpreter's finalization, where gloo's threads could abort it; any other
process exits as Python does."""

from __future__ import annotations

import os
import socket
import subprocess
import sys

import pytest

SCRIPT = """
import atexit, os, sys
import torch
import torch.distributed as dist
from turbo_dllm.train.distributed import init_distributed
from turbo_dllm.train.entry import run_and_end

atexit.register(lambda: print("finalized", flush=True))


def main():
    if os.environ.get("WORLD_SIZE", "1") != "1":
        env = init_distributed()
        total = torch.ones(1)
        dist.all_reduce(total)
        dist.destroy_process_group()
        print(f"rank {env.rank} sum {int(total.item())}", end="")  # no newline: still buffered
    else:
        print("alone", end="")
    if sys.argv[1] == "raise":
        raise RuntimeError("a bug")
    return int(sys.argv[1])


run_and_end(main)
"""


def _run(code: int | str, env: dict[str, str]) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, "-c", SCRIPT, str(code)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, "OMP_NUM_THREADS": "1", **env},
    )


@pytest.mark.slow
@pytest.mark.parametrize(("given", "code"), [(2, 2), ("raise", 1)])
def test_ranks_that_joined_a_group_end_with_their_code_and_without_finalization(given, code):
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    ranks = [
        _run(given, {"RANK": str(rank), "LOCAL_RANK": str(rank), "WORLD_SIZE": "2",
                     "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port)})
        for rank in (0, 1)
    ]  # fmt: skip
    for rank, process in enumerate(ranks):
        out, err = process.communicate(timeout=120)
        assert process.returncode == code, err
        assert out == f"rank {rank} sum 2", out  # flushed before the exit; atexit never ran
        # an exception escaping main is printed as Python prints it
        assert ("RuntimeError: a bug" in err) == (given == "raise"), err


def test_a_process_that_joined_no_group_exits_as_python_does():
    process = _run(3, {"WORLD_SIZE": "1"})
    out, err = process.communicate(timeout=120)
    assert process.returncode == 3, err
    assert out == "alone" + "finalized\n"
