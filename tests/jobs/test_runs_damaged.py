"""`dllm run list | show` over run dirs whose files were damaged in ways a JSON parser alone does
not catch: each reads as unknown or is a `dllm: error:`, never a traceback. A status record
(result.json, slurm_job.json, launcher.json) is checked like the manifest: one that is damaged
or of another format is named, never read as no record or taken as is."""

from __future__ import annotations

import json

from tests.helpers import assert_user_error
from tests.jobs.test_runs_cli import slurm_run, write_metrics


def _damaged(format_name: str, good: dict) -> dict[str, tuple[bytes, str]]:
    """Ways a status record is damaged, each with what the error says about it."""
    expected = f"turbo_dllm.{format_name}.v1"
    return {
        "not UTF-8": (b'\xff\xfe{"exit_code": 0}', "cannot read"),
        "nested": (b"[" * 100_000, "nested deeper than JSON is parsed"),
        "torn": (json.dumps(good).encode()[:-9], "cannot read"),
        "not an object": (b"[1, 2]", f"(format None, expected {expected!r})"),
        "no format": (
            json.dumps({k: v for k, v in good.items() if k != "format"}).encode(),
            f"(format None, expected {expected!r})",
        ),
        "another format": (
            json.dumps({**good, "format": "turbo_dllm.run_manifest.v1"}).encode(),
            f"(format 'turbo_dllm.run_manifest.v1', expected {expected!r})",
        ),
    }


def _assert_each_named(cli, run_dir, name: str, damaged: dict) -> None:
    """Each {why: (bytes, what the message says)} written as `name` is named, not read."""
    for why, (data, says) in damaged.items():
        (run_dir / name).write_bytes(data)
        try:
            _assert_named_not_read(cli, run_dir, name, says)
        except AssertionError as error:
            raise AssertionError(f"{why}: {error}") from None


def _assert_named_not_read(cli, run_dir, name: str, *needles: str) -> None:
    """`run list` lists the other runs and names this one as unreadable; `run show` says what
    is wrong with which file and how to go on; neither is a traceback."""
    listing = cli("run", "list", "--json")
    assert listing.code == 0, listing.err
    document = json.loads(listing.out)
    assert [r["run_id"] for r in document["runs"]] == ["good"]
    assert document["unreadable_manifest"] == [f"runs/{run_dir.name}"]
    table = cli("run", "list")
    assert table.code == 0 and "Traceback" not in table.err, table.err
    assert f"says which and why): {run_dir.name}" in table.out
    shown = cli("run", "show", run_dir.name)
    assert_user_error(shown, str(run_dir / name), *needles, f"rm {run_dir / name}")
    assert cli("run", "show", run_dir.name, "--json").code == 0  # the manifest as recorded


def test_a_result_json_damaged_or_of_another_format_is_named_not_read_as_no_result(
    cli, spec_file, workdir
):
    """result.json was read with a bare json.loads: a non-UTF-8 byte was a UnicodeDecodeError
    traceback in list and show, then a torn or non-UTF-8 one read as no result, and one of
    another format (or without one) was taken as a result. Each is now named, as a damaged
    manifest is."""
    from turbo_dllm.jobs.result import RESULT_FORMAT, read_result, write_result

    slurm_run(cli, spec_file, "--run-dir", "runs/good")
    slurm_run(cli, spec_file, "--run-dir", "runs/r")
    run_dir = (workdir / "runs" / "r").resolve()
    write_metrics(run_dir, [5.0, 4.5])
    write_result(run_dir, 0, "2026-01-01T00:00:00+00:00", "slurm", slurm_job_id="7")
    good = json.loads((run_dir / "result.json").read_text())
    assert good["format"] == RESULT_FORMAT and read_result(run_dir) == good
    damaged = _damaged("run_result", good)
    damaged["invalid"] = (
        json.dumps({**good, "exit_code": "0"}).encode(),
        "is not a valid run result: exit_code",
    )
    _assert_each_named(cli, run_dir, "result.json", damaged)


def test_a_slurm_job_record_damaged_or_of_another_format_is_named_not_read_as_not_submitted(
    cli, spec_file, workdir
):
    """slurm_job.json was read with a bare json.loads: a non-UTF-8 byte (or nesting past the
    parser's depth) was a traceback in `run list` and `run show`, then read as `not submitted`,
    and one of another format with a job_id was taken as the run's job. Each is now named."""
    from turbo_dllm.jobs.backends.slurm import record_running_job

    slurm_run(cli, spec_file, "--run-dir", "runs/good")
    slurm_run(cli, spec_file, "--run-dir", "runs/s")
    run_dir = (workdir / "runs" / "s").resolve()
    write_metrics(run_dir, [5.0])
    record_running_job(run_dir, "12")
    good = json.loads((run_dir / "slurm_job.json").read_text())
    damaged = _damaged("slurm_job", good)
    damaged["invalid"] = (
        json.dumps({**good, "job_id": 12}).encode(),
        "is not a valid SLURM job record: job_id",
    )
    _assert_each_named(cli, run_dir, "slurm_job.json", damaged)


def test_a_job_that_starts_replaces_a_damaged_slurm_job_record(cli, spec_file, workdir, capsys):
    """The batch script's first step (`python -m turbo_dllm.jobs.result --job-started`) reads
    the record it replaces, where a damaged one is now an error: the job must not stop there
    (it is the run's latest attempt whatever the record said), nor replace it without a word as
    it did. It warns, naming the file, and records itself in its place."""
    from turbo_dllm.jobs.result import main

    slurm_run(cli, spec_file, "--run-dir", "runs/s")
    run_dir = (workdir / "runs" / "s").resolve()
    for data in (b"\xff", b'{"format": "turbo_dllm.run_result.v1", "job_id": "3"}'):
        (run_dir / "slurm_job.json").write_bytes(data)
        capsys.readouterr()
        assert main(["--run-dir", str(run_dir), "--job-started", "--slurm-job-id", "13"]) == 0
        err = capsys.readouterr().err
        assert err.startswith("dllm: warning: ") and str(run_dir / "slurm_job.json") in err, err
        assert "this job records itself in its place" in err
        assert json.loads((run_dir / "slurm_job.json").read_text())["job_id"] == "13"
        [run] = json.loads(cli("run", "list", "--json").out)["runs"]
        assert run["slurm_job_id"] == "13"


def test_a_launcher_record_damaged_or_of_another_format_is_named_not_left_out(
    cli, spec_file, workdir
):
    """launcher.json was read with a bare json.loads and one that did not parse (or lacked a
    host or pid) was left out: the run read `no result`, as if no launcher had started; one of
    another format with a host and pid was taken as the launcher. Each is now named."""
    slurm_run(cli, spec_file, "--run-dir", "runs/good")
    run_dir = (workdir / "runs" / "l").resolve()
    assert cli("launch", "--config", spec_file, "--run-dir", run_dir).code == 0
    (run_dir / "result.json").unlink()  # what a killed launcher leaves: its record only
    good = json.loads((run_dir / "launcher.json").read_text())
    damaged = _damaged("run_launcher", good)
    damaged["invalid"] = (
        json.dumps({**good, "pid": True}).encode(),
        "is not a valid launcher record: pid",
    )
    _assert_each_named(cli, run_dir, "launcher.json", damaged)
    # Another node's record damaged beside a good one is named too.
    (run_dir / "launcher.json").write_text(json.dumps(good))
    assert json.loads(cli("run", "list", "--json").out)["unreadable_manifest"] == []
    (run_dir / "launcher-node-b.json").write_text("{torn")
    _assert_named_not_read(cli, run_dir, "launcher-node-b.json", "cannot read launcher record")


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
