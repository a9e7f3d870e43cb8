"""Every error a user can fix prints `dllm: error: ...` and a `hint:` line (README). These
option-value and path errors printed the error line alone: a launch option out of range, a
bundle install/build/publish option or archive, an environment manifest path. Each now says
how to fix it; and a DllmError raised anywhere without a hint still gets a hint line, naming
the command's --help."""

from __future__ import annotations

import json

import pytest

from tests.helpers import assert_user_error

SPEC = "training: {steps: 1}\n"


@pytest.mark.parametrize(
    "argv, message, hint",
    [
        (
            ["launch", "--config", "{spec}", "--dry-run", "--nproc-per-node", "0"],
            "--nproc-per-node must be >= 1",
            "processes to start on each node",
        ),
        (
            ["launch", "--config", "{spec}", "--dry-run", "--max-restarts", "-1"],
            "--max-restarts must be >= 0",
            "0 restarts no worker group",
        ),
        (
            ["launch", "--config", "{spec}", "--dry-run", "--master-port", "70000"],
            "is not a TCP port",
            "a port from 1 to 65535",
        ),
        (
            [
                "launch",
                "--config",
                "{spec}",
                "--dry-run",
                "--run-dir",
                "{dir}/a",
                "--run-root",
                "{dir}/b",
            ],
            "give --run-dir or --run-root, not both",
            "--run-root ROOT",
        ),
        (
            ["launch", "--config", "{spec}", "--dry-run", "--allow-drift"],
            "--allow-drift only applies to a replay",
            "drop --allow-drift",
        ),
        (
            ["launch", "--config", "{spec}", "--dry-run", "--submit"],
            "--submit goes with --backend slurm",
            "add --backend slurm",
        ),
        (
            [
                "launch",
                "--config",
                "{spec}",
                "--dry-run",
                "--cpus-per-task",
                "0",
                "--backend",
                "slurm",
            ],
            "--cpus-per-task must be >= 1",
            "1 or more CPUs",
        ),
        (
            ["bundle", "install", "--auto", "--retries", "-1"],
            "--retries must be 0 or more",
            "0 tries each download once",
        ),
        (
            ["bundle", "install", "--auto", "--lock-timeout", "-5"],
            "--lock-timeout must be 0 or more seconds",
            "leave it out",
        ),
        (
            [
                "bundle",
                "install",
                "--target",
                "cp311-torch2.13-cpu-cxx11-linux_x86_64",
                "--build",
                "missing",
            ],
            "--build missing builds this host's own target",
            "--auto",
        ),
        (
            ["bundle", "install", "--auto", "--mirror", "{dir}", "--catalog-sha256", "abc"],
            "is not a sha256 hex digest",
            "64 hex digits",
        ),
        (
            ["bundle", "build", "--check", "{dir}/no-catalog.toml"],
            "cannot read the catalog",
            "catalog.toml",
        ),
        (
            ["bundle", "build", "--check", "{dir}/no-catalog.toml", "--op", "x"],
            "--check rebuilds every op",
            "without --op",
        ),
        (
            ["bundle", "publish", "{dir}/none.tar.zst", "--release", "v1", "--mirror", "{dir}/m"],
            "no such archive",
            "dllm bundle build --out DIR",
        ),
        (
            ["env", "check", "--manifest", "{dir}/none.toml"],
            "no environment manifest at",
            "dllm env list",
        ),
        (
            ["env", "check", "--manifest", "{dir}"],
            "cannot read the environment manifest",
            "dllm env lock",
        ),
    ],
)
def test_an_option_error_has_a_hint(cli, tmp_path, monkeypatch, argv, message, hint):
    monkeypatch.setenv("DLLM_HOME", str(tmp_path / "home"))
    spec = tmp_path / "train.yaml"
    spec.write_text(SPEC)
    argv = [a.format(dir=tmp_path, spec=spec) for a in argv]
    result = cli(*argv)
    assert_user_error(result, message)
    hint_lines = [line for line in result.err.splitlines() if line.startswith("hint: ")]
    assert len(hint_lines) == 1 and hint in hint_lines[0], result.err


def test_an_error_raised_without_a_hint_still_prints_one(cli, monkeypatch):
    import turbo_dllm.cli.recipe as recipe
    from turbo_dllm.errors import DllmError

    def fail(args):
        raise DllmError("something the user can fix")

    monkeypatch.setattr(recipe, "_list", fail)
    result = cli("recipe", "list")
    assert_user_error(result, "dllm: error: something the user can fix")
    assert "hint: `dllm recipe list --help` describes what it takes" in result.err
    as_json = json.loads(cli("recipe", "list", "--json").out)
    assert as_json["hint"] == "`dllm recipe list --help` describes what it takes"
