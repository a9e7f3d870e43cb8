"""`dllm export --checkpoint RUN` of a run that is still training: the run saves a newer step
and prunes (checkpoint.keep_last) the one the export is reading. The export failed, naming
the step as damaged ('cannot read the checkpoint ... metadata is None') or as one that does
not exist; 10 of 12 exports of a real run at keep_last 1 failed so. It now exports the newest
step, saying so, and names what happened where the step was given itself. The prune here is
the run's own code (`Checkpointer._prune`), called as the export reads."""

from __future__ import annotations

import shutil

import pytest

from tests.helpers import assert_user_error
from tests.train.util import tiny_spec
from turbo_dllm.train import checkpoint as checkpointing
from turbo_dllm.train.entry import train


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    run = tmp_path_factory.mktemp("pruned") / "run"
    train(tiny_spec("training.steps=4", "checkpoint.interval=2", "checkpoint.keep_last=2"), run)
    return run


@pytest.fixture
def run(trained, tmp_path, monkeypatch):
    """A copy whose step 4 is 'not saved yet': the export's first read finds step 2 the
    newest; as it reads, the run saves step 4 and prunes step 2 (keep_last 1)."""
    run = shutil.copytree(trained, tmp_path / "run")
    checkpoints = run / "checkpoints"
    later = checkpoints / "step_00000004"
    hidden = later.rename(tmp_path / "step_4_not_saved_yet")
    real = checkpointing.load_tensors
    reads = []

    def load_while_the_run_saves(state, path):
        reads.append(path)
        if len(reads) == 1:
            hidden.rename(later)  # the run's save of step 4, then its prune
            checkpointing.Checkpointer(checkpoints, keep_last=1, rank=0, world_size=1)._prune(4)
        return real(state, path)

    monkeypatch.setattr(checkpointing, "load_tensors", load_while_the_run_saves)
    return run


def test_an_export_of_a_run_dir_takes_the_newest_step_when_the_run_prunes_its_read(run, cli):
    result = cli("export", "--checkpoint", str(run), "--out", str(run.parent / "hf"))
    assert result.code == 0, result.err
    assert "note: step_00000002 was removed while it was read" in result.err
    assert "exporting step_00000004" in result.err
    assert result.out == f"wrote {run.parent / 'hf'} from {run / 'checkpoints/step_00000004'}\n"
    assert (run.parent / "hf/config.json").is_file()


def test_an_export_of_a_step_the_run_prunes_while_it_is_read_says_so(run, cli):
    step = run / "checkpoints/step_00000002"
    result = cli("export", "--checkpoint", str(step), "--out", str(run.parent / "hf"))
    assert_user_error(
        result,
        f"the checkpoint '{step}' was removed while it was read (a run training into",
        f"--checkpoint {run / 'checkpoints'} takes it",
    )
    assert not (run.parent / "hf").exists()
