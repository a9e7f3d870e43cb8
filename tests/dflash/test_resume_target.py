"""A drafter resumes only against the target its checkpoint was trained against: a same-shape
target with other weights (another folder, or the same folder's files replaced) is refused; a
copy of the same target resumes; a checkpoint from before the record existed still resumes."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from tests.dflash.helpers import drafter_spec
from tests.train.util import metrics
from turbo_dllm.errors import DllmError
from turbo_dllm.train.entry import train


def _other_weights(target: Path, out: Path) -> Path:
    """A copy of `target` (same config, same shapes) with one layer's weights changed."""
    from safetensors.torch import load_file, save_file

    shutil.copytree(target, out)
    tensors = load_file(str(target / "model.safetensors"))
    name = "model.layers.0.mlp.down_proj.weight"
    tensors[name] = tensors[name] + 0.01
    (out / "model.safetensors").unlink()
    save_file(tensors, str(out / "model.safetensors"), metadata={"format": "pt"})
    return out


def _spec(target: Path, world, steps: int):
    return drafter_spec(
        target, world["artifact"], f"training.steps={steps}", "checkpoint.interval=2"
    )


@pytest.fixture(scope="module")
def targets(world, tmp_path_factory):
    root = tmp_path_factory.mktemp("targets")
    a = world["target"]
    return {
        "a": a,
        "b": _other_weights(a, root / "b"),
        "a_copy": shutil.copytree(a, root / "a-copy"),
    }


def test_a_resume_against_other_target_weights_is_refused(world, targets, tmp_path):
    run = tmp_path / "run"
    train(_spec(targets["a"], world, 2), run)
    recorded = json.loads((run / "checkpoints/step_00000002/checkpoint.json").read_text())
    assert recorded["target"]["path"] == str(Path(targets["a"]).absolute())
    with pytest.raises(DllmError) as caught:
        train(_spec(targets["b"], world, 4), run)
    error = caught.value
    assert "step_00000002" in error.message
    assert str(targets["a"]) in error.message and str(targets["b"]) in error.message
    assert "model.dflash.target" in error.hint
    assert [r["step"] for r in metrics(run)] == [1, 2]  # nothing trained against B
    # the target it was trained against, or a copy of it elsewhere, resumes
    train(_spec(targets["a_copy"], world, 3), run)
    train(_spec(targets["a"], world, 4), run)
    assert [r["step"] for r in metrics(run)] == [1, 2, 3, 4]


def test_a_target_folder_whose_weights_were_replaced_is_refused(world, targets, tmp_path):
    folder = shutil.copytree(targets["a"], tmp_path / "target")
    run = tmp_path / "run"
    train(_spec(folder, world, 2), run)
    # the same path, the same sizes, other bytes: the files' record must not vouch for them
    shutil.copyfile(targets["b"] / "model.safetensors", folder / "model.safetensors")
    with pytest.raises(DllmError, match="other weights"):
        train(_spec(folder, world, 4), run)


def test_a_checkpoint_without_the_record_still_resumes(world, targets, tmp_path, capsys):
    run = tmp_path / "run"
    train(_spec(targets["a"], world, 2), run)
    meta = run / "checkpoints/step_00000002/checkpoint.json"
    document = json.loads(meta.read_text())
    del document["target"]  # as written before the target was recorded
    meta.write_text(json.dumps(document))
    capsys.readouterr()
    train(_spec(targets["a"], world, 4), run)
    assert [r["step"] for r in metrics(run)] == [1, 2, 3, 4]
    assert "does not record its target" in capsys.readouterr().err


@pytest.mark.slow
def test_two_processes_refuse_together(world, targets, tmp_path):
    """Rank 0 checks the target and every rank refuses with it: none goes on into the load's
    collectives (a hang), and the error is rank 0's."""
    import os
    import subprocess
    import sys

    import yaml

    from tests.dflash.helpers import drafter_document

    run = tmp_path / "run"
    train(_spec(targets["a"], world, 2), run)
    config = tmp_path / "train.yaml"
    args = ("training.steps=4", "checkpoint.interval=2", "topology.dp=2")
    config.write_text(yaml.safe_dump(drafter_document(targets["b"], world["artifact"], *args)))
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node=2"]
    command += ["-m", "turbo_dllm", "train", "--config", str(config), "--run-dir", str(run)]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    proc = subprocess.run(
        command, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300
    )
    assert proc.returncode != 0
    assert "holds other weights" in proc.stderr and "rank 0 refused" in proc.stderr
    assert [r["step"] for r in metrics(run)] == [1, 2]
