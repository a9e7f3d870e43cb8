"""Drift detection: missing, mismatched and extra packages, exact versions, local labels."""

from __future__ import annotations

import sys

import pytest

from tests.envs.test_manifest import manifest
from tests.helpers import assert_user_error
from turbo_dllm.envs.check import compare, drift_fixes
from turbo_dllm.envs.inventory import Environment, Installed, inspect_environment
from turbo_dllm.envs.manifest import Provided
from turbo_dllm.errors import DllmError


def environment(*dists: tuple[str, str], python: str = "3.11") -> Environment:
    return Environment(
        python=python,
        executable="/venv/bin/python",
        prefix="/venv",
        base_prefix="/usr",
        distributions=tuple(Installed(n, v, f"/venv/lib/{n}") for n, v in dists),
    )


EXACT = (("typing-extensions", "4.16.0"), ("torch", "2.13.0+cpu"), ("turbo-dllm", "0.1.0"))


def test_exact_environment_is_clean():
    drift = compare(manifest(), environment(*EXACT, ("pip", "25.0")))
    assert drift.clean, drift.summary()
    assert drift.checked == 3
    assert "3 packages match" in drift.summary()


def test_each_kind_of_drift_is_named():
    drift = compare(
        manifest(),
        environment(
            ("typing-extensions", "4.15.0"), ("turbo-dllm", "0.1.0"), ("requests", "2.32.0")
        ),
    )
    assert [(m.name, m.expected, m.found) for m in drift.mismatched] == [
        ("typing-extensions", "4.16.0", "4.15.0")
    ]
    assert [(m.name, m.version) for m in drift.missing] == [("torch", "2.13.0+cpu")]
    assert [(e.name, e.version) for e in drift.extra] == [("requests", "2.32.0")]
    summary = drift.summary()
    assert "typing-extensions 4.15.0 != 4.16.0" in summary and "torch==2.13.0+cpu" in summary
    data = drift.to_json()
    assert data["clean"] is False and data["format"] == "turbo_dllm.env_check.v1"


def test_local_label_is_part_of_the_version():
    env = environment(
        ("typing-extensions", "4.16.0"), ("torch", "2.13.0+cu130"), ("turbo-dllm", "0.1.0")
    )
    drift = compare(manifest(), env)
    assert [(m.name, m.found) for m in drift.mismatched] == [("torch", "2.13.0+cu130")]


def test_equal_versions_spelled_differently_match():
    env = environment(("typing-extensions", "4.16"), ("torch", "2.13.0+cpu"), ("turbo-dllm", "0.1"))
    assert compare(manifest(), env).clean


def test_provided_packages_are_version_checked():
    with_base = manifest(provided=[Provided(name="numpy", version="2.0.0")])
    assert [m.name for m in compare(with_base, environment(*EXACT)).missing] == ["numpy"]
    assert compare(with_base, environment(*EXACT, ("numpy", "2.0.0"))).clean


def test_other_python_is_drift():
    drift = compare(manifest(), environment(*EXACT, python="3.12"))
    assert [(m.name, m.expected, m.found) for m in drift.mismatched] == [("python", "3.11", "3.12")]


def test_inspecting_another_interpreter_matches_in_process():
    inside = inspect_environment()
    outside = inspect_environment(sys.executable)
    assert outside.python == inside.python
    names_inside = {d.name: d.version for d in inside.distributions}
    names_outside = {d.name: d.version for d in outside.distributions}
    assert names_outside["pytest"] == names_inside["pytest"]
    assert "turbo-dllm" in names_outside


def _script(path, body: str):
    path.write_text("#!/bin/sh\n" + body + "\n")
    path.chmod(0o755)
    return path


def test_what_an_interpreter_prints_at_startup_is_not_its_package_list(tmp_path):
    """A Python whose startup prints to stdout (a .pth, a sitecustomize) was a JSONDecodeError
    traceback from `dllm env check --python`; sync read the noise as the version."""
    from turbo_dllm.envs.sync import _interpreter_version

    noisy = _script(
        tmp_path / "python", f'echo "welcome to the cluster"\nexec {sys.executable} "$@"'
    )
    env = inspect_environment(noisy)
    assert env.python == f"{sys.version_info[0]}.{sys.version_info[1]}"
    assert "pytest" in {d.name for d in env.distributions}
    assert _interpreter_version(str(noisy)) == env.python


def test_an_executable_that_is_not_python_is_a_user_error(tmp_path, cli, monkeypatch):
    """`--python /bin/true` (exit 0, no answer) was a JSONDecodeError traceback, and a hang a
    TimeoutExpired one; sync called /bin/true 'Python ' and went on."""
    import turbo_dllm.envs.inventory as inventory
    from turbo_dllm.envs.sync import _interpreter_version

    silent = _script(tmp_path / "silent", "exit 0")
    assert_user_error(
        cli("env", "check", "--python", silent), "did not list its packages", "printed nothing"
    )
    chatty = _script(tmp_path / "chatty", "echo not json")
    assert_user_error(cli("env", "check", "--python", chatty), "began 'not json'")
    with pytest.raises(DllmError, match="did not say a Python version"):
        _interpreter_version(str(silent))
    monkeypatch.setattr(inventory, "_PROBE_TIMEOUT_S", 0.5)
    slow = _script(tmp_path / "slow", "sleep 5")
    assert_user_error(cli("env", "check", "--python", slow), "within 0.5 s")


def test_a_venv_folder_given_as_python_names_its_interpreter(tmp_path, cli):
    """`--python .venv` (the folder) failed with "Permission denied" for env check and sync,
    which reads like a file-mode problem; it is named a folder, with the interpreter in it."""
    venv, empty = tmp_path / "venv", tmp_path / "empty"
    (venv / "bin").mkdir(parents=True)
    (venv / "bin" / "python").symlink_to(sys.executable)
    empty.mkdir()
    for folder, hint in (
        (venv, f"--python {venv / 'bin' / 'python'}"),
        (empty, ".venv/bin/python"),
    ):
        for command in (
            ("env", "check"),
            ("env", "sync", "--target", "cpu-x86_64", "--venv", tmp_path / "new"),
        ):
            result = cli(*command, "--python", folder)
            assert_user_error(
                result, f"--python {folder} is a folder, not a Python interpreter", hint
            )
            assert "Permission denied" not in result.err
    assert not (tmp_path / "new").exists()


def fixes(manifest_, env) -> list[str]:
    return drift_fixes(manifest_, compare(manifest_, env), env, sync_source="--target cpu-x86_64")


def test_clean_needs_no_fix():
    assert fixes(manifest(), environment(*EXACT)) == []


def test_pinned_drift_is_fixed_by_a_sync_of_that_venv():
    env = environment(("typing-extensions", "4.15.0"), *EXACT[1:], ("requests", "2.32.0"))
    assert fixes(manifest(), env) == ["dllm env sync --target cpu-x86_64 --venv /venv"]


def test_fixes_for_what_sync_cannot_fix():
    """Sync refuses a venv of another Python, never installs provided packages and installs the
    project only from a mirror: the fix was `dllm env sync` for all of them."""
    other_python = fixes(manifest(), environment(*EXACT, python="3.12"))
    assert other_python == [
        "/venv runs Python 3.12 and sync keeps a venv's Python: remove /venv, then "
        "dllm env sync --target cpu-x86_64 --venv /venv --python python3.11"
    ]
    with_base = manifest(provided=[Provided(name="numpy", version="2.0.0")])
    provided = fixes(with_base, environment(*EXACT, ("numpy", "2.1.0")))
    assert (
        len(provided) == 1
        and "sync never installs what the base interpreter provides" in (provided[0])
    )
    assert "--reinstall 'numpy==2.0.0'" in provided[0] and "--from-environment" in provided[0]
    project = fixes(manifest(), environment(*EXACT[:2]))
    assert len(project) == 1 and project[0].startswith("install turbo-dllm 0.1.0 itself")
    newer = fixes(manifest(), environment(*EXACT[:2], ("turbo-dllm", "0.2.0")))
    assert newer == [
        "turbo-dllm 0.2.0 is installed and manifest cpu-x86_64 is for 0.1.0: sync the manifest "
        "of the installed release (dllm env sync --target cpu-x86_64 --venv /venv)"
    ]
