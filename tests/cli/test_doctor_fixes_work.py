"""`dllm doctor`'s fixes, taken at their word: each command a failing check prints must be one
that exists, with the flags it has, quoted for the paths it names, and must fix what it says."""

from __future__ import annotations

import re
import shlex
import sys

from turbo_dllm.cli import build_parser
from turbo_dllm.doctor import DoctorContext


def _commands(fix: str) -> list[list[str]]:
    """The backquoted `dllm ...` commands of a fix line, split as bash would."""
    return [shlex.split(found) for found in re.findall(r"`(dllm [^`]*)`", fix)]


def _parses(argv: list[str]) -> None:
    """argparse accepts the command (it exits 2 on a flag the command lacks)."""
    assert argv[0] == "dllm"
    build_parser().parse_args(argv[1:])


def test_a_damaged_synced_copy_s_fix_names_only_commands_and_flags_that_exist(
    tmp_path, monkeypatch
):
    """The fix said 'or pass --target/--manifest', flags `dllm doctor` refuses (exit 2), and its
    sync line ran on into '; --target NAME where auto picks another' when pasted."""
    from turbo_dllm.doctor.checks import env as env_check

    venv = tmp_path / "my venv"
    venv.mkdir()
    (venv / "dllm-env-manifest.toml").write_text("format = [[[")
    monkeypatch.setattr(sys, "prefix", str(venv))
    result = env_check.environment_manifest(DoctorContext())
    assert result.status == "warn" and "not valid TOML" in result.detail
    assert "pass --target" not in result.fix
    commands = _commands(result.fix)
    assert ["dllm", "env", "sync", "--venv", str(venv)] in commands
    assert "dllm env check --target NAME (or --manifest FILE)" in result.fix
    for argv in commands:
        _parses(argv)


def _spec(artifact, eval_artifact=None):
    from types import SimpleNamespace

    return SimpleNamespace(
        launch=SimpleNamespace(kind="smoke"),
        data=SimpleNamespace(artifact=str(artifact)),
        eval=SimpleNamespace(artifact=str(eval_artifact), interval=10) if eval_artifact else None,
    )


def test_an_artifact_path_that_is_a_file_fails_with_a_fix_that_is_not_prepare(tmp_path):
    """data.artifact naming a file (or a path through one) warned 'has not been prepared yet'
    (ready, exit 0) with a `dllm data prepare ... --set output.overwrite=true` fix that prepare
    refuses ('exists and is not a folder'); eval.artifact alike (a failure, same fix)."""
    from turbo_dllm.doctor.checks import data

    in_the_way = tmp_path / "corpus.jsonl"
    in_the_way.write_text("{}\n")
    for artifact in (in_the_way, in_the_way / "prepared"):
        ctx = DoctorContext(spec=_spec(artifact, eval_artifact=artifact))
        for result in (data.data_artifact(ctx), data.eval_data(ctx)):
            assert result.status == "fail", result
            assert "dllm data prepare" not in result.fix
            assert f"move the file {in_the_way} out of the way" in result.fix
            assert "not prepared" not in result.detail and "is a file" in result.detail
    in_the_way.unlink()  # the fix, followed: now it is an artifact to prepare there
    ctx = DoctorContext(spec=_spec(in_the_way, eval_artifact=in_the_way))
    assert data.data_artifact(ctx).status == "warn"
    assert "dllm data prepare" in data.data_artifact(ctx).fix
    assert "has not been prepared yet" in data.eval_data(ctx).detail


def test_a_misspelt_override_variable_is_named_with_the_one_meant(monkeypatch):
    """DLLM_OVERRIDE_GPU=sm90 (for ..._GPUS) was ignored without a word: the fingerprint check
    passed on the real host, and a login node seemed checked for its GPU nodes."""
    from turbo_dllm.doctor.checks import host_bundles

    for name in list(__import__("os").environ):
        if name.startswith("DLLM_OVERRIDE_"):
            monkeypatch.delenv(name)
    monkeypatch.setenv("DLLM_OVERRIDE_GPU", "sm90")
    result = host_bundles.host_fingerprint(DoctorContext())
    assert result.status == "warn" and "DLLM_OVERRIDE_GPU: no such" in result.detail
    assert "`unset DLLM_OVERRIDE_GPU`" in result.fix
    assert "`export DLLM_OVERRIDE_GPUS=sm90`" in result.fix
    # the fix, followed: the override is read, and its own fix names the variable to unset
    monkeypatch.delenv("DLLM_OVERRIDE_GPU")
    monkeypatch.setenv("DLLM_OVERRIDE_GPUS", "sm90")
    result = host_bundles.host_fingerprint(DoctorContext())
    assert result.status == "warn" and "1x sm90 (overridden: gpus)" in result.detail
    assert result.fix == "unset DLLM_OVERRIDE_GPUS to check the real host"
    monkeypatch.delenv("DLLM_OVERRIDE_GPUS")
    assert host_bundles.host_fingerprint(DoctorContext()).status in ("pass", "warn")
    assert "overridden" not in host_bundles.host_fingerprint(DoctorContext()).detail


def test_a_model_folder_that_does_not_load_is_the_model_check_s_failure_only(cli, tmp_path):
    """model.path without config.json failed 'data fit' too, with the fix 'change those RunSpec
    fields or prepare the data again to match': preparing the data again changes nothing."""
    import json

    project = tmp_path / "p"
    assert cli("init", project).code == 0
    assert cli("data", "prepare", "--config", project / "prepare.yaml").code == 0
    result = cli(
        "doctor",
        "--config",
        project / "train.yaml",
        "--set",
        f"model.path={tmp_path / 'no model'}",
        "--set",
        "model.from_config=null",
        "--json",
    )
    assert result.code == 1
    checks = {c["name"]: c for c in json.loads(result.out)["checks"]}
    assert checks["model"]["status"] == "fail" and "config.json" in checks["model"]["fix"]
    assert checks["data fit"]["status"] == "pass", checks["data fit"]
    assert "see the model check" in checks["data fit"]["detail"]


def test_an_incomplete_venv_s_fix_is_the_sync_that_was_killed(cli, tmp_path, monkeypatch):
    """The fix read 'run that `dllm env sync ... --venv V` again': pasted, argparse refused the
    literal '...' (exit 2). The mark now keeps the sync's own line, absolute, and the fix of
    `dllm env check` and `dllm doctor` is that line."""
    from pathlib import Path

    from turbo_dllm.doctor.checks import env as env_check
    from turbo_dllm.envs import sync
    from turbo_dllm.envs.incomplete import SyncMark
    from turbo_dllm.errors import DllmError

    seen = {}

    def killed(manifest, venv, **kwargs):  # the sync dies once its mark is placed
        seen["command"] = kwargs["command"]
        Path(venv).mkdir()
        mark = SyncMark.place(
            Path(venv), created=True, target=manifest.target, command=seen["command"]
        )
        mark.close()  # its lock goes with the process; the mark stays
        raise DllmError("stopped here")

    monkeypatch.setattr(sync, "sync_environment", killed)
    monkeypatch.chdir(tmp_path)
    assert cli("env", "sync", "--target", "cpu-x86_64", "--venv", "my venv").code == 2
    venv = tmp_path / "my venv"
    expected = ["dllm", "env", "sync", "--target", "cpu-x86_64", "--venv", str(venv)]
    assert shlex.split(seen["command"]) == expected
    monkeypatch.setattr(sys, "prefix", str(venv))
    result = env_check.environment_manifest(DoctorContext())
    assert result.status == "fail" and "incomplete venv" in result.detail
    assert _commands(result.fix)[0] == expected, result.fix
    _parses(_commands(result.fix)[0])


def test_without_torch_the_fix_syncs_this_venv_not_a_new_one_named_venv(tmp_path, monkeypatch):
    """In a venv without torch the pinned fix was `dllm env sync --venv .venv`: run where doctor
    ran, it made another venv there and left this one without torch. A synced venv (uv made it:
    no pip in it) is told to sync its own manifest copy; another venv is named by its path."""
    from turbo_dllm.doctor.checks import portable

    venv = tmp_path / "my venv"
    venv.mkdir()
    monkeypatch.setitem(sys.modules, "torch", None)  # import torch raises ImportError
    monkeypatch.setattr(sys, "prefix", str(venv))
    monkeypatch.setattr(sys, "base_prefix", str(tmp_path / "base"))
    result = portable.torch_import(DoctorContext())
    assert result.status == "fail"
    assert f"pinned: dllm env sync --venv {shlex.quote(str(venv))}" in result.fix
    assert "--venv .venv" not in result.fix
    (venv / "dllm-env-manifest.toml").write_text("")
    fix = portable.torch_import(DoctorContext()).fix
    copy = shlex.quote(str(venv / "dllm-env-manifest.toml"))
    assert fix.startswith(f"dllm env sync --manifest {copy} --venv {shlex.quote(str(venv))} ")
    _parses(shlex.split(fix.split(" (")[0]))


def test_outside_a_venv_the_fix_pastes_whole_and_installs_the_cpu_torch_first(monkeypatch):
    """The fix ended its command with '(torch first: docs/install.md), or pinned: ...': pasted
    whole, bash stopped at the parenthesis; pasted up to it, pip installed PyPI's CUDA torch."""
    import subprocess

    from turbo_dllm.doctor.checks import portable

    monkeypatch.setattr(sys, "base_prefix", sys.prefix)
    monkeypatch.delenv("CONDA_PREFIX", raising=False)
    monkeypatch.setattr(portable, "_nvidia_driver", lambda: False)  # a host without a GPU
    fix = portable.venv_isolation(DoctorContext()).fix
    syntax = subprocess.run(["bash", "-n", "-c", fix], capture_output=True, text=True)
    assert syntax.returncode == 0, syntax.stderr
    command = fix.split("#")[0]
    torch = command.index("pip install torch --index-url https://download.pytorch.org/whl/cpu")
    assert torch < command.index("pip install 'turbo-dllm[data,env]'")
    assert "dllm env sync --venv .venv" in fix
    # On a host with an NVIDIA driver it is PyPI's CUDA torch (it offered the CPU build there)
    monkeypatch.setattr(portable, "_nvidia_driver", lambda: True)
    command = portable.venv_isolation(DoctorContext()).fix.split("#")[0]
    assert "&& pip install torch && pip install 'turbo-dllm[data,env]'" in command


def test_without_torch_doctor_reports_every_check_instead_of_a_traceback(
    cli, tmp_path, monkeypatch
):
    """In a venv whose torch is gone, `dllm doctor --config` ended in a traceback from the
    compile cache check's `import torch` (no report, no JSON); a check that needs torch is now
    'not checked' under its own name, and the torch check says how to get torch back."""
    import json

    import torch

    project = tmp_path / "p"
    assert cli("init", project).code == 0
    monkeypatch.setitem(sys.modules, "torch", None)  # import torch raises ImportError
    result = cli("doctor", "--config", project / "train.yaml", "--json")
    assert result.code == 1, result.err
    checks = {c["name"]: c for c in json.loads(result.out)["checks"]}
    assert checks["torch"]["status"] == "fail"
    cache = checks["compile cache"]
    # a skip (it was a warning): the torch check fails, with the fix
    assert cache["status"] == "skip" and cache["detail"].startswith("not checked: it needs torch")
    assert "see the torch check" in cache["detail"] and cache["fix"] is None
    # the name a check that could not run is reported under is the one it reports itself
    from turbo_dllm.doctor import _REGISTRY, _check_name, run_checks

    # torch back as it was: deleting the entry made the next `import torch` load a second torch
    # over the first one's submodules, which broke every later test of the session
    monkeypatch.setitem(sys.modules, "torch", torch)
    ran = [r.name for r in run_checks(DoctorContext()).results]
    assert ran == [_check_name(f) for _, _, f in sorted(_REGISTRY, key=lambda i: (i[0], i[1]))]


def test_without_torch_the_bundle_checks_say_torch_not_another_bundle(monkeypatch):
    """With torch gone the active bundle 'does not fit this host: torch: host none', and the fix
    was to install or build another bundle: a build needs torch (it stopped in a traceback), and
    any bundle differs from a host without torch."""
    from types import SimpleNamespace

    from turbo_dllm.bundles import store
    from turbo_dllm.doctor.checks import host_bundles
    from turbo_dllm.host import collect_fingerprint

    real = collect_fingerprint(apply_overrides=False)
    without = real.__class__(**{**real.__dict__, "torch": None, "torch_cuda": None})
    bundle = SimpleNamespace(
        bundle_id="b",
        short_sha="0" * 12,
        target=SimpleNamespace(differences=lambda fp: ["torch: host none, bundle torch2.13"]),
    )
    monkeypatch.setattr(store, "active_bundle", lambda: bundle)
    ctx = DoctorContext(extras={"fingerprint": without})
    for check in (host_bundles.kernel_bundle, host_bundles.kernels_for_spec):
        result = check(ctx)
        assert result.status == "warn" and "does not fit this host" in result.detail
        assert result.fix.startswith("install torch first"), result.fix
        assert "dllm bundle install" not in result.fix
    ctx = DoctorContext(extras={"fingerprint": real})  # torch there: another bundle it is
    assert "dllm bundle install" in host_bundles.kernel_bundle(ctx).fix


def test_a_read_only_mount_is_said_as_such_not_as_permission_denied(tmp_path, monkeypatch):
    """On a read-only mount os.access fails (EROFS) even for root: the run dir and checkpoint
    dir checks said 'not writable (permission denied)' (chmod does not help), and the cache dir
    check quoted the write test's '[Errno 30] Read-only file system: .../.dllm-write-test-x'."""
    import os

    from turbo_dllm.doctor import folders
    from turbo_dllm.doctor.checks import portable

    monkeypatch.setattr(folders, "_mount_of", lambda folder: (tmp_path, "ext4", True))
    monkeypatch.setattr(os, "access", lambda *args, **kwargs: False)  # as on that mount
    problem = folders.folder_problem(tmp_path / "runs")
    assert problem.detail == f"{tmp_path} is on a read-only file system (mounted at {tmp_path})"
    monkeypatch.setenv("DLLM_HOME", str(tmp_path / "home"))
    result = portable.cache_dir(DoctorContext())
    assert result.status == "fail" and "read-only file system" in result.detail
    assert result.fix == "set DLLM_HOME to a folder you can write"
    assert not (tmp_path / "home").exists()


def test_the_attention_merge_fix_installs_a_bundle_in_a_way_that_works(monkeypatch):
    """bp > 1 with reference kernels on GPUs: the fix was 'set `kernels: native` after `dllm
    bundle install --auto`', which stops at 'no bundle index given' without DLLM_BUNDLE_INDEX;
    and it asked for an install where a fitting bundle was active already."""
    from types import SimpleNamespace

    from turbo_dllm.bundles import store
    from turbo_dllm.doctor.checks import train
    from turbo_dllm.host import collect_fingerprint

    monkeypatch.delenv("DLLM_BUNDLE_INDEX", raising=False)
    spec = SimpleNamespace(
        topology=SimpleNamespace(bp=2),
        kernels="reference",
        model=SimpleNamespace(attention="reference"),
    )
    extras = {"job_plan": SimpleNamespace(device="cuda"), "fingerprint": collect_fingerprint()}
    monkeypatch.setattr(store, "active_bundle", lambda: None)
    result = train.partial_merge(DoctorContext(spec=spec, extras=dict(extras)))
    assert result.status == "warn"
    assert "dllm bundle install --auto`" not in result.fix
    command = result.fix.split("installed: ", 1)[1].split("#")[0]
    assert "--index URL" in command
    _parses(shlex.split(command.replace("URL", "https://example.invalid/dllm")))
    fitting = SimpleNamespace(bundle_id="b1", target=SimpleNamespace(differences=lambda fp: []))
    monkeypatch.setattr(store, "active_bundle", lambda: fitting)
    result = train.partial_merge(DoctorContext(spec=spec, extras=dict(extras)))
    assert result.fix == "set `kernels: native` (the active bundle b1 fits this host)"


def test_a_venv_of_another_python_is_remade_from_a_manifest_that_is_still_there(tmp_path):
    """A synced venv of another Python: the fix was 'remove V, then dllm env sync --manifest
    V/dllm-env-manifest.toml --venv V --python pythonX.Y', and removing V removed that manifest.
    The fix, run in bash (a stand-in `dllm` that reads its --manifest), now works."""
    import subprocess

    from tests.envs.test_manifest import manifest
    from turbo_dllm.envs.check import compare, drift_fixes
    from turbo_dllm.envs.inventory import Environment, Installed

    venv = tmp_path / "my venv"
    venv.mkdir()
    copy = venv / "dllm-env-manifest.toml"
    copy.write_text("the manifest\n")
    env = Environment(
        python="3.12",
        executable=str(venv / "bin/python"),
        prefix=str(venv),
        base_prefix="/usr",
        distributions=(Installed("torch", "2.13.0+cpu", str(venv / "lib")),),
    )
    wanted = manifest()
    (fix,) = drift_fixes(
        wanted, compare(wanted, env), env, sync_source=f"--manifest {shlex.quote(str(copy))}"
    )
    command = re.findall(r"`([^`]*)`", fix)[-1]
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "dllm").write_text(
        '#!/bin/sh\nwhile [ "$1" != --manifest ]; do shift; done\ncat "$2"\n'
    )
    (bin_dir / "dllm").chmod(0o755)
    ran = subprocess.run(
        ["bash", "-c", command],
        env={"PATH": f"{bin_dir}:/usr/bin:/bin"},
        capture_output=True,
        text=True,
    )
    assert ran.returncode == 0 and ran.stdout == "the manifest\n", (command, ran.stderr)
    assert not venv.exists()  # made anew by the sync
    assert f"--venv {shlex.quote(str(venv))} --python python3.11" in command


def test_a_config_file_that_does_not_parse_gets_the_loader_s_fix(cli, tmp_path, monkeypatch):
    """A YAML syntax error, a key written twice or a file that is not UTF-8 named no field, yet
    the fix read 'edit the fields named above'; the loader's own hint (what `dllm config
    validate` prints) is the fix now, with the validate line to check it again."""
    import json

    monkeypatch.chdir(tmp_path)
    (tmp_path / "twice.yaml").write_text("model: {family: qwen3}\nmodel: {family: llama}\n")
    (tmp_path / "latin1.yaml").write_bytes("launch: {name: caf\xe9}\n".encode("latin-1"))
    for name, hint in (
        ("twice.yaml", "write model: once"),
        ("latin1.yaml", "save the file as UTF-8"),
    ):
        validated = cli("config", "validate", "--config", name)
        assert validated.code == 2 and f"hint: {hint}" in validated.err
        result = cli("doctor", "--config", name, "--json")
        check = {c["name"]: c for c in json.loads(result.out)["checks"]}["config"]
        assert check["status"] == "fail" and check["fix"].startswith(hint), check
        assert "fields named above" not in check["fix"]
        assert _commands(check["fix"]) == [["dllm", "config", "validate", "--config", name]]


def test_busy_gpus_fix_names_the_free_ones(monkeypatch):
    """GPU 0 in use by another process: the fix read 'pick free GPUs with CUDA_VISIBLE_DEVICES'
    and named none, though nvidia-smi had said GPU 1 was free."""
    from types import SimpleNamespace

    from turbo_dllm.doctor.checks import launch

    answers = {
        "--query-gpu=index,uuid,memory.used": [["0", "GPU-a", "30000"], ["1", "GPU-b", "0"]],
        "--query-compute-apps=gpu_uuid,pid,used_memory": [["GPU-a", "4242", "30000"]],
        "--query-gpu=index": [["0"], ["1"]],
    }
    monkeypatch.setattr(launch, "_smi", lambda query: answers[query])
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    host = SimpleNamespace(gpus=["sm90", "sm90"], cpu_count=16)
    result = launch.free_gpus(DoctorContext(world_size=1, extras={"host_view": host}))
    assert result.status == "fail" and "GPU 0: pid 4242" in result.detail
    assert result.fix.endswith("use free GPUs: export CUDA_VISIBLE_DEVICES=1")
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "1")  # the fix, followed
    assert launch.free_gpus(DoctorContext(world_size=1, extras={"host_view": host})).status == (
        "pass"
    )
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES")
    result = launch.free_gpus(DoctorContext(world_size=2, extras={"host_view": host}))
    assert result.fix == (
        "stop those processes; only 1 GPU(s) are free for 2 process(es): to launch on those, "
        "export CUDA_VISIBLE_DEVICES=1 and `dllm launch --nproc-per-node 1` with a topology to "
        "match"
    )


def test_the_data_check_s_validate_keeps_doctor_s_set_values(cli, tmp_path, monkeypatch):
    """The fix said 'then dllm data validate X --config F' after `dllm doctor --config F --set
    data.seq_len=128`: without the --set it checked the file's run (seq_len 256), which the
    artifact fits, and passed where doctor's data fit fails. It now carries doctor's --set
    values (`dllm data validate` takes them), and fails as doctor does."""
    import json

    monkeypatch.chdir(tmp_path)
    assert cli("init", "p").code == 0
    doctor = ("doctor", "--config", "p/train.yaml", "--set", "data.seq_len=128", "--json")
    checks = {c["name"]: c for c in json.loads(cli(*doctor).out)["checks"]}
    fix = checks["data artifact"]["fix"]
    assert fix == (
        "dllm data prepare --config p/prepare.yaml (then dllm data validate p/data/prepared "
        "--config p/train.yaml --set data.seq_len=128)"
    ), fix
    prepare, validate = (shlex.split(part) for part in fix.removesuffix(")").split(" (then "))
    assert cli(*prepare[1:]).code == 0
    checks = {c["name"]: c for c in json.loads(cli(*doctor).out)["checks"]}
    assert checks["data fit"]["status"] == "fail", checks["data fit"]
    result = cli(*validate[1:])
    assert result.code == 1, (result.out, result.err)
    assert "does not fit p/train.yaml with its --set values:\n  - data.seq_len" in result.out
    assert cli(*validate[1:-2]).code == 0  # the file's own run: the artifact fits it
