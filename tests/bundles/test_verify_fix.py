"""`dllm bundle verify`'s fix, followed exactly as printed, repairs a damaged bundle: it names
the install command that puts the bundle back from where it came (installing again replaces a
damaged copy, as docs/bundles.md says); it said "dllm bundle uninstall ID ..., then install
again", with no command to install it with."""

from __future__ import annotations

import json
import re
import shlex
from pathlib import Path

import pytest

from tests.bundles.server import MirrorServer


def _damage(bundle_path) -> None:
    library = next((bundle_path / "lib").iterdir())
    library.chmod(0o644)
    data = bytearray(library.read_bytes())
    data[100] ^= 0xFF
    library.write_bytes(bytes(data))


def _printed_fix(err: str) -> tuple[str, str]:
    """(install command, removal text) of verify's one fix line."""
    lines = [line for line in err.splitlines() if line.startswith("fix ")]
    assert len(lines) == 1, err
    found = re.search(
        r"install it again: `([^`]+)` \(replaces the damaged copy\), or (.*)$", lines[0]
    )
    assert found, lines[0]
    return found.group(1), found.group(2)


def _run(cli, command: str):
    words = shlex.split(command)
    assert words[:2] == ["dllm", "bundle"], command
    return cli(*words[1:])


@pytest.mark.parametrize("served", [False, True], ids=["mirror-folder", "http-index"])
def test_following_verify_fix_repairs_a_damaged_bundle(cli, mirror, served):
    root, catalog_sha = mirror
    with MirrorServer(root) as server:
        source = ["--index", server.url] if served else ["--mirror", str(root)]
        installed = cli(
            "bundle", "install", "--release", "v-test", "--auto", *source,
            "--catalog-sha256", catalog_sha, "--json",
        )  # fmt: skip
        assert installed.code == 0, installed.err
        bundle = json.loads(installed.out)["installed"]
        _damage(Path(bundle["path"]))
        failed = cli("bundle", "verify")
        assert failed.code == 1 and "FAIL" in failed.out
        command, remove = _printed_fix(failed.err)
        assert command == (
            f"dllm bundle install --release v-test --target {bundle['target']} "
            f"{' '.join(map(shlex.quote, source))} --catalog-sha256 {catalog_sha}"
        )
        assert (
            remove
            == (  # no previous bundle: rollback, which would be refused, is not named
                f"`dllm bundle deactivate`, then `dllm bundle uninstall {bundle['sha256'][:12]}`"
            )
        )
        as_json = json.loads(cli("bundle", "verify", "--json").out)
        assert list(as_json["fixes"].values()) == [failed.err.split(": ", 1)[1].strip()]
        repaired = _run(cli, command)  # exactly as printed
        assert repaired.code == 0, repaired.err
    verified = cli("bundle", "verify")
    assert verified.code == 0 and verified.out.startswith("ok"), (verified.out, verified.err)
    assert "fix" not in verified.err
    assert cli("bundle", "status").out.count(bundle["bundle_id"]) == 1  # still the active one


def test_the_other_fix_removes_the_damaged_bundle(cli, installed):
    _damage(installed.path)
    failed = cli("bundle", "verify")
    _, remove = _printed_fix(failed.err)
    for command in re.findall(r"`([^`]+)`", remove):
        if "rollback" in command:  # the alternative to deactivate: no previous bundle here
            continue
        done = _run(cli, command)
        assert done.code == 0, (command, done.err)
    verified = cli("bundle", "verify")
    assert verified.code == 0 and verified.out.startswith("no bundles installed")
