"""`dllm train` under a torchrun of another process count also says how to fit the spec to the
processes it was started with (`--set topology.dp=N`, or fsdp), as `dllm launch`'s refusal
does. Before, its hint offered only one process (or the spec's count) and `dllm launch`."""

from __future__ import annotations

import re

import pytest

from tests.helpers import assert_user_error


@pytest.fixture(autouse=True)
def one_process(monkeypatch):
    monkeypatch.delenv("WORLD_SIZE", raising=False)


@pytest.mark.parametrize(
    ("sets", "world", "fixes"),
    [
        ([], 2, ["--set topology.dp=2", "--set topology.fsdp=2"]),
        (["topology.dp=2"], 4, ["--set topology.dp=4", "--set topology.fsdp=2"]),
        (["topology.dp=2"], 3, ["--set topology.dp=3"]),
    ],
    ids=["one-process-spec-on-2", "dp2-on-4", "dp2-on-3"],
)
def test_the_hint_fits_the_spec_to_the_processes_torchrun_started(
    cli, spec_file, monkeypatch, sets, world, fixes
):
    overrides = [word for item in sets for word in ("--set", item)]
    monkeypatch.setenv("WORLD_SIZE", str(world))
    result = cli("train", "--config", spec_file, *overrides)
    shown = " or ".join(f"`{fix}`" for fix in fixes)
    assert_user_error(
        result,
        f"torchrun started {world} (WORLD_SIZE={world})",
        f"or fit the spec to the {world} processes torchrun started: add {shown} to this "
        "`dllm train`",
    )
    monkeypatch.delenv("WORLD_SIZE")
    for fix in re.findall(r"`(--set \S+)`", result.err):  # each fix fits that world size
        checked = cli(
            "config", "validate", "--config", spec_file, *overrides, *fix.split(),
            "--world-size", str(world),
        )  # fmt: skip
        assert checked.code == 0, (fix, checked.err)


def test_where_no_dp_fits_the_hint_says_why(cli, spec_file, monkeypatch):
    monkeypatch.setenv("WORLD_SIZE", "3")
    result = cli("train", "--config", spec_file, "--set", "topology.cp=2")
    assert_user_error(
        result,
        "no dp fits the 3 processes torchrun started: 3 is not a multiple of "
        "fsdp*max(cp,bp)*tp = 2",
    )
    assert "fit the spec to" not in result.err
