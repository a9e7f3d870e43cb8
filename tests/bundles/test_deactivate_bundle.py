"""`dllm bundle deactivate`: back to no active bundle without deleting files by hand (there was no
way out when the active bundle was the only one: rollback needs a previous one, uninstall refuses
the active one). The bundle stays installed as `previous`; rollback or installing it again makes
it active, and doctor and the kernel loader see no bundle meanwhile."""

from __future__ import annotations

import json
import os

from tests.bundles.test_adversarial import bundle_b  # noqa: F401
from tests.helpers import assert_user_error
from turbo_dllm.bundles.store import BundleStore, file_lock


def _doctor(cli, tmp_path, kernels):
    config = tmp_path / "train.yaml"
    config.write_text(f"kernels: {kernels}\n")
    result = cli("doctor", "--config", config, "--json")
    return result.code, {c["name"]: c for c in json.loads(result.out)["checks"]}


def test_the_only_bundle_is_deactivated_and_kept(cli, installed):
    store = BundleStore()
    result = cli("bundle", "deactivate")
    assert result.code == 0, result.err
    assert f"deactivated {installed.bundle_id} ({installed.short_sha})" in result.out
    assert "no bundle is active now" in result.out and "dllm bundle rollback" in result.out
    assert store.active() is None and not (store.root / "active").is_symlink()
    assert store.previous().sha256 == installed.sha256 and not store.verify(installed)

    listing = json.loads(cli("bundle", "list", "--json").out)["bundles"]
    assert [(b["sha256"], b["state"]) for b in listing] == [(installed.sha256, "previous")]
    status = json.loads(cli("bundle", "status", "--json").out)
    assert status["active"] is None and status["fits_host"] is False
    assert status["previous"]["sha256"] == installed.sha256
    shown = cli("bundle", "status").out
    assert f"active    none (dllm bundle rollback activates {installed.bundle_id})" in shown

    again = cli("bundle", "deactivate")  # idempotent, and says there was nothing to do
    assert again.code == 0, again.err
    assert again.out.strip() == "no bundle is active: nothing to deactivate"
    assert store.previous().sha256 == installed.sha256  # untouched

    # Uninstalling the bundle, refused while it was active, works now.
    assert cli("bundle", "uninstall", installed.short_sha).code == 0
    assert store.installed() == [] and store.previous() is None


def test_rollback_or_installing_it_again_reactivates_it_once(cli, installed, mirror):
    store = BundleStore()
    assert cli("bundle", "deactivate").code == 0
    back = cli("bundle", "rollback")
    assert back.code == 0, back.err
    assert store.active().sha256 == installed.sha256
    # `previous` became `active`: it does not also stay behind naming the same bundle.
    assert store.previous() is None and "previous  none" in cli("bundle", "status").out

    assert cli("bundle", "deactivate").code == 0
    root, catalog_sha = mirror
    result = cli("bundle", "install", "--release", "v-test", "--auto", "--mirror", root,
                 "--catalog-sha256", catalog_sha)  # fmt: skip
    assert result.code == 0, result.err
    assert "activated (already in the store)" in result.out and "previous:" not in result.out
    assert store.active().sha256 == installed.sha256 and store.previous() is None


def test_deactivating_keeps_the_previous_bundle_reachable_by_rollback(
    cli,
    installed,
    bundle_b,  # noqa: F811 - the fixture's value
):
    """With A previous and B active, deactivating B makes B the previous one (what was active,
    as every activation does), so rollback returns to B."""
    mirror, catalog_sha, entry = bundle_b
    assert cli("bundle", "install", "--release", "v-b", "--auto", "--mirror", mirror,
               "--catalog-sha256", catalog_sha).code == 0  # fmt: skip
    store = BundleStore()
    assert store.previous().sha256 == installed.sha256
    assert cli("bundle", "deactivate").code == 0
    assert store.active() is None and store.previous().sha256 == entry.sha256
    assert cli("bundle", "rollback").code == 0
    assert store.active().sha256 == entry.sha256


def test_doctor_sees_no_bundle_and_its_fix_brings_it_back(cli, tmp_path, installed):
    code, checks = _doctor(cli, tmp_path, "native")
    assert code == 0 and checks["kernel bundle"]["status"] == "pass"
    assert cli("bundle", "deactivate").code == 0
    code, checks = _doctor(cli, tmp_path, "native")
    assert code == 1
    bundle = checks["kernel bundle"]
    # None active, but the bundle is still installed: named, with rollback as the fix.
    assert bundle["status"] == "fail" and installed.short_sha in bundle["detail"]
    assert bundle["fix"].startswith("dllm bundle rollback")
    assert checks["kernels"]["status"] == "fail"  # the loader finds no bundle either
    _, checks = _doctor(cli, tmp_path, "reference")
    assert checks["kernel bundle"]["status"] == "pass"
    # The fix line's command.
    command = bundle["fix"].split("   #")[0].split()[1:]
    assert command == ["bundle", "rollback"], command
    fixed = cli(*command)
    assert fixed.code == 0, fixed.err
    code, checks = _doctor(cli, tmp_path, "native")
    assert code == 0 and checks["kernels"]["status"] == "pass", checks["kernels"]


def test_deactivate_json(cli, installed):
    first = cli("bundle", "deactivate", "--json")
    assert first.code == 0, first.err
    assert json.loads(first.out)["deactivated"]["sha256"] == installed.sha256
    second = cli("bundle", "deactivate", "--json")
    assert second.code == 0 and json.loads(second.out) == {"deactivated": None}


def test_rollback_is_offered_only_where_it_would_run(cli, installed, cpu_bundle, tmp_path):
    """The fixes for a damaged active bundle ("`dllm bundle deactivate` (or `dllm bundle
    rollback`), then ...") and for uninstalling the active one named rollback with no previous
    bundle, where it is refused ("there is no previous bundle to roll back to")."""
    from tests.bundles.crafting import variant
    from tests.bundles.test_kernels import _install

    refused = cli("bundle", "uninstall", installed.short_sha)
    assert refused.code == 2 and "rollback" not in refused.err, refused.err
    assert cli("bundle", "rollback").code == 2  # what the hint no longer offers
    _install(variant(cpu_bundle, tmp_path), tmp_path, "v-next")  # `installed` becomes previous
    assert cli("bundle", "rollback").code == 0  # `installed` is active again, a previous too
    refused = cli("bundle", "uninstall", installed.short_sha)
    assert "`dllm bundle rollback`, or install another bundle" in refused.err, refused.err
    installed.path.chmod(0o755)
    (installed.path / "bundle.json").unlink()
    hint = cli("bundle", "list").err
    assert "`dllm bundle deactivate` (or `dllm bundle rollback`), then" in hint, hint
    assert cli("bundle", "rollback").code == 0  # the offered fix runs


def test_a_damaged_active_bundle_can_be_deactivated_then_removed(cli, installed):
    """The damaged active bundle's fix named rollback, which fails without a previous bundle."""
    installed.path.chmod(0o755)
    (installed.path / "bundle.json").unlink()
    hint = cli("bundle", "list").err
    assert f"`dllm bundle deactivate`, then `dllm bundle uninstall {installed.short_sha}`" in hint
    result = cli("bundle", "deactivate")
    assert result.code == 0, result.err
    assert f"deactivated the damaged bundle {installed.short_sha}" in result.out
    status = cli("bundle", "status")  # was an error naming the damaged active bundle
    assert status.code == 0 and f"previous  DAMAGED ({installed.short_sha})" in status.out
    assert cli("bundle", "uninstall", installed.short_sha).code == 0
    assert BundleStore().entries() == []


def test_uninstalling_the_active_bundle_names_deactivate(cli, installed):
    refused = cli("bundle", "uninstall", installed.short_sha)
    assert_user_error(refused, "is active", "dllm bundle deactivate")


def test_a_link_to_a_missing_entry_is_removed(cli, installed):
    """`active` pointing at a store entry that is gone (removed by hand): nothing is active,
    and the stale link goes."""
    store = BundleStore()
    os.symlink(f"store/{'e' * 64}", store.root / ".tmp-link")
    os.replace(store.root / ".tmp-link", store.root / "active")
    result = cli("bundle", "deactivate")
    assert result.code == 0 and "nothing to deactivate" in result.out
    assert not (store.root / "active").is_symlink()


def test_deactivate_waits_for_the_store_lock(cli, installed):
    store = BundleStore()
    with file_lock(store.lock_path, 0, "held by the test"):
        busy = cli("bundle", "deactivate", "--lock-timeout", "0.2")
    waiting, error = busy.err.split("\n", 1)  # it said it waits, then the error
    assert waiting.startswith("dllm: waiting up to 0.2 s for another bundle operation")
    busy.err = error
    assert_user_error(busy, "another bundle operation is running", "waited 0.2 s")
    assert store.active().sha256 == installed.sha256  # nothing changed
    assert_user_error(
        cli("bundle", "deactivate", "--lock-timeout", "-1"), "--lock-timeout must be 0 or more"
    )
