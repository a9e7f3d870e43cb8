"""Every `dllm bundle` command with `--lock-timeout` says what it is and its default in
`--help` (uninstall, rollback and deactivate said nothing)."""

from __future__ import annotations

import pytest


@pytest.mark.parametrize("command", ["install", "uninstall", "rollback", "deactivate"])
def test_lock_timeout_has_help(cli, command):
    result = cli("bundle", command, "--help")
    assert result.code == 0, result.err
    text = " ".join(result.out.split())  # argparse wraps to the terminal's width
    assert (
        "--lock-timeout LOCK_TIMEOUT seconds to wait for the bundle store's lock while another "
        "bundle command holds it (default 60; 0 or more)"
    ) in text, text


def test_retries_says_its_default(cli):
    """`--retries` gave no default (4, as docs/bundles.md says: five attempts in all)."""
    text = " ".join(cli("bundle", "install", "--help").out.split())
    assert "default 4; 0: one attempt" in text, text
