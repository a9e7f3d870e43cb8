"""Held-out evaluation during training (`eval:`, `train/evaluate.py`).

The data is real text every machine has: the training artifact is made from the standard
library's `json` and `argparse` sources, the held-out one from `textwrap`'s, both with the
byte-level tokenizer. The oracle for the logged eval loss is a separate computation: the
checkpoint of that step loaded into a plain model, every held-out sequence corrupted in one batch
under the documented noise key, and the objective's loss over the whole-sequence mask.
"""

from __future__ import annotations

import argparse
import inspect
import json
import os
import signal
import textwrap
import time
import types
from functools import partial

import pytest
import torch

from tests.data.helpers import prepare_config, write_jsonl
from tests.data.helpers import write_config as write_prepare_config
from tests.distributed.test_csbp_training import train_under_torchrun
from tests.train.util import metrics, tiny_spec, write_config
from turbo_dllm.data.compat import eval_artifact_problems
from turbo_dllm.errors import DllmError
from turbo_dllm.train.attention import ReferenceAttention
from turbo_dllm.train.checkpoint import read_meta
from turbo_dllm.train.data import build_data
from turbo_dllm.train.distributed import init_distributed
from turbo_dllm.train.entry import train
from turbo_dllm.train.evaluate import EVAL_STEP, build_eval_set
from turbo_dllm.train.objectives import NoiseKey, build_objective, score
from turbo_dllm.train.trainer import Trainer

SEQ = 64


def _artifact(folder, modules, seq_len: int = SEQ):
    """A byte-level artifact of these modules' sources, one document per 12 lines."""
    lines = [line for module in modules for line in inspect.getsource(module).splitlines()]
    docs = ["\n".join(lines[i : i + 12]) for i in range(0, len(lines), 12)]
    write_jsonl(folder / "data.jsonl", [{"text": d} for d in docs if d.strip()])
    prepare_config(write_prepare_config(folder, packing={"seq_len": seq_len, "block_size": 8}))
    return folder / "out"


@pytest.fixture(scope="module")
def artifacts(tmp_path_factory):
    root = tmp_path_factory.mktemp("eval-data")
    return _artifact(root / "train", [json, argparse]), _artifact(root / "heldout", [textwrap])


def _args(artifacts, *more: str) -> tuple[str, ...]:
    train_data, heldout = artifacts
    return (
        "training.steps=5",
        "checkpoint.interval=2",
        "checkpoint.keep_last=5",
        "data.synthetic=null",
        f"data.artifact={train_data}",
        f"eval.artifact={heldout}",
        "eval.interval=2",
        "eval.sequences=8",
        *more,
    )


def _independent_eval_loss(spec, checkpoint) -> float:
    """The held-out loss at `checkpoint`'s weights, computed apart from the trainer's
    evaluation: all evaluated sequences in one batch, the whole-sequence reference mask."""
    resumed = spec.model_copy(
        update={"checkpoint": spec.checkpoint.model_copy(update={"resume": str(checkpoint)})}
    )
    trainer = Trainer(resumed, checkpoint.parent.parent / "oracle", init_distributed())
    trainer.build()
    trainer.resume()
    from turbo_dllm.data.artifact import DataArtifact

    heldout = DataArtifact(spec.eval.artifact)
    rows = [heldout.row(i) for i in range(spec.eval.sequences)]
    batch = {
        "input_ids": torch.stack([torch.from_numpy(r[0]) for r in rows]),
        "loss_mask": torch.stack([torch.from_numpy(r[1]) for r in rows]),
        "doc_ids": torch.stack([torch.from_numpy(r[2]) for r in rows]),
    }
    data = build_data(spec, model_vocab_size=trainer.model_config.vocab_size, dp_rank=0, dp_size=1)
    objective = build_objective(spec.objective, data.mask_token_id)
    key = NoiseKey(spec.launch.seed, EVAL_STEP, 0, spec.eval.sequences)
    diffusion = objective.corrupt(batch, key)
    mask = ReferenceAttention().prepare(diffusion.layout, diffusion.doc_ids, torch.device("cpu"))
    with torch.no_grad():
        total = trainer.model(
            diffusion.input_ids,
            diffusion.layout.positions(torch.device("cpu")),
            mask,
            output=partial(score, diffusion),
        )
    trainer.checkpointer.release()
    return float(total) / objective.supervised_count(batch, key=key)


def test_evaluations_follow_the_interval_and_the_last_step_and_match_an_independent_loss(
    tmp_path, artifacts
):
    spec = tiny_spec(*_args(artifacts))
    run = tmp_path / "run"
    train(spec, run)
    records = {r["step"]: r for r in metrics(run)}
    assert [s for s, r in records.items() if "eval_loss" in r] == [2, 4, 5]
    assert all(records[s]["eval_sequences"] == 8 for s in (2, 4, 5))
    for step in (2, 4):
        expected = _independent_eval_loss(spec, run / f"checkpoints/step_{step:08d}")
        assert records[step]["eval_loss"] == pytest.approx(expected, rel=1e-5), step
    # the weights moved, the held-out batches did not: the curve reads the weights
    assert records[2]["eval_loss"] != records[4]["eval_loss"]


def test_the_same_weights_evaluate_to_the_same_loss(tmp_path, artifacts):
    spec = tiny_spec(*_args(artifacts, "training.steps=2"))
    trainer = Trainer(spec, tmp_path / "run", init_distributed()).build()
    first, second = trainer.evaluate(), trainer.evaluate()
    trainer.checkpointer.release()
    assert first["eval_loss"] == second["eval_loss"]


@pytest.mark.slow
@pytest.mark.parametrize(
    "topology,same_batch",
    # two dp ranks train a global batch of 8: one process takes it in two accumulated halves
    [("topology.fsdp=2", "training.grad_accumulation=2"), ("topology.bp=2", None)],
    ids=["dp2", "bp2"],
)
def test_the_eval_loss_is_one_process_s_under_torchrun(tmp_path, artifacts, topology, same_batch):
    """8 held-out sequences: 2 micro-batches of 4 on one process, one on each of 2 dp ranks, or
    both on a block-parallel pair; the loss is one process's at every evaluation."""
    single = tmp_path / "single"
    train(tiny_spec(*_args(artifacts), *([same_batch] if same_batch else [])), single)
    config = write_config(tmp_path / "train.yaml", *_args(artifacts))
    run = tmp_path / "run"
    train_under_torchrun(2, config, run, topology)
    for key in ("loss", "eval_loss"):  # the same training, then the same evaluations
        want = [r[key] for r in metrics(single) if key in r]
        got = [r[key] for r in metrics(run) if key in r]
        assert len(got) == len(want) > 0
        torch.testing.assert_close(got, want, rtol=5e-5, atol=5e-5, msg=key)


def test_held_out_data_that_does_not_fit_is_named(tmp_path, artifacts):
    train_data, heldout = artifacts
    longer = _artifact(tmp_path / "long", [textwrap], seq_len=2 * SEQ)
    with pytest.raises(DllmError, match="the held-out data does not fit the run") as error:
        build_eval_set(
            tiny_spec(*_args(artifacts, f"eval.artifact={longer}")), dp_rank=0, dp_size=1
        )
    assert "eval.artifact: data.seq_len: 64, but the artifact holds sequences of 128" in str(
        error.value.message
    )
    # fewer sequences than one global micro-batch (4 x 2 data-parallel ranks)
    spec = tiny_spec(*_args(artifacts, "eval.sequences=5"))
    with pytest.raises(DllmError, match="make no whole global micro-batch of 8") as error:
        build_eval_set(spec, dp_rank=0, dp_size=2)
    assert "eval.sequences" in error.value.hint
    assert build_eval_set(spec, dp_rank=0, dp_size=1).sequences == 4  # rounded down


def test_held_out_data_of_another_tokenizer_is_named(artifacts):
    from turbo_dllm.data.artifact import read_manifest

    train_data, heldout = artifacts
    spec = tiny_spec(*_args(artifacts))
    train_manifest = read_manifest(train_data)
    assert eval_artifact_problems(read_manifest(heldout), spec, train_manifest) == []
    other = train_manifest.tokenizer.model_copy(update={"vocab_sha256": "0" * 64})
    found = eval_artifact_problems(
        read_manifest(heldout), spec, train_manifest.model_copy(update={"tokenizer": other})
    )
    assert len(found) == 1 and "prepared with another tokenizer than data.artifact" in found[0]


def test_a_drafter_run_is_pointed_at_dflash_eval(artifacts):
    from turbo_dllm.config.runspec import RunSpec
    from turbo_dllm.config.validate import problems

    train_data, heldout = artifacts
    spec = RunSpec.model_validate(
        {
            "objective": {"name": "dflash_distillation"},
            "eval": {"artifact": str(heldout), "interval": 5},
        }
    )
    messages = [p.message for p in problems(spec) if p.path == "eval"]
    assert messages and "dllm dflash eval" in messages[0]


def test_doctor_checks_the_held_out_data(tmp_path, artifacts, cli):
    train_data, heldout = artifacts

    def held_out(*more: str) -> dict:
        config = write_config(tmp_path / "train.yaml", *_args(artifacts, *more))
        report = json.loads(cli("doctor", "--config", str(config), "--json").out)
        return next(c for c in report["checks"] if c["name"] == "held-out data")

    check = held_out()
    assert check["status"] == "pass" and "8 of" in check["detail"], check
    missing = held_out(f"eval.artifact={tmp_path / 'nothere'}")
    assert missing["status"] == "fail" and "has not been prepared yet" in missing["detail"]
    assert missing["fix"].startswith("dllm data prepare --config")
    longer = _artifact(tmp_path / "long", [textwrap], seq_len=2 * SEQ)
    misfit = held_out(f"eval.artifact={longer}")
    assert misfit["status"] == "fail" and "eval.artifact: data.seq_len: 64" in misfit["detail"]


def test_sigterm_during_an_evaluation_saves_that_step_at_once(tmp_path, artifacts, monkeypatch):
    """A SIGTERM that arrives while the held-out sequences run leaves the evaluation off and
    saves the step it follows: before, the whole evaluation ran, then one more step, and only
    then the save (a long evaluation outlasted the scheduler's grace period before SIGKILL)."""
    forwards_after_signal = []
    build_model = Trainer.build_model

    def build_with_a_signal_in_the_evaluation(self):
        build_model(self)
        forward = self.model.forward

        def forward_then_signal(*args, **kwargs):
            if not torch.is_grad_enabled():  # an evaluation's forward
                if not forwards_after_signal:
                    # the trainer's handler, never the default (which would end pytest)
                    assert signal.getsignal(signal.SIGTERM) != signal.SIG_DFL
                    os.kill(os.getpid(), signal.SIGTERM)
                forwards_after_signal.append(1)
            return forward(*args, **kwargs)

        self.model.forward = forward_then_signal

    monkeypatch.setattr(Trainer, "build_model", build_with_a_signal_in_the_evaluation)
    # 16 held-out sequences: 4 micro-batches; no checkpoint before the end
    spec = tiny_spec(*_args(artifacts, "eval.sequences=16", "checkpoint.interval=100"))
    run = tmp_path / "run"
    assert train(spec, run) == 143
    assert sorted(p.name for p in (run / "checkpoints").glob("step_*")) == ["step_00000002"]
    assert [r["step"] for r in metrics(run)] == [1, 2]
    assert not any("eval_loss" in r for r in metrics(run))
    assert metrics(run)[-1]["eval_left_off"] == "SIGTERM"  # why step 2 has no eval_loss
    assert len(forwards_after_signal) == 1  # the forward under way, no more


def test_doctor_counts_the_evaluated_sequences_as_the_trainer_rounds_them(tmp_path, artifacts, cli):
    """5 sequences with 2 data-parallel ranks of micro-batch 4 make no global micro-batch: the
    trainer refuses it, so doctor fails it (it passed, saying '5 of ...')."""

    def held_out(*more: str) -> dict:
        config = write_config(tmp_path / "train.yaml", *_args(artifacts, *more))
        report = json.loads(cli("doctor", "--config", str(config), "--json").out)
        return next(c for c in report["checks"] if c["name"] == "held-out data")

    assert "4 of" in held_out("eval.sequences=5")["detail"]  # rounded down to 4, as trained
    refused = held_out("eval.sequences=5", "topology.fsdp=2")
    assert refused["status"] == "fail", refused
    assert "make no whole global micro-batch of 8" in refused["detail"]
    assert refused["fix"].startswith("evaluate at least 8 sequences")


def test_a_launch_with_unprepared_held_out_data_is_refused_before_anything_is_written(
    tmp_path, artifacts, cli
):
    """It recorded the run and started it, and the trainer stopped before its first step with
    'data artifact not found', naming no eval.artifact."""
    config = write_config(
        tmp_path / "train.yaml", *_args(artifacts, f"eval.artifact={tmp_path / 'nothere'}")
    )
    run = tmp_path / "run"
    result = cli("launch", "--config", str(config), "--run-dir", str(run))
    assert result.code == 2, result.err
    assert "held-out data: eval.artifact" in result.err and "not been prepared" in result.err
    assert not run.exists()
    with pytest.raises(DllmError, match="^eval.artifact: data artifact not found"):
        build_eval_set(
            tiny_spec(*_args(artifacts, f"eval.artifact={tmp_path / 'nothere'}")),
            dp_rank=0,
            dp_size=1,
        )


def test_synthetic_training_data_s_mask_token_must_not_be_held_out_text(artifacts):
    """Synthetic data masks with its vocabulary's last id: 199 for a vocabulary of 200, a real
    byte of the byte-level held-out text (260 ids), and nothing said so. 511 (vocabulary 512)
    is outside the held-out ids: nothing to say."""
    from turbo_dllm.data.artifact import read_manifest

    train_data, heldout = artifacts
    manifest = read_manifest(heldout)
    mask = manifest.special_tokens["mask"]
    base = ("data.artifact=null", f"eval.artifact={heldout}", "eval.interval=2")
    found = eval_artifact_problems(manifest, tiny_spec(*base, "data.synthetic.vocab_size=200"))
    assert len(found) == 1 and "the run masks with token 199 (synthetic data's)" in found[0]
    assert f"set objective.mask_token_id: {mask}" in found[0]
    assert eval_artifact_problems(manifest, tiny_spec(*base, "data.synthetic.vocab_size=512")) == []
    fixed = tiny_spec(*base, "data.synthetic.vocab_size=512", f"objective.mask_token_id={mask}")
    assert eval_artifact_problems(manifest, fixed) == []


def test_the_evaluation_runs_the_model_in_eval_mode_and_gives_it_back_for_training(
    tmp_path, artifacts
):
    spec = tiny_spec(*_args(artifacts, "training.steps=2"))
    trainer = Trainer(spec, tmp_path / "run", init_distributed()).build()
    seen = []
    hook = trainer.model.register_forward_pre_hook(
        lambda module, args: seen.append(module.training)
    )
    trainer.evaluate()
    hook.remove()
    trainer.checkpointer.release()
    assert seen and not any(seen)
    assert trainer.model.training
    # only the corrupted copies of the held-out rows stay on the host, not the rows as well
    assert trainer.eval_set.batches == [] and len(trainer._eval_batches) == 2


def _slow_evaluation(monkeypatch, seconds: float, slow: int = 0) -> list:
    """Trainer models whose evaluation forward number `slow` (of the first evaluation) moves
    the trainer's clock on by `seconds` (a slow evaluation, without waiting for it: on a loaded
    machine two tiny steps took 2 s); the list counts the evaluation forwards."""
    import turbo_dllm.train.trainer as trainer_module

    forwards: list = []
    late = [0.0]
    clock = types.SimpleNamespace(perf_counter=lambda: time.perf_counter() + late[0])
    monkeypatch.setattr(trainer_module, "time", clock)
    build_model = Trainer.build_model

    def build_with_a_slow_evaluation(self):
        build_model(self)
        forward = self.model.forward

        def slow_forward(*args, **kwargs):
            if not torch.is_grad_enabled():  # an evaluation's forward
                if len(forwards) == slow:
                    late[0] += seconds
                forwards.append(1)
            return forward(*args, **kwargs)

        self.model.forward = slow_forward

    monkeypatch.setattr(Trainer, "build_model", build_with_a_slow_evaluation)
    return forwards


def test_a_time_limit_that_runs_out_during_an_evaluation_leaves_it_off_and_saves_that_step(
    tmp_path, artifacts, monkeypatch
):
    """training.max_duration_s was read at step boundaries only: an evaluation that outlasted
    it ran to its end, logged its eval_loss, and one more step ran before the stop. Now the
    budget is read between the evaluation's micro-batches: the rest is left off, the step it
    follows is saved (exit status 0, as any time-limit stop), and its record says why it has
    no eval_loss."""
    budget = 600.0  # two tiny steps take less; the first evaluation forward spends it
    forwards = _slow_evaluation(monkeypatch, budget)
    spec = tiny_spec(
        *_args(artifacts, "eval.sequences=16", "checkpoint.interval=100"),
        f"training.max_duration_s={budget}",
    )
    run = tmp_path / "run"
    assert train(spec, run) == 0
    assert sorted(p.name for p in (run / "checkpoints").glob("step_*")) == ["step_00000002"]
    records = metrics(run)
    assert [r["step"] for r in records] == [1, 2]
    assert not any("eval_loss" in r for r in records)  # 1 of 4 micro-batches: no loss at all
    assert records[-1]["eval_left_off"] == "training.max_duration_s"
    assert len(forwards) == 1  # of the 4 micro-batches
    # the checkpoint counts the evaluation's time as training time, as a step-boundary stop does
    assert read_meta(run / "checkpoints/step_00000002").train_time_s >= budget


def test_a_time_limit_that_runs_out_during_the_last_evaluation_forward_stops_after_it(
    tmp_path, artifacts, monkeypatch
):
    """The whole evaluation ran: its loss is logged, and the run stops there with that step
    saved instead of training one more step first."""
    budget = 600.0
    forwards = _slow_evaluation(monkeypatch, budget, slow=3)  # the last of 4 micro-batches
    spec = tiny_spec(
        *_args(artifacts, "eval.sequences=16", "checkpoint.interval=100"),
        f"training.max_duration_s={budget}",
    )
    run = tmp_path / "run"
    assert train(spec, run) == 0
    assert sorted(p.name for p in (run / "checkpoints").glob("step_*")) == ["step_00000002"]
    records = metrics(run)
    assert [r["step"] for r in records] == [1, 2]
    assert records[-1]["eval_sequences"] == 16 and "eval_left_off" not in records[-1]
    assert len(forwards) == 4
    expected = _independent_eval_loss(spec, run / "checkpoints/step_00000002")
    assert records[-1]["eval_loss"] == pytest.approx(expected, rel=1e-5)


def test_dllm_train_refuses_misfit_held_out_data_before_making_the_run_dir(
    tmp_path, artifacts, cli
):
    """The trainer named the misfit, but only after `dllm train` had made the run dir: each
    refused attempt left an empty one (a fresh runs/<stamp>-<id> every time by default)."""
    longer = _artifact(tmp_path / "long", [textwrap], seq_len=2 * SEQ)
    for more, said in (
        (f"eval.artifact={longer}", "eval.artifact: data.seq_len: 64, but the artifact holds"),
        ("eval.sequences=3", "make no whole global micro-batch of 4"),
        (f"eval.artifact={tmp_path / 'nothere'}", "eval.artifact: data artifact not found"),
    ):
        config = write_config(tmp_path / "train.yaml", *_args(artifacts, more))
        run = tmp_path / "run"
        result = cli("train", "--config", str(config), "--run-dir", str(run))
        assert result.code == 2 and said in result.err, result.err
        assert not run.exists()


def test_a_resume_that_evaluates_other_held_out_data_says_so(tmp_path, artifacts, capsys):
    """eval.sequences (or the eval artifact) changed on resume without a word: the eval_loss
    curve then measured other sequences from the resumed step on."""
    run = tmp_path / "run"
    train(tiny_spec(*_args(artifacts, "training.steps=2")), run)
    capsys.readouterr()
    train(tiny_spec(*_args(artifacts, "training.steps=4", "eval.sequences=4")), run)
    err = capsys.readouterr().err
    assert "eval.sequences 8 -> 4 (the evaluated sequences: its eval_loss is not comparable" in err


@pytest.mark.parametrize(
    ("sequences", "note"),
    [
        ("10", "note: eval.sequences is 10; each evaluation scores 8 (rounded down to whole "
         "global micro-batches of 4)"),
        ("100000", "note: eval.sequences is 100,000; each evaluation scores"),
    ],
)  # fmt: skip
def test_an_evaluation_of_fewer_sequences_than_asked_says_so(
    tmp_path, artifacts, capsys, sequences, note
):
    """eval.sequences above the artifact's count, or off whole global micro-batches, scored
    fewer sequences without a word (only eval_sequences in the metrics showed it)."""
    capsys.readouterr()
    train(tiny_spec(*_args(artifacts, "training.steps=2", f"eval.sequences={sequences}")), tmp_path)
    err = capsys.readouterr().err
    assert note in err
    if sequences == "100000":
        assert "(the held-out artifact holds " in err
        return  # the run without a note below is the same for both cases: asserted once
    capsys.readouterr()
    train(tiny_spec(*_args(artifacts, "training.steps=2")), tmp_path / "exact")  # 8: all of it
    assert "note: eval.sequences" not in capsys.readouterr().err
