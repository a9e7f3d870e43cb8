"""The `--json` contract (README, docs/architecture.md "Output"): `--json` prints exactly one JSON
object on stdout, also when the command fails. A user error under `--json` (exit 2) printed its
`dllm: error:` and `hint:` on stderr and nothing on stdout, so `json.loads(stdout)` in a script
raised on empty text; it now also prints `{"error": MESSAGE, "hint": HINT}` on stdout. The
stderr text is unchanged, and without `--json` stdout stays empty."""

from __future__ import annotations

import json
import os

import pytest

from tests.helpers import assert_user_error

SPEC = "training: {steps: 1}\n"


def write(path, text: str):
    path.write_text(text)
    return path


def _one_error_object(result) -> dict:
    assert_user_error(result)
    obj = json.loads(result.out)  # the whole of stdout: one object, nothing else
    assert isinstance(obj, dict), result.out
    assert set(obj) == {"error", "hint"}, obj
    # The same message and hint a person reads on stderr.
    assert f"dllm: error: {obj['error']}" in result.err
    assert obj["hint"] and f"hint: {obj['hint']}" in result.err
    return obj


@pytest.mark.parametrize(
    "argv, needle",
    [
        (["config", "validate", "--config", "{dir}/missing.yaml"], "config file not found"),
        (["config", "validate", "--config", "{spec}", "--set", "training.steps=0"], "steps"),
        (["config", "validate", "--config", "{spec}", "--world-size", "0"], "--world-size"),
        (["doctor", "--world-size", "0"], "--world-size"),
        (["data", "validate", "{dir}/nothing"], "data artifact not found"),
        (["data", "stats", "{dir}/nothing"], "data artifact not found"),
        (["data", "inspect", "{dir}/nothing"], "data artifact not found"),
        (["data", "prepare", "--config", "{spec}"], "not a prepare.yaml"),
        (["launch", "--config", "{dir}/missing.yaml", "--dry-run"], "config file not found"),
        (["run", "list", "--root", "{dir}/no-runs"], "does not exist"),
        (["run", "show", "nope", "--root", "{dir}"], "no run 'nope'"),
        (["bundle", "verify", "abcdef"], "no installed bundle"),
        (["cache", "verify", "abcdef"], "no installed compile-cache pack"),
        (["env", "check", "--target", "no-such-target"], "no environment manifest"),
        (["env", "list", "--mirror", "{dir}/no-mirror"], "does not exist"),
        (["mirror", "verify", "{dir}/no-mirror"], "does not exist"),
        (["model", "add-mask-token", "{dir}/no-model"], "does not exist"),
        (["export", "--checkpoint", "{dir}/nope", "--out", "{dir}/out"], "not a checkpoint"),
    ],
)
def test_a_user_error_under_json_is_one_json_object(cli, tmp_path, monkeypatch, argv, needle):
    monkeypatch.setenv("DLLM_HOME", str(tmp_path / "home"))
    spec = write(tmp_path / "train.yaml", SPEC)
    argv = [a.format(dir=tmp_path, spec=spec) for a in argv]
    obj = _one_error_object(cli(*argv, "--json"))
    assert needle in obj["error"], obj
    # Without --json: the same error, and nothing on stdout.
    plain = cli(*argv)
    assert_user_error(plain, needle)
    assert plain.out == ""


def test_a_file_system_error_under_json_is_one_json_object(cli, tmp_path, monkeypatch):
    """An OSError no command foresaw (here: a path through a file) is reported like a
    DllmError, so under --json it is one error object too."""
    import turbo_dllm.cli.recipe as recipe

    ok = cli("recipe", "list", "--json")  # the command as it works: one object, no error key
    assert ok.code == 0 and "error" not in json.loads(ok.out)
    blocker = write(tmp_path / "file", "x")

    def fail(args):
        raise NotADirectoryError(20, "Not a directory", str(blocker / "x"))

    monkeypatch.setattr(recipe, "_list", fail)
    obj = _one_error_object(cli("recipe", "list", "--json"))
    assert str(blocker) in obj["error"]


@pytest.mark.parametrize(
    "argv",
    [
        ["config", "validate", "--json"],  # a required option missing
        ["data", "inspect", "x", "--n", "two", "--json"],  # not an int
        ["run", "list", "--json", "a=b"],  # an unrecognized argument
    ],
)
def test_a_usage_error_under_json_is_one_json_object(cli, argv):
    result = cli(*argv)
    assert result.code == 2
    assert "Traceback" not in result.err and "usage: dllm" in result.err
    obj = json.loads(result.out)
    assert set(obj) == {"error", "hint"} and obj["error"] in result.err, obj
    assert f"hint: {obj['hint']}" in result.err
    # Without --json: the same usage error on stderr, stdout empty.
    plain = cli(*[a for a in argv if a != "--json"])
    assert plain.code == 2 and plain.out == "" and obj["error"] in plain.err


def test_the_json_error_object_comes_from_the_dllm_process(cli_process, tmp_path):
    """As a script sees it: a real process, stdout piped."""
    result = cli_process(
        "data",
        "validate",
        tmp_path / "nothing",
        "--json",
        env={"DLLM_HOME": str(tmp_path / "home"), "NO_COLOR": "1"},
        cwd=os.fspath(tmp_path),
    )
    obj = _one_error_object(result)
    assert "data artifact not found" in obj["error"]
