"""`dllm env lock` and `dllm env sync` with uv, offline, on wheels built in the test."""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from tests.envs.uv_stand_in import sync_held_by_uv
from tests.envs.wheelfactory import make_wheel
from tests.helpers import assert_user_error
from turbo_dllm.envs.lock import LockRequest, lock_environment
from turbo_dllm.envs.manifest import (
    EnvManifest,
    Index,
    Pin,
    Project,
    Provided,
    WheelFile,
    dump_manifest,
)
from turbo_dllm.envs.sync import sync_environment, venv_python
from turbo_dllm.envs.uvtool import uv_binary
from turbo_dllm.errors import DllmError

PYTHON = f"{sys.version_info.major}.{sys.version_info.minor}"


@pytest.fixture(autouse=True)
def private_uv_cache(tmp_path, monkeypatch):
    """A fresh uv cache: every install really reads the wheels the test points at."""
    monkeypatch.setenv("UV_CACHE_DIR", str(tmp_path / "uv-cache"))


@pytest.fixture
def wheels(tmp_path) -> Path:
    folder = tmp_path / "wheels"
    make_wheel(folder, "dllm-fixture-a", "1.0")
    make_wheel(folder, "dllm-fixture-a", "1.1")
    make_wheel(folder, "dllm-fixture-b", "2.0", requires=("dllm-fixture-a",))
    make_wheel(folder, "dllm-fixture-c", "3.0")
    return folder


def lock_fixtures(wheels: Path, *requirements: str) -> EnvManifest:
    return lock_environment(
        LockRequest(
            target="cpu-x86_64",
            python_version=PYTHON,
            torch_version="2.13.0",
            requirements=list(requirements) or ["dllm-fixture-b==2.0", "dllm-fixture-a<1.1"],
            project=Project(name="turbo-dllm", version="0.1.0"),
            index_url=None,
            extra_index_urls=[],
            find_links=[str(wheels)],
            offline=True,
        )
    )


def sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def test_lock_pins_versions_and_wheel_hashes(wheels):
    manifest = lock_fixtures(wheels)
    assert [(p.name, p.version) for p in manifest.packages] == [
        ("dllm-fixture-a", "1.0"),
        ("dllm-fixture-b", "2.0"),  # the dependency was resolved, not only the inputs
    ]
    wheel = manifest.pin("dllm-fixture-a").wheels[0]
    assert wheel.filename == "dllm_fixture_a-1.0-py3-none-any.whl"
    assert wheel.sha256 == sha256(wheels / wheel.filename)
    assert wheel.size == (wheels / wheel.filename).stat().st_size
    assert [(i.url, i.kind) for i in manifest.indexes] == [(wheels.as_uri(), "find-links")]
    assert manifest.bundle_target == f"cp{PYTHON.replace('.', '')}-torch2.13-cpu-cxx11-linux_x86_64"
    assert manifest.resolver.startswith("uv ")


def test_lock_refuses_what_the_target_does_not_allow(wheels):
    with pytest.raises(DllmError, match="not one of target cpu-x86_64"):
        lock_environment(
            LockRequest(
                target="cpu-x86_64",
                torch_version="2.5.0",
                requirements=["dllm-fixture-c"],
                project=Project(name="turbo-dllm", version="0.1.0"),
            )
        )
    with pytest.raises(DllmError, match="unknown target"):
        lock_environment(LockRequest(target="tpu-v9", requirements=[]))


def test_lock_reports_unresolvable_requirements(wheels):
    with pytest.raises(DllmError, match="resolving the environment") as error:
        lock_fixtures(wheels, "dllm-fixture-a==9.9")
    assert "dllm-fixture-a" in error.value.message


def test_sync_check_drift_and_resync(wheels, tmp_path, cli):
    manifest = lock_fixtures(wheels)
    venv = tmp_path / "venv"
    result = sync_environment(manifest, venv)
    assert result.created and result.drift.clean is True
    python = venv_python(venv)
    out = subprocess.run(
        [python, "-c", "import dllm_fixture_a, dllm_fixture_b; print(dllm_fixture_a.VERSION)"],
        capture_output=True,
        text=True,
    )
    assert out.stdout.strip() == "1.0", out.stderr
    # The venv records what it was synced to, so `env check --python` needs no target.
    assert (venv / "dllm-env-manifest.toml").is_file()

    # Drift: one package at another version, one extra package.
    subprocess.run(
        [uv_binary(), "pip", "install", "--python", python, "--no-index", "--find-links", wheels,
         "dllm-fixture-a==1.1", "dllm-fixture-c"],
        check=True,
        capture_output=True,
    )  # fmt: skip
    checked = cli("env", "check", "--python", python, "--json")
    assert checked.code == 1, checked.err
    report = json.loads(checked.out)
    assert report["mismatched"] == [{"name": "dllm-fixture-a", "expected": "1.0", "found": "1.1"}]
    assert report["extra"] == [{"name": "dllm-fixture-c", "version": "3.0"}]
    assert report["missing"] == [{"name": "turbo-dllm", "version": "0.1.0"}]  # never installed
    human = cli("env", "check", "--python", python)
    assert "dllm-fixture-a: installed 1.1, manifest 1.0" in human.out
    # The fix is a sync, which also uninstalls the extras (a dev venv's pytest, ruff): said so.
    fix = next(line for line in human.out.splitlines() if line.startswith("fix: dllm env sync"))
    assert fix.endswith("  # also uninstalls the 1 extra package: dllm-fixture-c"), human.out

    # A second sync restores the pin and removes the extra.
    again = sync_environment(manifest, venv)
    assert not again.created and again.removed == ["dllm-fixture-c"]
    report = json.loads(cli("env", "check", "--python", python, "--json").out)
    assert report["mismatched"] == [] and report["extra"] == []


def test_sync_refuses_a_wheel_whose_hash_is_not_pinned(wheels, tmp_path):
    manifest = lock_fixtures(wheels)
    data = manifest.model_dump()
    data["packages"][0]["wheels"][0]["sha256"] = "0" * 64
    with pytest.raises(DllmError, match="installing manifest") as error:
        sync_environment(EnvManifest.model_validate(data), tmp_path / "venv")
    assert "hash" in error.value.message.lower()


def test_sync_cli_errors(wheels, tmp_path, cli):
    manifest_file = tmp_path / "m.toml"
    manifest_file.write_text(dump_manifest(lock_fixtures(wheels)))
    result = cli("env", "sync", "--manifest", manifest_file, "--offline", "--venv", tmp_path / "v")
    assert_user_error(result, "--offline needs --mirror")
    result = cli(
        "env", "sync", "--manifest", manifest_file, "--venv", tmp_path / "v", "--python", "/nope"
    )
    assert_user_error(result, "/nope")
    (tmp_path / "notvenv").mkdir()
    (tmp_path / "notvenv" / "file").write_text("x")
    result = cli("env", "sync", "--manifest", manifest_file, "--venv", tmp_path / "notvenv")
    assert_user_error(result, "not a virtual environment")


def test_sync_of_an_existing_venv_refuses_a_python_it_would_ignore(wheels, tmp_path, cli):
    """--python chooses the interpreter of a venv sync creates; for an existing venv it was
    ignored, even a path that does not exist. One of the venv's own Python version is accepted;
    another version, or none that runs, is refused with the two ways out."""
    manifest_file = tmp_path / "m.toml"
    manifest_file.write_text(dump_manifest(lock_fixtures(wheels)))
    venv = tmp_path / "venv"
    sync = ("env", "sync", "--manifest", manifest_file, "--venv", venv)
    assert cli(*sync).code == 0
    assert cli(*sync, "--python", sys.executable).code == 0  # the venv's own Python version

    other = tmp_path / "python3.99"  # answers the version question as another Python would
    other.write_text("#!/bin/sh\necho 3.99\n")
    other.chmod(0o755)
    for python, needle in (
        (other, f"--python {other} is Python 3.99, but {venv} exists with Python {PYTHON}"),
        (tmp_path / "nope", f"cannot run --python {tmp_path / 'nope'}"),
    ):
        result = cli(*sync, "--python", python)
        assert_user_error(result, needle, f"hint: drop --python to update {venv}",
                          f"or remove {venv} to create it anew")  # fmt: skip
        assert venv_python(venv).exists()  # the venv is left as it was


def test_sync_never_installs_into_a_prefix_that_is_not_a_venv(wheels, tmp_path):
    prefix = tmp_path / "prefix"
    (prefix / "bin").mkdir(parents=True)
    (prefix / "bin" / "python").symlink_to(sys.executable)  # looks like an interpreter prefix
    with pytest.raises(DllmError, match="not a virtual environment"):
        sync_environment(lock_fixtures(wheels), prefix)


def test_env_cli_lists_and_prints_the_shipped_manifest(cli):
    listed = cli("env", "list", "--json")
    assert "cpu-x86_64" in json.loads(listed.out)["manifests"]
    printed = cli("env", "requirements", "--target", "cpu-x86_64")
    lines = printed.out.splitlines()
    assert lines[0].startswith("# cpu-x86_64 (cp3") and lines[1].startswith("--index-url ")
    torch = next(line for line in lines if line.startswith("torch=="))
    assert torch.startswith("torch==2.13.0+cpu --hash=sha256:")
    assert "--index-url" not in cli("env", "requirements", "--target", "cpu-x86_64",
                                     "--no-sources").out  # fmt: skip


def test_requirements_say_which_packages_the_base_provides(wheels, tmp_path, cli):
    """A manifest whose packages are all `provided` (the shipped sm90, locked
    --from-environment) printed its header and `--no-index` only: pip installed nothing and said
    nothing. A comment now counts them and names the check; pip and uv skip it."""
    manifest = lock_fixtures(wheels, "dllm-fixture-b==2.0", "dllm-fixture-a==1.0")
    base = [Provided(name="dllm-fixture-a", version="1.0")]
    some = tmp_path / "some.toml"
    pins = [p for p in manifest.packages if p.name == "dllm-fixture-b"]
    some.write_text(dump_manifest(manifest.model_copy(update={"packages": pins, "provided": base})))
    every = tmp_path / "all.toml"
    both = [*base, Provided(name="dllm-fixture-b", version="2.0")]
    every.write_text(dump_manifest(manifest.model_copy(update={"packages": [], "provided": both})))

    printed = cli("env", "requirements", "--manifest", every)
    assert printed.code == 0, printed.err
    assert printed.out.splitlines()[1] == (
        "# all 2 packages of manifest cpu-x86_64 are provided by the base interpreter and not "
        f"listed here (check them: dllm env check --manifest {every})"
    )
    printed = cli("env", "requirements", "--manifest", some, "--no-sources")
    assert printed.out.splitlines()[1:] == [
        "# 1 package of manifest cpu-x86_64 is provided by the base interpreter and not listed "
        f"here (check them: dllm env check --manifest {some})",
        pins[0].requirement_line(),
    ]
    # A manifest that provides nothing prints as before: no such line.
    assert "provided" not in cli("env", "requirements", "--target", "cpu-x86_64").out

    # pip and uv read the file as before: the comment is no requirement, the pin is installed.
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PIP_", "UV_"))}
    env["PIP_CONFIG_FILE"] = os.devnull
    for manifest_file, expected in ((some, "dllm-fixture-b"), (every, None)):
        requirements = tmp_path / f"{manifest_file.stem}.txt"
        requirements.write_text(cli("env", "requirements", "--manifest", manifest_file).out)
        for command in (
            [sys.executable, "-m", "pip", "install", "--dry-run", "--no-deps",
             "--require-hashes", "-r", requirements],
            [uv_binary(), "pip", "install", "--dry-run", "--no-deps", "--require-hashes",
             "--offline", "--python", sys.executable, "-r", requirements],
        ):  # fmt: skip
            proc = subprocess.run(command, capture_output=True, text=True, env=env)
            said = proc.stdout + proc.stderr
            assert proc.returncode == 0, said
            if expected:
                assert expected in said.replace("_", "-"), said
            else:
                assert "dllm-fixture" not in said.replace("_", "-"), said


def test_env_lock_cli_errors(cli):
    assert_user_error(cli("env", "lock", "--target", "tpu-v9"), "unknown target")
    assert_user_error(
        cli("env", "lock", "--target", "cpu-x86_64", "--torch", "2.5.0"), "not one of target"
    )
    # was an InvalidVersion traceback
    assert_user_error(
        cli("env", "lock", "--target", "cpu-x86_64", "--torch", "banana"), "is not a version"
    )


def test_sync_refuses_pins_that_do_not_fit_together_and_removes_the_venv_it_made(
    wheels, tmp_path, cli
):
    """Pins are installed with --no-deps: a hand-edited manifest whose pins conflict made a
    broken venv that sync called clean."""
    wheel = make_wheel(wheels, "dllm-fixture-d", "1.0", requires=("dllm-fixture-a>=1.1",))
    manifest = lock_fixtures(wheels, "dllm-fixture-a==1.0")
    conflicting = Pin(
        name="dllm-fixture-d",
        version="1.0",
        wheels=[WheelFile(filename=wheel.name, sha256=sha256(wheel))],
    )
    edited = manifest.model_copy(update={"packages": [*manifest.packages, conflicting]})
    path = tmp_path / "edited.toml"
    path.write_text(dump_manifest(edited))
    venv = tmp_path / "venv"
    result = cli("env", "sync", "--manifest", path, "--venv", venv)
    error = result.err[result.err.index("dllm: error:") :]  # after uv's progress
    assert_user_error(
        dataclasses.replace(result, err=error),
        "pins do not fit together",
        "dllm-fixture-a>=1.1",
        "hint: ",
        "dllm env lock",
    )
    assert not venv.exists()  # nothing half-done


def test_a_failed_sync_leaves_no_venv_behind(wheels, tmp_path):
    manifest = lock_fixtures(wheels)
    absent = Pin(
        name="dllm-fixture-x",
        version="1.0",
        wheels=[WheelFile(filename="dllm_fixture_x-1.0-py3-none-any.whl", sha256="0" * 64)],
    )
    broken = manifest.model_copy(update={"packages": [*manifest.packages, absent]})
    with pytest.raises(DllmError, match="installing manifest"):
        sync_environment(broken, tmp_path / "venv")
    assert not (tmp_path / "venv").exists()
    named = tmp_path / "named"  # an empty folder the user named stays, empty
    named.mkdir()
    with pytest.raises(DllmError, match="installing manifest"):
        sync_environment(broken, named)
    assert named.is_dir() and not any(named.iterdir())
    # An existing venv is not removed by a failed update.
    sync_environment(manifest, tmp_path / "kept")
    with pytest.raises(DllmError, match="installing manifest"):
        sync_environment(broken, tmp_path / "kept")
    assert venv_python(tmp_path / "kept").exists()


def test_sigterm_during_sync_stops_uv_and_removes_the_venv_it_made(wheels, tmp_path):
    """SIGTERM (`kill`, `timeout`, a scheduler's limit) ended dllm on the spot: uv went on
    installing into the venv sync had just made, and the half-made venv stayed."""
    manifest_file = tmp_path / "m.toml"
    manifest_file.write_text(dump_manifest(lock_fixtures(wheels)))
    marker = tmp_path / "uv-installing"
    slow_uv = tmp_path / "uv"  # the real uv, but `pip install` hangs until stopped
    slow_uv.write_text(
        "#!/bin/sh\n"
        f'if [ "$1" = pip ] && [ "$2" = install ]; then echo $$ > {marker}; exec sleep 60; fi\n'
        f'exec {uv_binary()} "$@"\n'
    )
    slow_uv.chmod(0o755)
    venv = tmp_path / "venv"
    with sync_held_by_uv(slow_uv, marker, manifest_file, venv) as (proc, uv_pid):
        assert (venv / "pyvenv.cfg").is_file()
        proc.send_signal(signal.SIGTERM)
        out, err = proc.communicate(timeout=30)
        assert proc.returncode == -signal.SIGTERM, (proc.returncode, err)
        assert "Traceback" not in err
        assert not venv.exists()
        with pytest.raises(ProcessLookupError):  # uv was stopped, not left running
            os.kill(uv_pid, 0)


def test_sync_where_it_cannot_write_is_refused_before_anything_is_made(
    wheels, tmp_path, cli, monkeypatch
):
    manifest_file = tmp_path / "m.toml"
    manifest_file.write_text(dump_manifest(lock_fixtures(wheels)))
    blocker = tmp_path / "file"
    blocker.write_text("")
    result = cli("env", "sync", "--manifest", manifest_file, "--venv", blocker / "venv")
    assert_user_error(result, f"{blocker} is a file, not a folder", "--venv")
    readonly = tmp_path / "readonly"
    readonly.mkdir()
    from turbo_dllm.envs import sync

    # Root may write anywhere, so the permission is denied by stand-in (os.access says no).
    monkeypatch.setattr(sync.os, "access", lambda path, mode: Path(path) != readonly)
    result = cli("env", "sync", "--manifest", manifest_file, "--venv", readonly / "venv")
    assert_user_error(result, f"{readonly} is not writable", "--venv")
    assert not (readonly / "venv").exists()


def test_a_damaged_synced_copy_says_to_sync_again(wheels, tmp_path, cli):
    manifest_file = tmp_path / "m.toml"
    manifest_file.write_text(dump_manifest(lock_fixtures(wheels)))
    venv = tmp_path / "venv"
    sync_environment(lock_fixtures(wheels), venv)
    copy = venv / "dllm-env-manifest.toml"
    copy.write_text(copy.read_text() + "garbage [[[\n")
    result = cli("env", "check", "--python", venv_python(venv))
    # Was: no hint for bad TOML, and "regenerate it with dllm env lock" for a bad field.
    assert_user_error(result, str(copy), "hint: it is the copy `dllm env sync` left", "sync again")
    assert cli("env", "sync", "--manifest", manifest_file, "--venv", venv).code == 0
    assert "garbage" not in copy.read_text()


def test_env_check_fixes_restore_the_manifest_the_venv_was_synced_to(wheels, tmp_path, cli):
    """The fix line was `dllm env sync --target T --venv VENV`: the packaged manifest of T (not
    the one this venv was synced to, which may not be packaged at all) and a placeholder."""
    manifest = lock_fixtures(wheels).model_copy(update={"target": "fixture-target"})
    manifest_file = tmp_path / "m.toml"
    manifest_file.write_text(dump_manifest(manifest))
    venv = tmp_path / "venv"
    assert cli("env", "sync", "--manifest", manifest_file, "--venv", venv).code == 0
    python = venv_python(venv)
    subprocess.run(
        [uv_binary(), "pip", "install", "--python", python, "--no-index", "--find-links", wheels,
         "dllm-fixture-a==1.1"],
        check=True,
        capture_output=True,
    )  # fmt: skip
    report = json.loads(cli("env", "check", "--python", python, "--json").out)
    sync_fix = f"dllm env sync --manifest {venv / 'dllm-env-manifest.toml'} --venv {venv}"
    assert report["fixes"][0] == sync_fix
    assert "install turbo-dllm 0.1.0 itself" in report["fixes"][1]  # sync does not install it
    # The fix, as printed, fixes what was reported.
    assert cli(*sync_fix.split()[1:]).code == 0
    report = json.loads(cli("env", "check", "--python", python, "--json").out)
    assert report["mismatched"] == [] and [m["name"] for m in report["missing"]] == ["turbo-dllm"]


def test_a_pin_may_require_a_package_the_base_provides(wheels, tmp_path):
    """uv's own check sees only the venv's site-packages, so a pin's requirement on a provided
    package (from the base interpreter, here through a .pth file) looks missing to it: that is
    not a conflict of the pins."""
    base = tmp_path / "base-site"
    subprocess.run(
        [uv_binary(), "pip", "install", "--target", base, "--no-index", "--find-links", wheels,
         "dllm-fixture-a==1.0", "--python", sys.executable],
        check=True,
        capture_output=True,
    )  # fmt: skip
    venv = tmp_path / "venv"
    subprocess.run([uv_binary(), "venv", venv, "--python", sys.executable, "--quiet"], check=True)
    (site,) = (venv / "lib").glob("python3.*/site-packages")
    (site / "_base.pth").write_text(f"{base}\n")
    manifest = lock_fixtures(wheels, "dllm-fixture-b==2.0", "dllm-fixture-a==1.0")
    pins = [p for p in manifest.packages if p.name == "dllm-fixture-b"]
    provided = [Provided(name="dllm-fixture-a", version="1.0")]
    result = sync_environment(
        manifest.model_copy(update={"packages": pins, "provided": provided}), venv
    )
    assert result.drift.clean and not result.created


def test_an_unreachable_index_points_at_a_mirror(wheels, tmp_path, cli):
    """Offline without --mirror: the hint spoke of a mirror the user had not named."""
    manifest = lock_fixtures(wheels).model_copy(
        update={"indexes": [Index(url="http://127.0.0.1:9/simple")]}
    )
    path = tmp_path / "m.toml"
    path.write_text(dump_manifest(manifest))
    result = cli("env", "sync", "--manifest", path, "--venv", tmp_path / "venv")
    assert result.code == 2 and "Traceback" not in result.err
    assert "hint: the manifest's indexes must be reachable" in result.err
    assert "--mirror DIR|URL --offline" in result.err
    assert not (tmp_path / "venv").exists()


@pytest.mark.parametrize("kind", ["another machine", "a newer glibc"])
def test_a_manifest_for_another_platform_is_refused_before_a_venv_is_made(
    wheels, tmp_path, cli, kind
):
    """A manifest locked for another host went to uv, which picked this host's wheel (or none)
    and failed with "hash mismatch" under a hint about unreachable indexes."""
    import platform as platform_module

    machine = platform_module.machine().lower()
    if kind == "another machine":
        tag = "manylinux_2_17_" + ("x86_64" if machine == "aarch64" else "aarch64")
    else:
        tag = f"manylinux_9_99_{machine}"  # a glibc no host has yet
    source = next(wheels.glob("dllm_fixture_c-3.0-*.whl"))
    wheel = source.with_name(f"dllm_fixture_c-3.0-cp311-cp311-{tag}.whl")
    source.rename(wheel)
    manifest = lock_fixtures(wheels, "dllm-fixture-a==1.0")
    foreign = Pin(
        name="dllm-fixture-c",
        version="3.0",
        wheels=[WheelFile(filename=wheel.name, sha256=sha256(wheel))],
    )
    path = tmp_path / "foreign.toml"
    path.write_text(dump_manifest(manifest.model_copy(update={"packages": [foreign]})))
    venv = tmp_path / "venv"
    result = cli("env", "sync", "--manifest", path, "--venv", venv)
    assert_user_error(
        result,
        "pins wheels this host",
        f"dllm-fixture-c ({tag})",
        "hint: sync on a host of that platform",
    )
    assert "installing manifest" not in result.err and "hash" not in result.err.lower()
    assert not venv.exists()


def test_a_full_disk_during_the_install_says_so_not_unreachable_indexes(
    wheels, tmp_path, cli, monkeypatch
):
    """uv's "No space left on device (os error 28)" came with the hint that the manifest's
    indexes must be reachable and hold every pinned wheel."""
    from turbo_dllm.envs import uvtool

    real = uv_binary()
    fake = tmp_path / "uv"
    fake.write_text(
        "#!/bin/sh\n"
        'if [ "$1 $2" = "pip install" ]; then\n'
        "  echo 'error: Failed to install: dllm_fixture_a-1.0-py3-none-any.whl' >&2\n"
        "  echo '  cause: failed to copy file: No space left on device (os error 28)' >&2\n"
        "  exit 2\n"
        "fi\n"
        f'exec "{real}" "$@"\n'
    )
    fake.chmod(0o755)
    monkeypatch.setattr(uvtool, "uv_binary", lambda: str(fake))
    path = tmp_path / "m.toml"
    path.write_text(dump_manifest(lock_fixtures(wheels)))
    result = cli("env", "sync", "--manifest", path, "--venv", tmp_path / "venv")
    error = result.err[result.err.index("dllm: error:") :]  # after uv's progress
    assert_user_error(
        dataclasses.replace(result, err=error),
        "os error 28",
        "hint: the disk is full",
        "UV_CACHE_DIR",
    )
    assert "indexes must be reachable" not in result.err
    assert not (tmp_path / "venv").exists()


def test_printed_commands_run_as_printed_where_paths_hold_spaces(wheels, tmp_path, cli):
    """`activate: . /x/my venv/bin/activate`, `fix: dllm env sync --manifest /x/my venv/...`
    and the note's `uv pip install --python /x/my venv/bin/python` printed paths unquoted: pasted
    into a shell, each split at the space and failed."""
    import shlex

    folder = tmp_path / "my envs"
    manifest_file = folder / "the manifest.toml"
    folder.mkdir()
    manifest_file.write_text(dump_manifest(lock_fixtures(wheels)))
    venv = folder / "my venv"
    synced = cli("env", "sync", "--manifest", manifest_file, "--venv", venv)
    assert synced.code == 0, synced.err
    activate = next(line for line in synced.out.splitlines() if line.startswith("activate: "))
    shell = subprocess.run(
        ["bash", "-c", f"{activate.removeprefix('activate: ')} && python -c 'import sys; "
         "print(sys.prefix)'"],
        capture_output=True, text=True,
    )  # fmt: skip
    assert shell.stdout.strip() == str(venv), shell.stderr
    note = next(line for line in synced.out.splitlines() if "uv pip install" in line)
    assert f"--python {shlex.quote(str(venv_python(venv)))} " in note

    python = venv_python(venv)
    subprocess.run(
        [uv_binary(), "pip", "install", "--python", python, "--no-index", "--find-links", wheels,
         "dllm-fixture-a==1.1"],
        check=True, capture_output=True,
    )  # fmt: skip
    for args in ((), ("--manifest", manifest_file)):
        checked = cli("env", "check", "--python", python, *args)
        assert checked.code == 1
        fix = next(line for line in checked.out.splitlines() if line.startswith("fix: dllm env"))
        assert cli(*shlex.split(fix.removeprefix("fix: "))[1:]).code == 0, fix
        assert cli("env", "check", "--python", python, *args).out.count("mismatched") == 0
        subprocess.run(
            [uv_binary(), "pip", "install", "--python", python, "--no-index", "--find-links",
             wheels, "dllm-fixture-a==1.1"],
            check=True, capture_output=True,
        )  # fmt: skip
