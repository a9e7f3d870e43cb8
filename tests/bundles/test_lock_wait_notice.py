"""A bundle command that finds the store locked by another (an install downloading a large
bundle) waited up to --lock-timeout (60 s by default) without a word, then failed naming the
holder. It now says at once that it is waiting, for whom and for how long."""

from __future__ import annotations

import os

from turbo_dllm.bundles.store import BundleStore, file_lock


def test_a_command_that_waits_for_the_lock_says_so_at_once(cli):
    store = BundleStore()
    with file_lock(store.lock_path, 0, "held by the test"):
        result = cli("bundle", "rollback", "--lock-timeout", "0.2")
    assert result.code == 2, result.err
    first, error, *_ = result.err.splitlines()
    assert error.startswith("dllm: error: another bundle operation is running"), result.err
    assert first.startswith("dllm: waiting up to 0.2 s for another bundle operation"), result.err
    assert f"(pid {os.getpid()} since " in first and "--lock-timeout" in first


def test_no_notice_when_the_lock_is_free_or_not_waited_for(cli):
    store = BundleStore()
    free = cli("bundle", "rollback", "--lock-timeout", "0.2")
    assert "waiting" not in free.err  # (no previous bundle: its own error)
    with file_lock(store.lock_path, 0, "held by the test"):
        at_once = cli("bundle", "rollback", "--lock-timeout", "0")
    assert "waiting" not in at_once.err and "another bundle operation" in at_once.err
