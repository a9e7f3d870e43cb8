"""docs/parallelism.md read as a new user: what `dllm doctor` and `dllm config validate` say
about a topology that cannot run, and the fix each gives."""

from __future__ import annotations

import json
import textwrap

import pytest

SPEC = """
launch:
  seed: 0
model:
  family: qwen3
  from_config: tiny
objective:
  name: block_diffusion
  block_size: 16
data:
  synthetic:
    num_sequences: 32
    vocab_size: 256
  seq_len: 128
training:
  micro_batch_size: 2
  steps: 2
scheduler:
  warmup_steps: 1
"""


@pytest.fixture
def spec_file(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    path = tmp_path / "train.yaml"
    path.write_text(textwrap.dedent(SPEC))
    return path


def _checks(result) -> dict[str, dict]:
    return {check["name"]: check for check in json.loads(result.out)["checks"]}


def test_doctor_judges_a_process_count_in_its_world_size_check(cli, spec_file):
    """`dllm doctor --world-size 3` for cp = 2: the RunSpec is valid (config passes) and the
    world size check fails with the launch flags that fit. It was the config check that failed,
    with the fix `dllm config validate --config ...` (which says the file is valid), and the
    world size check said it had not run."""
    result = cli(
        "doctor", "--config", "train.yaml", "--set", "topology.cp=2", "--world-size", "3", "--json"
    )
    assert result.code == 1
    checks = _checks(result)
    assert checks["config"]["status"] == "pass", checks["config"]
    world = checks["world size"]
    assert world["status"] == "fail"
    assert "launch starts 3 processes" in world["detail"]
    assert "--nproc-per-node 2" in world["fix"]
    assert "--nproc-per-node 4 --set topology.dp=2" in world["fix"]


def test_a_huge_process_count_is_refused_at_once(cli_process, spec_file):
    """`--nproc-per-node 1099511627777` for cp = 2: refused (exit 2) with the nearest counts
    that fit. The fixes were found by scanning every count from 1099511627776 down to 1: the
    launch never returned."""
    result = cli_process(
        "launch",
        "--config",
        "train.yaml",
        "--set",
        "topology.cp=2",
        "--nproc-per-node",
        str(2**40 + 1),
        "--dry-run",
        cwd=spec_file.parent,
        timeout=60,
    )
    assert result.code == 2, result.err
    assert f"--nproc-per-node {2**40} --set topology.dp={2**39}" in result.err
    assert f"--nproc-per-node {2**40 + 2} --set topology.dp={2**39 + 1}" in result.err
