"""A resume whose checkpoint lacks one rank's RNG file (a folder copied in part) ends on every
rank with that rank's error: it was skipped without a word, the run going on with other random
streams than the ones saved; and raised on that rank alone, the others would have waited in the
next collective."""

from __future__ import annotations

import json

import pytest

from tests.distributed.harness import run_gloo
from tests.train.util import tiny_spec

ARGS = ("topology.dp=2", "checkpoint.interval=2")


def _rank(rank: int, world: int, run_dir: str, steps: int, errors: str) -> None:
    import os

    from turbo_dllm.errors import DllmError
    from turbo_dllm.train.entry import train

    os.environ.update(WORLD_SIZE=str(world), RANK=str(rank), LOCAL_RANK=str(rank))
    try:
        train(tiny_spec(*ARGS, f"training.steps={steps}"), run_dir)
        found = None
    except DllmError as error:
        found = [error.message, error.hint]
    with open(f"{errors}.{rank}", "w") as handle:
        json.dump(found, handle)


@pytest.mark.slow
def test_a_missing_rank_file_ends_the_resume_on_every_rank(tmp_path):
    run, errors = tmp_path / "run", tmp_path / "errors"
    for store in ("first", "second"):  # each run's rendezvous in a folder of its own
        (tmp_path / store).mkdir()
    run_gloo(_rank, 2, tmp_path / "first", str(run), 2, str(errors), timeout_s=60)
    step = run / "checkpoints/step_00000002"
    assert sorted(p.name for p in step.glob("rank_*.pt")) == ["rank_00000.pt", "rank_00001.pt"]
    (step / "rank_00001.pt").unlink()
    run_gloo(_rank, 2, tmp_path / "second", str(run), 4, str(errors), timeout_s=60)
    found = [json.loads((tmp_path / f"errors.{rank}").read_text()) for rank in (0, 1)]
    # the shape of a failed save's error (one vote, Checkpointer._agreed_failure)
    message = f"cannot read the checkpoint {str(step / 'rank_00001.pt')!r} (rank 1 of 2): "
    for each in found:
        assert each is not None and each[0] == message + "No such file or directory", found
        assert each[1].startswith("its files are damaged or incomplete")
    assert found[0] == found[1]
