"""Servers that never let a download finish: broken range answers end in a clear error after a
bounded number of requests, and a server that trickles bytes is cut off by the transfer deadline
($DLLM_DOWNLOAD_DEADLINE_S), so no install holds the store lock for days."""

from __future__ import annotations

import threading
import time

import pytest

from tests.bundles.server import MirrorServer
from turbo_dllm.bundles.fetch import download
from turbo_dllm.bundles.sources import (
    DEADLINE_VARIABLE,
    DeadlineExceeded,
    HttpSource,
    LoopbackHttpSource,
    transfer_deadline,
)
from turbo_dllm.errors import DllmError


@pytest.fixture(params=["stdlib", "requests"])
def client(request):
    return LoopbackHttpSource if request.param == "stdlib" else HttpSource


def bounded(fn, seconds: float):
    """fn() on a daemon thread: (its result or exception, seconds taken); fails the test if it
    is still running after `seconds` (broken code is left behind, not waited for)."""
    outcome: list = []

    def run():
        try:
            outcome.append(fn())
        except BaseException as error:  # noqa: BLE001 - handed to the test
            outcome.append(error)

    start = time.monotonic()
    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    thread.join(seconds)
    assert not thread.is_alive(), f"still running after {seconds} s"
    return outcome[0], time.monotonic() - start


def fetch(client, server, entry, dest, **options):
    return download(
        client(server.url), f"bundles/{entry.file}", sha256=entry.sha256, size=entry.size,
        dest_dir=dest, backoff_s=0.01, **options,
    )  # fmt: skip


def bundle_requests(server):
    return [r for path, r in server.state.requests if "/bundles/" in path]


@pytest.mark.parametrize("fault", ["always-416", "wrong-content-range"])
def test_broken_range_answers_end_in_a_clear_error(honest, client, tmp_path, fault):
    mirror, _, entry, archive = honest
    dest = tmp_path / "dl"
    dest.mkdir()
    (dest / f"{entry.sha256}.part").write_bytes(archive.read_bytes()[:1000])  # to resume
    with MirrorServer(mirror) as server:
        if fault == "always-416":
            server.state.fail_status = 416
        else:
            server.state.wrong_range = True
        error, _ = bounded(lambda: fetch(client, server, entry, dest, retries=1), 30)
        requests = bundle_requests(server)
    assert isinstance(error, DllmError), repr(error)
    assert "range support is broken" in error.hint
    assert requests == ["bytes=1000-", None]  # one restart from byte 0, then the error


def test_a_trickling_server_is_cut_off_by_the_deadline(honest, client, tmp_path, monkeypatch):
    mirror, _, entry, _ = honest
    monkeypatch.setenv(DEADLINE_VARIABLE, "1.5")
    with MirrorServer(mirror) as server:
        server.state.throttle_bps, server.state.chunk = 0.2, 1  # one byte every 5 s
        error, took = bounded(lambda: fetch(client, server, entry, tmp_path / "dl"), 15)
    assert isinstance(error, DeadlineExceeded), repr(error)
    assert "did not finish within the 1.5 s transfer deadline" in error.message
    assert DEADLINE_VARIABLE in error.hint and "resume" in error.hint
    assert took < 5
    assert (tmp_path / "dl" / f"{entry.sha256}.part").stat().st_size >= 1  # kept for resuming


def test_the_deadline_setting_is_checked(monkeypatch):
    monkeypatch.setenv(DEADLINE_VARIABLE, "soon")
    with pytest.raises(DllmError, match="is not a positive number of seconds"):
        transfer_deadline()
    monkeypatch.setenv(DEADLINE_VARIABLE, "7200")
    assert transfer_deadline().seconds == 7200
