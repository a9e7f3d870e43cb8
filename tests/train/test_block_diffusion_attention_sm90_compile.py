"""The block-diffusion attention kernels compiled for Hopper (sm90) on this CPU host.

`triton.compile` for `GPUTarget("cuda", 90, 32)` runs Triton's whole pipeline down to ptxas
without a GPU, so what ships (each head dim's default config, every kernel) is checked against
the real compiler here: API misuse, pass failures and shared memory over what an sm90 block may
use fail this test instead of a GPU session. The check is `ci/triton_sm90_compile.py`, run as a
user runs it.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from tests import prefetch

pytest.importorskip("triton")

SCRIPT = Path(__file__).resolve().parents[2] / "ci" / "triton_sm90_compile.py"


# Each compile this module checks, started with the session (tests/prefetch.py): minutes of
# ptxas in all, on the core the other tests leave idle.
COMPILES = {
    "defaults 64": ("--defaults", "--head-dim", "64"),
    "defaults 128": ("--defaults", "--head-dim", "128"),
    "over smem": ("--head-dim", "128", "--only", "runs 128x128 w8 s3"),
    "gluon 64": ("--head-dim", "64", "--only", "gluon"),
    "gluon 128": ("--head-dim", "128", "--only", "gluon"),
}
for _name, _args in COMPILES.items():
    prefetch.declare(f"sm90 {_name}", [sys.executable, str(SCRIPT), *_args], timeout=600)


def _compile(name: str) -> subprocess.CompletedProcess:
    return prefetch.result(f"sm90 {name}")[0]


@pytest.mark.parametrize("head_dim", [64, 128])
def test_default_configs_compile_for_sm90(head_dim):
    done = _compile(f"defaults {head_dim}")
    assert done.returncode == 0, done.stdout + done.stderr
    lines = [line for line in done.stdout.splitlines() if " default " in line]
    assert [line.split()[0] for line in lines] == ["fwd", "dkdv", "dq"], done.stdout
    assert all(" ok " in line for line in lines), done.stdout


def test_a_config_over_sm90_shared_memory_fails():
    """dQ at 128 x 128 in 3 stages asks ~262 KB (it failed at launch on the H200); the forward's
    variant of the same name fits (229,400 of the 232,448 bytes an sm90 block may use)."""
    done = _compile("over smem")
    assert done.returncode == 1, done.stdout + done.stderr
    rows = {line.split()[0]: line for line in done.stdout.splitlines() if "128x128" in line}
    assert " ok " in rows["fwd"], done.stdout
    assert "FAILED needs" in rows["dq"] and "232448" in rows["dq"], done.stdout


@pytest.mark.parametrize("head_dim", [64, 128])
def test_gluon_kernels_compile_for_sm90(head_dim):
    """The Gluon dK/dV and dQ kernels (config.dkdv_gluon, dq_gluon; Gluon has no interpreter, so
    this compile is what the CPU suite can check of them) at every ring depth the sweep times,
    each also split, dK/dV also with dQ fused, under this host's Triton (the GPU host runs 3.6, this one
    may run a later one: the kernels must build in both)."""
    done = _compile(f"gluon {head_dim}")
    assert done.returncode == 0, done.stdout + done.stderr
    tests = ["test: gluon dkdv", "test: gluon dkdv dq fused", "test: gluon dkdv split",
             "test: gluon dkdv head-major", "test: gluon dkdv chunks 3", "test: gluon backward",
             "test: gluon backward split"]  # fmt: skip
    rings = ["gluon s2", "gluon s3", "gluon s4"]
    split = ["gluon split s2", "gluon split s3", "gluon split s4"]
    orders = [f"gluon split s3 {o}" for o in ("chosen", "head-major", "chunks 4", "chunks 16")]
    expected = {"dkdv": rings + split + orders + tests, "dq": rings + split + tests}
    for kernel in ("dkdv", "dq"):  # the dQ kernel of the first three tests is the `tl` one
        lines = [line for line in done.stdout.splitlines() if line.startswith(f"{kernel} ")]
        names = [line[6:34].strip() for line in lines]
        assert names == expected[kernel], done.stdout
        assert all(" ok " in line for line in lines), done.stdout


def test_register_use_disassembles_only_a_kernel_with_local_memory(monkeypatch):
    """Spill stores and loads (STL/LDL) live in local memory: a cubin whose resource usage shows
    no stack and no local memory is reported 0/0 spills without `cuobjdump -sass` (2-3 s a
    cubin, run for each of the ~40 variants above), and one with local memory is disassembled
    and counted."""
    import importlib.util

    import triton

    spec = importlib.util.spec_from_file_location("triton_sm90_compile", SCRIPT)
    script = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(script)
    tool = Path(triton.__file__).parent / "backends" / "nvidia" / "bin" / "cuobjdump"
    if not tool.is_file():
        pytest.skip("this Triton wheel ships no cuobjdump")
    usage = {"local": "REG:168 STACK:0 SHARED:1024 LOCAL:0 CONSTANT[0]:784"}
    calls = []

    def run(command, **kwargs):
        calls.append(command[1])
        out = (
            usage["local"] if command[1] == "--dump-resource-usage" else "STL [R1]\nLDL R2\nLDL R3"
        )
        return subprocess.CompletedProcess(command, 0, stdout=out, stderr="")

    monkeypatch.setattr(subprocess, "run", run)
    assert script.register_use(b"cubin") == " regs 168 stack    0 spills 0/0"
    assert calls == ["--dump-resource-usage"]
    usage["local"] = "REG:255 STACK:0 SHARED:1024 LOCAL:16 CONSTANT[0]:784"
    assert script.register_use(b"cubin") == " regs 255 stack    0 spills 1/2"
    usage["local"] = "REG:255 STACK:8 SHARED:1024 LOCAL:0 CONSTANT[0]:784"
    assert script.register_use(b"cubin") == " regs 255 stack    8 spills 1/2"
    assert calls == ["--dump-resource-usage"] + ["--dump-resource-usage", "-sass"] * 2
