"""doctor on a host without a kernel bundle, for a RunSpec that needs one (`kernels: native`,
`model.attention: turbo` on GPUs): every line says the bundle is needed, and every fix that
names `--index URL` says what URL is and how to do without one."""

from __future__ import annotations

import json

from tests.train.util import write_config
from turbo_dllm.kernels.loader import install_command

NOTE = "   # URL: your release server, or --mirror DIR; without one, build it here: "
BUILD = "dllm bundle install --auto --build missing"
TURBO = ("model.attention=turbo", "model.config_overrides.head_dim=64")


def _checks(cli, config) -> dict[str, dict]:
    return {
        c["name"]: c for c in json.loads(cli("doctor", "--config", config, "--json").out)["checks"]
    }


def test_without_a_bundle_index_every_install_fix_says_what_url_is(cli, tmp_path, monkeypatch):
    """The kernels and attention backend checks' fix was `... --auto --index URL   # or set
    ...`: pasted, it fetched from "URL" (the kernel bundle check's fix already explained it)."""
    monkeypatch.delenv("DLLM_BUNDLE_INDEX", raising=False)
    monkeypatch.setenv("DLLM_OVERRIDE_GPUS", "sm90")  # GPUs where the run goes
    assert install_command().endswith("--index URL")
    native = _checks(cli, write_config(tmp_path / "native.yaml", "kernels=native"))["kernels"]
    assert native["status"] == "fail"
    assert native["fix"] == f"{install_command()}{NOTE}{BUILD}; or set `kernels: reference`"
    turbo = _checks(cli, write_config(tmp_path / "turbo.yaml", *TURBO))["attention backend"]
    assert turbo["status"] == "fail" and "no kernel bundle is installed" in turbo["detail"]
    assert turbo["fix"] == f"{install_command()}{NOTE}{BUILD}; or set `model.attention: flex`"
    monkeypatch.setenv("DLLM_BUNDLE_INDEX", "http://127.0.0.1:9/dllm")  # pasted, it reads that
    turbo = _checks(cli, write_config(tmp_path / "turbo.yaml", *TURBO))["attention backend"]
    assert turbo["fix"] == f"{install_command()}   # or set `model.attention: flex`"


def test_the_kernel_bundle_check_says_turbo_needs_a_bundle(cli, tmp_path, monkeypatch):
    """It passed "not needed for `kernels: reference`" beside the attention backend check's
    failure for no bundle; on a host without GPUs no bundle helps turbo, and it stays so."""
    monkeypatch.setenv("DLLM_OVERRIDE_GPUS", "sm90")
    checks = _checks(cli, write_config(tmp_path / "turbo.yaml", *TURBO))
    bundle = checks["kernel bundle"]
    assert bundle["status"] == "fail", bundle
    assert bundle["detail"] == "none installed, but the config asks for `model.attention: turbo`"
    assert "dllm bundle install" in bundle["fix"]
    # kernels: jit builds turbo's op from source: no bundle needed
    jit = _checks(cli, write_config(tmp_path / "jit.yaml", *TURBO, "kernels=jit"))
    assert jit["kernel bundle"]["status"] == "pass"
    monkeypatch.setenv("DLLM_OVERRIDE_GPUS", "none")
    checks = _checks(cli, write_config(tmp_path / "cpu.yaml", *TURBO))
    assert checks["kernel bundle"]["status"] == "pass"
    assert checks["attention backend"]["status"] == "fail"  # turbo needs a GPU
