"""`dllm bundle install` stopped by SIGTERM (`kill`, `timeout`, a scheduler) or Ctrl-C while it
downloads: nothing changes (the previous bundle stays active, no staging folder is left, the
lock is free), one line says so, and the process ends as that signal ends a `dllm` job (SIGTERM:
by the signal, exit status 143; Ctrl-C: 130). SIGTERM ended it on the spot before, with
nothing said and its staging folder left for the next install to sweep."""

from __future__ import annotations

import os
import signal
import time

import pytest

from tests.bundles.server import MirrorServer
from tests.bundles.test_adversarial import (  # noqa: F401 (bundle_b: a fixture)
    _slow_install,
    assert_previous_still_active,
    attempt,
    bundle_b,
)
from turbo_dllm.bundles.store import BundleStore
from turbo_dllm.sigterm import signals_deferred


@pytest.mark.parametrize(
    ("sent", "code", "by"),
    [(signal.SIGTERM, -signal.SIGTERM, "SIGTERM"), (signal.SIGINT, 130, "Ctrl-C")],
    ids=["sigterm", "ctrl-c"],
)
def test_an_interrupted_install_changes_nothing_and_says_so(
    bundle_b,  # noqa: F811
    installed,
    sent,
    code,
    by,
):
    mirror, catalog_sha, entry = bundle_b
    with MirrorServer(mirror) as server:
        process, part = _slow_install(server, catalog_sha)
        process.send_signal(sent)
        out, err = process.communicate(timeout=60)
        assert process.returncode == code, (out, err)
        lines = err.splitlines()
        assert lines == [
            f"dllm: bundle install interrupted by {by}: nothing changed (the active bundle is "
            f"still {installed.bundle_id} ({installed.short_sha})); the partial download is "
            "kept: the same command resumes it"
        ], err
        assert out == ""
        assert_previous_still_active(installed)  # and no staging folder left behind
        assert 0 < part.stat().st_size < entry.size
        with BundleStore().locked(0):  # the lock went with the process
            pass
        # The same install, run again, resumes the kept bytes and completes.
        server.state.throttle_bps = None
        result = attempt(server.url, catalog_sha=catalog_sha)
    assert result.bundle.sha256 == entry.sha256
    assert BundleStore().previous().sha256 == installed.sha256


def test_signals_wait_for_the_end_of_a_deferred_block():
    """What keeps an interrupt out of the renames that install and activate a bundle."""
    seen: list[str] = []

    def on_term(signum, frame):
        seen.append("handler")

    saved = signal.signal(signal.SIGTERM, on_term)
    try:
        with signals_deferred():
            os.kill(os.getpid(), signal.SIGTERM)
            os.kill(os.getpid(), signal.SIGTERM)  # one delivery, whatever the count
            time.sleep(0.05)
            seen.append("block done")
        assert seen == ["block done", "handler"]
        assert signal.getsignal(signal.SIGTERM) is on_term
        with pytest.raises(KeyboardInterrupt), signals_deferred():
            os.kill(os.getpid(), signal.SIGINT)
            time.sleep(0.05)
            seen.append("interrupted block done")
        assert seen[-1] == "interrupted block done"
    finally:
        signal.signal(signal.SIGTERM, saved)


class _Stop(Exception):
    pass


def test_a_signal_while_the_bundle_is_put_in_place_waits_for_it(
    bundle_b,  # noqa: F811
    installed,
    monkeypatch,
):
    """SIGTERM that arrives between the rename into the store and the swap of `active` is
    taken once both are done: the install is whole (new bundle active, the old one previous),
    and the signal's handler runs after it, never with the store half-changed."""
    mirror, catalog_sha, entry = bundle_b
    store_type = type(BundleStore())
    real_add = store_type.add_extracted

    def add_then_signal(self, *args, **kwargs):
        bundle = real_add(self, *args, **kwargs)
        os.kill(os.getpid(), signal.SIGTERM)  # after the rename, before `active` moves
        time.sleep(0.05)
        return bundle

    def on_term(signum, frame):
        raise _Stop

    monkeypatch.setattr(store_type, "add_extracted", add_then_signal)
    saved = signal.signal(signal.SIGTERM, on_term)
    try:
        with pytest.raises(_Stop):
            attempt(mirror, catalog_sha=catalog_sha)
    finally:
        signal.signal(signal.SIGTERM, saved)
    store = BundleStore()
    assert store.active().sha256 == entry.sha256
    assert store.previous().sha256 == installed.sha256
    assert not [p for p in store.store_dir.iterdir() if p.name.startswith(".")]
