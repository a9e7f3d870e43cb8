"""Families and objectives from other packages (entry points), installed by pip for real.

Two packages are built and installed with pip into a folder on PYTHONPATH: `toy-plugin` adds a
family (the decoder under another name, with its own runtime module) and an objective (block
diffusion under another name); `broken-plugin` declares every kind of unusable entry point. The
`dllm` processes of the tests then see them through importlib.metadata, as a user's would.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from tests.train.util import write_config

_PYPROJECT = """\
[build-system]
requires = ["setuptools"]
build-backend = "setuptools.build_meta"

[project]
name = "{name}"
version = "{version}"

[tool.setuptools]
packages = ["{package}"]

{entry_points}
"""

_TOY = {
    "__init__.py": """\
        from dataclasses import replace

        from turbo_dllm.families.base import Objective
        from turbo_dllm.families.decoder import QWEN3

        TOY_LM = replace(
            QWEN3,
            name="toy_lm",
            summary="the decoder, from a plugin",
            objectives=("toy_objective", "block_diffusion"),
            runtime_module="toy_plugin.runtime",
        )
        TOY_OBJECTIVE = Objective(
            "toy_objective", "block diffusion, from a plugin", "toy_plugin.objective"
        )
        TWIN = replace(TOY_LM, name="twin")
        """,
    "runtime.py": """\
        import os

        from turbo_dllm.families.decoder import runtime as _decoder

        with open(os.environ["TOY_MARKS"], "a") as marks:
            marks.write("runtime\\n")


        def __getattr__(name):
            return getattr(_decoder, name)
        """,
    "objective.py": """\
        import os

        from turbo_dllm.train.objectives import block_diffusion


        def build(spec, mask_token_id, vocab_size=None):
            with open(os.environ["TOY_MARKS"], "a") as marks:
                marks.write("objective\\n")
            return block_diffusion.build(spec, mask_token_id, vocab_size=vocab_size)
        """,
}
_TOY_POINTS = """\
[project.entry-points."turbo_dllm.families"]
toy_lm = "toy_plugin:TOY_LM"
twin = "toy_plugin:TWIN"

[project.entry-points."turbo_dllm.objectives"]
toy_objective = "toy_plugin:TOY_OBJECTIVE"
"""

_BROKEN = {
    "__init__.py": """\
        from dataclasses import replace

        from turbo_dllm.families.decoder import QWEN3

        NOT_A_FAMILY = {"name": "wrong_type"}
        MISNAMED = replace(QWEN3, name="another_name")
        TYPO = replace(QWEN3, name="typo", objectives=("block_difusion",))
        TWIN = replace(QWEN3, name="twin")
        SHADOW = replace(QWEN3, summary="a second qwen3")
        """,
    "crash.py": """\
        raise RuntimeError("this plugin is broken on purpose")
        """,
}
_BROKEN_POINTS = """\
[project.entry-points."turbo_dllm.families"]
crash = "broken_plugin.crash:FAMILY"
wrong_type = "broken_plugin:NOT_A_FAMILY"
misnamed = "broken_plugin:MISNAMED"
typo = "broken_plugin:TYPO"
twin = "broken_plugin:TWIN"
qwen3 = "broken_plugin:SHADOW"
"""


def _install(root: Path, target: Path, name: str, files: dict[str, str], points: str) -> None:
    package = name.replace("-", "_")
    source = root / name
    (source / package).mkdir(parents=True)
    for file, text in files.items():
        (source / package / file).write_text(textwrap.dedent(text))
    (source / "pyproject.toml").write_text(
        _PYPROJECT.format(name=name, version="0.3", package=package, entry_points=points)
    )
    subprocess.run(
        [sys.executable, "-m", "pip", "install", "--quiet", "--no-deps", "--no-index"]
        + ["--no-build-isolation", "--target", str(target), str(source)],
        check=True,
        capture_output=True,
        timeout=300,
    )


@pytest.fixture(scope="module")
def plugin_env(tmp_path_factory):
    root = tmp_path_factory.mktemp("plugins")
    target = root / "site"
    _install(root, target, "toy-plugin", _TOY, _TOY_POINTS)
    _install(root, target, "broken-plugin", _BROKEN, _BROKEN_POINTS)
    repo = Path(__file__).resolve().parents[2]
    return {
        "PYTHONPATH": os.pathsep.join([str(target), str(repo)]),
        "TOY_MARKS": str(root / "marks.txt"),
    }


def _dllm(env: dict[str, str], *args, cwd=None) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "turbo_dllm", *map(str, args)],
        env={**os.environ, "OMP_NUM_THREADS": "1", **env},
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=600,
    )


def test_doctor_lists_the_loaded_plugins_and_why_each_broken_one_was_left_out(plugin_env):
    proc = _dllm(plugin_env, "doctor", "--json")
    checks = {c["name"]: c for c in json.loads(proc.stdout)["checks"]}
    plugins = checks["plugins"]
    assert plugins["status"] == "warn" and "pip show" in plugins["fix"]
    detail = plugins["detail"]
    assert "family toy_lm from toy-plugin 0.3 (toy_plugin:TOY_LM)" in detail
    assert "objective toy_objective from toy-plugin 0.3 (toy_plugin:TOY_OBJECTIVE)" in detail
    assert "importing it failed: RuntimeError: this plugin is broken on purpose" in detail
    assert "it is a dict, not a turbo_dllm.families.base.Family" in detail
    assert "its family is named 'another_name'" in detail
    assert "its objectives ['block_difusion'] are not defined" in detail
    assert "turbo-dllm has a family of that name already" in detail  # qwen3 is not shadowed
    assert "'twin': declared by broken-plugin 0.3" in detail and "and toy-plugin 0.3" in detail


def test_a_plugin_family_and_objective_train_end_to_end(plugin_env, tmp_path):
    config = write_config(
        tmp_path / "train.yaml",
        "model.family=toy_lm",
        "objective.name=toy_objective",
        "training.steps=3",
    )
    run = tmp_path / "run"
    proc = _dllm(plugin_env, "train", "--config", config, "--run-dir", run)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    records = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in records] == [1, 2, 3]
    assert all(r["loss"] == r["loss"] and r["loss"] > 0 for r in records)  # finite, positive
    # The plugin's own modules built the model and the objective.
    marks = Path(plugin_env["TOY_MARKS"]).read_text().split()
    assert "runtime" in marks and "objective" in marks


@pytest.mark.parametrize(
    ("family", "reason"),
    [
        ("crash", "importing it failed: RuntimeError: this plugin is broken on purpose"),
        ("twin", "declared by broken-plugin 0.3 (broken_plugin:TWIN) and toy-plugin 0.3"),
        ("typo", "its objectives ['block_difusion'] are not defined by turbo-dllm or any plugin"),
    ],
)
def test_a_runspec_naming_a_broken_plugin_gets_its_reason(plugin_env, tmp_path, family, reason):
    config = write_config(tmp_path / "train.yaml", f"model.family={family}")
    proc = _dllm(plugin_env, "config", "validate", "--config", config)
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert f"family {family!r} could not be loaded from its plugin" in proc.stderr
    assert reason in proc.stderr
    assert "Traceback" not in proc.stderr


def test_commands_that_read_no_runspec_load_no_plugin(plugin_env, tmp_path):
    """docs/architecture.md: a broken plugin cannot stop `dllm bundle status` or `dllm run
    list` (they never import the registry, so no plugin module is imported)."""
    env = {**plugin_env, "DLLM_HOME": str(tmp_path / "home")}
    for command in (("bundle", "status"), ("run", "list", "--root", tmp_path), ("--help",)):
        proc = _dllm(env, *command)
        assert proc.returncode == 0, (command, proc.stdout + proc.stderr)
        assert "plugin" not in proc.stderr, command
    probe = subprocess.run(
        [sys.executable, "-X", "importtime", "-m", "turbo_dllm", "bundle", "status"],
        env={**os.environ, **env},
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert "broken_plugin" not in probe.stderr and "turbo_dllm.registry" not in probe.stderr


def test_broken_plugins_leave_the_built_in_families_alone(plugin_env, tmp_path):
    config = write_config(tmp_path / "train.yaml", "model.family=qwen3")
    proc = _dllm(plugin_env, "config", "validate", "--config", config)
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_without_plugins_the_registry_holds_the_built_in_names_only():
    from importlib.metadata import entry_points

    from turbo_dllm import plugins, registry

    installed = [p for group in plugins.GROUPS.values() for p in entry_points(group=group)]
    if installed:  # a plugin's own venv, running these tests against its family
        pytest.skip(f"plugins are installed here: {', '.join(p.name for p in installed)}")

    assert dict(registry.FAMILIES) == dict(registry.BUILTIN_FAMILIES)
    assert dict(registry.OBJECTIVES) == dict(registry.BUILTIN_OBJECTIVES)
    assert registry.unavailable_reason("family", "toy_lm") is None
