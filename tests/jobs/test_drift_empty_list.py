"""A list or mapping that was empty on one side and has items on the other is said by its items'
lines alone. Before, a replay on a host that gained a GPU listed `host.gpus: [] -> (none)` (as if
the GPU list had vanished) above `host.gpus[0].arch: (none) -> sm90`, and counted it as one more
drifted input; `dllm run diff` showed the same line."""

from __future__ import annotations

import pytest

from tests.helpers import assert_user_error
from tests.jobs.test_replay_inputs import record
from turbo_dllm.jobs import provenance
from turbo_dllm.jobs.drift import flat_diff


@pytest.fixture
def pinned_code(monkeypatch):
    code = provenance.code_version()  # others may edit this checkout while the test runs
    monkeypatch.setattr(provenance, "code_version", lambda: dict(code))


def test_a_host_that_gained_a_gpu_reads_as_its_gpu(cli, spec_file, workdir, gpus, pinned_code):
    gpus(0)
    path, _ = record(cli, "--config", spec_file, "--run-dir", "a")
    gpus(1)
    result = cli("launch", "--manifest", path, "--dry-run")
    assert_user_error(result, "  - host.gpus[0].arch: (none) -> sm90\n")
    assert "host.gpus: " not in result.err, result.err
    drifted = [line for line in result.err.splitlines() if line.startswith("  - ")]
    assert f"refused: {len(drifted)} inputs drifted" in result.err, result.err


def test_flat_diff_keeps_a_change_between_empty_and_a_value():
    assert [i.field for i in flat_diff({"a": {"x": [{"k": 1}]}}, {"a": {"x": []}})] == ["a.x[0].k"]
    assert [i.field for i in flat_diff({"a": {}}, {"a": {"b": 1}})] == ["a.b"]
    # an empty list against a plain value, or against nothing, is still a line
    assert [(i.recorded, i.current) for i in flat_diff({"x": []}, {"x": 0})] == [([], 0)]
    assert [(i.recorded, i.current) for i in flat_diff({"x": []}, {})] == [([], None)]
