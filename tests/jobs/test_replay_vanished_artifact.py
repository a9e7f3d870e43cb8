"""A replay whose data artifact (or held-out one) is gone names its path and how to make it
again. Before, the drift line read `data: {"fingerprint": ..., ...} -> (none)`, naming no folder,
and the hint said "restore the recorded data, or pass --allow-drift to run anyway", but
--allow-drift then failed on the missing artifact ("data artifact not found")."""

from __future__ import annotations

import shutil
import textwrap

import pytest

from tests.helpers import assert_user_error
from tests.jobs.test_replay_eval_data import _held_out
from tests.jobs.test_replay_inputs import record
from turbo_dllm.jobs import provenance


@pytest.fixture
def pinned_code(monkeypatch):
    code = provenance.code_version()  # others may edit this checkout while the test runs
    monkeypatch.setattr(provenance, "code_version", lambda: dict(code))


def test_a_vanished_artifact_is_named_with_the_way_to_make_it_again(
    cli, spec_file, workdir, pinned_code
):
    data = _held_out(workdir / "train", textwrap)
    heldout = _held_out(workdir / "heldout", textwrap)
    sets = ["--set", "data.synthetic=null", "--set", f"data.artifact={data}"]
    sets += ["--set", f"eval.artifact={heldout}", "--set", "eval.interval=2"]
    path, _ = record(cli, "--config", spec_file, *sets, "--run-dir", "a")

    shutil.rmtree(data)
    result = cli("launch", "--manifest", path, "--dry-run")
    assert_user_error(
        result,
        "refused: 1 input drifted",
        f" -> (none): data.artifact {data} does not exist now\n",
        f"hint: prepare {data} again with the prepare.yaml and sources that made it (dllm data "
        "prepare --config PREPARE.yaml: the same ones give the recorded fingerprint; "
        "--allow-drift cannot replay without the data)\n",
    )
    # What the hint says of --allow-drift holds.
    assert_user_error(
        cli("launch", "--manifest", path, "--allow-drift", "--dry-run"), "not found", str(data)
    )

    # Both gone, the held-out one's folder still there but empty: both named, in one hint.
    shutil.rmtree(heldout)
    heldout.mkdir()
    result = cli("launch", "--manifest", path, "--dry-run")
    assert_user_error(
        result,
        "refused: 2 inputs drifted",
        f": data.artifact {data} does not exist now\n",
        f": eval.artifact {heldout} holds no artifact now\n",
        f"hint: prepare {data} and {heldout} again with the prepare.yaml and sources that made "
        "them",
    )
