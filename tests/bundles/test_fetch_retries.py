"""`dllm bundle install --retries N` rules every download the command makes: the release catalog's
fetch as well as the bundle archive's (the catalog fetch made 4 attempts whatever --retries said),
with `--retries 0` one attempt, and the error naming the attempts really made. A real HTTP server
on 127.0.0.1 serves a mirror folder, answering the first requests for a path with HTTP 503."""

from __future__ import annotations

import os
import threading
from http.server import SimpleHTTPRequestHandler, ThreadingHTTPServer

from tests.helpers import assert_user_error
from turbo_dllm.bundles.install import install, plan_install
from turbo_dllm.bundles.store import BundleStore


class FlakyMirror:
    """Serves `root` on 127.0.0.1; the first `fail[kind]` GETs of the catalog (`kind`
    "catalog") or of a bundle archive ("bundle") are answered with HTTP 503. `requests[kind]`
    counts every GET of that kind."""

    def __init__(self, root, catalog: int = 0, bundle: int = 0) -> None:
        self.fail = {"catalog": catalog, "bundle": bundle}
        self.requests = {"catalog": 0, "bundle": 0}
        mirror = self

        class Handler(SimpleHTTPRequestHandler):
            def __init__(self, *args, **kwargs):
                super().__init__(*args, directory=os.fspath(root), **kwargs)

            def log_message(self, format, *args):
                pass

            def do_GET(self):
                kind = "catalog" if self.path.endswith("catalog.toml") else "bundle"
                mirror.requests[kind] += 1
                if mirror.fail[kind] > 0:
                    mirror.fail[kind] -= 1
                    self.send_error(503)
                    return
                super().do_GET()

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._server.daemon_threads = True
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)
        self.url = f"http://127.0.0.1:{self._server.server_address[1]}"

    def __enter__(self) -> FlakyMirror:
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(timeout=5)


def install_cli(cli, url, catalog_sha, retries):
    return cli(
        "bundle", "install", "--release", "v-test", "--auto", "--index", url,
        "--catalog-sha256", catalog_sha, "--retries", str(retries),
    )  # fmt: skip


def test_the_catalog_fetch_makes_as_many_attempts_as_retries_allow(cli, mirror):
    """--retries 2 against a catalog that fails three times: three attempts, then the error
    says three (it made four, and the install went on)."""
    root, catalog_sha = mirror
    with FlakyMirror(root, catalog=3) as server:
        result = install_cli(cli, server.url, catalog_sha, 2)
    assert_user_error(result, "releases/v-test/catalog.toml after 3 attempts: HTTP 503")
    assert server.requests == {"catalog": 3, "bundle": 0}
    assert BundleStore().active() is None


def test_retries_0_is_one_attempt_at_the_catalog(cli, mirror):
    root, catalog_sha = mirror
    with FlakyMirror(root, catalog=1) as server:
        result = install_cli(cli, server.url, catalog_sha, 0)
    assert_user_error(result, "catalog.toml after 1 attempt: HTTP 503")
    assert server.requests == {"catalog": 1, "bundle": 0}
    assert BundleStore().active() is None


def test_retries_0_is_one_attempt_at_the_bundle_and_says_one(cli, mirror):
    root, catalog_sha = mirror
    with FlakyMirror(root, bundle=1) as server:
        result = install_cli(cli, server.url, catalog_sha, 0)
    assert_user_error(result, ".tar.zst failed after 1 attempt: HTTP 503")
    assert server.requests == {"catalog": 1, "bundle": 1}
    assert BundleStore().active() is None


def test_more_retries_than_the_old_fixed_four_attempts_reach_the_catalog(cli, mirror):
    """A catalog that fails five times is fetched with --retries 5 (six attempts); the bundle,
    failing once, needs its second attempt. `plan_install` and `install` take the retries (and
    the backoff, kept short here) for the catalog fetch."""
    root, catalog_sha = mirror
    with FlakyMirror(root, catalog=5) as server:
        plan = plan_install("v-test", index=server.url, catalog_sha256=catalog_sha, retries=5,
                            backoff_s=0.01)  # fmt: skip
    assert server.requests["catalog"] == 6 and plan.entry.sha256
    with FlakyMirror(root, catalog=5, bundle=1) as server:
        result = install(
            "v-test", index=server.url, catalog_sha256=catalog_sha, retries=5, backoff_s=0.01
        )
    assert server.requests == {"catalog": 6, "bundle": 2}
    assert BundleStore().active().sha256 == result.bundle.sha256
    with FlakyMirror(root, catalog=2) as server:
        shown = cli(
            "bundle", "install", "--release", "v-test", "--auto", "--index", server.url,
            "--catalog-sha256", catalog_sha, "--retries", "2", "--dry-run",
        )  # fmt: skip
    assert shown.code == 0, shown.err
    assert "would install" in shown.out and server.requests["catalog"] == 3


def test_the_help_says_retries_rule_the_catalog_too(cli):
    """The help says --retries is each download's, the catalog's too."""
    shown = cli("bundle", "install", "--help")
    assert "the catalog's and the bundle's" in " ".join(shown.out.split())
