"""What a resume refuses (another model family or shape, objective, seed or data stream) and what
it accepts but says (another batch split, sequence length, run length), and where it starts."""

from __future__ import annotations

import copy
import json
import shutil

import pytest

from tests.helpers import assert_user_error
from tests.train.conftest import RESUME_ARGS as ARGS
from tests.train.util import TINY, losses, metrics, tiny_spec
from turbo_dllm.errors import DllmError
from turbo_dllm.train.checkpoint import read_meta
from turbo_dllm.train.entry import train


def refused(run, *overrides, base=None) -> DllmError:
    with pytest.raises(DllmError) as caught:
        train(tiny_spec(*ARGS, *overrides, base=base), run)
    assert [r["step"] for r in metrics(run)] == [1, 2, 3, 4]  # nothing trained, nothing dropped
    return caught.value


def test_resume_onto_an_artifact_prepared_again_is_refused_naming_both_fingerprints(tmp_path):
    from tests.data.helpers import prepare_config, write_config, write_jsonl

    data = tmp_path / "data"

    def prepare(word: str):
        write_jsonl(
            data / "data.jsonl", [{"text": f"{word} {i} " + "xy" * (i % 23)} for i in range(300)]
        )
        config = write_config(
            data,
            packing={"seq_len": 64, "block_size": 8},
            output={"path": "out", "overwrite": True},
        )
        return prepare_config(config).manifest.fingerprint

    before = prepare("doc")
    base = copy.deepcopy(TINY)
    base["data"] = {"artifact": str(data / "out"), "seq_len": 64}
    train(tiny_spec(*ARGS, base=base), tmp_path / "run")
    shutil.rmtree(tmp_path / "run/checkpoints/step_00000004")
    after = prepare("other")
    assert after != before
    error = refused(tmp_path / "run", base=base)
    assert "trained on other data" in error.message
    assert before in error.message and after in error.message  # whole, to compare by eye
    assert "new run dir" in error.hint


@pytest.mark.parametrize(
    "override", ["data.synthetic.num_sequences=32", "data.synthetic.vocab_size=400"]
)
def test_resume_onto_other_synthetic_data_is_refused(run, override):
    error = refused(run, override)
    assert "trained on other data" in error.message and "synthetic data" in error.message


def test_resume_with_another_seed_is_refused(run):
    error = refused(run, "launch.seed=1")
    assert "launch.seed 0" in error.message and "has 1" in error.message
    assert "launch.seed: 0" in error.hint


def test_resume_with_another_objective_is_refused(run):
    error = refused(run, "objective.name=fast_dllm_v2")
    assert "objective block_diffusion" in error.message and "fast_dllm_v2" in error.message
    assert "objective.name: block_diffusion" in error.hint and "dllm export" in error.hint


def test_resume_with_another_model_shape_names_what_differs(run):
    error = refused(run, "model.config_overrides.num_hidden_layers=3")
    assert "different model shape than this RunSpec (num_hidden_layers 2 -> 3)" in error.message


def test_resume_of_another_familys_checkpoint_names_both_families(tmp_path):
    base = copy.deepcopy(TINY)
    base["model"] = {"family": "nemotron_diffusion", "from_config": "tiny"}
    base["objective"]["mask_token_id"] = 100  # the nemotron config's
    train(tiny_spec(*ARGS, base=base), tmp_path / "run")
    shutil.rmtree(tmp_path / "run/checkpoints/step_00000004")
    error = refused(tmp_path / "run", "objective.mask_token_id=100")
    assert "holds a nemotron_diffusion model and this RunSpec builds qwen3" in error.message
    assert "model_type nemotron_labs_diffusion -> qwen3" in error.message
    assert "model.family: nemotron_diffusion" in error.hint


def _diffusion_gemma_run(tmp_path):
    from tests.train.util import two_step_run

    base = two_step_run({"family": "diffusion_gemma", "from_config": "tiny"})
    base["objective"]["block_size"] = 16  # the preset's canvas_length
    train(tiny_spec(base=base), tmp_path / "dg")
    return base


def test_resume_into_a_diffusion_gemma_names_the_text_config_fields_that_differ(run, tmp_path):
    """diffusion_gemma keeps its sizes in text_config: the message compared top-level keys only
    and said `vocab_size 512 -> -` (both 512) of a qwen3 checkpoint resumed into it."""
    base = _diffusion_gemma_run(tmp_path)
    with pytest.raises(DllmError) as caught:
        train(tiny_spec(*ARGS, "training.steps=5", base=base), run)
    message = caught.value.message
    assert "holds a qwen3 model and this RunSpec builds diffusion_gemma" in message
    assert "num_hidden_layers 2 -> 3" in message
    assert "vocab_size" not in message  # 512 in both
    # A diffusion_gemma checkpoint resumed with another text_config size names that field.
    with pytest.raises(DllmError) as caught:
        train(
            tiny_spec("model.config_overrides.moe_intermediate_size=16", base=base),
            tmp_path / "dg",
        )
    message = caught.value.message
    assert "different model shape than this RunSpec (moe_intermediate_size 32 -> 16)" in message


def test_a_resume_says_which_batch_and_objective_settings_changed(run, capsys):
    capsys.readouterr()
    train(tiny_spec(*ARGS), run)  # the run's own spec: nothing to say
    assert "note: this resume changes" not in capsys.readouterr().err
    shutil.rmtree(run / "checkpoints/step_00000004")
    changed = (
        "training.steps=6",
        "training.micro_batch_size=2",
        "data.seq_len=32",
        "objective.block_size=4",
    )
    train(tiny_spec(*ARGS, *changed), run)
    err = capsys.readouterr().err
    for note in (
        "data.seq_len 64 -> 32",
        "training.micro_batch_size 4 -> 2",
        "training.steps 4 -> 6",
        "objective.block_size 8 -> 4",
        "the global batch 4 -> 2 sequences",
    ):
        assert note in err, note
    assert [r["step"] for r in metrics(run)] == list(range(1, 7))


def test_a_resume_says_which_schedule_clip_and_dtype_settings_changed(run, capsys):
    """The scheduler, clip_grad_norm and model.dtype changed on resume without a word: the
    trace was no longer the uninterrupted one (and bfloat16 rounded the float32 weights)."""
    capsys.readouterr()
    changed = (
        "scheduler.name=constant",
        "scheduler.warmup_steps=0",
        "training.clip_grad_norm=0.5",
        "model.dtype=bfloat16",
    )
    train(tiny_spec(*ARGS, *changed), run)
    err = capsys.readouterr().err
    for note in (
        "scheduler.name cosine -> constant",
        "scheduler.warmup_steps 2 -> 0",
        "training.clip_grad_norm 1.0 -> 0.5",
        "model.dtype float32 -> bfloat16 (the checkpoint's weights and optimizer state are "
        "rounded to bfloat16)",
    ):
        assert note in err, note


def test_a_split_of_the_same_global_batch_resumes_the_same_trace(run, tmp_path):
    """mb 4 x 1 saved, mb 2 x 2 resumed: the same samples and noise, the same losses."""
    straight = tmp_path / "straight"
    train(tiny_spec(*ARGS), straight)
    train(tiny_spec(*ARGS, "training.micro_batch_size=2", "training.grad_accumulation=2"), run)
    assert losses(run)[:2] == losses(straight)[:2]
    assert losses(run)[2:] == pytest.approx(losses(straight)[2:], rel=1e-5, abs=1e-5)


def test_resume_from_a_checkpoints_folder_takes_its_newest_complete_step(run, capsys):
    checkpoints = run / "checkpoints"
    shutil.copytree(checkpoints / "step_00000002", checkpoints / "step_00000001")
    (checkpoints / "step_00000003").mkdir()  # a partial step: no checkpoint.json
    (checkpoints / ".tmp-step_00000004").mkdir()  # a save that never finished
    capsys.readouterr()
    assert train(tiny_spec(*ARGS, f"checkpoint.resume={checkpoints}"), run) == 0
    assert f"resumed from {checkpoints / 'step_00000002'} (step 2)" in capsys.readouterr().err
    assert [r["step"] for r in metrics(run)] == [1, 2, 3, 4]


def test_resume_from_a_folder_without_checkpoints_is_refused(run, tmp_path):
    (tmp_path / "empty").mkdir()
    error = refused(run, f"checkpoint.resume={tmp_path / 'empty'}")
    assert "not a complete checkpoint" in error.message and "checkpoints/ folder" in error.hint


def test_a_restart_before_the_first_checkpoint_starts_the_metrics_over(tmp_path):
    """A run killed before its first checkpoint restarts at step 1: its metrics.jsonl held
    steps 1-3 of the dead attempt, which used to stay before the new 1-3."""
    args = ("training.steps=3", "checkpoint.interval=10")
    train(tiny_spec(*args), tmp_path / "run")
    shutil.rmtree(tmp_path / "run/checkpoints")
    train(tiny_spec(*args), tmp_path / "run")
    assert [r["step"] for r in metrics(tmp_path / "run")] == [1, 2, 3]


def test_resume_never_over_an_earlier_runs_checkpoints_is_refused(run):
    """Their higher steps would prune this run's checkpoints and be what `auto` resumes."""
    error = refused(run, "checkpoint.resume=never")
    assert "holds an earlier run's checkpoints (newest step_00000002)" in error.message
    assert "new run dir" in error.hint


def test_resume_from_another_runs_checkpoint_below_the_folders_newest_is_refused(
    run, tmp_path, capsys
):
    """Was: it trained, saved its steps beside the later steps of the folder's own run and
    left those newest: `auto` and `dllm export` took the other lineage, a prune removed the
    new steps first, and metrics.jsonl mixed the two."""
    train(tiny_spec(*ARGS), run)  # steps 3-4: the folder holds step_2 and step_4
    other = shutil.copytree(run / "checkpoints/step_00000002", tmp_path / "other/step_00000002")
    error = refused(run, f"checkpoint.resume={other}")
    assert f"checkpoint.resume is {str(other)!r} (step 2)" in error.message
    assert "later checkpoints of another run (step_00000004)" in error.message
    assert "new run dir" in error.hint and "after step 2" in error.hint
    # An earlier step of the folder itself (a rewind) goes on, saying what it will replace.
    capsys.readouterr()
    earlier = run / "checkpoints/step_00000002"
    assert train(tiny_spec(*ARGS, f"checkpoint.resume={earlier}"), run) == 0
    assert "holds checkpoints after step 2 (step_00000004): each is replaced" in (
        capsys.readouterr().err
    )
    # A rewind that ends before the old run's later step leaves it the folder's newest: the
    # closing line said only "done: 3 steps, checkpoint in F" (the crash audit).
    assert train(tiny_spec(*ARGS, "training.steps=3", f"checkpoint.resume={earlier}"), run) == 0
    said = capsys.readouterr()
    assert (
        "still holds the earlier run's later steps (step_00000004): `resume: auto` and `dllm "
        "export` take step_00000004, not this run's step 3"
    ) in said.err + said.out
    assert str(run / "checkpoints/step_00000003") in said.err + said.out


def test_a_restart_of_a_run_resumed_from_a_path_goes_on_from_its_own_later_steps(
    run, tmp_path, capsys
):
    """The same command again after a stop (or a launched run's `dllm train` line, whose
    spec keeps the path): the folder's later steps descend from that path, so the run goes on
    from its newest step instead of being refused or training again from the path."""
    source = run / "checkpoints"  # step_2
    branch = tmp_path / "branch"
    train(tiny_spec(*ARGS, "training.steps=3", f"checkpoint.resume={source}"), branch)
    assert read_meta(branch / "checkpoints/step_00000003").resumed_from == str(
        (source / "step_00000002").resolve()
    )
    capsys.readouterr()
    train(tiny_spec(*ARGS, f"checkpoint.resume={source}"), branch)
    err = capsys.readouterr().err
    assert "holds this run's later steps (step_00000003)" in err
    assert f"resumed from {branch / 'checkpoints/step_00000003'} (step 3)" in err
    assert [r["step"] for r in metrics(branch)] == [3, 4]
    # carried by each resume: the step 4 checkpoint descends from the same path
    assert read_meta(branch / "checkpoints/step_00000004").resumed_from == str(
        (source / "step_00000002").resolve()
    )


def test_resume_never_in_a_run_dir_without_checkpoints_starts_the_metrics_over(run):
    shutil.rmtree(run / "checkpoints")
    train(tiny_spec(*ARGS, "checkpoint.resume=never"), run)
    assert [r["step"] for r in metrics(run)] == [1, 2, 3, 4]


def test_the_checkpoint_records_the_settings_a_resume_compares(run):
    meta = json.loads((run / "checkpoints/step_00000002/checkpoint.json").read_text())
    assert meta["settings"]["data.seq_len"] == 64 and meta["settings"]["global_batch"] == 4
    assert meta["data_fingerprint"]  # synthetic data too


def test_cli_resume_with_another_objective_is_a_user_error(cli, run, tmp_path):
    from tests.train.util import write_config

    config = write_config(tmp_path / "train.yaml", *ARGS)
    result = cli(
        "train", "--config", config, "--run-dir", run, "--set", "objective.name=autoregressive"
    )
    assert_user_error(result, "objective block_diffusion")
