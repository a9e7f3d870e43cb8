"""`dllm run list | show` over run dirs whose files were damaged in ways a JSON parser alone does
not catch: each reads as unknown or is a `dllm: error:`, never a traceback."""

from __future__ import annotations

import json

from tests.helpers import assert_user_error
from tests.jobs.test_runs_cli import slurm_run, write_metrics


def test_a_result_json_that_is_not_utf8_reads_as_no_result(cli, spec_file, workdir):
    """A non-UTF-8 byte in result.json was a UnicodeDecodeError traceback in list and show."""
    slurm_run(cli, spec_file, "--run-dir", "runs/r")
    run_dir = workdir / "runs" / "r"
    write_metrics(run_dir, [5.0, 4.5])
    for damaged in (b'\xff\xfe{"exit_code": 0}', b"[" * 100_000):
        (run_dir / "result.json").write_bytes(damaged)
        listing = cli("run", "list", "--json")
        assert listing.code == 0, listing.err
        [run] = json.loads(listing.out)["runs"]
        assert (run["steps_done"], run["exit_code"], run["status"]) == (2, None, "not submitted")
        shown = cli("run", "show", "r")
        assert shown.code == 0, shown.err
        assert "progress     2/4 steps, last loss 4.5000; not submitted" in shown.out


def test_a_manifest_whose_spec_launch_is_not_a_mapping_is_named_not_a_traceback(
    cli, spec_file, workdir
):
    """`launch: null` in the recorded spec was an AttributeError traceback while its hash was
    checked (in `run list`, `run show` and `launch --manifest`)."""
    slurm_run(cli, spec_file, "--run-dir", "runs/good")
    for name, launch in (("null", None), ("list", [1])):
        slurm_run(cli, spec_file, "--run-dir", f"runs/{name}")
        path = workdir / "runs" / name / "manifest.json"
        manifest = json.loads(path.read_text())
        manifest["spec"]["launch"] = launch
        path.write_text(json.dumps(manifest))
    listing = cli("run", "list", "--json")
    assert listing.code == 0, listing.err
    document = json.loads(listing.out)
    assert [r["run_id"] for r in document["runs"]] == ["good"]
    assert document["unreadable_manifest"] == ["runs/list", "runs/null"]
    for name in ("null", "list"):
        assert_user_error(
            cli("run", "show", name), "not a valid run manifest", "spec_sha256 does not match"
        )
        assert_user_error(
            cli("launch", "--manifest", f"runs/{name}/manifest.json", "--dry-run"),
            "not a valid run manifest",
        )


def test_a_slurm_job_record_that_is_not_utf8_reads_as_not_submitted(cli, spec_file, workdir):
    """A non-UTF-8 byte (or nesting past the parser's depth) in slurm_job.json was a
    UnicodeDecodeError (RecursionError) traceback in `run list` and `run show`."""
    slurm_run(cli, spec_file, "--run-dir", "runs/s")
    run_dir = workdir / "runs" / "s"
    write_metrics(run_dir, [5.0])
    for damaged in (b'\xff{"job_id": "12"}', b"[" * 100_000):
        (run_dir / "slurm_job.json").write_bytes(damaged)
        listing = cli("run", "list", "--json")
        assert listing.code == 0, listing.err
        [run] = json.loads(listing.out)["runs"]
        assert (run["slurm_job_id"], run["status"]) == (None, "not submitted")
        shown = cli("run", "show", "s")
        assert shown.code == 0, shown.err
        assert "progress     1/4 steps, last loss 5.0000; not submitted" in shown.out


def _rewrite_spec(path, change) -> None:
    """Change the recorded spec and its hash, as another version of turbo-dllm may have
    recorded it."""
    from turbo_dllm.jobs.manifest import spec_sha256

    manifest = json.loads(path.read_text())
    change(manifest["spec"])
    manifest["spec_sha256"] = spec_sha256(manifest["spec"])
    path.write_text(json.dumps(manifest))


def test_a_recorded_spec_without_a_field_list_and_show_read_is_named_not_a_traceback(
    cli, spec_file, workdir
):
    """A recorded spec (its hash intact) without training.steps was a KeyError traceback in
    `run list` (for every run) and `run show`; without launch or model.family, in `run show`."""
    slurm_run(cli, spec_file, "--run-dir", "runs/good")
    slurm_run(cli, spec_file, "--run-dir", "runs/nosteps")
    slurm_run(cli, spec_file, "--run-dir", "runs/noname")
    _rewrite_spec(
        workdir / "runs" / "nosteps" / "manifest.json", lambda s: s["training"].pop("steps")
    )

    def no_launch(spec):
        spec.pop("launch")
        spec["model"].pop("family")

    _rewrite_spec(workdir / "runs" / "noname" / "manifest.json", no_launch)
    listing = cli("run", "list", "--json")
    assert listing.code == 0, listing.err
    document = json.loads(listing.out)
    assert [r["run_id"] for r in document["runs"]] == ["good", "noname"]
    assert document["unreadable_manifest"] == ["runs/nosteps"]
    assert_user_error(cli("run", "show", "nosteps"), "without training.steps", "--json")
    assert cli("run", "show", "nosteps", "--json").code == 0
    shown = cli("run", "show", "noname")
    assert shown.code == 0, shown.err
    assert "? / block_diffusion, 4 steps" in shown.out


def test_a_manifest_nested_past_the_json_parser_is_named_not_a_traceback(cli, spec_file, workdir):
    """JSON nested deeper than the parser goes was a RecursionError traceback in `run list`,
    `run show` and `run diff`."""
    slurm_run(cli, spec_file, "--run-dir", "runs/good")
    slurm_run(cli, spec_file, "--run-dir", "runs/deep")
    (workdir / "runs/deep/manifest.json").write_text("[" * 100_000)
    listing = cli("run", "list", "--json")
    assert listing.code == 0, listing.err
    assert json.loads(listing.out)["unreadable_manifest"] == ["runs/deep"]
    assert_user_error(cli("run", "show", "deep"), "nested deeper than JSON is parsed")
    assert_user_error(cli("run", "diff", "good", "deep"), "nested deeper than JSON is parsed")


def test_a_metrics_line_nested_past_the_json_parser_is_skipped(tmp_path):
    from turbo_dllm.train.metrics import read_metrics

    (tmp_path / "metrics.jsonl").write_text('{"step": 1}\n' + "[" * 100_000 + '\n{"step": 2}\n')
    assert read_metrics(tmp_path) == [{"step": 1}, {"step": 2}]


_NOT_A_STEP = ("true", "false", "1.0", '"3"', "null", "[4]")


def test_a_metrics_record_whose_step_is_no_integer_is_skipped(tmp_path):
    """`"step": true` read as step 1 (bool is an int in Python): plotted there, and a resume
    kept it as a step. A step is an int that is not a bool; a record with another step is
    damaged and skipped like a torn line, by `read_metrics` and `last_metrics_record` alike.
    A record without a step (an event) is kept as before."""
    from turbo_dllm.train.metrics import last_metrics_record, read_metrics

    lines = ['{"step": 1, "loss": 5.0}', '{"event": "eval"}']
    lines += [f'{{"step": {step}, "loss": 9.0}}' for step in _NOT_A_STEP]
    (tmp_path / "metrics.jsonl").write_text("\n".join(lines) + "\n")
    assert read_metrics(tmp_path) == [{"step": 1, "loss": 5.0}, {"event": "eval"}]
    assert last_metrics_record(tmp_path, lambda r: True) == {"event": "eval"}


def test_a_resume_drops_records_whose_step_is_no_integer(tmp_path):
    """A resume's truncation compared every record's step with `<=`: a `"step": "x"` line was a
    TypeError traceback, and a `"step": true` line was kept as step 1."""
    from turbo_dllm.config.runspec import LoggingSpec
    from turbo_dllm.train.metrics import MetricsLogger, read_metrics

    lines = ['{"step": 1, "loss": 5.0}', '{"step": "x"}', '{"step": true}', '{"step": 3}']
    (tmp_path / "metrics.jsonl").write_text("\n".join(lines) + "\n")
    logger = MetricsLogger(tmp_path, LoggingSpec(), is_main=True, total_steps=4)
    logger.truncate_after(2)
    assert read_metrics(tmp_path) == [{"loss": 5.0, "step": 1}]


def test_plot_list_and_show_take_no_bool_for_a_step_or_a_value(
    cli, spec_file, workdir, monkeypatch
):
    """`dllm run plot` drew a `"step": true` record at step 1; a bool metric value is no value
    (plot, and list/show's last loss), and list/show's last step is the last integer one."""
    import matplotlib.axes

    slurm_run(cli, spec_file, "--run-dir", "runs/r")
    run_dir = workdir / "runs" / "r"
    lines = ['{"step": true, "loss": 9.0}', '{"step": 2, "loss": 5.0}']
    lines += ['{"step": 3, "loss": 4.0, "mem_gb": true}', '{"step": false, "loss": 1.0}']
    (run_dir / "metrics.jsonl").write_text("\n".join(lines) + "\n")
    drawn = {}
    real_plot = matplotlib.axes.Axes.plot

    def plot(self, xs, ys, *args, **kwargs):
        drawn[self.get_ylabel() or len(drawn)] = (list(xs), list(ys))
        return real_plot(self, xs, ys, *args, **kwargs)

    monkeypatch.setattr(matplotlib.axes.Axes, "plot", plot)
    result = cli("run", "plot", "r")
    assert result.code == 0, result.err
    assert list(drawn.values()) == [([2, 3], [5.0, 4.0])], drawn  # loss only: no memory plot
    assert not (run_dir / "plots" / "memory.png").exists()
    [run] = json.loads(cli("run", "list", "--json").out)["runs"]
    assert (run["steps_done"], run["last_loss"]) == (3, 4.0)
    assert "progress     3/4 steps, last loss 4.0000" in cli("run", "show", "r").out


def test_plot_own_step_guard_takes_no_bool():
    """plot's own step guard let a bool through (`"step": true` as step 1); `read_metrics`
    already skips such records, the guard now refuses them too: a step is an int, not a bool."""
    from turbo_dllm.jobs.plot import _last_per_step

    records = [{"step": True, "loss": 9.0}, {"step": 2, "loss": 5.0}, {"step": False}]
    assert _last_per_step(records) == [{"step": 2, "loss": 5.0}]


def test_plot_names_what_is_wrong_with_a_metrics_file_it_cannot_plot(cli, spec_file, workdir):
    """Every line of metrics.jsonl damaged read as "metrics.jsonl is missing or empty": it is
    neither. A missing and an empty file keep their messages."""
    slurm_run(cli, spec_file, "--run-dir", "runs/r")
    run_dir = workdir / "runs" / "r"
    assert_user_error(cli("run", "plot", "r"), "has no metrics yet (metrics.jsonl is missing)")
    for empty in ("", "\n\n  \n"):
        (run_dir / "metrics.jsonl").write_text(empty)
        assert_user_error(cli("run", "plot", "r"), "has no metrics yet (metrics.jsonl is empty)")
    lines = ['{"step": 1, "loss"', "not json", '{"step": true, "loss": 1.0}', "[1, 2]", ""]
    (run_dir / "metrics.jsonl").write_text("\n".join(lines) + "\n")
    result = cli("run", "plot", "r")
    assert_user_error(result, "metrics.jsonl has 4 lines and none is a readable record")
    assert "missing or empty" not in result.err and "is empty" not in result.err
    (run_dir / "metrics.jsonl").write_text('{"event": "eval"}\n{"event": "eval"}\nnot json\n')
    result = cli("run", "plot", "r")
    assert_user_error(result, "metrics.jsonl has 3 lines and none is a record with a step")
    assert not (run_dir / "plots").exists()
