"""The doctor's environment check: pass on an exact environment, warn on drift, fail for prod."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from turbo_dllm.doctor import DoctorContext
from turbo_dllm.doctor.checks import env as env_check
from turbo_dllm.envs import select
from turbo_dllm.envs.inventory import inspect_environment
from turbo_dllm.envs.manifest import EnvManifest, Pin, Project, WheelFile
from turbo_dllm.errors import DllmError


def manifest_of_this_environment(change: str | None = None) -> EnvManifest:
    """A manifest that pins exactly what this interpreter has (optionally one version off)."""
    pins = []
    for dist in inspect_environment().distributions:
        if dist.name in ("turbo-dllm", "pip"):
            continue
        version = "999.0" if dist.name == change else dist.version
        wheel = WheelFile(
            filename=f"{dist.name.replace('-', '_')}-{version}-py3-none-any.whl", sha256="c" * 64
        )
        pins.append(Pin(name=dist.name, version=version, wheels=[wheel]))
    return EnvManifest(
        target="cpu-x86_64",
        bundle_target="cp311-torch2.13-cpu-cxx11-linux_x86_64",
        python=inspect_environment().python,
        python_platform="x86_64-manylinux_2_28",
        resolver="test",
        project=Project(name="turbo-dllm", version=__import__("turbo_dllm").__version__),
        requirements=[],
        packages=pins,
    )


def use(monkeypatch, manifest):
    monkeypatch.setattr(select, "environment_manifest", lambda *a, **k: (manifest, "test"))


def prod_context() -> DoctorContext:
    return DoctorContext(spec=SimpleNamespace(launch=SimpleNamespace(kind="prod")))


def test_exact_environment_passes(monkeypatch):
    use(monkeypatch, manifest_of_this_environment())
    result = env_check.environment_manifest(DoctorContext())
    assert result.status == "pass", result.detail
    assert "match manifest cpu-x86_64" in result.detail


def test_drift_warns_and_fails_for_prod(monkeypatch):
    use(monkeypatch, manifest_of_this_environment(change="pytest"))
    result = env_check.environment_manifest(DoctorContext())
    assert result.status == "warn"
    assert "pytest" in result.detail and "999.0" in result.detail
    assert "dllm env sync --target cpu-x86_64" in result.fix
    assert env_check.environment_manifest(prod_context()).status == "fail"


def test_extra_packages_alone_warn_and_say_what_sync_would_remove(monkeypatch):
    manifest = manifest_of_this_environment()
    pins = [pin for pin in manifest.packages if pin.name != "pytest"]
    use(monkeypatch, manifest.model_copy(update={"packages": pins}))
    result = env_check.environment_manifest(DoctorContext())
    assert result.status == "warn"
    assert "1 extra (pytest" in result.detail
    assert "every pinned package matches" in result.fix and "uninstalls the extras" in result.fix
    assert env_check.environment_manifest(prod_context()).status == "fail"


@pytest.mark.parametrize("prod", [False, True])
def test_no_manifest_for_the_host(monkeypatch, prod):
    def missing(*args, **kwargs):
        raise DllmError("no environment manifest fits this host", hint="pass --target NAME")

    monkeypatch.setattr(select, "environment_manifest", missing)
    result = env_check.environment_manifest(prod_context() if prod else DoctorContext())
    assert result.status == ("fail" if prod else "warn")
    assert result.fix.startswith("dllm env check --target NAME")


def test_no_manifest_fits_names_the_reasons_and_a_fix_doctor_does_not_refuse(cli, monkeypatch):
    """Was, on a host no manifest fits (an A100 node, say): "no environment manifest to compare
    with: no environment manifest fits this host (...):", ending in a colon, the reasons dropped,
    and the fix "pass --target NAME", which `dllm doctor` refuses (it has no --target)."""
    monkeypatch.setenv("DLLM_OVERRIDE_GPUS", "sm80")
    monkeypatch.setenv("DLLM_OVERRIDE_CUDA", "13.0")
    result = env_check.environment_manifest(DoctorContext())
    assert result.status == "warn"
    assert not result.detail.endswith(":"), result.detail
    assert "cpu-x86_64: gpus: host sm80, bundle none" in result.detail
    assert "\n" not in result.detail
    assert not result.fix.startswith("pass --target")
    assert "dllm env check --target NAME" in result.fix
    assert "dllm env lock --target NAME" in result.fix
    assert cli("doctor", "--target", "cpu-x86_64").code == 2  # what the old fix said to do


def test_doctor_reports_the_environment_check(cli, monkeypatch):
    use(monkeypatch, manifest_of_this_environment(change="pytest"))
    result = cli("doctor")
    assert "environment" in result.out and "pytest" in result.out


def test_a_synced_venv_is_told_to_sync_its_own_copy(monkeypatch):
    """The fix named `--target T`, the packaged manifest, which need not be the one the venv
    was synced to (a mirror's, a file's) and so did not make the check pass."""
    import sys

    manifest = manifest_of_this_environment(change="pytest")
    copy = f"{sys.prefix}/dllm-env-manifest.toml"
    monkeypatch.setattr(
        select, "environment_manifest", lambda *a, **k: (manifest, f"synced copy {copy}")
    )
    result = env_check.environment_manifest(DoctorContext())
    assert result.status == "warn"
    assert result.fix.startswith(f"dllm env sync --manifest {copy} --venv {sys.prefix} ")


def test_a_damaged_synced_copy_is_reported_with_the_sync_that_rewrites_it(tmp_path, monkeypatch):
    import sys

    (tmp_path / "dllm-env-manifest.toml").write_text("format = [[[")
    monkeypatch.setattr(sys, "prefix", str(tmp_path))
    result = env_check.environment_manifest(DoctorContext())
    assert result.status == "warn"
    # Was "no environment manifest for this host", with `dllm env sync --target TARGET` or
    # "regenerate it with dllm env lock" (the packaged manifests' fix) as the fix.
    assert result.detail.startswith("no environment manifest to compare with: ")
    assert "not valid TOML" in result.detail
    assert f"dllm env sync --venv {tmp_path}" in result.fix and "dllm env lock" not in result.fix


def test_outside_a_venv_the_fix_installs_dllm_into_the_new_one(monkeypatch):
    """`python3 -m venv .venv && . .venv/bin/activate` left `dllm` the system interpreter's,
    so doctor kept reporting the system interpreter."""
    import sys

    from turbo_dllm.doctor.checks import portable

    monkeypatch.setattr(sys, "base_prefix", sys.prefix)
    monkeypatch.delenv("CONDA_PREFIX", raising=False)
    result = portable.venv_isolation(DoctorContext())
    assert result.status == "warn"
    assert "pip install 'turbo-dllm[data,env]'" in result.fix
    assert "dllm env sync --venv .venv" in result.fix


def test_without_torch_the_fix_names_the_cpu_build_index(monkeypatch):
    """`pip install torch (CPU)` installs PyPI's CUDA build on Linux (docs/install.md)."""
    import sys

    from turbo_dllm.doctor.checks import portable

    monkeypatch.setitem(sys.modules, "torch", None)  # import torch raises ImportError
    monkeypatch.setattr(portable, "_nvidia_driver", lambda: False)  # a host without a GPU
    result = portable.torch_import(DoctorContext())
    assert result.status == "fail"
    assert "--index-url https://download.pytorch.org/whl/cpu" in result.fix


def test_without_torch_the_fix_installs_the_torch_this_host_can_use(monkeypatch):
    """The fix read 'pip install torch --index-url .../cpu (the CPU build; ...), or the CUDA
    build for your driver': on a GPU host the command given installed a torch without CUDA, and
    pasted whole the line was a bash syntax error. It is now PyPI's (CUDA) torch where an NVIDIA
    driver is loaded, into this interpreter's environment, and the rest a shell comment."""
    import shlex
    import subprocess
    import sys

    from turbo_dllm.doctor.checks import portable

    monkeypatch.setitem(sys.modules, "torch", None)
    python = shlex.quote(sys.executable)
    for driver, command in (
        (True, f"{python} -m pip install torch"),
        (False, f"{python} -m pip install torch --index-url https://download.pytorch.org/whl/cpu"),
    ):
        monkeypatch.setattr(portable, "_nvidia_driver", lambda driver=driver: driver)
        fix = portable.torch_import(DoctorContext()).fix
        assert fix.split("   #")[0] == command, fix
        syntax = subprocess.run(["bash", "-n", "-c", fix], capture_output=True, text=True)
        assert syntax.returncode == 0, syntax.stderr
        assert "pinned: dllm env sync --venv" in fix
