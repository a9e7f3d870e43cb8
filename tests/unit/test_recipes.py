"""Every packaged recipe is a RunSpec: it parses through the same loader `dllm config validate`
uses (an unquoted 40-zero revision once read as the integer 0 and failed it)."""

from __future__ import annotations

import shlex

import pytest

from turbo_dllm.config.bounded_yaml import parse_yaml
from turbo_dllm.config.load import load_model
from turbo_dllm.config.recipe_catalog import list_recipes
from turbo_dllm.config.runspec import RunSpec


@pytest.mark.parametrize("recipe", list_recipes(), ids=lambda r: r.name)
def test_every_recipe_is_a_runspec(recipe):
    load_model(RunSpec, parse_yaml(recipe.text, recipe.name), recipe.name)  # raises on a bad one


def test_recipes_are_listed_in_name_order():
    """A recipe precedes its variants (`smoke/cpu-tiny`, then `smoke/cpu-tiny-nemotron`): sorted
    by file name, `cpu-tiny-nemotron.yaml` came first ('-' sorts before '.')."""
    names = [recipe.name for recipe in list_recipes()]
    assert names == sorted(names)
    assert names.index("smoke/cpu-tiny") < names.index("smoke/cpu-tiny-nemotron")


def test_recipe_list_prints_brackets_as_written(cli, monkeypatch):
    """rich read `[gdn]` as markup: the list said `pip install 'turbo-dllm'` for the recipe whose
    hardware line asks for `pip install 'turbo-dllm[gdn]'`."""
    monkeypatch.setenv("COLUMNS", "400")  # one line per recipe: nothing wraps
    result = cli("recipe", "list")
    assert result.code == 0, result.err
    [line] = [x for x in result.out.splitlines() if "h200/fast-dllm-v2-qwen3.8" in x]
    hardware = next(r.hardware for r in list_recipes() if r.name == "h200/fast-dllm-v2-qwen3.8")
    assert "turbo-dllm[gdn]" in hardware and hardware in line


def test_recipe_copy_prints_a_next_command_that_pastes_into_bash(cli, tmp_path):
    """`next: dllm config validate --config /x/my configs/cpu-tiny.yaml` named two words."""
    folder = tmp_path / "my configs"
    folder.mkdir()
    result = cli("recipe", "copy", "smoke/cpu-tiny", f"{folder}/")
    assert result.code == 0, result.err
    [line] = [x for x in result.out.splitlines() if x.startswith("next: ")]
    words = shlex.split(line.removeprefix("next: "))
    assert words == ["dllm", "config", "validate", "--config", str(folder / "cpu-tiny.yaml")]


def test_recipe_copy_into_a_missing_folder_hints_a_mkdir_that_pastes_into_bash(cli, tmp_path):
    """The hint was `mkdir -p /x/my configs`: two folders, neither the one asked for."""
    result = cli("recipe", "copy", "smoke/cpu-tiny", f"{tmp_path}/my configs/")
    assert result.code == 2
    [hint] = [x for x in result.err.splitlines() if x.startswith("hint: ")]
    assert shlex.split(hint.removeprefix("hint: ")) == ["mkdir", "-p", str(tmp_path / "my configs")]


@pytest.mark.parametrize("failure", [OSError(28, "No space left on device"), KeyboardInterrupt])
def test_a_failed_recipe_copy_leaves_no_partial_file(cli, tmp_path, monkeypatch, failure):
    """A write that failed (a full disk, Ctrl-C) left the file created but empty or cut short,
    and the copy run again was refused: "already exists; not overwriting"."""
    import os

    real = os.fdopen

    class Failing:
        def __init__(self, fd, *args, **kwargs):
            self.handle = real(fd, *args, **kwargs)

        def __enter__(self):
            return self

        def __exit__(self, *exc):
            self.handle.close()

        def write(self, text):
            self.handle.write(text[:10])
            raise failure

    dest = tmp_path / "cpu-tiny.yaml"
    monkeypatch.setattr(os, "fdopen", Failing)
    result = cli("recipe", "copy", "smoke/cpu-tiny", dest)
    assert result.code == (130 if failure is KeyboardInterrupt else 2), result.err
    assert not dest.exists()
    if failure is not KeyboardInterrupt:
        assert f"{str(dest)!r}: No space left on device" in result.err  # the path is named
    monkeypatch.setattr(os, "fdopen", real)
    assert cli("recipe", "copy", "smoke/cpu-tiny", dest).code == 0
    assert dest.read_text() == cli("recipe", "show", "smoke/cpu-tiny").out


def test_recipe_list_cuts_no_word_in_a_narrow_terminal(cli, monkeypatch):
    """At 80 columns (a pipe's width) rich cut words longer than their column with an ellipsis:
    the hardware line read `flash-linear-atte…`, a summary `Nemotron-Labs-Dif…`."""
    monkeypatch.setenv("COLUMNS", "80")
    result = cli("recipe", "list")
    assert result.code == 0, result.err
    assert "…" not in result.out
