"""`dllm env sync` SIGKILLed midway (or its machine lost): nothing cleans up, so the venv it
was working on carries its mark; check and doctor refuse it, and the next sync repairs it."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from tests.envs.test_lock_sync import lock_fixtures, private_uv_cache, wheels  # noqa: F401
from tests.envs.uv_stand_in import sync_held_by_uv
from tests.helpers import assert_user_error
from turbo_dllm.envs.incomplete import MARK
from turbo_dllm.envs.manifest import Pin, WheelFile, dump_manifest
from turbo_dllm.envs.sync import sync_environment, venv_python
from turbo_dllm.envs.uvtool import uv_binary


def _killed_sync(tmp_path: Path, manifest_file: Path, venv: Path, phase: str) -> None:
    """Run `dllm env sync` in a process of its own with a uv that stops at `phase` (`venv`:
    after a half-made venv, its interpreter not written yet; `pip install`: after one installed
    package lost its module, as a half-written install would), then SIGKILL it and that uv."""
    ready = tmp_path / "uv-stopped"
    ready.unlink(missing_ok=True)
    real = uv_binary()
    slow_uv = tmp_path / "uv"
    slow_uv.write_text(
        "#!/bin/sh\n"
        + (
            'if [ "$1" = venv ]; then\n'
            f'  "{real}" "$@" || exit $?\n'
            f'  rm "$2/bin/python"; echo $$ > {ready}; exec sleep 60\n'
            "fi\n"
            if phase == "venv"
            else ""
        )
        + 'if [ "$1 $2" = "pip install" ]; then\n'
        f"  rm -f {venv}/lib/python*/site-packages/dllm_fixture_a/__init__.py\n"
        f"  echo $$ > {ready}; exec sleep 60\n"
        "fi\n"
        f'exec "{real}" "$@"\n'
    )
    slow_uv.chmod(0o755)
    with sync_held_by_uv(slow_uv, ready, manifest_file, venv) as (proc, _):
        proc.send_signal(signal.SIGKILL)
        proc.communicate(timeout=30)
        assert proc.returncode == -signal.SIGKILL


def _imports(venv: Path) -> str:
    out = subprocess.run(
        [venv_python(venv), "-c", "import dllm_fixture_a, dllm_fixture_b; "
         "print(dllm_fixture_a.VERSION, dllm_fixture_b.VERSION)"],
        capture_output=True, text=True,
    )  # fmt: skip
    return out.stdout.strip() or out.stderr.strip().splitlines()[-1]


@pytest.mark.parametrize(
    ("work", "phase"),
    [("create", "venv"), ("create", "pip install"), ("update", "pip install")],
)
def test_a_sync_killed_midway_leaves_a_venv_check_refuses_and_the_next_sync_repairs(
    wheels,  # noqa: F811
    tmp_path,
    cli,
    monkeypatch,
    work,
    phase,
):
    """Was: the half-made venv stayed as if it were one. `env check` compared it with the
    packaged manifest (or, after an update, with the copy of the last sync: "clean"), doctor the
    same; the next sync took it for an existing venv (a package uv half-wrote stayed broken) or,
    killed during `uv venv`, refused it for good ("exists and is not a virtual environment")."""
    manifest = lock_fixtures(wheels)
    manifest_file = tmp_path / "m.toml"
    manifest_file.write_text(dump_manifest(manifest))
    venv = tmp_path / "venv"
    if work == "update":
        sync_environment(manifest, venv)
        assert _imports(venv) == "1.0 2.0"
    _killed_sync(tmp_path, manifest_file, venv, phase)
    if phase == "pip install":  # an interpreter to ask: check and doctor refuse the venv
        result = cli("env", "check", "--python", venv_python(venv))
        assert_user_error(
            result,
            f"{venv} is an incomplete venv: the `dllm env sync` "
            f"{'creating' if work == 'create' else 'updating'} it",
            "did not finish",
            # the killed sync's own line (was 'run that `dllm env sync ... --venv V` again')
            f"hint: run `dllm env sync --manifest {manifest_file} --venv {venv}` again",
        )
        from turbo_dllm.doctor import DoctorContext
        from turbo_dllm.doctor.checks import env as env_check

        monkeypatch.setattr(sys, "prefix", str(venv))
        checked = env_check.environment_manifest(DoctorContext())
        monkeypatch.undo()
        assert checked.status == "fail" and checked.detail.startswith(
            f"{venv} is an incomplete venv"
        )
        assert "dllm env sync" in checked.fix
    mark = json.loads((venv / MARK).read_text())
    assert mark["created"] is (work == "create") and mark["target"] == manifest.target

    if work == "update":  # a repair that fails leaves the venv marked: it is no more complete
        absent = Pin(
            name="dllm-fixture-x",
            version="1.0",
            wheels=[WheelFile(filename="dllm_fixture_x-1.0-py3-none-any.whl", sha256="0" * 64)],
        )
        broken = tmp_path / "broken.toml"
        broken.write_text(
            dump_manifest(manifest.model_copy(update={"packages": [*manifest.packages, absent]}))
        )
        failed = cli("env", "sync", "--manifest", broken, "--venv", venv)
        assert failed.code == 2 and "installing manifest" in failed.err
        assert (venv / MARK).is_file()

    again = cli("env", "sync", "--manifest", manifest_file, "--venv", venv)
    assert again.code == 0, again.err
    said = {
        "create": f"note: removed {venv}: a sync that was creating it did not finish",
        "update": "a sync that was updating it did not finish; every pin is reinstalled",
    }[work]
    assert said in again.out, again.out
    assert not (venv / MARK).exists()
    assert _imports(venv) == "1.0 2.0"  # the half-written package was reinstalled
    report = json.loads(cli("env", "check", "--python", venv_python(venv), "--json").out)
    # turbo-dllm itself is installed by sync only from a mirror that carries its wheel.
    assert (report["mismatched"], report["extra"]) == ([], [])
    assert [m["name"] for m in report["missing"]] == ["turbo-dllm"]


def test_a_sync_still_running_is_not_taken_for_an_interrupted_one(wheels, tmp_path, cli):  # noqa: F811
    """The mark is locked while its sync runs: another sync or a check waits for it, never
    removes a venv being made under it."""
    manifest_file = tmp_path / "m.toml"
    manifest_file.write_text(dump_manifest(lock_fixtures(wheels)))
    venv = tmp_path / "venv"
    venv.mkdir()
    # The lock is per open file: this process's mark locks another's out, as one sync does.
    holder = subprocess.Popen(
        [sys.executable, "-c", "import sys, time; from pathlib import Path; "
         "from turbo_dllm.envs.incomplete import SyncMark; "
         f"SyncMark.place(Path({str(venv)!r}), created=True, target='t'); "
         "print('held', flush=True); time.sleep(60)"],
        stdout=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        assert holder.stdout.readline().strip() == "held"
        result = cli("env", "sync", "--manifest", manifest_file, "--venv", venv)
        assert_user_error(result, f"{venv} is being synced right now", f"(pid {holder.pid})")
        assert (venv / MARK).is_file()  # not removed under the running sync
    finally:
        holder.kill()
        holder.wait()
    assert cli("env", "sync", "--manifest", manifest_file, "--venv", venv).code == 0
    assert not (venv / MARK).exists()
