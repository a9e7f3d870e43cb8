"""Fixtures for the job tests: a small RunSpec, a pretend GPU count, a working folder, and a
real one-node SLURM cluster (tests/jobs/slurm_cluster.py)."""

from __future__ import annotations

import textwrap

import pytest

from tests.jobs.slurm_cluster import slurm_cluster  # noqa: F401 (a session fixture)

SMALL_SPEC = """
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
    vocab_size: 512
  seq_len: 64
training:
  micro_batch_size: 2
  steps: 4
scheduler:
  warmup_steps: 1
"""


@pytest.fixture
def workdir(tmp_path, monkeypatch):
    """Run in a fresh folder (runs/ lands here) on a host with no pretend GPUs."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("DLLM_OVERRIDE_GPUS", raising=False)
    return tmp_path


@pytest.fixture
def spec_file(workdir):
    path = workdir / "train.yaml"
    path.write_text(textwrap.dedent(SMALL_SPEC))
    return path


@pytest.fixture
def gpus(monkeypatch):
    """Pretend this host has N H200s (the fingerprint's DLLM_OVERRIDE_GPUS)."""

    def set_count(count: int) -> None:
        monkeypatch.setenv("DLLM_OVERRIDE_GPUS", ",".join(["sm90"] * count) or "none")

    return set_count
