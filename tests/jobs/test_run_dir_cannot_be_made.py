"""A run dir that cannot be made, under /proc or under a read-only folder, is refused by the
launch's readiness checks as such, with a fix. Before, as root (os.access passes everywhere)
`dllm launch --run-dir /proc/x/run` passed the run dir check and failed the disk check with
"/proc is full ... 0 bytes free on /proc (run dir)"."""

from __future__ import annotations

import os
import stat

from tests.helpers import assert_user_error


def test_a_run_dir_under_proc_is_refused_as_one_that_cannot_be_made(cli, spec_file, workdir):
    result = cli("launch", "--config", spec_file, "--run-dir", "/proc/dllm-no-such/run")
    why = (
        "/proc is the kernel's proc file system: no folder can be made there"
        if os.access("/proc", os.W_OK | os.X_OK)
        else "/proc is not writable (permission denied)"
    )
    assert_user_error(
        result,
        f"run dir: cannot create runs under /proc/dllm-no-such/run: {why}",
        "fix: pass --run-dir (or --run-root, or set launch.run_dir) to a folder you can write",
    )
    assert "full" not in result.err and "disk" not in result.err
    assert sorted(p.name for p in workdir.iterdir()) == ["train.yaml"]


def test_a_run_dir_under_a_read_only_folder_is_refused(cli, spec_file, workdir):
    locked = workdir / "locked"
    locked.mkdir()
    locked.chmod(stat.S_IRUSR | stat.S_IXUSR | stat.S_IRGRP | stat.S_IXGRP | stat.S_IROTH)
    try:
        if os.access(locked, os.W_OK):
            # root writes through 0o555: what cannot be made for root is a folder through a
            # file, or (above) one under /proc
            (workdir / "taken").write_text("a file")
            where, why = "taken/run", f"the path goes through {workdir / 'taken'}, which is a file"
        else:
            where, why = "locked/run", f"{locked} is not writable (permission denied)"
        result = cli("launch", "--config", spec_file, "--run-dir", where)
        assert_user_error(result, f"{workdir / where}: {why}", "--run-dir")
        assert "full" not in result.err
        assert not (locked / "run").exists()
    finally:
        locked.chmod(0o755)


def test_a_file_system_with_no_size_is_not_said_to_be_full(cli, workdir):
    """The disk check reads /proc's 0 blocks as no size, not as 0 bytes free."""
    from turbo_dllm.fsutil import file_system

    assert file_system("/proc/dllm-no-such") == (file_system("/proc")[0], None)
