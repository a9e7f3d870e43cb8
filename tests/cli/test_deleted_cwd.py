"""A command run from a folder that was deleted (or moved) while the shell sat in it: `dllm
doctor` ended inside torch's import ("Intel oneMKL FATAL ERROR: Cannot load libtorch_cpu.so",
exit 2) without a word from dllm, and other commands said only "No such file or directory".
Every command now says so before it starts (exit 2)."""

from __future__ import annotations

import json
import subprocess
import sys

from tests.helpers import assert_user_error

MESSAGE = "the current folder no longer exists"
HINT = "hint: cd to an existing folder and run the command again"


def test_doctor_in_a_deleted_folder_says_so_before_torch(tmp_path):
    (tmp_path / "d").mkdir()
    proc = subprocess.run(
        ["sh", "-c", 'cd d && rmdir ../d && exec "$0" -m turbo_dllm doctor', sys.executable],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 2, (proc.stdout, proc.stderr)
    assert proc.stderr.startswith(f"dllm: error: {MESSAGE}"), proc.stderr
    assert HINT in proc.stderr and "oneMKL" not in proc.stderr


def test_every_command_in_a_deleted_folder_says_so(cli, tmp_path, monkeypatch):
    gone = tmp_path / "d"
    gone.mkdir()
    monkeypatch.chdir(gone)
    monkeypatch.setenv("PWD", str(gone))
    gone.rmdir()
    for command in (
        ("config", "validate", "--config", "train.yaml"),
        ("data", "validate", tmp_path / "artifact"),
        ("run", "list"),
    ):
        assert_user_error(cli(*command), f"dllm: error: {MESSAGE} ({gone})\n{HINT}\n")
    result = cli("doctor", "--json")
    assert result.code == 2
    assert json.loads(result.out) == {
        "error": f"{MESSAGE} ({gone})",
        "hint": HINT.removeprefix("hint: "),
    }
    assert cli("--version").code == 0  # needs no folder
