"""`dllm recipe copy` of a recipe that reads local folders (a model, a DFlash target, a data
artifact) said only `next: dllm config validate`, which answers "valid" without them (it checks
the spec alone): nothing named what to put where until `dllm launch` refused. The copy now names
each input that is not there yet, resolved against the copy's folder, and the doctor line."""

from __future__ import annotations

import shlex

import pytest


@pytest.mark.parametrize(
    ("name", "keys"),
    [
        ("h200/fast-dllm-v2-qwen3-1.7b", ["model.path", "data.artifact"]),
        ("h200/dflash-qwen3-8b", ["model.dflash.target", "data.artifact"]),
        ("smoke/cpu-dflash", ["model.dflash.target", "data.artifact"]),
    ],
)
def test_a_copy_names_the_inputs_it_needs(cli, tmp_path, name, keys):
    result = cli("recipe", "copy", name, f"{tmp_path}/")
    assert result.code == 0, result.err
    needs = [x for x in result.out.splitlines() if x.startswith("needs: ")]
    assert [x.split(": ")[1] for x in needs] == keys, result.out
    assert f"{tmp_path}/data/prepared is not there yet" in result.out
    assert "dllm data prepare" in needs[-1]
    config = tmp_path / (name.rsplit("/", 1)[1] + ".yaml")
    [then] = [x for x in result.out.splitlines() if x.startswith("then: ")]
    assert shlex.split(then.removeprefix("then: "), comments=True) == [
        "dllm",
        "doctor",
        "--config",
        str(config),
    ]


def test_a_copy_whose_inputs_exist_or_are_synthetic_names_none(cli, tmp_path):
    result = cli("recipe", "copy", "smoke/cpu-tiny", f"{tmp_path}/")
    assert result.code == 0, result.err
    assert "needs:" not in result.out and "then:" not in result.out
    (tmp_path / "data" / "prepared").mkdir(parents=True)
    again = cli("recipe", "copy", "smoke/cpu-ar-target", f"{tmp_path}/")
    assert "needs:" not in again.out, again.out
