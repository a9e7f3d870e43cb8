"""An argument no option takes is refused by the command's own parser: its usage and a hint
naming its --help (README: a usage error's hint names the command's --help). Before, the
top-level parser said it: `usage: dllm [-h] [--version] COMMAND ...` and "`dllm --help` lists
its arguments", which lists the commands, not what `dllm run show` takes (`dllm run show A B`,
two runs, was told to read `dllm --help`; `dllm run plot A B` now overlays two runs)."""

from __future__ import annotations

import json

import pytest


@pytest.mark.parametrize(
    ("argv", "command"),
    [
        (("run", "show", "a", "b"), "dllm run show"),
        (("run", "list", "extra"), "dllm run list"),
        (("launch", "--config", "train.yaml", "x=1"), "dllm launch"),
    ],
)
def test_an_unrecognized_argument_names_the_commands_help(
    cli, tmp_path, monkeypatch, argv, command
):
    monkeypatch.chdir(tmp_path)
    result = cli(*argv)
    assert result.code == 2
    assert result.err.startswith(f"usage: {command} "), result.err
    assert f"\n{command}: error: unrecognized arguments: " in result.err, result.err
    assert result.err.endswith(f"\nhint: `{command} --help` lists its arguments\n"), result.err

    answer = cli(*argv, "--json")
    assert answer.code == 2
    assert json.loads(answer.out)["hint"] == f"`{command} --help` lists its arguments"
