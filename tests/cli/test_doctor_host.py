"""doctor's host checks where the environment is odd."""

from __future__ import annotations

import json
import shlex


def test_a_relative_dllm_home_is_a_warning_with_the_absolute_export(cli, tmp_path, monkeypatch):
    """DLLM_HOME='rel home' passed as "rel home is writable": each folder dllm then runs
    from has a home of its own (bundles and compile caches not found from another)."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("DLLM_HOME", "rel home")
    result = cli("doctor", "--json")
    check = {c["name"]: c for c in json.loads(result.out)["checks"]}["cache dir"]
    assert check["status"] == "warn", check
    assert check["detail"].startswith("DLLM_HOME='rel home' is a relative path")
    assert check["fix"] == f"export DLLM_HOME={shlex.quote(str(tmp_path / 'rel home'))}"
    monkeypatch.setenv("DLLM_HOME", str(tmp_path / "rel home"))  # the fix, applied
    result = cli("doctor", "--json")
    assert {c["name"]: c for c in json.loads(result.out)["checks"]}["cache dir"]["status"] == "pass"
