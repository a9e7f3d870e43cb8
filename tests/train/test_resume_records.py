"""What a resume reads back: metrics.jsonl (torn lines included), the checkpoint (RNG, model
config) and what DCP says while it loads."""

from __future__ import annotations

import copy
import json
import shutil
import warnings

from tests.train.util import TINY, metrics, tiny_spec
from turbo_dllm.train.entry import train


def test_resume_after_a_torn_metrics_line(tmp_path):
    """A run killed mid-write leaves half a JSON line; the resume drops it and carries on."""
    args = ("training.steps=4", "checkpoint.interval=2", "checkpoint.keep_last=2")
    train(tiny_spec(*args), tmp_path)
    shutil.rmtree(tmp_path / "checkpoints/step_00000004")  # the crash came after step 3
    text = (tmp_path / "metrics.jsonl").read_text().splitlines()
    (tmp_path / "metrics.jsonl").write_text("\n".join(text[:3]) + '\n{"step": 4, "lo')
    assert train(tiny_spec(*args), tmp_path) == 0
    assert [r["step"] for r in metrics(tmp_path)] == [1, 2, 3, 4]


def test_resume_at_another_world_size_says_the_rng_is_not_restored(tmp_path, capsys):
    args = ("training.steps=4", "checkpoint.interval=2", "checkpoint.keep_last=2")
    train(tiny_spec(*args), tmp_path)
    shutil.rmtree(tmp_path / "checkpoints/step_00000004")
    meta_path = tmp_path / "checkpoints/step_00000002/checkpoint.json"
    meta = json.loads(meta_path.read_text())
    meta["world_size"] = 2  # as if two ranks had saved it (their RNG files are rank-local)
    meta_path.write_text(json.dumps(meta))
    capsys.readouterr()
    train(tiny_spec(*args), tmp_path)
    assert "was saved by 2 rank(s) and this run has 1: the RNG states are not restored" in (
        capsys.readouterr().err
    )


def test_checkpoint_and_export_hide_only_the_known_dcp_notice(tmp_path, monkeypatch):
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
    args = ("training.steps=4", "checkpoint.interval=2")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        train(tiny_spec(*args), tmp_path / "run")
        shutil.rmtree(tmp_path / "run/checkpoints/step_00000004")
        train(tiny_spec(*args), tmp_path / "run")  # a resume loads
        export_checkpoint(tmp_path / "run/checkpoints", tmp_path / "hf")
    messages = [str(w.message) for w in caught]
    assert messages.count("new problem in save") == 3 and messages.count("new problem in load") == 2
    assert not any("single process" in m for m in messages)


def test_a_checkpoint_from_before_the_token_ids_resumes(tmp_path):
    """Checkpoints written before the decoder config carried bos/eos/pad ids lack them."""
    from tests.train.test_export_generation import save_source_model

    save_source_model(tmp_path / "source")  # its config.json has eos and bos ids
    base = copy.deepcopy(TINY)
    base["model"] = {"path": str(tmp_path / "source"), "from_config": None}
    args = ("training.steps=4", "checkpoint.interval=2", "checkpoint.keep_last=2")
    train(tiny_spec(*args, base=base), tmp_path / "run")
    shutil.rmtree(tmp_path / "run/checkpoints/step_00000004")
    meta_path = tmp_path / "run/checkpoints/step_00000002/checkpoint.json"
    meta = json.loads(meta_path.read_text())
    for field in ("bos_token_id", "eos_token_id", "pad_token_id"):
        meta["model"].pop(field, None)
    meta_path.write_text(json.dumps(meta))
    assert train(tiny_spec(*args, base=base), tmp_path / "run") == 0
    assert [r["step"] for r in metrics(tmp_path / "run")] == [1, 2, 3, 4]
