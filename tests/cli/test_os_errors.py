"""A file-system error no command foresaw (a path that is a folder, a full disk, permission
denied) ends as `dllm: error:` naming the path and the OS's reason, exit 2, no traceback."""

from __future__ import annotations

import errno
import json

import pytest

from tests.helpers import assert_user_error
from turbo_dllm.cli import describe_os_error


def _plain_run(folder):
    """A `dllm train --run-dir` run under folder/runs: metrics only, which `run plot` reads."""
    run_dir = folder / "runs" / "plain"
    run_dir.mkdir(parents=True)
    lines = [
        {"step": i + 1, "loss": 5.0 - i, "tokens_per_s": 100.0, "mem_gb": 0.5} for i in range(3)
    ]
    (run_dir / "metrics.jsonl").write_text("".join(json.dumps(x) + "\n" for x in lines))
    return run_dir


def test_a_plot_over_a_folder_is_a_user_error_in_a_real_process(cli_process, tmp_path):
    run_dir = _plain_run(tmp_path)
    (run_dir / "plots" / "loss.png").mkdir(parents=True)  # the image's name is a folder
    result = cli_process("run", "plot", "plain", cwd=tmp_path)
    assert_user_error(result, f"{str(run_dir / 'plots' / 'loss.png')!r}: Is a directory", "hint:")


@pytest.mark.parametrize(
    ("error", "needles"),
    [
        (
            OSError(errno.ENOSPC, "No space left on device", "/data/runs/x/loss.png"),
            ["'/data/runs/x/loss.png': No space left on device", "hint: the disk is full"],
        ),
        (
            PermissionError(errno.EACCES, "Permission denied", "/data/runs/x"),
            ["'/data/runs/x': Permission denied", "permissions"],
        ),
        (OSError("the device said no"), ["dllm: error: the device said no\nhint:"]),
    ],
)
def test_an_os_error_from_any_command_is_a_user_error(cli, tmp_path, monkeypatch, error, needles):
    import turbo_dllm.jobs.plot as plot

    def fail(run_dirs, out_dir=None):
        raise error

    monkeypatch.setattr(plot, "plot_runs", fail)  # what `dllm run plot RUN [RUN ...]` calls
    monkeypatch.chdir(tmp_path)
    _plain_run(tmp_path)
    assert_user_error(cli("run", "plot", "plain"), *needles)


def test_the_file_in_the_way_and_both_paths_of_a_rename_are_named(tmp_path):
    (tmp_path / "afile").write_text("x")
    try:
        (tmp_path / "afile" / "sub").mkdir(parents=True)
    except OSError as error:
        message, hint = describe_os_error(error)
    assert message == (
        f"{str(tmp_path / 'afile' / 'sub')!r}: Not a directory "
        f"({str(tmp_path / 'afile')!r} is a file, not a folder)"
    )
    assert "a part of that path is a file" in hint
    message, _ = describe_os_error(
        OSError(errno.EXDEV, "Invalid cross-device link", "a", None, "b")
    )
    assert message == "'a' -> 'b': Invalid cross-device link"
