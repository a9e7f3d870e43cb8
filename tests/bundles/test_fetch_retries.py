"""`dllm bundle install --retries N` rules every download the command makes: the release catalog's
fetch as well as the bundle archive's (the catalog fetch made 4 attempts whatever --retries said),
with `--retries 0` one attempt, and the error naming the attempts really made. A real HTTP server
on 127.0.0.1 serves a mirror folder, answering the first requests for a path with HTTP 503."""

from __future__ import annotations

from tests.bundles.server import MirrorServer
from tests.helpers import assert_user_error
from turbo_dllm.bundles.install import install, plan_install
from turbo_dllm.bundles.store import BundleStore


def flaky(root, catalog: int = 0, bundle: int = 0) -> MirrorServer:
    """A mirror server whose first `catalog` GETs of the release catalog and first `bundle` GETs
    of a bundle archive are answered with HTTP 503."""
    server = MirrorServer(root)
    server.state.catalog_failures = catalog
    server.state.fail_status, server.state.fail_times = 503, bundle
    return server


def requests(server: MirrorServer) -> dict[str, int]:
    """Every GET the server saw, by kind: the catalog's, and the others (the bundle's)."""
    catalog = sum(path.endswith("catalog.toml") for path, _ in server.state.requests)
    return {"catalog": catalog, "bundle": len(server.state.requests) - catalog}


def install_cli(cli, url, catalog_sha, retries):
    return cli(
        "bundle", "install", "--release", "v-test", "--auto", "--index", url,
        "--catalog-sha256", catalog_sha, "--retries", str(retries),
    )  # fmt: skip


def test_the_catalog_fetch_makes_as_many_attempts_as_retries_allow(cli, mirror):
    """--retries 2 against a catalog that fails three times: three attempts, then the error
    says three (it made four, and the install went on)."""
    root, catalog_sha = mirror
    with flaky(root, catalog=3) as server:
        result = install_cli(cli, server.url, catalog_sha, 2)
    assert_user_error(result, "releases/v-test/catalog.toml after 3 attempts: HTTP 503")
    assert requests(server) == {"catalog": 3, "bundle": 0}
    assert BundleStore().active() is None


def test_retries_0_is_one_attempt_at_the_catalog(cli, mirror):
    root, catalog_sha = mirror
    with flaky(root, catalog=1) as server:
        result = install_cli(cli, server.url, catalog_sha, 0)
    assert_user_error(result, "catalog.toml after 1 attempt: HTTP 503")
    assert requests(server) == {"catalog": 1, "bundle": 0}
    assert BundleStore().active() is None


def test_retries_0_is_one_attempt_at_the_bundle_and_says_one(cli, mirror):
    root, catalog_sha = mirror
    with flaky(root, bundle=1) as server:
        result = install_cli(cli, server.url, catalog_sha, 0)
    assert_user_error(result, ".tar.zst failed after 1 attempt: HTTP 503")
    assert requests(server) == {"catalog": 1, "bundle": 1}
    assert BundleStore().active() is None


def test_more_retries_than_the_old_fixed_four_attempts_reach_the_catalog(cli, mirror):
    """A catalog that fails five times is fetched with --retries 5 (six attempts); the bundle,
    failing once, needs its second attempt. `plan_install` and `install` take the retries (and
    the backoff, kept short here) for the catalog fetch."""
    root, catalog_sha = mirror
    with flaky(root, catalog=5) as server:
        plan = plan_install("v-test", index=server.url, catalog_sha256=catalog_sha, retries=5,
                            backoff_s=0.01)  # fmt: skip
    assert requests(server)["catalog"] == 6 and plan.entry.sha256
    with flaky(root, catalog=5, bundle=1) as server:
        result = install(
            "v-test", index=server.url, catalog_sha256=catalog_sha, retries=5, backoff_s=0.01
        )
    assert requests(server) == {"catalog": 6, "bundle": 2}
    assert BundleStore().active().sha256 == result.bundle.sha256
    with flaky(root, catalog=2) as server:
        shown = cli(
            "bundle", "install", "--release", "v-test", "--auto", "--index", server.url,
            "--catalog-sha256", catalog_sha, "--retries", "2", "--dry-run",
        )  # fmt: skip
    assert shown.code == 0, shown.err
    assert "would install" in shown.out and requests(server)["catalog"] == 3


def test_the_help_says_retries_rule_the_catalog_too(cli):
    """The help says --retries is each download's, the catalog's too."""
    shown = cli("bundle", "install", "--help")
    assert "the catalog's and the bundle's" in " ".join(shown.out.split())


def test_a_catalog_the_server_fails_to_serve_blames_the_server(cli, mirror):
    """Every attempt answered HTTP 503: the hint said "check the index URL and your
    connection", neither of which was wrong (the server answered). It says the server failed
    now, with the status's reason."""
    root, catalog_sha = mirror
    with flaky(root, catalog=2) as server:
        result = install_cli(cli, server.url, catalog_sha, 1)
    assert_user_error(result, "after 2 attempts: HTTP 503 Service Unavailable")
    hint = result.err.split("hint: ", 1)[1]
    assert "the server answered with an error" in hint and "your connection" not in hint
