"""What a resume reads back: metrics.jsonl (torn lines included), the checkpoint (RNG, model
config) and what DCP says while it loads."""

from __future__ import annotations

import copy
import json
import shutil
import warnings

import pytest

from tests.train.conftest import RESUME_ARGS as ARGS
from tests.train.util import TINY, metrics, tiny_spec
from turbo_dllm.train.entry import train


def test_resume_after_a_torn_metrics_line(run):
    """A run killed mid-write leaves half a JSON line; the resume drops it and carries on."""
    text = (run / "metrics.jsonl").read_text().splitlines()
    (run / "metrics.jsonl").write_text("\n".join(text[:3]) + '\n{"step": 4, "lo')
    assert train(tiny_spec(*ARGS), run) == 0
    assert [r["step"] for r in metrics(run)] == [1, 2, 3, 4]


def test_resume_at_another_world_size_says_the_rng_is_not_restored(run, capsys):
    meta_path = run / "checkpoints/step_00000002/checkpoint.json"
    meta = json.loads(meta_path.read_text())
    meta["world_size"] = 2  # as if two ranks had saved it (their RNG files are rank-local)
    meta_path.write_text(json.dumps(meta))
    capsys.readouterr()
    train(tiny_spec(*ARGS), run)
    err = capsys.readouterr().err
    assert "was saved by 2 rank(s) and this run has 1: the RNG states are not restored" in err
    # and that this is harmless: a user resuming on another layout read it as a fault
    assert "(nothing the trace depends on: the noise and the data order are keyed" in err


def test_a_resume_says_which_optimizer_settings_the_checkpoint_keeps(run, capsys):
    capsys.readouterr()
    train(tiny_spec(*ARGS), run)  # the run's own spec: nothing to say
    assert "note: the optimizer" not in capsys.readouterr().err
    shutil.rmtree(run / "checkpoints/step_00000004")
    train(tiny_spec(*ARGS, "optimizer.lr=0.5", "optimizer.weight_decay=0.0"), run)
    err = capsys.readouterr().err
    assert "note: the optimizer resumes with the checkpoint's settings" in err
    assert "optimizer.lr " in err and "the spec says 0.5" in err
    assert "optimizer.weight_decay" in err and "optimizer.betas" not in err
    # Its way to the spec's settings was 'train into a new run dir', but a resume into a new
    # run dir (checkpoint.resume: PATH) loads the optimizer as well: a fresh one starts from
    # the exported weights.
    assert "train into a new run dir to use the spec's" not in err
    assert "`dllm export` it and train a new run with model.path set to the export" in err


def test_checkpoint_and_export_hide_only_the_known_dcp_notice(run, tmp_path, monkeypatch):
    """DCP's single-process notice is filtered; any other warning from a save, a load or an
    export reaches the user."""
    import torch.distributed.checkpoint as dcp

    from turbo_dllm.train.export import export_checkpoint

    def noisy(real):
        def call(*args, **kwargs):
            warnings.warn(f"new problem in {real.__name__}", UserWarning, stacklevel=2)
            return real(*args, **kwargs)

        return call

    monkeypatch.setattr(dcp, "save", noisy(dcp.save))
    monkeypatch.setattr(dcp, "load", noisy(dcp.load))
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        train(tiny_spec(*ARGS), run)  # a resume loads step 2, saves step 4
        export_checkpoint(run / "checkpoints", tmp_path / "hf")  # loads step 4
    messages = [str(w.message) for w in caught]
    assert messages.count("new problem in save") == 1 and messages.count("new problem in load") == 2
    assert not any("single process" in m for m in messages)


def test_a_checkpoint_from_before_the_token_ids_resumes(tmp_path):
    """Checkpoints written before the decoder config carried bos/eos/pad ids lack them."""
    from tests.train.test_export_generation import save_source_model

    save_source_model(tmp_path / "source")  # its config.json has eos and bos ids
    base = copy.deepcopy(TINY)
    base["model"] = {"path": str(tmp_path / "source"), "from_config": None}
    train(tiny_spec(*ARGS, base=base), tmp_path / "run")
    shutil.rmtree(tmp_path / "run/checkpoints/step_00000004")
    meta_path = tmp_path / "run/checkpoints/step_00000002/checkpoint.json"
    meta = json.loads(meta_path.read_text())
    for field in ("bos_token_id", "eos_token_id", "pad_token_id"):
        meta["model"].pop(field, None)
    meta_path.write_text(json.dumps(meta))
    assert train(tiny_spec(*ARGS, base=base), tmp_path / "run") == 0
    assert [r["step"] for r in metrics(tmp_path / "run")] == [1, 2, 3, 4]


@pytest.mark.parametrize("damage", ["truncated_tensors", "no_metadata", "torn_rng", "no_rng"])
def test_a_damaged_checkpoint_is_a_user_error_on_resume_and_export(
    run, tmp_path, cli, caplog, damage
):
    """A checkpoint folder with a torn or missing file (copied in half, a disk error) used to
    end a resume and an export in DCP's traceback; both now say which checkpoint is damaged."""
    from tests.helpers import assert_user_error
    from turbo_dllm.errors import DllmError

    step = run / "checkpoints/step_00000002"
    if damage == "truncated_tensors":
        with (step / "__0_0.distcp").open("r+b") as handle:
            handle.truncate(1000)
    elif damage == "no_metadata":
        (step / ".metadata").unlink()
    elif damage == "no_rng":  # copied in part: was skipped without a word
        (step / "rank_00000.pt").unlink()
    else:
        (step / "rank_00000.pt").write_bytes(b"torn")
    with pytest.raises(DllmError, match="cannot read the checkpoint"):
        train(tiny_spec(*ARGS), run)
    assert not any("metadata is not found" in r.getMessage() for r in caplog.records)
    if damage not in ("torn_rng", "no_rng"):  # export reads no RNG state
        result = cli("export", "--checkpoint", step, "--out", tmp_path / "hf")
        assert_user_error(result, f"cannot read the checkpoint {str(step)!r}")
        assert not (tmp_path / "hf").exists()


def test_a_missing_step_names_the_checkpoints_there(run, tmp_path, cli):
    from tests.helpers import assert_user_error

    listed = f"{run / 'checkpoints'} has step_00000002"
    wrong = run / "checkpoints/step_00000009"  # a typo'd step
    result = cli("export", "--checkpoint", wrong, "--out", tmp_path / "hf")
    assert_user_error(result, f"not a checkpoint: {str(wrong)!r}", listed)
    wrong = run / "checkpoints/other"  # a folder beside the steps
    wrong.mkdir()
    result = cli("export", "--checkpoint", wrong, "--out", tmp_path / "hf")
    assert_user_error(result, f"not a checkpoint: {str(wrong)!r}", listed)


def test_a_checkpoint_with_fields_this_version_does_not_know_resumes(run):
    """A newer turbo-dllm that records more (a field, a setting) writes the same format: this
    version ignores what it does not know instead of refusing the whole checkpoint."""
    meta_path = run / "checkpoints/step_00000002/checkpoint.json"
    meta = json.loads(meta_path.read_text())
    meta["tokenizer_sha256"] = "0" * 64
    meta["settings"]["objective.some_new_option"] = 3
    meta_path.write_text(json.dumps(meta))
    assert train(tiny_spec(*ARGS), run) == 0
    assert [r["step"] for r in metrics(run)] == [1, 2, 3, 4]


@pytest.mark.parametrize(
    ("field", "value", "said"),
    [
        ("format", "turbo_dllm.checkpoint.v2", "format is 'turbo_dllm.checkpoint.v2', and this"),
        ("step", "two", "step: Input should be a valid integer"),
    ],
)
def test_a_checkpoint_of_another_format_or_a_bad_field_is_refused_naming_it(
    run, field, value, said
):
    """What changes the meaning (another format, a known field that does not parse) is refused
    in one line that names it, not with pydantic's multi-line report."""
    from turbo_dllm.errors import DllmError

    meta_path = run / "checkpoints/step_00000002/checkpoint.json"
    meta = json.loads(meta_path.read_text())
    meta[field] = value
    meta_path.write_text(json.dumps(meta))
    with pytest.raises(DllmError) as caught:
        train(tiny_spec(*ARGS), run)
    assert said in caught.value.message and "\n" not in caught.value.message
    if field == "format":
        assert "'turbo_dllm.checkpoint.v1'" in caught.value.message
        assert "another turbo-dllm version" in caught.value.hint
    assert [r["step"] for r in metrics(run)] == [1, 2, 3, 4]  # nothing trained, nothing dropped


def test_a_longer_resumed_run_follows_its_own_schedule_from_its_first_step(tmp_path):
    """A resume with more `training.steps` rebuilds the schedule: its first step already runs
    at the new schedule's rate (it ran at the saved run's last one), the same as a run trained
    with those steps from the start."""
    common = ("checkpoint.interval=3", "scheduler.warmup_steps=1")
    assert train(tiny_spec("training.steps=3", *common), tmp_path / "run") == 0
    assert train(tiny_spec("training.steps=6", *common), tmp_path / "run") == 0
    assert train(tiny_spec("training.steps=6", *common), tmp_path / "fresh") == 0
    resumed = {r["step"]: r["lr"] for r in metrics(tmp_path / "run")}
    fresh = {r["step"]: r["lr"] for r in metrics(tmp_path / "fresh")}
    assert sorted(resumed) == sorted(fresh) == [1, 2, 3, 4, 5, 6]
    assert resumed[3] != fresh[3]  # the short run decayed to its floor by its step 3
    for step in (4, 5, 6):
        assert resumed[step] == pytest.approx(fresh[step], rel=1e-12), step
