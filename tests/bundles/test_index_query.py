"""An index URL with a query string (a token-authenticated or signed mirror:
`https://mirror/x/?token=abc`) had each file's path appended after the query
(`...?token=abc/releases/v/catalog.toml`), so every request missed. Now paths join onto the
URL's path and the query goes with every request; its values are secrets: they are written
to no file (install.json records `token=***`) and printed nowhere (messages, hints, reinstall
commands show `token=***` and say to put the value back)."""

from __future__ import annotations

import os
import shlex
from pathlib import Path
from urllib.parse import urlsplit

import pytest

from tests.adversarial.hostile import published, tiny_bundle
from tests.bundles.server import MirrorServer
from turbo_dllm.bundles import sources
from turbo_dllm.bundles.store import BundleStore

SECRET = "s3cr3t-Tok3n"
QUERY = f"token={SECRET}&user=me"


@pytest.fixture
def mirror(tmp_path):
    root, catalog_sha, _ = published(tmp_path, tiny_bundle(tmp_path, {"lib/a.so": os.urandom(99)}))
    return root, catalog_sha


def _install(cli, catalog_sha, index):
    return cli(
        "bundle", "install", "--release", "v-adv", "--auto", "--index", index,
        "--catalog-sha256", catalog_sha, "--retries", "0",
    )  # fmt: skip


def _files_holding(folder, text: str) -> list[str]:
    return [
        str(path)
        for path in folder.rglob("*")
        if path.is_file() and not path.is_symlink() and text.encode() in path.read_bytes()
    ]


def test_redact_url_hides_query_values_and_passwords():
    assert sources.redact_url("https://m/x/?token=abc&b=") == "https://m/x/?token=***&b=***"
    assert sources.redact_url("https://u:pw@m/x?abc") == "https://u:***@m/x?***"
    assert sources.redact_url("https://m/x") == "https://m/x"


def test_an_index_with_a_token_query_installs_and_keeps_the_token_secret(cli, mirror):
    root, catalog_sha = mirror
    home = os.environ["DLLM_HOME"]
    with MirrorServer(root) as server:
        server.state.require_query = QUERY
        # the server refuses a request without the token
        refused = _install(cli, catalog_sha, server.url + "/")
        assert refused.code == 2 and "HTTP 403" in refused.err, refused.err
        result = _install(cli, catalog_sha, f"{server.url}/?{QUERY}")
        requests = [path for path, _ in server.state.requests[1:]]
    assert result.code == 0, result.err
    assert SECRET not in result.out + result.err
    # every request carried the query, after the file's path
    assert [urlsplit(path).query for path in requests] == [QUERY] * len(requests)
    assert {urlsplit(path).path.split("/")[1] for path in requests} == {"releases", "bundles"}
    store = BundleStore()
    active = store.active()
    assert active is not None
    assert "token=***&user=***" in active.record.source
    assert _files_holding(Path(home), SECRET) == []


def test_errors_and_hints_name_the_index_with_its_token_hidden(cli, mirror):
    root, catalog_sha = mirror
    with MirrorServer(root) as server:
        server.state.require_query = QUERY
        deep = _install(cli, catalog_sha, f"{server.url}/releases/?{QUERY}")
        wrong = _install(cli, catalog_sha, f"{server.url}/?token=wrong")
    assert deep.code == 2 and "HTTP 404" in deep.err, deep.err
    assert SECRET not in deep.err
    # the index to pass instead, its query values hidden, and what to do about them
    assert f"--index '{server.url}/?token=***&user=***'" in deep.err, deep.err
    assert "in place of ***" in deep.err
    assert wrong.code == 2 and "HTTP 403" in wrong.err and "token=***" in wrong.err


def test_the_repair_hint_of_a_damaged_bundle_hides_the_token(cli, mirror):
    root, catalog_sha = mirror
    with MirrorServer(root) as server:
        server.state.require_query = QUERY
        assert _install(cli, catalog_sha, f"{server.url}/?{QUERY}").code == 0
        store = BundleStore()
        active = store.active()
        (active.path / "lib" / "a.so").chmod(0o644)
        (active.path / "lib" / "a.so").write_bytes(b"changed")
        hint = store.repair_hint(active.sha256)
        assert SECRET not in hint
        assert f"--index '{server.url}/?token=***&user=***'" in hint, hint
        assert "in place of ***" in hint
        # the command works once the value is put back
        command = hint.split("`")[1].replace("***", SECRET, 1).replace("***", "me")
        again = cli(*shlex.split(command)[1:], "--retries", "0")
    assert again.code == 0, again.err
    assert (active.path / "lib" / "a.so").read_bytes() != b"changed"
