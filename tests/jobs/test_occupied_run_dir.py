"""A launch into a run dir that already holds a run: real CPU runs (one finished, one whose
launcher was killed, one `dllm train --run-dir` folder), then dry runs, launches and replays
pointed at them. Every one is refused, names the run and the ways on, and leaves every file of
the earlier run as it was; a folder that holds no run is still launched into.
"""

from __future__ import annotations

import hashlib
import json
import shlex
import textwrap
from pathlib import Path

import pytest

import turbo_dllm
from tests.helpers import assert_user_error
from tests.jobs.conftest import SMALL_SPEC
from turbo_dllm.jobs import provenance

pytestmark = pytest.mark.slow

# Pinned so that edits elsewhere in the working tree during the session are not replay drift.
PINNED_CODE = {
    "package_version": turbo_dllm.__version__,
    "git_commit": "c0de" * 10,
    "diff_sha256": "0" * 64,
    "dirty": False,
}
SPEC = textwrap.dedent(SMALL_SPEC) + "checkpoint:\n  interval: 2\n"
# A training process points these at its home's compile cache (tests/conftest.py).
PROCESS_CACHE_VARIABLES = ("TORCHINDUCTOR_CACHE_DIR", "TRITON_CACHE_DIR")
# One node of an elastic multi-node launch: every node runs this into one shared run dir.
MULTI_NODE = ("--nnodes", "1:2", "--nproc-per-node", "1", "--rdzv-endpoint", "127.0.0.1:29400")
# Stops after its first step with exit status 0, as a run out of its time slot does.
SHORT = ("--set", "training.max_duration_s=0.000001")


def snapshot(folder: Path) -> dict[str, tuple[str, int] | None]:
    """Every file (content hash, mtime) and folder under `folder`: what "untouched" means."""
    return {
        str(path.relative_to(folder)): (
            (hashlib.sha256(path.read_bytes()).hexdigest(), path.stat().st_mtime_ns)
            if path.is_file()
            else None
        )
        for path in sorted(folder.rglob("*"))
    }


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """Real launches on CPU: `done` finished; `stopped`'s launcher was killed after the last
    step (no result.json, as a SIGKILL leaves it: `died`), and `killed`'s too; `short` stopped after step 1 of 4 with exit
    status 0 (training.max_duration_s); `trained` is a `dllm train --run-dir` run."""
    root = tmp_path_factory.mktemp("occupied")
    spec = root / "train.yaml"
    spec.write_text(SPEC)
    from turbo_dllm.cli import main

    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("DLLM_HOME", str(tmp_path_factory.mktemp("home")))
        mp.delenv("DLLM_OVERRIDE_GPUS", raising=False)
        for name in PROCESS_CACHE_VARIABLES:
            mp.delenv(name, raising=False)
        mp.setattr(provenance, "code_version", lambda: dict(PINNED_CODE))
        mp.chdir(root)
        for name in ("done", "stopped", "killed"):
            assert main(["launch", "--config", str(spec), "--run-dir", str(root / name)]) == 0
        assert (
            main(["launch", "--config", str(spec), *SHORT, "--run-dir", str(root / "short")]) == 0
        )
        assert main(["train", "--config", str(spec), "--run-dir", str(root / "trained")]) == 0
    (root / "stopped" / "result.json").unlink()
    (root / "killed" / "result.json").unlink()  # `stopped` is resumed by a test below
    return spec, root


def recorded_threads(run_dir: Path) -> str:
    """`OMP_NUM_THREADS=N` as the run's plan recorded it (this host's CPUs)."""
    env = json.loads((run_dir / "manifest.json").read_text())["plan"]["env"]
    assert list(env) == ["OMP_NUM_THREADS"], env
    return f"OMP_NUM_THREADS={env['OMP_NUM_THREADS']}"


@pytest.fixture
def pinned(workdir, monkeypatch):
    monkeypatch.setattr(provenance, "code_version", lambda: dict(PINNED_CODE))


@pytest.mark.parametrize("dry", [("--dry-run",), ("--dry-run", "--json"), ()])
def test_a_launch_into_a_finished_run_is_refused_and_touches_nothing(runs, cli, pinned, dry):
    """The same spec into the same run dir: before, a dry run printed a plan and a start line
    for a run dir it "would write" (and a launch that then failed), and a launch said only
    "already holds a run"."""
    spec, root = runs
    before = snapshot(root / "done")
    result = cli("launch", "--config", spec, "--run-dir", root / "done", *dry)
    assert_user_error(
        result,
        f"{root / 'done'} already holds run done (ok, step 4/4)",
        "a new run: pass --run-dir a new folder",
        f"the same job again, into a new run dir: dllm launch --manifest {root / 'done'}",
        f"dllm run show {root / 'done'}",
    )
    assert "dllm train" not in result.err  # a finished run has nothing to continue
    # ... but it can train on, as a new run from its last checkpoint: the line as printed, with
    # N and NEW_DIR filled in, is a launch that plans it.
    more = result.err.split("more steps, as a new run from its last checkpoint: ")[1]
    more = more.split("\n")[0].replace("training.steps=N", "training.steps=6")
    planned = cli(*shlex.split(more.replace("NEW_DIR", str(root / "more")))[1:], "--dry-run")
    assert planned.code == 0, planned.err
    assert f"--set checkpoint.resume={root / 'done'} " in more
    # No plan, no start line that would fail (--json: only the error object).
    printed = set(json.loads(result.out)) if "--json" in dry else result.out
    assert printed == ({"error", "hint"} if "--json" in dry else "")
    assert snapshot(root / "done") == before


def test_a_stopped_run_is_refused_with_the_command_that_resumes_it(runs, cli, pinned):
    spec, root = runs
    stopped = root / "stopped"
    before = snapshot(stopped)
    result = cli("launch", "--config", spec, "--run-dir", stopped)
    threads = recorded_threads(stopped)
    resume = f"{threads} dllm train --config {stopped / 'spec.yaml'} --run-dir {stopped}"
    assert_user_error(result, "already holds run stopped (died, step 4/4)", resume)
    assert snapshot(stopped) == before
    manifest = (stopped / "manifest.json").read_bytes()

    # The printed command is the way on: it resumes that run as its latest attempt, with the
    # thread count it ran with (the subprocess run of it: test_resume_command_env).
    words = shlex.split(
        result.err.split("continue it from its last checkpoint: ")[1].split("\n")[0]
    )
    assert words[:3] == [threads, "dllm", "train"]
    resumed = cli(*words[2:])
    assert resumed.code == 0, resumed.err
    assert json.loads((stopped / "result.json").read_text())["resumed_by"] == "dllm train"
    assert (stopped / "manifest.json").read_bytes() == manifest


@pytest.mark.parametrize("dry", [("--dry-run",), ()])
def test_a_node_of_a_multi_node_launch_is_refused_by_its_finished_run(runs, cli, pinned, dry):
    """The nodes of one multi-node launch join the run the first of them recorded; once it
    finished (exit status 0 at its last step: rank 0's worker writes that result.json, see the
    elastic test in test_launch_runs) the same launch is refused as a finished run. Before, it
    said only "(ok, step 4/4)": nothing told its nodes that it finished, or when."""
    spec, root = runs
    done = root / "done"
    before = snapshot(done)
    finished_at = json.loads((done / "result.json").read_text())["finished_at"]
    result = cli("launch", "--config", spec, *MULTI_NODE, "--run-dir", done, *dry)
    assert_user_error(
        result,
        f"{done} already holds run done (ok, step 4/4), which finished at {finished_at} "
        "with exit status 0",
        "(the nodes of a multi-node launch join its run only until it finishes)",
        "a new run: pass --run-dir a new folder",
        f"the same job again, into a new run dir: dllm launch --manifest {done / 'manifest.json'}",
    )
    assert "dllm train" not in result.err  # a finished run has nothing to continue
    assert result.out == ""
    assert snapshot(done) == before


def test_nodes_still_join_a_run_that_has_not_finished(runs, cli, pinned):
    """A run its nodes left without a result (stopped, failed), or that stopped early with exit
    status 0 (training.max_duration_s), is joined again by the same multi-node launch, which
    resumes it; a one-node launch into the early-stopped run is refused with the command that
    continues it. Before, exit status 0 alone read as finished: its nodes were refused and the
    refusal offered no way to continue it."""
    spec, root = runs
    for name, extra in (("killed", ()), ("short", SHORT)):
        before = snapshot(root / name)
        result = cli(
            "launch", "--config", spec, *extra, *MULTI_NODE, "--run-dir", root / name, "--dry-run"
        )
        assert result.code == 0, result.err
        assert "joins the job another node recorded in the run dir (same spec)" in result.out
        assert snapshot(root / name) == before
    short = root / "short"
    result = cli("launch", "--config", spec, *SHORT, "--run-dir", short)
    assert_user_error(
        result,
        f"{short} already holds run short (stopped, step 1/4), which ended at ",
        " with exit status 0; a launch does not write into another run's dir. Instead:",
        "continue it from its last checkpoint: "
        f"{recorded_threads(short)} dllm train --config {short / 'spec.yaml'} --run-dir {short}",
    )


def record_multi_node_run(spec: Path, run_dir: Path, steps: int) -> None:
    """A multi-node job's run dir as its nodes leave it after `steps` steps, without training:
    the launch's spec.yaml and manifest.json (`materialize`, as the first node writes them), the
    metrics, and the result.json its rank 0 writes when training returns 0 (the real job: the
    elastic test in test_launch_runs)."""
    from turbo_dllm.jobs import launcher
    from turbo_dllm.jobs.options import LaunchOptions, NodeRange
    from turbo_dllm.jobs.result import write_result

    options = LaunchOptions(
        nproc_per_node=1,
        nnodes=NodeRange(1, 2),
        rdzv_endpoint="127.0.0.1:29400",
        run_dir=str(run_dir),
    )
    argv = ["dllm", "launch", "--config", str(spec), *MULTI_NODE, "--run-dir", str(run_dir)]
    job = launcher.prepare_launch(spec, [], options, argv)
    assert job.multi_node
    launcher.materialize(job)
    records = [{"step": step, "loss": 5.0} for step in range(1, steps + 1)]
    (run_dir / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    write_result(run_dir, 0, "2026-01-01T00:00:00+00:00", "torchrun", recorded_by="rank 0")


def test_a_finished_multi_node_run_offers_a_replay_its_nodes_can_run(cli, pinned, workdir):
    """A finished multi-node run's replay is a multi-node launch too, which needs one run dir
    named on every node: the refusal's ways on say so, and the replay line it prints runs.
    Before, it printed `dllm launch --manifest M` (and "leave --run-dir unset"), which a
    multi-node job refuses ("every node of a multi-node launch must write into the same run
    dir")."""
    spec = workdir / "train.yaml"
    spec.write_text(SPEC)
    multi = workdir / "multi"
    record_multi_node_run(spec, multi, 4)
    before = snapshot(multi)
    finished_at = json.loads((multi / "result.json").read_text())["finished_at"]
    result = cli("launch", "--config", spec, *MULTI_NODE, "--run-dir", multi)
    assert_user_error(
        result,
        f"{multi} already holds run multi (ok, step 4/4), which finished at {finished_at} "
        "with exit status 0",
        "a new run: pass --run-dir a new folder on shared storage, the same on every node",
        f"dllm launch --manifest {multi / 'manifest.json'} --run-dir DIR, on every node",
    )
    assert "leave --run-dir" not in result.err and "dllm train" not in result.err
    assert snapshot(multi) == before

    again = result.err.split("into a new run dir: ")[1].split(",")[0]
    words = shlex.split(again.replace("DIR", str(workdir / "again")))
    assert words[:2] == ["dllm", "launch"]
    replay = cli(*words[1:], "--dry-run", "--json")
    assert replay.code == 0, replay.err
    assert json.loads(replay.out)["plan"]["run_dir"] == str(workdir / "again")
    assert snapshot(multi) == before


def test_rank_0_of_a_rejoined_multi_node_run_clears_its_earlier_result(
    cli, pinned, workdir, monkeypatch
):
    """A multi-node run that stopped early with exit status 0 (training.max_duration_s) is
    joined again by the same launch; its rank 0 removes that attempt's result.json when it
    starts (as a `dllm train` resume does), so the run reads `no result` while it trains, and
    writes its own when training returns. Before, the earlier "ok" stood until then."""
    spec = workdir / "train.yaml"
    spec.write_text(SPEC)
    short = workdir / "short"
    record_multi_node_run(spec, short, 1)
    joined = cli("launch", "--config", spec, *MULTI_NODE, "--run-dir", short, "--dry-run")
    assert joined.code == 0, joined.err
    assert "joins the job another node recorded in the run dir (same spec)" in joined.out

    import turbo_dllm.train.entry
    from turbo_dllm.jobs import worker

    seen = []

    def train(spec, run_dir, layout=None):
        seen.append((Path(run_dir) / "result.json").is_file())
        return 0

    monkeypatch.setattr(turbo_dllm.train.entry, "train", train)
    monkeypatch.setenv("WORLD_SIZE", "2")
    earlier = (short / "result.json").read_bytes()
    monkeypatch.setenv("RANK", "1")  # not the rank that records the run
    assert worker.main(["--manifest", str(short / "manifest.json")]) == 0
    assert seen == [True] and (short / "result.json").read_bytes() == earlier
    monkeypatch.setenv("RANK", "0")
    assert worker.main(["--manifest", str(short / "manifest.json")]) == 0
    assert seen == [True, False]
    result = json.loads((short / "result.json").read_text())
    assert result["exit_code"] == 0 and result["recorded_by"] == "rank 0"
    assert result["started_at"] != "2026-01-01T00:00:00+00:00"


@pytest.mark.parametrize("dry", [("--dry-run",), ()])
def test_a_launch_into_a_dllm_train_run_is_refused(runs, cli, pinned, dry):
    """Before, the launch adopted the folder: it wrote a manifest over another run's checkpoints
    and metrics (whose steps it then described) and trained on from them."""
    spec, root = runs
    trained = root / "trained"
    before = snapshot(trained)
    result = cli("launch", "--config", spec, "--run-dir", trained, *dry)
    assert_user_error(
        result,
        f"{trained} already holds a run's files (metrics.jsonl, checkpoints) but no manifest.json",
        f"dllm train --config F --run-dir {trained}",
        f"dllm run plot {trained}",
    )
    assert snapshot(trained) == before


@pytest.mark.parametrize("dry", [("--dry-run",), ()])
def test_a_replay_into_an_occupied_run_dir_is_refused(runs, cli, pinned, dry):
    _, root = runs
    before = snapshot(root / "done")
    manifest = root / "done" / "manifest.json"
    result = cli("launch", "--manifest", manifest, "--run-dir", root / "done", *dry)
    assert_user_error(
        result,
        "already holds run done (ok, step 4/4)",
        "replay into a new run dir: pass --run-dir a new folder, or leave it unset",
    )
    assert "dllm launch --manifest" not in result.err  # that is what was just refused
    assert snapshot(root / "done") == before


def test_a_folder_that_holds_no_run_is_still_launched_into(runs, cli, pinned, workdir):
    spec, root = runs
    (workdir / "empty").mkdir()
    (workdir / "notes").mkdir()
    (workdir / "notes" / "README.txt").write_text("what this run is for\n")
    (workdir / "notes" / "checkpoints").mkdir()  # made ahead of the run, still empty
    for folder in ("empty", "notes"):
        result = cli("launch", "--config", spec, "--run-dir", workdir / folder, "--dry-run")
        assert result.code == 0, result.err
        assert f"would be written to {workdir / folder / 'manifest.json'}" in result.out
    replay = cli("launch", "--manifest", root / "done" / "manifest.json", "--dry-run", "--json")
    assert replay.code == 0, replay.err  # a replay's own default: a new dir next to the run
    assert Path(json.loads(replay.out)["plan"]["run_dir"]).parent == root
    assert cli("launch", "--config", spec, "--run-dir", workdir / "notes").code == 0
    assert (workdir / "notes" / "README.txt").read_text() == "what this run is for\n"
    assert (workdir / "notes" / "manifest.json").is_file()


def test_a_stopped_two_process_run_is_refused_with_the_torchrun_line_that_resumes_it(
    cli, pinned, workdir
):
    """Was: "continue it ... (under torchrun, as its plan does): dllm train --config ..." for a
    run of 2 processes on one node, a command that, run as printed, stops at the topology's
    world size check (dp 2, 1 process); now the torchrun line itself, which runs as pasted."""
    import subprocess

    from turbo_dllm.jobs import launcher
    from turbo_dllm.jobs.options import LaunchOptions

    spec = workdir / "train.yaml"
    spec.write_text(SPEC)
    run_dir = workdir / "pair"
    # Its launcher recorded the job, then died before any worker trained a step.
    options = LaunchOptions(nproc_per_node=2, run_dir=str(run_dir))
    job = launcher.prepare_launch(spec, ["topology.dp=2"], options, ["dllm", "launch"])
    launcher.materialize(job)
    result = cli(
        "launch", "--config", spec, "--set", "topology.dp=2", "--nproc-per-node", "2",
        "--run-dir", run_dir,
    )  # fmt: skip
    assert_user_error(result, "already holds run pair (no result, no steps yet)")
    line = result.err.split("(under torchrun, as its plan does): ")[1].split("\n")[0]
    assert " -m torch.distributed.run --standalone --nproc-per-node 2 -m turbo_dllm train " in line
    assert line.startswith("OMP_NUM_THREADS=1 PYTHONHASHSEED=0 ")
    resumed = subprocess.run(["bash", "-c", line], capture_output=True, text=True, timeout=300)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    recorded = json.loads((run_dir / "result.json").read_text())
    assert (recorded["resumed_by"], recorded["backend"]) == ("dllm train", "torchrun")
