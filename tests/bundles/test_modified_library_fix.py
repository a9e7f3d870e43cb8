"""A changed native .so in the active bundle: the fix doctor's kernels check and the loader
give installs that bundle again from where its install.json says it came, as pasted. It said
`dllm bundle install --release vX --auto --index URL`, the URL left for the user to find,
although the store records the mirror or server (and the target) the bundle came from."""

from __future__ import annotations

import functools
import json
import shlex

import pytest
import torch

from tests.bundles.crafting import damage_library
from turbo_dllm.errors import DllmError
from turbo_dllm.kernels import merge_attention_partials

native = functools.partial(merge_attention_partials, backend="native")


def _kernels_check(cli, tmp_path):
    config = tmp_path / "train.yaml"
    config.write_text("kernels: native\n")
    result = cli("doctor", "--config", config, "--json")
    return {c["name"]: c for c in json.loads(result.out)["checks"]}["kernels"]


def test_the_fix_for_a_changed_library_names_where_the_bundle_came_from(
    cli, tmp_path, installed, mirror, monkeypatch
):
    monkeypatch.delenv("DLLM_BUNDLE_INDEX", raising=False)
    root, _ = mirror
    damage_library(installed)
    check = _kernels_check(cli, tmp_path)
    assert check["status"] == "fail", check
    assert "does not match its bundle.json" in check["detail"]
    fix = check["fix"]
    assert "URL" not in fix, fix
    assert f"--mirror {shlex.quote(str(root))}" in fix, fix
    assert "--release v-test" in fix and f"--target {installed.target}" in fix, fix
    with pytest.raises(DllmError) as caught:
        native(torch.zeros(1, 2, 4), torch.zeros(1, 2), torch.zeros(1, 2, 4), torch.zeros(1, 2))
    assert caught.value.hint == fix

    # ... and it works: the command as printed puts the bundle's files back
    command = fix.removeprefix("install the bundle again: ").split(" (dllm bundle verify", 1)[0]
    words = shlex.split(command)
    assert words[:3] == ["dllm", "bundle", "install"]
    result = cli(*words[1:])
    assert result.code == 0, result.err
    assert _kernels_check(cli, tmp_path)["status"] == "pass"
