"""A pack whose install was killed while moving its files is listed INCOMPLETE, and its fix was
to install it again from the file it came from. Once that file is gone (a download folder
cleaned, a USB stick unplugged) the fix was `dllm cache install PACK (its file ... is no longer
at ...)`, which no shell runs, or (in `dllm cache list`) a command naming the missing file. The
fix now names a copy on offer ($DLLM_PACK_PATH) when there is one, and otherwise the command
that removes the incomplete entry; each runs as printed."""

from __future__ import annotations

import json
import os
import shlex
import shutil
import signal
import subprocess
import sys

from tests.cache.conftest import clean_env
from tests.cache.test_packs import KILLED_AFTER_TWO_FILES, ROOT, _cache_files, _small_pack


def _half_installed(tmp_path):
    """A pack whose `dllm cache install` process was killed (SIGKILL) after 2 of its 6 files."""
    path = _small_pack(tmp_path)
    env = clean_env(DLLM_HOME=os.environ["DLLM_HOME"], PYTHONPATH=str(ROOT))
    process = subprocess.run(
        [sys.executable, "-c", KILLED_AFTER_TWO_FILES, str(path)], env=env, timeout=300
    )
    assert process.returncode == -signal.SIGKILL
    return path


def _fix_command(err: str, sha: str) -> list[str]:
    """The command in the `fix SHA:` line of stderr (the words after the first ': ' up to ' puts'
    or ' (')."""
    (line,) = [line for line in err.splitlines() if line.startswith(f"fix {sha}:")]
    assert "dllm cache " in line, line
    command = "dllm cache " + line.split("dllm cache ", 1)[1]
    for end in (" puts ", " (", "; "):
        command = command.split(end, 1)[0]
    return shlex.split(command)


def test_with_the_pack_file_gone_the_fix_removes_the_incomplete_entry(cli, tmp_path):
    path = _half_installed(tmp_path)
    path.unlink()
    listed = cli("cache", "list")
    assert "INCOMPLETE: 4 of 6 files missing" in listed.out
    (sha,) = [line.split()[0] for line in listed.out.splitlines() if "INCOMPLETE" in line]
    assert f"dllm cache install {path}" not in listed.err  # that file is gone
    assert "is gone" in listed.err, listed.err
    command = _fix_command(listed.err, sha)
    assert command[:3] == ["dllm", "cache", "remove"], command
    verified = cli("cache", "verify")
    assert verified.code == 1 and _fix_command(verified.err, sha) == command
    # --json carries the same fix (it had only the count of missing files)
    (entry,) = json.loads(cli("cache", "list", "--json").out)["installed"]
    assert entry["missing"] == 4 and f"remove it: {shlex.join(command)} " in entry["fix"]

    removed = cli(*command[1:])
    assert removed.code == 0 and "2 files deleted" in removed.out, removed.err
    assert cli("cache", "list").out.startswith("no compile-cache packs installed")
    # Nothing left, the killed install's staging folder (the files it had not moved) included.
    assert _cache_files() == []


def test_with_the_pack_file_gone_the_fix_names_a_copy_on_offer(cli, tmp_path, monkeypatch):
    path = _half_installed(tmp_path)
    offered = tmp_path / "offered packs"
    offered.mkdir()
    shutil.move(path, offered / path.name)
    monkeypatch.setenv("DLLM_PACK_PATH", str(offered))
    listed = cli("cache", "list")
    (sha,) = [line.split()[0] for line in listed.out.splitlines() if "INCOMPLETE" in line]
    command = _fix_command(listed.err, sha)
    assert command == ["dllm", "cache", "install", str(offered / path.name)], listed.err

    installed = cli(*command[1:])
    assert installed.code == 0, installed.err
    assert "INCOMPLETE" not in cli("cache", "list").out
    assert cli("cache", "verify").code == 0
