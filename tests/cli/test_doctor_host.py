"""doctor's host checks where the environment is odd."""

from __future__ import annotations

import json
import shlex


def test_a_relative_dllm_home_is_a_warning_with_the_absolute_export(cli, tmp_path, monkeypatch):
    """DLLM_HOME='rel home' passed as "rel home is writable": each folder dllm then runs
    from has a home of its own (bundles and compile caches not found from another)."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("DLLM_HOME", "rel home")
    result = cli("doctor", "--json")
    check = {c["name"]: c for c in json.loads(result.out)["checks"]}["cache dir"]
    assert check["status"] == "warn", check
    assert check["detail"].startswith("DLLM_HOME='rel home' is a relative path")
    assert check["fix"] == f"export DLLM_HOME={shlex.quote(str(tmp_path / 'rel home'))}"
    monkeypatch.setenv("DLLM_HOME", str(tmp_path / "rel home"))  # the fix, applied
    (tmp_path / "rel home").mkdir()
    result = cli("doctor", "--json")
    assert {c["name"]: c for c in json.loads(result.out)["checks"]}["cache dir"]["status"] == "pass"


def test_a_dllm_home_that_does_not_exist_is_a_warning_and_is_not_made(cli, tmp_path, monkeypatch):
    """A misspelt DLLM_HOME passed as "<it> is writable": doctor's write test had made the
    folder, so the typo became a new, empty home (no bundles, no compile packs) without a word."""
    (tmp_path / "dllm-home").mkdir()
    typo = tmp_path / "dllm-hom"
    monkeypatch.setenv("DLLM_HOME", str(typo))
    result = cli("doctor", "--json")
    check = {c["name"]: c for c in json.loads(result.out)["checks"]}["cache dir"]
    assert result.code == 0 and check["status"] == "warn", check
    assert check["detail"].startswith(f"{typo} (DLLM_HOME) does not exist yet: the first command")
    assert check["fix"] == (
        f"export DLLM_HOME={shlex.quote(str(tmp_path / 'dllm-home'))} if you meant it; else check "
        f"the spelling of DLLM_HOME; if this is the home you want, mkdir -p {shlex.quote(str(typo))}"
    )
    assert not typo.exists()
    typo.mkdir()  # the fix's second branch, applied
    result = cli("doctor", "--json")
    assert {c["name"]: c for c in json.loads(result.out)["checks"]}["cache dir"]["status"] == "pass"


def test_a_run_dir_that_holds_a_run_fails_as_launch_refuses_it(cli, tmp_path, monkeypatch):
    """launch.run_dir naming the folder of an earlier run (the same spec launched again): doctor
    passed "runs go under <it>" and reported ready; `dllm launch` then refused it."""
    monkeypatch.chdir(tmp_path)
    config = tmp_path / "train.yaml"
    config.write_text(
        "model: {family: qwen3, from_config: tiny}\n"
        "data: {synthetic: {}, seq_len: 64}\n"
        "training: {steps: 10}\nlaunch: {run_dir: held run}\n"
    )
    checks = {
        c["name"]: c for c in json.loads(cli("doctor", "--config", config, "--json").out)["checks"]
    }
    assert checks["run dir"] == {
        "name": "run dir",
        "status": "pass",
        "detail": f"the run goes to {tmp_path / 'held run'} (launch.run_dir)",
        "fix": None,
    }
    (tmp_path / "held run").mkdir()
    (tmp_path / "held run" / "manifest.json").write_text("{}")
    result = cli("doctor", "--config", config, "--json")
    check = {c["name"]: c for c in json.loads(result.out)["checks"]}["run dir"]
    assert result.code == 1 and check["status"] == "fail", check
    assert "already holds a run" in check["detail"]
    assert f"dllm run show {shlex.quote(str(tmp_path / 'held run'))}" in check["fix"]
    launch = cli("launch", "--config", config, "--dry-run")
    assert launch.code == 2 and "already holds a run" in launch.err  # what doctor now foretells


def test_flex_is_judged_on_the_gpus_the_overrides_describe(cli, tmp_path, monkeypatch):
    """A login node checking for its compute nodes (DLLM_OVERRIDE_GPUS, docs/bundles.md): the
    attention backend check failed flex for "no CUDA GPU" in this process, while the other checks
    judged the host described; the compile cache check said "nothing compiles (CPU ...)" of a
    GPU run, whose cache its own torch keys. Where the overrides describe no GPU, flex fails."""
    import torch

    if torch.cuda.is_available():
        monkeypatch.setattr(torch.cuda, "is_available", lambda: False)  # a login node
    config = tmp_path / "train.yaml"
    config.write_text(
        "model: {family: qwen3, from_config: tiny, attention: flex}\n"
        "data: {synthetic: {}, seq_len: 64}\ntraining: {steps: 10}\n"
    )

    def checks():
        report = json.loads(cli("doctor", "--config", config, "--json").out)
        return {c["name"]: c for c in report["checks"]}

    monkeypatch.setenv("DLLM_OVERRIDE_GPUS", "sm90,sm90")
    found = checks()
    assert found["attention backend"]["status"] == "pass", found["attention backend"]
    assert (
        found["attention backend"]["detail"] == "flex on the 2 GPU(s) DLLM_OVERRIDE_GPUS describes"
    )
    assert found["compile cache"]["status"] == "skip", found["compile cache"]
    monkeypatch.setenv("DLLM_OVERRIDE_GPUS", "none")
    found = checks()
    assert found["attention backend"]["status"] == "fail"
    assert "DLLM_OVERRIDE_GPUS describes a host without one" in found["attention backend"]["detail"]
    assert found["compile cache"]["status"] == "pass"


def test_a_run_manifest_given_as_the_config_is_named_as_one(cli, tmp_path, monkeypatch):
    """`dllm doctor --config runs/<id>/manifest.json` read the manifest as a RunSpec ('format:
    unknown key', 'run_id: unknown key'); `dllm launch` says what it is. The fix checks the
    spec that run recorded, which then passes (outside that run's dir)."""
    monkeypatch.chdir(tmp_path)
    run = tmp_path / "runs" / "r 1"
    run.mkdir(parents=True)
    (run / "manifest.json").write_text('{"format": "turbo_dllm.run_manifest.v1", "run_id": "r"}')
    (run / "spec.yaml").write_text(
        "model: {family: qwen3, from_config: tiny}\ndata: {synthetic: {}, seq_len: 64}\n"
        f"training: {{steps: 10}}\nlaunch: {{run_dir: '{run}'}}\n"
    )
    result = cli("doctor", "--config", "runs/r 1/manifest.json", "--json")
    config = {c["name"]: c for c in json.loads(result.out)["checks"]}["config"]
    assert result.code == 1 and config["status"] == "fail"
    assert config["detail"] == "runs/r 1/manifest.json is a run manifest, not a RunSpec"
    assert "unknown key" not in config["detail"]
    command = config["fix"].split(": ", 1)[1].split(";")[0]
    assert command == "dllm doctor --config 'runs/r 1/spec.yaml' --set launch.run_dir=null"
    assert "dllm launch --manifest 'runs/r 1/manifest.json' replays that run" in config["fix"]
    fixed = cli(*shlex.split(command)[1:], "--json")
    checks = {c["name"]: c for c in json.loads(fixed.out)["checks"]}
    assert checks["config"]["status"] == checks["run dir"]["status"] == "pass", checks


def test_checkpoints_under_a_run_dir_that_cannot_be_made_are_not_a_pass(cli, tmp_path):
    """The run dir check failed (a file on its path) and the checkpoint dir check passed
    "<run dir>/checkpoints (checkpoint.dir unset)", a folder inside it."""
    (tmp_path / "afile").write_text("x")
    config = tmp_path / "train.yaml"
    config.write_text(
        "model: {family: qwen3, from_config: tiny}\ndata: {synthetic: {}, seq_len: 64}\n"
        f"training: {{steps: 10}}\nlaunch: {{run_dir: '{tmp_path / 'afile' / 'r'}'}}\n"
    )
    checks = {
        c["name"]: c for c in json.loads(cli("doctor", "--config", config, "--json").out)["checks"]
    }
    assert checks["run dir"]["status"] == "fail"
    assert checks["checkpoint dir"]["status"] == "skip", checks["checkpoint dir"]
    assert "see the run dir check" in checks["checkpoint dir"]["detail"]
