"""The trainer's doctor checks: attention backend, merge, model source, compile cache, W&B."""

from __future__ import annotations

import json
import os

from tests.train.util import write_config


def checks(cli, config) -> dict[str, dict]:
    result = cli("doctor", "--config", config, "--json")
    return {c["name"]: c for c in json.loads(result.out)["checks"]}


def test_defaults_pass(cli, tmp_path):
    found = checks(cli, write_config(tmp_path / "train.yaml"))
    assert found["attention backend"]["status"] == "pass"
    assert found["model"]["status"] == "pass" and "random init" in found["model"]["detail"]
    assert found["wandb"]["status"] == "pass"


def test_flex_without_cuda_fails_with_a_fix(cli, tmp_path):
    found = checks(cli, write_config(tmp_path / "train.yaml", "model.attention=flex"))
    assert found["attention backend"]["status"] == "fail"
    assert "model.attention: reference" in found["attention backend"]["fix"]


def test_turbo_without_a_bundle_fails_with_the_install_command(cli, tmp_path, monkeypatch):
    turbo = ("model.attention=turbo", "model.config_overrides.head_dim=64")
    monkeypatch.setenv("DLLM_OVERRIDE_GPUS", "sm90")  # GPUs here (or where the run goes)
    found = checks(cli, write_config(tmp_path / "train.yaml", *turbo))
    check = found["attention backend"]
    assert check["status"] == "fail" and "model.attention: turbo" in check["detail"]
    assert "dllm bundle install" in check["fix"]
    # Without a GPU no bundle helps (a CPU bundle has no turbo kernels): was the install
    # command, then "install a GPU bundle", neither of which a CPU host can do.
    monkeypatch.setenv("DLLM_OVERRIDE_GPUS", "none")
    cpu = checks(cli, write_config(tmp_path / "cpu.yaml", *turbo))["attention backend"]
    assert cpu["status"] == "fail" and "CUDA GPU" in cpu["detail"]
    assert "model.attention: reference" in cpu["fix"]
    monkeypatch.delenv("DLLM_OVERRIDE_GPUS")
    jit = checks(cli, write_config(tmp_path / "jit.yaml", *turbo, "kernels=jit"))
    assert jit["attention backend"]["status"] == "fail"  # no bundle needed, but a GPU
    assert "CUDA GPU" in jit["attention backend"]["detail"]


def test_model_folder_without_weights_fails(cli, tmp_path):
    folder = tmp_path / "model"
    folder.mkdir()
    (folder / "config.json").write_text(
        json.dumps(
            {
                "model_type": "qwen3",
                "vocab_size": 512,
                "hidden_size": 64,
                "intermediate_size": 128,
                "num_hidden_layers": 2,
                "num_attention_heads": 4,
                "num_key_value_heads": 2,
                "head_dim": 16,
            }
        )
    )
    config = write_config(tmp_path / "train.yaml", f"model.path={folder}", "model.from_config=null")
    found = checks(cli, config)
    assert found["model"]["status"] == "fail" and "safetensors" in found["model"]["detail"]
    missing = write_config(
        tmp_path / "b.yaml", f"model.path={tmp_path}/nope", "model.from_config=null"
    )
    assert checks(cli, missing)["model"]["status"] == "fail"


def test_wandb_configured_but_missing(cli, tmp_path, monkeypatch):
    import importlib.util

    real = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util, "find_spec", lambda name, *a: None if name == "wandb" else real(name, *a)
    )
    found = checks(cli, write_config(tmp_path / "train.yaml", "logging.wandb.project=p"))
    assert found["wandb"]["status"] == "fail" and "pip install" in found["wandb"]["fix"]


def test_block_parallel_flex_with_the_reference_merge_warns_with_a_fix(cli, tmp_path):
    found = checks(cli, write_config(tmp_path / "a.yaml"))
    assert found["attention merge"]["status"] == "pass"  # bp = 1: nothing to merge
    config = write_config(
        tmp_path / "b.yaml", "topology.cp=2", "topology.bp=2", "model.attention=flex"
    )
    merge = checks(cli, config)["attention merge"]
    assert merge["status"] == "warn" and "float32 copies" in merge["detail"]
    assert "kernels: native" in merge["fix"]
    native = write_config(
        tmp_path / "c.yaml", "topology.cp=2", "topology.bp=2", "model.attention=flex",
        "kernels=native",
    )  # fmt: skip
    assert checks(cli, native)["attention merge"]["status"] == "pass"


def test_compile_cache_reported_cold_then_warm(cli, tmp_path, monkeypatch):
    from turbo_dllm.train.compile_cache import (
        INDUCTOR_CACHE_VARIABLE,
        TRITON_CACHE_VARIABLE,
        compile_cache_dir,
    )

    for name in (INDUCTOR_CACHE_VARIABLE, TRITON_CACHE_VARIABLE, "DLLM_COMPILE_CACHE"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("DLLM_HOME", str(tmp_path / "home"))
    plain = checks(cli, write_config(tmp_path / "a.yaml"))["compile cache"]
    assert plain["status"] == "pass" and "nothing compiles" in plain["detail"]
    config = write_config(tmp_path / "b.yaml", "training.compile=true")
    cold = checks(cli, config)["compile cache"]
    assert cold["status"] == "pass" and "cold" in cold["detail"]
    assert str(compile_cache_dir()) in cold["detail"]
    assert INDUCTOR_CACHE_VARIABLE not in os.environ  # doctor sets nothing in its process
    (compile_cache_dir() / "inductor" / "x").write_bytes(b"1" * 2_000_000)
    warm = checks(cli, config)["compile cache"]
    assert "warm (2 MB)" in warm["detail"]
    monkeypatch.setenv("DLLM_COMPILE_CACHE", str(config))  # a file: not a folder
    broken = checks(cli, config)["compile cache"]
    assert broken["status"] == "fail" and "DLLM_COMPILE_CACHE" in broken["fix"]


def test_a_broken_compile_cache_variable_of_the_users_own_is_the_one_to_fix(
    cli, tmp_path, monkeypatch
):
    """TORCHINDUCTOR_CACHE_DIR (or TRITON_CACHE_DIR) set by the user wins over ours, so the fix
    names it (was: "set DLLM_COMPILE_CACHE to a writable folder", which changes nothing)."""
    blocker = tmp_path / "file"
    blocker.write_text("")
    monkeypatch.setenv("DLLM_COMPILE_CACHE", str(tmp_path / "cache"))
    config = write_config(tmp_path / "a.yaml", "training.compile=true")
    for name in ("TORCHINDUCTOR_CACHE_DIR", "TRITON_CACHE_DIR"):
        monkeypatch.delenv("TORCHINDUCTOR_CACHE_DIR", raising=False)
        monkeypatch.delenv("TRITON_CACHE_DIR", raising=False)
        monkeypatch.setenv(name, str(blocker / "cache"))
        broken = checks(cli, config)["compile cache"]
        assert broken["status"] == "fail" and str(blocker / "cache") in broken["detail"]
        assert broken["fix"].startswith(f"set {name} to a writable folder, or unset it")
        monkeypatch.setenv(name, str(tmp_path / name))  # the fix: doctor passes
        assert checks(cli, config)["compile cache"]["status"] == "pass"


def test_the_model_check_says_a_small_models_size_in_thousands(cli, tmp_path):
    """A tiny model read '0.0M parameters'."""
    from turbo_dllm.config.load import load_runspec
    from turbo_dllm.registry import resolve_model_config

    config = write_config(tmp_path / "train.yaml")
    count = resolve_model_config(load_runspec(config).model).num_params()
    assert count < 1_000_000
    detail = checks(cli, config)["model"]["detail"]
    assert f"{count / 1e3:,.1f}K parameters" in detail and "0.0M" not in detail
