"""A bundle store whose path goes through a file (a `DLLM_HOME` that is a file): every bundle
command names the file, reading ones included (they said "no bundles installed")."""

from __future__ import annotations

import json

import pytest

from tests.helpers import assert_user_error

COMMANDS = [
    ("list",),
    ("list", "--json"),
    ("status",),
    ("status", "--json"),
    ("verify",),
    ("verify", "--json"),
    ("uninstall", "abcdef"),
    ("rollback",),
    ("deactivate",),
    ("install", "--auto", "--mirror", "{mirror}", "--catalog-sha256", "0" * 64),
]


@pytest.mark.parametrize("command", COMMANDS, ids=lambda c: " ".join(c[:2]))
def test_a_home_that_is_a_file_is_named(cli, tmp_path, monkeypatch, command):
    home = tmp_path / "home"
    home.write_text("not a folder")
    monkeypatch.setenv("DLLM_HOME", str(home))
    args = [a.format(mirror=tmp_path) for a in command]
    result = cli("bundle", *args)
    assert_user_error(
        result,
        f"the bundle store {home / 'bundles'} cannot be used: DLLM_HOME {home} is a file, "
        "not a folder",
        f"hint: move the file {home} out of the way, or set DLLM_HOME to a folder",
    )
    assert len(result.err.strip().splitlines()) == 2
    # --json: that error as the one JSON object (tests/cli/test_json_errors.py); else nothing.
    assert result.out == "" if "--json" not in args else json.loads(result.out)["error"]
    assert home.read_text() == "not a folder"


@pytest.mark.parametrize("command", [("list",), ("status",), ("verify",)], ids=str)
def test_a_file_inside_the_store_is_named(cli, isolated_home, command):
    blocker = isolated_home / "bundles" / "store"
    blocker.parent.mkdir()
    blocker.write_text("")
    assert_user_error(
        cli("bundle", *command),
        f"the bundle store {isolated_home / 'bundles'} cannot be used: {blocker} is a file",
        f"move the file {blocker} out of the way",
    )


def test_a_store_with_nothing_in_the_way_still_reads_empty(cli):
    assert cli("bundle", "list").out.startswith("no bundles installed")
    assert cli("bundle", "verify").out.startswith("no bundles installed")
