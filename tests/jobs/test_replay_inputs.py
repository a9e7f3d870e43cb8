"""A replay pins what the spec reads by path besides data and weights: the config.json that
`model.from_config` names (the model's shape), and the checkpoint that `checkpoint.resume`
starts from, as the trainer resolves it (a run dir: its newest complete step). Either changed
refuses `dllm launch --manifest` with a field diff; before, the replay ran another job without
a word of drift."""

from __future__ import annotations

import json
import shutil

import pytest
import yaml

from tests.helpers import assert_user_error
from turbo_dllm.jobs import provenance
from turbo_dllm.jobs.manifest import RunManifest, write_manifest


@pytest.fixture
def pinned_code(monkeypatch):
    code = provenance.code_version()  # others may edit this checkout while the test runs
    monkeypatch.setattr(provenance, "code_version", lambda: dict(code))


def record(cli, *args):
    """A dry-run launch's manifest, written into a run dir as a launch would."""
    result = cli("launch", "--dry-run", "--json", *args)
    assert result.code == 0, result.err
    manifest = RunManifest.model_validate(json.loads(result.out)["manifest"])
    run_dir = manifest.plan.run_dir
    from pathlib import Path

    Path(run_dir).mkdir(parents=True)
    return write_manifest(manifest, Path(run_dir)), manifest


def test_a_changed_from_config_file_refuses_the_replay(cli, spec_file, workdir, pinned_code):
    from turbo_dllm.registry import get_family

    config = workdir / "shape.json"
    config.write_text(json.dumps(get_family("qwen3").presets["tiny"]))
    path, manifest = record(
        cli, "--config", spec_file, "--set", f"model.from_config={config}", "--run-dir", "a"
    )
    assert manifest.model_shape.files == {"shape.json": provenance.sha256_file(config)}
    assert cli("launch", "--manifest", path, "--dry-run", "--json").code == 0

    shape = json.loads(config.read_text())
    config.write_text(json.dumps({**shape, "num_hidden_layers": shape["num_hidden_layers"] + 1}))
    result = cli("launch", "--manifest", path, "--dry-run")
    assert_user_error(result, "1 input drifted", "model_shape.files.shape.json", "from_config")


def test_a_resume_checkpoint_that_moved_on_refuses_the_replay(cli, spec_file, workdir, pinned_code):
    """Resume from a run dir: its newest complete step. Once that run's newest step is another
    one (here: the last one removed, as a prune does), a replay would start elsewhere."""
    source = workdir / "source"
    args = ("--set", "checkpoint.interval=2", "--set", "checkpoint.keep_last=2")
    result = cli("launch", "--config", spec_file, *args, "--run-dir", source)
    assert result.code == 0, result.err
    path, manifest = record(
        cli, "--config", spec_file, "--set", f"checkpoint.resume={source}", "--run-dir", "b"
    )
    assert manifest.resume.path == str(source / "checkpoints" / "step_00000004")
    assert "checkpoint.json" in manifest.resume.files
    assert cli("launch", "--manifest", path, "--dry-run", "--json").code == 0

    shutil.rmtree(source / "checkpoints" / "step_00000004")  # step 2 is its newest now
    result = cli("launch", "--manifest", path, "--dry-run")
    assert_user_error(result, "resume.files.checkpoint.json", "checkpoint.resume checkpoint")


def test_presets_and_auto_resume_pin_nothing_more(cli, spec_file, workdir):
    _, manifest = record(cli, "--config", spec_file, "--run-dir", "c")
    assert manifest.model_shape is None and manifest.resume is None


def test_a_vanished_resume_checkpoint_is_refused_even_with_allow_drift(
    cli, spec_file, workdir, pinned_code
):
    """--allow-drift takes a vanished resume checkpoint as drift, but the replay cannot start
    from it: it wrote the run dir and failed in the worker (`exit 2`); now it is refused first."""
    source = workdir / "source"
    result = cli(
        "launch", "--config", spec_file, "--set", "checkpoint.interval=2", "--run-dir", source
    )
    assert result.code == 0, result.err
    path, _ = record(
        cli, "--config", spec_file, "--set", f"checkpoint.resume={source}", "--run-dir", "d"
    )
    shutil.rmtree(source / "checkpoints")
    result = cli("launch", "--manifest", path, "--allow-drift", "--run-dir", workdir / "replay")
    assert_user_error(result, f"checkpoint.resume: {source} holds no complete checkpoint")
    assert not (workdir / "replay").exists()


def test_a_vanished_resume_checkpoint_is_named_by_its_path_with_a_fix(
    cli, spec_file, workdir, pinned_code
):
    """The refusal printed the checkpoint's whole record, every file's sha256, as one line of
    JSON without its path, and offered --allow-drift, which cannot run it (above). Now its line
    names the recorded checkpoint's path, its file count and what checkpoint.resume holds now;
    the hint says where to put it back and how to train from another checkpoint instead."""
    source = workdir / "source"
    result = cli(
        "launch", "--config", spec_file, "--set", "checkpoint.interval=2", "--run-dir", source
    )
    assert result.code == 0, result.err
    path, manifest = record(
        cli, "--config", spec_file, "--set", f"checkpoint.resume={source}", "--run-dir", "e"
    )
    (workdir / "e" / "spec.yaml").write_text(yaml.safe_dump(manifest.spec))  # as a launch does
    step = source / "checkpoints" / "step_00000004"
    assert manifest.resume.path == str(step)
    count = len(manifest.resume.files)
    shutil.rmtree(source / "checkpoints")
    result = cli("launch", "--manifest", path, "--run-dir", workdir / "replay")
    assert_user_error(
        result,
        f"  - resume: {step} ({count} files) -> (none): checkpoint.resume {source} holds no "
        "complete checkpoint now\n",
        f"hint: put the recorded checkpoint back at {step} (the replay starts from it, with "
        "--allow-drift too); or train the run's spec from another checkpoint, as a new run: "
        f"dllm launch --config {workdir}/e/spec.yaml --set checkpoint.resume=PATH --run-dir "
        "NEW_DIR",
    )
    assert (
        '"files"' not in result.err and manifest.resume.files["checkpoint.json"] not in result.err
    )
    assert not (workdir / "replay").exists()
