"""After `dllm bundle deactivate` the bundle is still installed, only not active: doctor's kernel
bundle check, the kernel loader and the readiness checks said "none installed" / "no ... bundle
is installed" with the install command as the fix. They now name the installed bundle and give
`dllm bundle rollback` (which re-activates it); a store with no bundle at all keeps the old
message and the install command."""

from __future__ import annotations

import json

import pytest

from tests.helpers import assert_user_error
from turbo_dllm.bundles.store import BundleStore
from turbo_dllm.errors import DllmError


def _doctor(cli, tmp_path, kernels=None):
    args = ["doctor", "--json"]
    if kernels:
        config = tmp_path / "train.yaml"
        config.write_text(f"kernels: {kernels}\n")
        args += ["--config", str(config)]
    result = cli(*args)
    return result.code, {c["name"]: c for c in json.loads(result.out)["checks"]}


def _load_error() -> DllmError:
    from turbo_dllm.kernels.loader import load_bundle_op

    with pytest.raises(DllmError) as caught:
        load_bundle_op("merge_attention_partials")
    return caught.value


def _turbo_spec():
    from turbo_dllm.config.load import load_model
    from turbo_dllm.config.runspec import RunSpec

    return load_model(RunSpec, {"model": {"attention": "turbo"}}, "test")


def test_doctor_names_the_deactivated_bundle_and_rollback(cli, tmp_path, installed):
    name = f"{installed.bundle_id} ({installed.short_sha})"
    assert cli("bundle", "deactivate").code == 0
    code, checks = _doctor(cli, tmp_path, "native")
    assert code == 1
    bundle, kernels = checks["kernel bundle"], checks["kernels"]
    assert bundle["status"] == "fail", bundle
    assert bundle["detail"] == (
        f"none active, but the config asks for `kernels: native`: {name} is installed"
    )
    assert bundle["fix"] == "dllm bundle rollback   # re-activates it"
    assert kernels["status"] == "fail" and "no kernel bundle is active" in kernels["detail"]
    assert kernels["fix"].startswith("dllm bundle rollback   # re-activates it")
    # Without a config: not needed, so a pass, and still no "none installed".
    _, checks = _doctor(cli, tmp_path)
    bundle = checks["kernel bundle"]
    assert bundle["status"] == "pass"
    assert bundle["detail"] == (
        f"none active: {name} is installed (`dllm bundle rollback` re-activates it)"
    )

    assert cli("bundle", "rollback").code == 0  # the fix
    code, checks = _doctor(cli, tmp_path, "native")
    assert code == 0 and checks["kernel bundle"]["status"] == "pass", checks["kernel bundle"]


def test_doctor_without_any_bundle_keeps_none_installed_and_the_install_fix(
    cli, tmp_path, installed
):
    assert cli("bundle", "deactivate").code == 0
    assert cli("bundle", "uninstall", installed.short_sha).code == 0
    _, checks = _doctor(cli, tmp_path, "native")
    bundle = checks["kernel bundle"]
    assert bundle["detail"] == "none installed, but the config asks for `kernels: native`"
    assert bundle["fix"].startswith("dllm bundle install --release v")
    assert checks["kernels"]["fix"].startswith("dllm bundle install --release v")
    _, checks = _doctor(cli, tmp_path)
    assert checks["kernel bundle"]["detail"] == "none installed"


def test_the_loader_and_readiness_name_rollback_for_a_deactivated_bundle(cli, installed):
    from turbo_dllm.kernels.readiness import require_attention_kernels, require_kernels

    assert cli("bundle", "deactivate").code == 0
    error = _load_error()
    assert error.message == (
        "no native-kernel bundle is active (kernels: native needs one): "
        f"{installed.bundle_id} ({installed.short_sha}) is installed"
    )
    assert error.hint == "dllm bundle rollback   # re-activates it; or use `kernels: reference`"
    with pytest.raises(DllmError, match="but no kernel bundle is active: ") as caught:
        require_kernels("native")
    assert installed.short_sha in caught.value.message
    assert caught.value.hint.startswith("dllm bundle rollback   # re-activates it; or set")
    with pytest.raises(DllmError, match="but no kernel bundle is active: ") as caught:
        require_attention_kernels(_turbo_spec())
    assert caught.value.hint.startswith("dllm bundle rollback")

    assert cli("bundle", "rollback").code == 0  # the hint's command
    from turbo_dllm.kernels.loader import load_bundle_op

    assert load_bundle_op("merge_attention_partials").sha256 == installed.sha256

    # Nothing installed at all: the old message and the install command.
    assert cli("bundle", "deactivate").code == 0
    assert cli("bundle", "uninstall", installed.short_sha).code == 0
    error = _load_error()
    assert error.message == "no native-kernel bundle is installed (kernels: native needs one)"
    assert error.hint.startswith("dllm bundle install --release v")
    with pytest.raises(DllmError, match="no kernel bundle is installed") as caught:
        require_kernels("native")
    assert caught.value.hint.startswith("dllm bundle install --release v")


def test_a_deactivated_bundle_that_does_not_fit_gets_the_install_fix(
    cli, tmp_path, installed, monkeypatch
):
    """Rolling back to a bundle built for another environment fixes nothing."""
    from turbo_dllm.kernels.readiness import require_kernels

    assert cli("bundle", "deactivate").code == 0
    monkeypatch.setenv("DLLM_OVERRIDE_CXX11_ABI", "0" if installed.target.cxx11_abi else "1")
    _, checks = _doctor(cli, tmp_path, "native")
    bundle = checks["kernel bundle"]
    assert installed.short_sha in bundle["detail"] and "another environment" in bundle["detail"]
    assert bundle["fix"].startswith("dllm bundle install --release v")
    with pytest.raises(DllmError, match="built for another environment: cxx11_abi") as caught:
        require_kernels("native")
    assert caught.value.hint.startswith("dllm bundle install --release v")


def test_a_damaged_or_unlinked_inactive_bundle_gets_the_install_fix(cli, tmp_path, installed):
    """Rollback cannot help where the bundle it would re-activate is damaged, or where no
    `previous` link names one (the store still holds a bundle: named)."""
    store = BundleStore()
    assert cli("bundle", "deactivate").code == 0
    (store.root / "previous").unlink()  # removed by hand: installed, linked by nothing
    _, checks = _doctor(cli, tmp_path, "native")
    bundle = checks["kernel bundle"]
    assert bundle["detail"].endswith(f"{installed.bundle_id} ({installed.short_sha}) is installed")
    assert bundle["fix"].startswith("dllm bundle install --release v")
    assert _load_error().hint.startswith("dllm bundle install --release v")

    # what the install fix avoids: rollback has nothing to return to
    assert_user_error(cli("bundle", "rollback"), "no previous bundle")
    store._set_link("previous", installed.sha256)
    installed.path.chmod(0o755)
    (installed.path / "bundle.json").unlink()
    _, checks = _doctor(cli, tmp_path, "native")
    bundle = checks["kernel bundle"]
    assert f"the installed bundle {installed.short_sha} is damaged" in bundle["detail"]
    assert bundle["fix"].startswith("dllm bundle install --release v")
