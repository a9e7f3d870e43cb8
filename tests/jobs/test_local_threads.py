"""A local (one-process) launch records its CPU thread count as a torchrun launch records its
workers' (`OMP_NUM_THREADS`, this host's CPUs / processes), runs with it, and a replay runs with
the recorded one. Before, a local plan recorded no thread count and ran with whatever the
interpreter had: a replay on a host with other cores computed other numbers without a word."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from turbo_dllm.host import view
from turbo_dllm.jobs import provenance
from turbo_dllm.jobs.manifest import RunManifest, write_manifest


@pytest.fixture
def pinned_code(monkeypatch):
    code = provenance.code_version()  # others may edit this checkout while the test runs
    monkeypatch.setattr(provenance, "code_version", lambda: dict(code))


def dry_run(cli, *args) -> dict:
    result = cli("launch", "--dry-run", "--json", *args)
    assert result.code == 0, result.err
    return json.loads(result.out)


@pytest.fixture
def trained_with(monkeypatch):
    """The torch thread count each training run of this test started with (the real trainer
    runs; this only looks)."""
    from turbo_dllm.train import entry

    seen: list[int] = []
    real = entry.train

    def train(*args, **kwargs):
        seen.append(torch.get_num_threads())
        return real(*args, **kwargs)

    monkeypatch.setattr(entry, "train", train)
    return seen


def test_a_local_launch_records_and_runs_with_its_thread_count(
    cli, spec_file, workdir, monkeypatch, pinned_code, trained_with
):
    monkeypatch.setattr(view, "_cpu_count", lambda: 3)
    plan = dry_run(cli, "--config", spec_file)["plan"]
    assert plan["backend"] == "local"
    assert plan["env"] == {"OMP_NUM_THREADS": "3"}  # as torchrun's one worker would get

    before = torch.get_num_threads()
    result = cli("launch", "--config", spec_file, "--run-dir", "a")
    assert result.code == 0, result.err
    recorded = json.loads((workdir / "a" / "manifest.json").read_text())["plan"]
    assert recorded["env"]["OMP_NUM_THREADS"] == "3"
    assert trained_with == [3]
    assert torch.get_num_threads() == before  # the launching process gets its own back

    # On a host with other CPUs, the replay runs with the recorded count, and says so.
    monkeypatch.setattr(view, "_cpu_count", lambda: 2)
    payload = dry_run(cli, "--manifest", workdir / "a" / "manifest.json")
    assert payload["plan"]["env"] == {"OMP_NUM_THREADS": "3"}
    assert (
        "replay: OMP_NUM_THREADS=3 as recorded (this host's CPUs would give 2)"
        in (payload["plan"]["notes"][-1])
    )
    assert payload["drift"] == []
    result = cli("launch", "--manifest", workdir / "a" / "manifest.json", "--run-dir", "b")
    assert result.code == 0, result.err
    assert trained_with == [3, 3]
    a, b = (json.loads((workdir / d / "manifest.json").read_text()) for d in ("a", "b"))
    assert b["plan"]["env"] == a["plan"]["env"]
    assert dry_run(cli, "--config", spec_file)["plan"]["env"] == {"OMP_NUM_THREADS": "2"}


def test_an_older_local_manifest_replays_without_a_thread_count(
    cli, spec_file, workdir, pinned_code
):
    """A local run recorded before the field ran with torch's own default: its replay sets
    none either (and says why), as that run did."""
    payload = dry_run(cli, "--config", spec_file, "--run-dir", "old")
    document = payload["manifest"]
    document["plan"]["env"] = {}  # what a local launch recorded before
    manifest = RunManifest.model_validate(document)
    Path("old").mkdir()
    path = write_manifest(manifest, Path("old"))
    replay = dry_run(cli, "--manifest", path)
    assert replay["plan"]["env"] == {}
    assert "replay: no OMP_NUM_THREADS, as recorded" in replay["plan"]["notes"][-1]
