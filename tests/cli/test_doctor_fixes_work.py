"""`dllm doctor`'s fixes, taken at their word: each command a failing check prints must be one
that exists, with the flags it has, quoted for the paths it names, and must fix what it says."""

from __future__ import annotations

import re
import shlex
import sys

from turbo_dllm.cli import build_parser
from turbo_dllm.doctor import DoctorContext


def _commands(fix: str) -> list[list[str]]:
    """The backquoted `dllm ...` commands of a fix line, split as bash would."""
    return [shlex.split(found) for found in re.findall(r"`(dllm [^`]*)`", fix)]


def _parses(argv: list[str]) -> None:
    """argparse accepts the command (it exits 2 on a flag the command lacks)."""
    assert argv[0] == "dllm"
    build_parser().parse_args(argv[1:])


def test_a_damaged_synced_copy_s_fix_names_only_commands_and_flags_that_exist(
    tmp_path, monkeypatch
):
    """The fix said 'or pass --target/--manifest', flags `dllm doctor` refuses (exit 2), and its
    sync line ran on into '; --target NAME where auto picks another' when pasted."""
    from turbo_dllm.doctor.checks import env as env_check

    venv = tmp_path / "my venv"
    venv.mkdir()
    (venv / "dllm-env-manifest.toml").write_text("format = [[[")
    monkeypatch.setattr(sys, "prefix", str(venv))
    result = env_check.environment_manifest(DoctorContext())
    assert result.status == "warn" and "not valid TOML" in result.detail
    assert "pass --target" not in result.fix
    commands = _commands(result.fix)
    assert ["dllm", "env", "sync", "--venv", str(venv)] in commands
    assert "dllm env check --target NAME (or --manifest FILE)" in result.fix
    for argv in commands:
        _parses(argv)
