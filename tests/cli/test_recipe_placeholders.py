"""A prod recipe copied as is: its `model.revision` placeholder (40 zeros, "replace with the
checkpoint's commit") passed validation, doctor and launch as a pinned commit, and the run's
manifest recorded a commit no checkpoint has. It is refused now, with where the commit is."""

from __future__ import annotations

import pytest

from turbo_dllm.config.recipe_catalog import list_recipes

PLACEHOLDER = "0" * 40
PROD = [r.name for r in list_recipes() if PLACEHOLDER in r.text]


def test_the_prod_recipes_carry_the_placeholder():
    assert "h200/fast-dllm-v2-qwen3-1.7b" in PROD, PROD


@pytest.mark.parametrize("name", PROD)
def test_a_copied_prod_recipe_names_its_placeholder_revision(cli, tmp_path, name):
    copied = cli("recipe", "copy", name, f"{tmp_path}/")
    assert copied.code == 0, copied.err
    config = tmp_path / (name.rsplit("/", 1)[1] + ".yaml")
    result = cli("config", "validate", "--config", config)
    assert result.code == 2, result.out
    assert "model.revision" in result.err and "placeholder" in result.err, result.err
    assert "snapshots/<commit>" in result.err and "rev-parse HEAD" in result.err
    pinned = cli("config", "validate", "--config", config, "--set", f"model.revision={'ab' * 20}")
    assert pinned.code == 0, pinned.err


def test_a_short_zero_revision_outside_prod_is_left_alone(cli, tmp_path):
    config = tmp_path / "train.yaml"
    config.write_text("launch: {kind: profile}\nmodel: {path: m, revision: '0000000'}\n")
    result = cli("config", "validate", "--config", config)
    assert result.code == 0, result.err
