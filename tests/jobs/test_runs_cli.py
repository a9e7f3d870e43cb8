"""`dllm run list | show | diff | plot` over run dirs written by `dllm launch` (and the metrics
of `dllm train --run-dir` runs)."""

from __future__ import annotations

import json
import os
import re
import sys

import yaml

from tests.helpers import assert_user_error


def slurm_run(cli, spec_file, *extra):
    """A real run dir (manifest, spec, script) without starting workers: the SLURM backend."""
    result = cli(
        "launch", "--config", spec_file, "--backend", "slurm", "--nproc-per-node", "1", *extra
    )
    assert result.code == 0, result.err
    return result


def write_metrics(run_dir, losses):
    lines = [
        {"step": i + 1, "loss": loss, "tokens_per_s": 1000.0 + i, "mem_gb": 0.5, "lr": 1e-3}
        for i, loss in enumerate(losses)
    ]
    (run_dir / "metrics.jsonl").write_text("".join(json.dumps(x) + "\n" for x in lines))


def test_list_show_diff(cli, spec_file, workdir, monkeypatch):
    from turbo_dllm.jobs import provenance

    code = provenance.code_version()  # others may edit this checkout between the two launches
    monkeypatch.setattr(provenance, "code_version", lambda: dict(code))
    assert "no recorded runs under runs/" in cli("run", "list").out
    slurm_run(cli, spec_file, "--set", "launch.name=first")
    slurm_run(cli, spec_file, "--set", "training.steps=6", "--set", "launch.name=second")
    by_name = {
        json.loads((d / "manifest.json").read_text())["spec"]["launch"]["name"]: d
        for d in (workdir / "runs").iterdir()
    }
    first, second = by_name["first"], by_name["second"]
    write_metrics(first, [5.0, 4.5, 4.25])

    listing = json.loads(cli("run", "list", "--json").out)
    runs = {r["name"]: r for r in listing["runs"]}
    assert runs["first"]["steps_done"] == 3 and runs["first"]["steps_total"] == 4
    assert runs["first"]["last_loss"] == 4.25
    assert runs["second"]["steps_done"] is None and runs["second"]["status"] == "not submitted"
    text = cli("run", "list").out
    assert first.name in text and "3/4" in text and "4.2500" in text

    shown = cli("run", "show", first.name[:-2])  # a unique prefix is enough
    assert shown.code == 0, shown.err
    assert f"run          {first.name} (first)" in shown.out
    assert "progress     3/4 steps, last loss 4.2500" in shown.out
    assert "backend      slurm" in shown.out
    whole = json.loads(cli("run", "show", str(first), "--json").out)
    assert whole["format"] == "turbo_dllm.run_manifest.v1"

    diff = json.loads(cli("run", "diff", first.name, second.name, "--json").out)
    spec_fields = {item["field"]: item for item in diff["diff"]["spec"]}
    assert spec_fields["spec.training.steps"]["recorded"] == 4
    assert spec_fields["spec.training.steps"]["current"] == 6
    assert diff["diff"]["inputs"] == []
    human = cli("run", "diff", first.name, second.name)
    assert "spec.training.steps" in human.out and "identical" in human.out


def test_diff_of_runs_with_short_ids_keeps_every_other_value_whole(cli, spec_file, workdir):
    """Each run's id is a placeholder in spec and plan only where it stands as a word of its
    own: runs `a` and `b` showed "flo<run_id>t32" and "<run_id>damw" as differences."""
    slurm_run(cli, spec_file, "--run-dir", "runs/a")
    slurm_run(cli, spec_file, "--run-dir", "runs/b", "--set", "training.steps=6")
    diff = json.loads(cli("run", "diff", "a", "b", "--json").out)
    assert [item["field"] for item in diff["diff"]["spec"]] == ["spec.training.steps"]
    assert not any("<run_id>" in json.dumps(item) for item in diff["diff"]["plan"])
    human = cli("run", "diff", "a", "b").out
    assert "adamw" not in human and "float32" not in human


def test_diff_shows_where_long_values_differ_and_a_run_against_itself_as_identical(
    cli, spec_file, workdir
):
    """Long values were cut at 72 characters from their start: two argv lists that differed
    only in a late --set read the same in both columns. A run diffed with itself listed its
    run_dir as a difference."""
    same = ["--backend", "slurm", "--nproc-per-node", "1", "--set", "launch.seed=0"]
    assert cli("launch", "--config", spec_file, "--run-dir", "runs/a", *same).code == 0
    result = cli(
        "launch", "--config", spec_file, "--run-dir", "runs/b", *same, "--set", "optimizer.lr=0.01"
    )
    assert result.code == 0, result.err
    [argv] = [line for line in cli("run", "diff", "a", "b").out.splitlines() if line[:4] == "argv"]
    _, left, right = re.split(r"\s{2,}", argv)
    assert left != right and "runs/a" in left and "runs/b" in right, argv
    assert len(left) <= 72 and len(right) <= 72
    itself = json.loads(cli("run", "diff", "a", "a", "--json").out)
    assert all(items == [] for items in itself["diff"].values()), itself["diff"]
    assert "run_dir" not in cli("run", "diff", "a", "a").out


def test_diff_tells_values_of_another_type_apart(cli, spec_file, workdir):
    """`true` and `1` compared equal (Python's True == 1), so the row was dropped; a string "1"
    and the number 1 were both shown as 1. Values differ by type as well, shown as JSON where
    they would read alike; ordinary differences read as before."""
    from turbo_dllm.jobs.manifest import spec_sha256

    slurm_run(cli, spec_file, "--run-dir", "runs/a")
    slurm_run(cli, spec_file, "--run-dir", "runs/b")
    pairs = {
        "flag": (True, 1),
        "count": ("1", 1),
        "ratio": (1, 1.0),
        "word": ("true", True),
        "none": ("-", None),
        "same": (2, 2),
        "name": ("adamw", "sgd"),
    }
    for run, side in (("a", 0), ("b", 1)):
        path = workdir / "runs" / run / "manifest.json"
        manifest = json.loads(path.read_text())
        manifest["spec"]["extra"] = {key: values[side] for key, values in pairs.items()}
        manifest["spec_sha256"] = spec_sha256(manifest["spec"])
        path.write_text(json.dumps(manifest))
    diff = json.loads(cli("run", "diff", "a", "b", "--json").out)
    fields = {item["field"]: item for item in diff["diff"]["spec"]}
    assert set(fields) == {f"spec.extra.{key}" for key in pairs if key != "same"}, fields
    assert fields["spec.extra.flag"]["recorded"] is True
    assert fields["spec.extra.flag"]["current"] == 1
    human = cli("run", "diff", "a", "b")
    assert human.code == 0, human.err
    rows = {
        line.split()[0]: re.split(r"\s{2,}", line)[1:]
        for line in human.out.splitlines()
        if line.startswith("spec.extra.")
    }
    assert rows == {
        "spec.extra.flag": ["true", "1"],
        "spec.extra.count": ['"1"', "1"],
        "spec.extra.ratio": ["1", "1.0"],
        "spec.extra.word": ['"true"', "true"],
        "spec.extra.none": ['"-"', "-"],
        "spec.extra.name": ["adamw", "sgd"],
    }, human.out
    itself = json.loads(cli("run", "diff", "a", "a", "--json").out)
    assert all(items == [] for items in itself["diff"].values()), itself["diff"]


def test_show_unknown_or_ambiguous_run(cli, spec_file, workdir):
    assert_user_error(cli("run", "show", "nope"), "no run 'nope' under runs")
    slurm_run(cli, spec_file)
    slurm_run(cli, spec_file)
    assert_user_error(cli("run", "show", "2"), "matches 2 runs")


def test_a_run_id_matches_by_prefix_only(cli, spec_file, workdir):
    """As documented: a run id, a unique prefix of one, or a run dir path; a part from the
    middle of an id (here of the UTC stamp) names no run rather than whichever run holds it."""
    slurm_run(cli, spec_file, "--run-dir", "runs/alpha-0412")
    slurm_run(cli, spec_file, "--run-dir", "runs/alpha-0413")
    slurm_run(cli, spec_file, "--run-dir", "runs/beta")
    assert "run          beta" in cli("run", "show", "be").out
    assert "run          alpha-0412" in cli("run", "show", "alpha-0412").out
    assert_user_error(cli("run", "show", "0412"), "no run '0412' under runs")
    assert_user_error(cli("run", "show", "eta"), "no run 'eta' under runs")
    result = cli("run", "show", "alpha")
    assert_user_error(result, "'alpha' matches 2 runs under runs: alpha-0412, alpha-0413")
    assert "give more of the run id" in result.err


def test_a_path_that_is_no_run_dir_is_named(cli, spec_file, workdir):
    """A folder or file given by path that holds no run was "no run 'data' under runs", which
    did not say why the path itself was not taken."""
    slurm_run(cli, spec_file, "--run-dir", "runs/a")
    (workdir / "data").mkdir()
    assert_user_error(cli("run", "diff", "a", "data"), "'data' is not a run dir (it has no")
    assert_user_error(cli("run", "show", spec_file), "is not a run dir (a file)")
    result = cli("run", "plot", "data")
    assert_user_error(result, "no manifest.json or metrics.jsonl", "dllm run list")
    (workdir / "runs" / "crashed").mkdir()  # by its name under the root
    assert_user_error(cli("run", "show", "crashed"), "'runs/crashed' is not a run dir")
    assert_user_error(cli("run", "show", "nope"), "no run 'nope' under runs")


def test_a_root_that_is_no_folder_is_a_clear_error(cli, spec_file, workdir):
    # no ./runs yet is a fresh project, not an error
    assert "no recorded runs under runs/" in cli("run", "list").out
    assert_user_error(cli("run", "list", "--root", spec_file), "is not a folder")
    assert_user_error(cli("run", "list", "--root", workdir / "nope", "--json"), "does not exist")
    assert_user_error(cli("run", "show", "x", "--root", workdir / "nope"), "(no such folder)")
    assert_user_error(cli("run", "show", "x", "--root", spec_file), "(not a folder)")
    (workdir / "runs").write_text("")
    assert_user_error(cli("run", "list"), "run root 'runs' is not a folder")


def test_plot_writes_pngs(cli, spec_file, workdir):
    slurm_run(cli, spec_file)
    [run_dir] = (workdir / "runs").iterdir()
    assert_user_error(cli("run", "plot", run_dir.name), "has no metrics yet")
    write_metrics(run_dir, [5.0, 4.0, 3.5])
    result = cli("run", "plot", run_dir.name)
    assert result.code == 0, result.err
    for name in ("loss.png", "tokens_per_s.png", "memory.png"):
        png = run_dir / "plots" / name
        assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
        assert f"wrote {png}" in result.out


def test_a_dllm_train_run_dir_is_listed_and_plotted_without_a_manifest(cli, spec_file, workdir):
    result = cli("train", "--config", spec_file, "--run-dir", "runs/plain")
    assert result.code == 0, result.err
    slurm_run(cli, spec_file, "--set", "launch.name=recorded")
    listing = json.loads(cli("run", "list", "--json").out)
    assert [r["name"] for r in listing["runs"]] == ["recorded"]
    assert listing["without_manifest"] == ["runs/plain"]  # as the runs' paths: under --root
    assert "without a manifest" in cli("run", "list").out and "plain" in cli("run", "list").out
    for ref in ("plain", "runs/plain"):  # by name under the root, or as a path
        plotted = cli("run", "plot", ref)
        assert plotted.code == 0, plotted.err
        assert (workdir / "runs" / "plain" / "plots" / "loss.png").read_bytes()[:4] == b"\x89PNG"
    # what needs the manifest says why it is missing
    assert_user_error(cli("run", "show", "plain"), "has no manifest.json", "dllm run plot")


def test_plot_of_metrics_without_any_plotted_value_is_an_error(cli, workdir):
    """Steps without loss, tokens_per_s or mem_gb (or all NaN) wrote no PNG and said nothing,
    exit 0."""
    run_dir = workdir / "runs" / "odd"
    run_dir.mkdir(parents=True)
    (run_dir / "metrics.jsonl").write_text('{"step": 1, "foo": 2}\n{"step": 2, "loss": NaN}\n')
    assert_user_error(cli("run", "plot", "odd"), "has steps but no finite loss, tokens_per_s")


def _line_pixels(png) -> int:
    """How many pixels of a plot are in its line's colour (matplotlib's first, #1f77b4)."""
    import matplotlib.image

    rgb = (matplotlib.image.imread(png)[..., :3] * 255).round()
    return int(((abs(rgb - [31, 119, 180])).sum(axis=-1) < 30).sum())


def test_plot_of_one_step_or_steps_between_infs_draws_the_points(cli, workdir):
    """A run with one logged step plotted an empty frame (a line through one point draws
    nothing); an inf loss broke the line, leaving the steps around it undrawn, and a metric of
    only infs was written as an empty plot instead of "no finite values"."""
    run_dir = workdir / "runs" / "young"
    run_dir.mkdir(parents=True)
    metrics = run_dir / "metrics.jsonl"
    metrics.write_text('{"step": 1, "loss": 5.0, "tokens_per_s": Infinity}\n')
    assert cli("run", "plot", "young").code == 0
    assert _line_pixels(run_dir / "plots" / "loss.png") > 20
    assert not (run_dir / "plots" / "tokens_per_s.png").exists()
    lines = [5.0, "Infinity", 4.0, "Infinity", 3.0]
    metrics.write_text("".join(f'{{"step": {i}, "loss": {v}}}\n' for i, v in enumerate(lines)))
    assert cli("run", "plot", "young").code == 0
    assert _line_pixels(run_dir / "plots" / "loss.png") > 200
    metrics.write_text('{"step": 1, "loss": Infinity}\n{"step": 2, "loss": -Infinity}\n')
    assert_user_error(cli("run", "plot", "young"), "has steps but no finite loss")


def test_plot_ignores_a_matplotlib_backend_it_does_not_need(cli_process, workdir):
    """MPLBACKEND set to a backend matplotlib does not know (a typo, a removed plugin) was a
    ValueError traceback: the plots are files, drawn by Agg whatever it says."""
    run_dir = workdir / "runs" / "r"
    run_dir.mkdir(parents=True)
    write_metrics(run_dir, [5.0, 4.0])
    result = cli_process("run", "plot", "r", cwd=workdir, env={"MPLBACKEND": "nosuchbackend"})
    assert result.code == 0, result.err
    assert (run_dir / "plots" / "loss.png").read_bytes()[:4] == b"\x89PNG"


def test_plot_without_matplotlib_is_a_clear_error(cli, spec_file, workdir, monkeypatch):
    slurm_run(cli, spec_file)
    [run_dir] = (workdir / "runs").iterdir()
    write_metrics(run_dir, [5.0])
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # import now raises ImportError
    assert_user_error(cli("run", "plot", run_dir.name), "needs matplotlib", "pip install")


def test_plot_into_a_file_is_a_clear_error(cli, spec_file, workdir):
    slurm_run(cli, spec_file)
    [run_dir] = (workdir / "runs").iterdir()
    write_metrics(run_dir, [5.0])
    (workdir / "taken").write_text("x")
    result = cli("run", "plot", run_dir.name, "--out", workdir / "taken")
    assert_user_error(result, "cannot create plot folder", "--out")


def test_dllm_train_resumes_a_recorded_run_only_with_its_spec(cli, spec_file, workdir):
    """Another spec would append steps the manifest does not describe (`run list`: 9/6)."""
    slurm_run(cli, spec_file)
    [run_dir] = (workdir / "runs").iterdir()
    other = cli("train", "--config", spec_file, "--run-dir", run_dir, "--set", "training.steps=6")
    assert_user_error(
        other, "recorded by `dllm launch` with another spec", "training.steps: 4 -> 6", "spec.yaml"
    )
    # Only what differs: not the run dir, which the spec's hash leaves out (it read
    # "launch.run_dir: '<run dir>' -> None" beside the real change).
    assert "launch.run_dir" not in other.err, other.err
    # The changed spec as a new run goes on from this run's checkpoint ("train into a new run
    # dir" alone started it over).
    assert (
        f"or train into a new run dir from its last checkpoint: dllm train --config {spec_file} "
        f"--set training.steps=6 --set checkpoint.resume={run_dir} --run-dir NEW_DIR"
    ) in other.err, other.err
    assert not (run_dir / "metrics.jsonl").exists()
    # its own spec.yaml, edited: the refusal names the edit (the hint pointed at that file)
    recorded = (run_dir / "spec.yaml").read_text()
    document = yaml.safe_load(recorded)
    lr = document["optimizer"]["lr"]
    document["optimizer"]["lr"] = lr * 2
    (run_dir / "spec.yaml").write_text(yaml.safe_dump(document))
    edited = cli("train", "--config", run_dir / "spec.yaml", "--run-dir", run_dir)
    assert_user_error(edited, f"optimizer.lr: {lr!r} -> {lr * 2!r}", "undo any edit")
    (run_dir / "spec.yaml").write_text(recorded)
    same = cli("train", "--config", run_dir / "spec.yaml", "--run-dir", run_dir)
    assert same.code == 0, same.err
    listing = json.loads(cli("run", "list", "--json").out)
    assert [(r["steps_done"], r["steps_total"]) for r in listing["runs"]] == [(4, 4)]


def test_a_run_resumed_by_dllm_train_reads_as_its_latest_attempt(
    cli, spec_file, workdir, monkeypatch
):
    """Not the launcher's or SLURM's word on the attempt before (here: a job that timed out)."""
    from tests.jobs.test_slurm_plans import fake_command

    bin_dir = workdir / "bin"
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    fake_command(bin_dir, "sbatch", "echo 4242\n")
    fake_command(bin_dir, "squeue", "echo '4242|TIMEOUT'\n")
    slurm_run(cli, spec_file, "--run-dir", "runs/r", "--submit")
    run_dir = workdir / "runs" / "r"

    def status() -> str:
        [run] = json.loads(cli("run", "list", "--json").out)["runs"]
        return run["status"]

    assert status() == "timeout"
    import turbo_dllm.train.entry as entry
    from turbo_dllm.errors import DllmError

    def failing(spec, run_dir):
        assert not (run_dir / "result.json").exists()  # "no result" while it runs
        raise DllmError("the attempt failed")

    with monkeypatch.context() as patch:
        patch.setattr(entry, "train", failing)
        resume = ("train", "--config", run_dir / "spec.yaml", "--run-dir", run_dir)
        assert_user_error(cli(*resume), "the attempt failed")
    assert status() == "exit 2"

    def disk_full(spec, run_dir):  # an OSError ends as `dllm: error:`, exit 2, too
        raise OSError(28, "No space left on device", str(run_dir / "metrics.jsonl"))

    with monkeypatch.context() as patch:
        patch.setattr(entry, "train", disk_full)
        assert_user_error(cli(*resume), "No space left on device")
    assert status() == "exit 2"
    assert cli(*resume).code == 0
    assert status() == "ok"
    result = json.loads((run_dir / "result.json").read_text())
    assert result["resumed_by"] == "dllm train" and result["backend"] == "local"


def test_damaged_metrics_read_as_unknown_and_a_damaged_result_is_named(cli, spec_file, workdir):
    """A metrics record whose step or loss is no number reads as unknown. A result.json that is
    no run result (`[1, 2]`, `"ok"`, no format, an exit code that is a string) read as no exit
    code: it is now named, as a damaged manifest is (tests/jobs/test_runs_damaged.py)."""
    slurm_run(cli, spec_file)
    [run_dir] = (workdir / "runs").iterdir()
    write_metrics(run_dir, [5.0, 4.5])
    with (run_dir / "metrics.jsonl").open("a") as handle:
        handle.write('{"step": "x", "loss": "y"}\n')
    listing = cli("run", "list", "--json")
    assert listing.code == 0, listing.err
    [run] = json.loads(listing.out)["runs"]
    assert (run["steps_done"], run["last_loss"], run["exit_code"]) == (2, 4.5, None)
    shown = cli("run", "show", run_dir.name)
    assert shown.code == 0, shown.err
    assert "progress     2/4 steps, last loss 4.5000; not submitted" in shown.out
    format_ = '"format": "turbo_dllm.run_result.v1"'
    for damaged, says in (
        ("[1, 2]", "is not a run result (format None"),
        ('"ok"', "is not a run result (format None"),
        ('{"exit_code": "0"}', "is not a run result (format None"),
        (f'{{{format_}, "exit_code": "0"}}', "is not a valid run result: exit_code"),
    ):
        (run_dir / "result.json").write_text(damaged)
        listing = cli("run", "list", "--json")
        assert listing.code == 0, listing.err
        assert json.loads(listing.out)["runs"] == []
        assert_user_error(cli("run", "show", run_dir.name), "result.json", says)


def test_list_and_show_read_only_the_end_of_a_long_metrics_file(cli, spec_file, workdir):
    """`run list` and `run show` read every run's whole metrics.jsonl for its last step: a long
    run's (hundreds of MB) took seconds and as much memory, per run. The last step is read from
    the end back, past a torn last line, a record without a step and a line that is no JSON."""
    import tracemalloc

    slurm_run(cli, spec_file, "--run-dir", "runs/long")
    metrics = workdir / "runs" / "long" / "metrics.jsonl"
    with metrics.open("wb") as handle:
        handle.truncate(64 * 1024 * 1024)  # 64 MiB of earlier lines (a hole: no disk used)
        handle.seek(0, os.SEEK_END)
        handle.write(b'\n{"step": 7, "loss": 3.5, "note": "\xc3\xa9' + b"x" * 200_000 + b'"}\n')
        handle.write(b'{"event": "eval", "loss": 1.0}\n\xff\xfe not json\n{"step": 8, "lo')
    tracemalloc.start()
    try:
        listing = cli("run", "list", "--json")
        shown = cli("run", "show", "long")
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert listing.code == 0 and shown.code == 0, (listing.err, shown.err)
    [run] = json.loads(listing.out)["runs"]
    assert (run["steps_done"], run["last_loss"]) == (7, 3.5)
    assert "progress     7/4 steps, last loss 3.5000" in shown.out
    assert peak < 16 * 1024 * 1024, peak


def test_list_names_a_moved_run_by_the_folder_that_show_takes(cli, spec_file, workdir):
    """`run list` named each run by its manifest's id: a run dir renamed (or copied) since
    launch was listed under an id that `run show` answered with "no run" (or the original)."""
    slurm_run(cli, spec_file, "--run-dir", "runs/first")
    (workdir / "runs" / "first").rename(workdir / "runs" / "baseline")
    text = cli("run", "list").out
    assert re.search(r"^baseline ", text, re.MULTILINE), text
    assert not re.search(r"^first ", text, re.MULTILINE), text
    shown = cli("run", "show", "baseline")
    assert shown.code == 0, shown.err
    assert json.loads(cli("run", "list", "--json").out)["runs"][0]["run_id"] == "first"


def test_a_run_whose_manifest_is_torn_is_named_by_list_and_explained_by_show(
    cli, spec_file, workdir
):
    """`dllm run list` left a run with an unreadable manifest out without a word (and `show`,
    which was to explain it, gave no hint)."""
    slurm_run(cli, spec_file, "--run-dir", "runs/good")
    slurm_run(cli, spec_file, "--run-dir", "runs/torn")
    manifest = workdir / "runs" / "torn" / "manifest.json"
    manifest.write_text(manifest.read_text()[:300])
    listing = json.loads(cli("run", "list", "--json").out)
    assert [r["run_id"] for r in listing["runs"]] == ["good"]
    assert listing["unreadable_manifest"] == ["runs/torn"]
    text = cli("run", "list").out
    assert "with a record that cannot be read (" in text and "says which and why): torn" in text
    assert_user_error(cli("run", "show", "torn"), "cannot read run manifest", "hint: it is torn")


def test_dllm_train_into_a_run_dir_it_cannot_create_is_a_clear_error(cli, spec_file, workdir):
    result = cli("train", "--config", spec_file, "--run-dir", spec_file)
    assert_user_error(result, "cannot create run dir", "it is not a folder", "--run-dir")
    result = cli("train", "--config", spec_file, "--run-dir", spec_file / "run")
    assert_user_error(result, "cannot create run dir", "Not a directory")


def test_a_one_process_launch_whose_trainer_raises_records_its_exit_status(
    cli, spec_file, workdir, monkeypatch
):
    """Like a failed torchrun job, a failed in-process one has a result.json: `exit 2` for what
    the CLI reports as an error (here a full disk), `exit 1` for a bug; not `no result`."""
    import errno

    import pytest

    import turbo_dllm.train.entry as entry

    def disk_full(spec, run_dir, layout=None):
        raise OSError(errno.ENOSPC, "No space left on device", str(run_dir / "checkpoints"))

    def bug(spec, run_dir, layout=None):
        raise RuntimeError("a bug")

    def status(name: str) -> str:
        runs = {r["path"]: r for r in json.loads(cli("run", "list", "--json").out)["runs"]}
        return runs[f"runs/{name}"]["status"]

    monkeypatch.setattr(entry, "train", disk_full)
    result = cli("launch", "--config", spec_file, "--run-dir", "runs/full")
    assert result.code == 2 and "Traceback" not in result.err
    error = result.err[result.err.index("dllm: error:") :]
    assert "runs/full/checkpoints': No space left on device\nhint: the disk is full" in error
    assert status("full") == "exit 2"
    result = json.loads((workdir / "runs/full/result.json").read_text())
    assert result["exit_code"] == 2 and result["backend"] == "local"

    monkeypatch.setattr(entry, "train", bug)
    with pytest.raises(RuntimeError, match="a bug"):  # in-process: a bug keeps its traceback
        cli("launch", "--config", spec_file, "--run-dir", "runs/bug")
    assert status("bug") == "exit 1"


def test_a_resume_of_a_run_whose_slurm_job_is_pending_or_running_is_refused(
    cli, spec_file, workdir, monkeypatch
):
    """The job would start (or runs) beside the resume; the resume wrote its result over the
    run's, which then read as `exit 2` or `ok` while SLURM still ran the job."""
    from tests.jobs.test_slurm_plans import fake_command

    bin_dir = workdir / "bin"
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    fake_command(bin_dir, "sbatch", "echo 4243\n")
    slurm_run(cli, spec_file, "--run-dir", "runs/r", "--submit")
    run_dir = workdir / "runs" / "r"
    resume = ("train", "--config", run_dir / "spec.yaml", "--run-dir", run_dir)
    for state in ("PENDING", "RUNNING"):
        fake_command(bin_dir, "squeue", f"echo '4243|{state}'\n")
        assert_user_error(
            cli(*resume),
            f"{run_dir} is not over: its SLURM job 4243 is {state.lower()}; a resume would "
            "train beside it",
            "scancel 4243",
        )
        assert sorted(p.name for p in run_dir.iterdir()) == [
            "job.sbatch",
            "manifest.json",
            "slurm_job.json",
            "spec.yaml",
        ]
    fake_command(bin_dir, "squeue", "echo '4243|CANCELLED'\n")
    assert cli(*resume).code == 0
    [run] = json.loads(cli("run", "list", "--json").out)["runs"]
    assert run["status"] == "ok" and run["resumed"] is True
