"""Hostile YAML in a RunSpec, a prepare.yaml or a `--set` value: one clear error, bounded cost.

Every case ends in `dllm: error:` naming the file's line and the key path (or the `--set` key),
exit 2, no traceback. Inputs built to exhaust memory run in a capped child process
(`bounded_run`), so on code with the bug they fail instead of filling the machine.
"""

from __future__ import annotations

import re
import time
from pathlib import Path

import pytest

import turbo_dllm
from tests.adversarial.bounded_run import run_dllm
from tests.data.helpers import write_config
from tests.helpers import assert_user_error


def _alias_bomb(levels: int = 9) -> str:
    """Each level lists the previous one 9 times: ~400 bytes standing for 9**levels strings."""
    lines = ['a0: &a0 ["x", "x", "x", "x", "x", "x", "x", "x", "x"]']
    for i in range(1, levels):
        lines.append(f"a{i}: &a{i} [" + ", ".join([f"*a{i - 1}"] * 9) + "]")
    return "\n".join(lines) + "\n"


def _runspec(tmp_path: Path, extra: str = "") -> Path:
    path = tmp_path / "train.yaml"
    path.write_text("training:\n  steps: 3\n" + extra, encoding="utf-8")
    return path


def _prepare_yaml(tmp_path: Path, extra: str = "") -> Path:
    path = write_config(tmp_path)
    path.write_text(path.read_text(encoding="utf-8") + extra, encoding="utf-8")
    return path


@pytest.mark.parametrize("command", ["config validate", "data prepare"])
def test_alias_bomb_is_refused_in_bounded_memory(tmp_path, command):
    bomb = "bomb:\n" + "".join(f"  {line}\n" for line in _alias_bomb().splitlines())
    config = (_runspec if command == "config validate" else _prepare_yaml)(tmp_path, bomb)
    assert config.stat().st_size < 700
    started = time.perf_counter()
    result = run_dllm(*command.split(), "--config", config, cwd=tmp_path)
    assert_user_error(result, f"{config.name}:", "bomb.a", "aliases expand")
    assert time.perf_counter() - started < 30


def test_alias_bomb_in_a_set_value(tmp_path):
    anchors = ", ".join(
        ["&a0 [x, x, x, x, x, x, x, x, x]"]
        + [f"&a{i} [" + ", ".join([f"*a{i - 1}"] * 9) + "]" for i in range(1, 9)]
    )
    result = run_dllm(
        "config", "validate", "--config", _runspec(tmp_path), "--set", f"launch.name=[{anchors}]"
    )
    assert_user_error(result, "--set launch.name", "aliases expand")


def test_small_aliases_and_merge_keys_still_work(cli, tmp_path):
    config = _runspec(
        tmp_path,
        "optimizer: &opt {lr: 0.001, weight_decay: 0.0}\n"
        "scheduler:\n  <<: {name: linear}\n  warmup_steps: 2\n"
        "launch: {name: &n small}\nlogging: {every: 1}\n",
    )
    result = cli("config", "validate", "--config", config, "--json")
    assert result.code == 0, result.err
    assert '"lr": 0.001' in result.out and '"name": "linear"' in result.out


@pytest.mark.parametrize(
    ("text", "needles"),
    [
        ("launch: &a {name: *a}\n", ["train.yaml:3:", "launch.name", "inside its own anchor &a"]),
        ("x: &a [1, [2, *a]]\n", ["x.1.1", "recursive document"]),
        ("x: " + "[" * 2000 + "]" * 2000 + "\n", ["train.yaml:3:", "deeper than 64 levels"]),
        ("x: " + "{a: " * 1500 + "1" + "}" * 1500 + "\n", ["x.a.a", "deeper than 64 levels"]),
        ("launch:\n  seed: " + "7" * 5000 + "\n", ["train.yaml:4:9", "launch.seed", "integer"]),
        ("launch:\n  seed: " + "7" * 40 + "\n", ["launch.seed", "out of range"]),
        ("launch:\n  name: 2026-13-45\n", ["launch.name", "invalid date"]),
        ('model:\n  path: "models/a\\0b"\n', ["train.yaml:4:9", "model.path", "NUL character"]),
        ('data:\n  artifact: "a\\0"\n', ["data.artifact", "NUL"]),
        ('checkpoint: {dir: "\\0"}\n', ["checkpoint.dir", "NUL"]),
    ],
)
def test_hostile_runspec_documents(cli, tmp_path, text, needles):
    result = cli("config", "validate", "--config", _runspec(tmp_path, text))
    assert_user_error(result, *needles)


@pytest.mark.parametrize(
    ("raw", "needles"),
    [
        # Saved as Latin-1: was "'utf-8' codec can't decode byte 0xe9 in position 29".
        (b"model:\n  path: caf\xe9\n", ["train.yaml:4:12:", "byte 0xe9", "not UTF-8", "UTF-8"]),
        # Was 'YAML syntax error at train.yaml: ... in "<unicode string>", position 30'.
        (b"model:\n  path: a\x07b\n", ["train.yaml:4:10:", "control character #x0007"]),
    ],
)
def test_a_character_yaml_cannot_read_is_named_by_line_and_column(cli, tmp_path, raw, needles):
    config = _runspec(tmp_path)
    config.write_bytes(config.read_bytes() + raw)
    result = cli("config", "validate", "--config", config)
    assert_user_error(result, *needles)
    assert "position" not in result.err and "<unicode string>" not in result.err


@pytest.mark.parametrize(
    ("override", "needles"),
    [
        ("launch.seed=" + "9" * 5000, ["--set launch.seed: integer of 5000 characters"]),
        ("launch.seed=18446744073709551616", ["--set launch.seed: integer", "out of range"]),
        ("launch.name=" + "[" * 1000 + "]" * 1000, ["--set launch.name.0.0", "deeper than 64"]),
        ("launch.name=&a [*a]", ["--set launch.name", "own anchor"]),
        ('model.path="x\\0y"', ["--set model.path: a NUL character"]),
        ("a" + ".a" * 100 + "=1", ["nested deeper than 64 levels"]),
    ],
)
def test_hostile_set_values(cli, tmp_path, override, needles):
    result = cli("config", "validate", "--config", _runspec(tmp_path), "--set", override)
    assert_user_error(result, *needles)


@pytest.mark.parametrize(
    ("section", "value", "path"),
    [
        ("source", '{kind: jsonl, paths: ["data\\0.jsonl"]}', "source.paths.0"),
        ("output", '{path: "out\\0"}', "output.path"),
        ("tokenizer", '{kind: huggingface, path: "\\0tok"}', "tokenizer.path"),
    ],
)
def test_nul_in_prepare_paths(cli, tmp_path, section, value, path):
    config = write_config(tmp_path)
    text = re.sub(rf"^{section}:\n(  .*\n)+", "", config.read_text(encoding="utf-8"), flags=re.M)
    config.write_text(text + f"{section}: {value}\n", encoding="utf-8")
    assert_user_error(cli("data", "prepare", "--config", config), path, "NUL character")


def test_prepare_yaml_with_a_huge_integer(cli, tmp_path):
    config = _prepare_yaml(tmp_path, "on_error: " + "1" * 5000 + "\n")
    assert_user_error(cli("data", "prepare", "--config", config), "on_error", "integer of 5000")
    config = _prepare_yaml(tmp_path)
    result = cli("data", "prepare", "--config", config, "--set", "workers=" + "2" * 5000)
    assert_user_error(result, "--set workers: integer of 5000")


def test_a_device_or_huge_file_as_config_is_refused_in_bounded_memory(tmp_path):
    result = run_dllm("config", "validate", "--config", "/dev/zero", memory_mib=400)
    assert_user_error(result, "/dev/zero", "larger than 4 MiB")
    big = tmp_path / "big.yaml"
    big.write_bytes("# é\n".encode() * 1_000_000)  # cut anywhere, é may split in two
    result = run_dllm("data", "prepare", "--config", big, memory_mib=400)
    assert_user_error(result, "big.yaml", "larger than 4 MiB")


def test_every_yaml_read_goes_through_the_bounded_loader():
    """No module parses YAML on its own: a new reader would escape every bound above."""
    package = Path(turbo_dllm.__file__).parent
    loaders = re.compile(
        r"\byaml\.(safe_load|load|full_load|unsafe_load|compose|parse)(_all)?\b"
        r"|\bC?(Safe|Full|Unsafe)?Loader\b|from yaml import"
    )
    offenders = [
        f"{path.relative_to(package)}:{number}"
        for path in package.rglob("*.py")
        if path.name != "bounded_yaml.py"
        for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1)
        if loaders.search(line)
    ]
    assert offenders == []


@pytest.mark.parametrize(
    ("text", "needles"),
    [
        ("training:\n\tsteps: 3\n", ["train.yaml:4:1:", "a tab indents line 4"]),
        ("model:\n  dtype: float32\n\tattention: flex\n", ["train.yaml:5:1:", "line 5"]),
        ("launch:\n  \tseed: 1\n", ["train.yaml:4:3:", "a tab indents line 4"]),
        ("x: [1,\n\t2]\n", ["train.yaml:4:1:", "a tab indents line 4"]),
    ],
)
def test_a_tab_that_indents_is_named(cli, tmp_path, text, needles):
    """Was: "found character '\\t' that cannot start any token", hint "check indentation and
    quoting on that line": nothing said that the tab was the fault, invisible in most editors."""
    result = cli("config", "validate", "--config", _runspec(tmp_path, text))
    assert_user_error(result, *needles, "YAML forbids tabs for indentation", "indent with spaces")
    assert "cannot start any token" not in result.err


def test_a_tab_between_a_key_and_its_value_is_named(cli, tmp_path):
    result = cli("config", "validate", "--config", _runspec(tmp_path, "launch:\tx\n"))
    assert_user_error(result, "train.yaml:3:8:", "a tab at line 3", "use spaces")
    assert "cannot start any token" not in result.err
