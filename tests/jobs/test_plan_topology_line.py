"""The plan names every parallel degree that is not 1 and how the context is split. Before, the
plan's mesh line (bp is no mesh axis) read the same for CSBP at cp=2, bp=2 and for the CP
baseline at cp=2, in `dllm launch --dry-run` and in `dllm run show`."""

from __future__ import annotations

import json

import pytest

from tests.jobs.conftest import SMALL_SPEC


@pytest.fixture
def long_spec(workdir):
    """SMALL_SPEC with room for bp=2 (8 blocks of 16)."""
    path = workdir / "long.yaml"
    path.write_text(SMALL_SPEC.replace("seq_len: 64", "seq_len: 128"))
    return path


def _topology_line(out: str) -> str:
    lines = [line for line in out.splitlines() if line.startswith("topology ")]
    assert len(lines) == 1, out
    return lines[0]


@pytest.mark.parametrize(
    ("sets", "line", "degrees", "context"),
    [
        (
            ["topology.cp=2", "topology.bp=2"],
            "topology     cp=2 x bp=2; context: CSBP (noisy blocks over bp=2 ranks, the clean "
            "stream zigzag-sharded over cp=2)",
            {"cp": 2, "bp": 2},
            "csbp",
        ),
        (
            ["topology.cp=2"],
            "topology     cp=2; context: CP baseline (both streams zigzag-sharded over cp=2, bp=1)",
            {"cp": 2},
            "cp",
        ),
        (
            ["topology.bp=2"],
            "topology     bp=2; context: CSBP (noisy blocks over bp=2 ranks, every rank "
            "recomputes its clean prefix)",
            {"bp": 2},
            "csbp",
        ),
        (
            ["topology.dp=2", "topology.tp=2", "topology.sp=true"],
            "topology     dp=2 x tp=2 x sp",
            {"dp": 2, "tp": 2, "sp": True},
            "none",
        ),
        ([], "topology     one process (every degree 1)", {}, "none"),
    ],
    ids=["csbp", "cp-baseline", "csbp-cp1", "dp-tp-sp", "one-process"],
)
def test_the_plan_names_the_degrees_and_the_context_split(
    cli, long_spec, sets, line, degrees, context
):
    overrides = [word for item in sets for word in ("--set", item)]
    args = ("launch", "--config", long_spec, *overrides, "--run-dir", "r", "--dry-run")
    text = cli(*args)
    assert text.code == 0, text.err
    assert _topology_line(text.out) == line
    data = json.loads(cli(*args, "--json").out)
    assert data["topology"] == {"degrees": degrees, "context": context, "text": line[13:]}


def test_run_show_prints_the_topology_of_the_recorded_plan(cli, long_spec, workdir):
    from turbo_dllm.jobs import launcher
    from turbo_dllm.jobs.options import LaunchOptions

    argv = ["dllm", "launch", "--config", str(long_spec)]
    options = LaunchOptions(run_dir="runs/csbp")
    job = launcher.prepare_launch(str(long_spec), ["topology.cp=2", "topology.bp=2"], options, argv)
    launcher.materialize(job)  # the manifest a launch writes, no worker started
    shown = cli("run", "show", "runs/csbp")
    assert shown.code == 0, shown.err
    assert "cp=2 x bp=2; context: CSBP" in _topology_line(shown.out)
