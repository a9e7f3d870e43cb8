"""`dllm cache` help and messages say what the docs say (docs/bundles.md, compile-cache packs)."""

from __future__ import annotations

import pytest


@pytest.mark.parametrize("command", ["install", "remove"])
def test_lock_timeout_says_its_default(cli, command):
    """`--lock-timeout` said only "seconds to wait for the lock": not its default (60, as the
    docs say), unlike every `dllm bundle` command's."""
    result = cli("cache", command, "--help")
    assert result.code == 0, result.err
    text = " ".join(result.out.split())  # argparse wraps to the terminal's width
    assert "(default 60; 0 or more)" in text, text


def test_available_names_every_place_packs_are_offered(cli, tmp_path, monkeypatch):
    """`--available` said "also packs on $DLLM_PACK_PATH", and with nothing on offer "looked in:
    no $DLLM_PACK_PATH folder exists": packs/ of a local DLLM_BUNDLE_INDEX (where `dllm mirror
    create --pack` puts them) is offered too and was named nowhere."""
    text = " ".join(cli("cache", "list", "--help").out.split())
    assert "$DLLM_PACK_PATH" in text and "$DLLM_BUNDLE_INDEX" in text, text
    monkeypatch.delenv("DLLM_PACK_PATH", raising=False)
    monkeypatch.setenv("DLLM_BUNDLE_INDEX", str(tmp_path / "no-mirror"))
    result = cli("cache", "list", "--available")
    assert result.code == 0, result.err
    assert "packs/ of a local $DLLM_BUNDLE_INDEX" in result.out, result.out
