"""The process backend: output streamed and kept, exit statuses as a shell reports them."""

from __future__ import annotations

import sys

from turbo_dllm.jobs.backends import exit_code
from turbo_dllm.jobs.backends.torchrun import run_process


def test_output_is_streamed_and_logged(tmp_path, capfd):
    log = tmp_path / "console.log"
    script = "import sys; print('to stdout'); print('to stderr', file=sys.stderr); sys.exit(3)"
    code = run_process([sys.executable, "-c", script], env={}, cwd=str(tmp_path), log_path=log)
    assert code == 3
    out, err = capfd.readouterr()
    assert "to stdout" in out and "to stderr" in err
    assert set(log.read_text().splitlines()) == {"to stdout", "to stderr"}


def test_killed_child_exits_128_plus_signal(tmp_path):
    script = "import os, signal; os.kill(os.getpid(), signal.SIGTERM)"
    assert run_process([sys.executable, "-c", script], env={}, cwd=str(tmp_path)) == 143
    assert exit_code(-9) == 137 and exit_code(0) == 0 and exit_code(2) == 2


def test_environment_reaches_the_child(tmp_path, capfd):
    script = "import os; print(os.environ['DLLM_RUN_ID'])"
    env = {"DLLM_RUN_ID": "r-42"}
    assert run_process([sys.executable, "-c", script], env=env, cwd=str(tmp_path)) == 0
    assert capfd.readouterr().out.strip() == "r-42"
