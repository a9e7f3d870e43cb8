"""Sources and resumable downloads: both HTTP clients (requests for remote indexes, the plain-socket
GET for a mirror on this machine), Range resume, servers without ranges, and the one-pass
download-and-unpack the installer uses (one pass; the unpacker's result counts only once the
whole archive matched its hash)."""

from __future__ import annotations

import hashlib
import os

import pytest

from tests.bundles.server import MirrorServer
from turbo_dllm.bundles.archive import BundleRejected
from turbo_dllm.bundles.fetch import download, download_unpacked
from turbo_dllm.bundles.sources import HttpSource, LocalSource, LoopbackHttpSource, open_source
from turbo_dllm.errors import DllmError

SIZE = 300_000


@pytest.fixture
def index(tmp_path):
    """A folder index holding `bundles/blob.bin` (random bytes); returns (root, sha256)."""
    root = tmp_path / "index"
    (root / "bundles").mkdir(parents=True)
    data = os.urandom(SIZE)
    (root / "bundles" / "blob.bin").write_bytes(data)
    return root, hashlib.sha256(data).hexdigest()


@pytest.fixture(params=["stdlib", "requests"])
def client(request):
    """Each HTTP client, pointed at the same loopback server."""
    return LoopbackHttpSource if request.param == "stdlib" else HttpSource


def fetch_blob(source, sha, dest, **options):
    options.setdefault("backoff_s", 0.01)
    return download(source, "bundles/blob.bin", sha256=sha, size=SIZE, dest_dir=dest, **options)


def bundle_requests(server):
    return [r for path, r in server.state.requests if "/bundles/" in path]


def test_sources_by_location(tmp_path):
    assert isinstance(open_source("http://127.0.0.1:8000/x"), LoopbackHttpSource)
    assert isinstance(open_source("http://localhost:8000"), LoopbackHttpSource)
    assert isinstance(open_source("http://[::1]:8000"), LoopbackHttpSource)
    # Remote and TLS indexes keep requests: proxy variables, CA bundles, certificates.
    assert isinstance(open_source("http://mirror.cluster:8000"), HttpSource)
    assert isinstance(open_source("https://127.0.0.1:8443"), HttpSource)
    assert isinstance(open_source(str(tmp_path)), LocalSource)
    assert isinstance(open_source(tmp_path.as_uri()), LocalSource)
    # Offline mode reaches the HTTP sources too: it rules where their redirects may lead.
    assert open_source("http://127.0.0.1:8000", offline=True).offline
    assert open_source("https://localhost:8443", offline=True).offline
    assert not open_source("http://127.0.0.1:8000").offline


def test_truncated_transfers_resume_with_range(index, client, hashing, tmp_path):
    root, sha = index
    with MirrorServer(root) as server:
        server.state.truncate_after, server.state.truncate_times = 100_000, 2
        path = fetch_blob(client(server.url), sha, tmp_path / "dl")
        assert bundle_requests(server) == [None, "bytes=100000-", "bytes=200000-"]
    assert path.name == f"{sha}.tar.zst" and hashlib.sha256(path.read_bytes()).hexdigest() == sha
    assert not list(path.parent.glob("*.part"))


def test_a_failure_after_some_bytes_says_the_next_run_resumes_them(index, client, tmp_path):
    root, sha = index
    with MirrorServer(root) as server:
        server.state.truncate_after, server.state.truncate_times = 100_000, 1
        server.state.fail_status, server.state.fail_times = 503, 0  # from the second request
        source = client(server.url)
        real_open = source.open

        def open_then_fail(*args, **kwargs):
            opened = real_open(*args, **kwargs)
            server.state.fail_times = -1  # every later answer is a 503
            return opened

        source.open = open_then_fail
        with pytest.raises(DllmError, match="failed after 2 attempts") as caught:
            fetch_blob(source, sha, tmp_path / "c", retries=1)
    assert "it resumes the partial download (100000 of 300000 bytes kept)" in caught.value.hint


def test_http_errors(index, client, tmp_path):
    root, sha = index
    with MirrorServer(root) as server:
        source = client(server.url)
        server.state.fail_status, server.state.fail_times = 503, 1  # transient: retried
        assert fetch_blob(source, sha, tmp_path / "a").is_file()
        server.state.fail_status, server.state.fail_times = 503, -1
        with pytest.raises(DllmError, match="failed after 2 attempts: .*HTTP 503") as caught:
            fetch_blob(source, sha, tmp_path / "b", retries=1)
        # Not a byte came: there is no partial download to resume (the hint said there was).
        assert "nothing was downloaded" in caught.value.hint
        assert (
            "resumes" not in caught.value.hint and "run the same command again" in caught.value.hint
        )
        server.state.fail_status = None
        with pytest.raises(DllmError, match="not found .HTTP 404."):
            download(source, "bundles/missing.bin", sha256=sha, size=SIZE, dest_dir=tmp_path)
        with pytest.raises(DllmError, match="catalog.toml was not found"):
            client(server.url).read_small("releases/v/catalog.toml", 100, backoff_s=0.01)


class Redirector:
    """A server on 127.0.0.1 answering every GET with `status` and `Location: to(path)` (no
    Location when `to` returns None)."""

    def __init__(self, to, status: int = 302) -> None:
        import threading
        from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args):
                pass

            def do_GET(self):
                self.send_response(status)
                location = to(self.path)
                if location is not None:
                    self.send_header("Location", location)
                self.send_header("Content-Length", "0")
                self.end_headers()

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._server.daemon_threads = True
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)
        self.url = f"http://127.0.0.1:{self._server.server_address[1]}"

    def __enter__(self):
        self._thread.start()
        return self

    def __exit__(self, *exc):
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(timeout=5)


@pytest.mark.parametrize("status", [301, 302, 307, 308])
def test_redirects_are_followed_and_resume_through_them(index, client, tmp_path, status):
    """The plain-socket client answered a redirect with "HTTP 302 Found" (while requests
    followed it): both follow it now, Range header included."""
    root, sha = index
    with MirrorServer(root) as server, Redirector(lambda p: server.url + p, status) as hop:
        server.state.truncate_after, server.state.truncate_times = 100_000, 1
        path = fetch_blob(client(hop.url), sha, tmp_path / "dl")
        assert bundle_requests(server) == [None, "bytes=100000-"]
        assert client(hop.url).read_small("bundles/blob.bin", SIZE) == path.read_bytes()
    assert hashlib.sha256(path.read_bytes()).hexdigest() == sha


def test_redirect_rules(index, client, tmp_path):
    """In offline mode a redirect may lead to this machine's loopback only (requests followed
    it anywhere, through any proxy); loops, other schemes and a missing Location are errors."""
    root, sha = index
    remote = "http://192.0.2.1:8000"  # TEST-NET-1: refused before any connection is tried
    with Redirector(lambda p: remote + p) as hop:
        with pytest.raises(DllmError, match="offline mode: .* refusing to contact '192.0.2.1'"):
            fetch_blob(client(hop.url, offline=True), sha, tmp_path)
    with Redirector(lambda p: p) as hop:  # to itself
        with pytest.raises(DllmError, match="more than 5 redirects") as caught:
            fetch_blob(client(hop.url), sha, tmp_path)
        assert "loop" in caught.value.hint
    with Redirector(lambda p: "ftp://127.0.0.1/x") as hop:
        with pytest.raises(DllmError, match="not an http.s. URL"):
            fetch_blob(client(hop.url), sha, tmp_path)
    with Redirector(lambda p: None) as hop:
        with pytest.raises(DllmError, match="HTTP 302 Found without a Location"):
            fetch_blob(client(hop.url), sha, tmp_path)
    with MirrorServer(root) as server:
        server.state.fail_status = 403
        with pytest.raises(DllmError, match="HTTP 403 Forbidden") as caught:
            fetch_blob(client(server.url), sha, tmp_path)
        assert "refused the request" in caught.value.hint
    assert list(tmp_path.glob("*.part")) == []


def test_requests_uses_no_proxy_for_a_mirror_on_loopback(index, tmp_path, monkeypatch):
    """No proxy can reach this machine's loopback (an https:// mirror served here, or where a
    redirect leads): requests went to the proxy of HTTP(S)_PROXY / ALL_PROXY."""
    root, sha = index
    for name in ("HTTP_PROXY", "HTTPS_PROXY", "ALL_PROXY", "http_proxy", "https_proxy"):
        monkeypatch.setenv(name, "http://192.0.2.1:9")  # TEST-NET-1: nothing answers there
    for name in ("NO_PROXY", "no_proxy"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setattr("turbo_dllm.bundles.sources.CONNECT_TIMEOUT_S", 1.0)
    with MirrorServer(root) as server:
        assert fetch_blob(HttpSource(server.url), sha, tmp_path, retries=0).is_file()


def test_refused_connection_is_transient(index, client, tmp_path):
    root, sha = index
    with MirrorServer(root) as server:
        url = server.url
    with pytest.raises(DllmError, match="failed after 2 attempts"):
        fetch_blob(client(url), sha, tmp_path, retries=1)  # the server is gone


def test_server_without_ranges_restarts_from_zero(index, client, tmp_path):
    root, sha = index
    dest = tmp_path / "dl"
    dest.mkdir()
    data = (root / "bundles" / "blob.bin").read_bytes()
    (dest / f"{sha}.part").write_bytes(data[:1000])  # a partial download of an earlier run
    with MirrorServer(root) as server:
        server.state.ranges = False
        path = fetch_blob(client(server.url), sha, dest)
        assert bundle_requests(server) == ["bytes=1000-"]  # answered with the whole file
    assert path.read_bytes() == data


def test_a_finished_download_is_verified_not_fetched_again(index, tmp_path):
    root, sha = index
    with MirrorServer(root) as server:
        first = fetch_blob(open_source(server.url), sha, tmp_path)
        again = fetch_blob(open_source(server.url), sha, tmp_path)
        assert len(bundle_requests(server)) == 1
    assert again == first
    first.write_bytes(b"x" * SIZE)  # damaged on disk: fetched again
    with MirrorServer(root) as server:
        assert fetch_blob(open_source(server.url), sha, tmp_path).read_bytes() != b"x" * SIZE
        assert bundle_requests(server) == [None]


def reading_unpacker(seen: list):
    """An unpacker that reads the stream to its end in small pieces, counting what it saw in
    `seen` (one entry per call, updated as it reads), and returns the sha256 of it."""

    def unpack(stream):
        seen.append(0)
        digest = hashlib.sha256()
        while block := stream.read(65536):
            assert len(block) <= 65536
            digest.update(block)
            seen[-1] += len(block)
        return digest.hexdigest()

    return unpack


def test_download_unpacked_streams_once_and_restarts_the_unpacker_on_resume(
    index, hashing, tmp_path
):
    root, sha = index
    seen: list[int] = []
    with MirrorServer(root) as server:
        server.state.truncate_after, server.state.truncate_times = 120_000, 1
        result = download_unpacked(
            open_source(server.url),
            "bundles/blob.bin",
            unpack=reading_unpacker(seen),
            sha256=sha,
            size=SIZE,
            dest_dir=tmp_path / "dl",
            backoff_s=0.01,
        )
        assert bundle_requests(server) == [None, "bytes=120000-"]
    # One pass: the unpacker reads the bytes as they arrive. The broken first attempt stopped
    # it; the second starts it again from byte 0, the kept bytes read back from the .part file.
    assert seen == [120_000, SIZE] and result == sha
    assert list((tmp_path / "dl").iterdir()) == []  # the verified archive is not kept


def test_download_unpacked_a_bad_hash_wins_over_the_unpackers_error(index, hashing, tmp_path):
    root, sha = index
    seen: list[int] = []

    def broken(stream):
        seen.append(len(stream.read(1000)))  # it stops reading early: the rest is still hashed
        raise BundleRejected("member 'x' is not listed in bundle.json")

    with pytest.raises(BundleRejected, match="sha256 mismatch"):
        download_unpacked(
            LocalSource(root), "bundles/blob.bin", unpack=broken, sha256="0" * 64,
            size=SIZE, dest_dir=tmp_path / "dl",
        )  # fmt: skip
    with pytest.raises(BundleRejected, match="not listed in bundle.json"):  # the right bytes
        download_unpacked(
            LocalSource(root), "bundles/blob.bin", unpack=broken, sha256=sha, size=SIZE,
            dest_dir=tmp_path / "dl",
        )  # fmt: skip
    assert seen == [1000, 1000]
    assert list((tmp_path / "dl").iterdir()) == []


def test_download_unpacked_the_transfers_own_error_wins(index, hashing, tmp_path):
    """A source that sends more than the catalog's size while the unpacker reads: the error is
    the size, not whatever the unpacker made of the cut-off stream."""
    root, sha = index
    (root / "bundles" / "blob.bin").write_bytes(os.urandom(SIZE + 1))

    class NoSize(LocalSource):  # like a server that sends no Content-Length
        def open(self, path, offset=0, deadline=None, pool=None):
            return super().open(path, offset, deadline)._replace(total=None)

    def unpack(stream):
        while stream.read(65536):
            pass
        raise BundleRejected("not a valid .tar.zst bundle archive")

    with pytest.raises(BundleRejected, match="wrong size: the source sent more"):
        download_unpacked(
            NoSize(root), "bundles/blob.bin", unpack=unpack, sha256=sha, size=SIZE,
            dest_dir=tmp_path / "dl",
        )  # fmt: skip
    assert list((tmp_path / "dl").iterdir()) == []


def test_download_unpacked_refuses_a_wrong_size_at_once(index, tmp_path):
    root, sha = index
    calls: list[int] = []
    with pytest.raises(BundleRejected, match="wrong size"):
        download_unpacked(
            LocalSource(root), "bundles/blob.bin", unpack=reading_unpacker(calls),
            sha256=sha, size=SIZE - 1, dest_dir=tmp_path / "dl", backoff_s=0.01,
        )  # fmt: skip
    assert calls == [] and list((tmp_path / "dl").iterdir()) == []


@pytest.mark.skipif(not os.path.exists("/dev/full"), reason="needs /dev/full")
def test_a_part_file_that_cannot_be_written_is_a_clear_error(index, hashing, tmp_path):
    """A failing `.part` write (here: a full disk) stops the download with the file's name,
    whether the hash runs inline or on the helper thread."""
    root, sha = index
    dest = tmp_path / "dl"
    dest.mkdir()
    (dest / f"{sha}.part").symlink_to("/dev/full")  # every write: ENOSPC
    with MirrorServer(root) as server:
        with pytest.raises(
            DllmError, match=r"cannot write .*\.part: No space left on device"
        ) as caught:
            download_unpacked(
                LoopbackHttpSource(server.url),
                "bundles/blob.bin",
                unpack=reading_unpacker([]),
                sha256=sha,
                size=SIZE,
                dest_dir=dest,
                backoff_s=0.01,
            )
    assert caught.value.hint == "the disk is full: free some space and run it again"


def test_a_buffer_pool_makes_buffers_on_demand_and_reuses_the_last_one_given_back():
    from turbo_dllm.bundles.sources import BufferPool

    pool = BufferPool(2, size=16)
    a, b = pool.take(1), pool.take(1)
    assert a is not b and len(a) == len(b) == 16
    with pytest.raises(RuntimeError, match="no receive buffer was handed back"):
        pool.take(0.01)  # both are out: a reader that never gives them back is a bug
    pool.give(a)
    pool.give(b)
    assert pool.take(1) is b and pool.take(1) is a  # warm first


def test_large_downloads_receive_into_a_few_reused_buffers(tmp_path, monkeypatch):
    """Archives hashed on the helper thread arrive from a loopback mirror in the pool's buffers:
    at most RECEIVE_BUFFERS of them for many more blocks, each handed back once hashed, and the
    unpacker (which reads every block before asking for the next) sees exactly the file."""
    from turbo_dllm.bundles import fetch

    size = 12 * 1024 * 1024
    root = tmp_path / "index"
    (root / "bundles").mkdir(parents=True)
    data = os.urandom(size)
    (root / "bundles" / "blob.bin").write_bytes(data)
    sha = hashlib.sha256(data).hexdigest()
    monkeypatch.setattr(fetch, "THREADED_HASH_BYTES", 0)
    buffers: set[int] = set()

    def unpack(stream):
        digest, blocks = hashlib.sha256(), 0
        while block := stream.read():
            assert isinstance(block, memoryview)
            buffers.add(id(block.obj))
            digest.update(block)
            blocks += 1
        return digest.hexdigest(), blocks

    with MirrorServer(root) as server:
        seen, blocks = download_unpacked(
            open_source(server.url), "bundles/blob.bin", unpack=unpack, sha256=sha, size=size,
            dest_dir=tmp_path / "dl",
        )  # fmt: skip
    assert seen == sha
    assert blocks > fetch.RECEIVE_BUFFERS >= len(buffers) >= 1
