"""What an install killed outright (SIGKILL, the OOM killer, a node lost) leaves in the store: its
staging folder (up to what the bundle unpacks to) until the next bundle command that takes the
lock, and its `.part` download until that bundle is installed. `dllm bundle status` and
`verify` said nothing of them (a real kill -9 during the download and during the unpack left
23 MiB and 40 MiB unseen); they now list each with its size and what removes it, and leave out
the folders of an operation that holds the lock right now."""

from __future__ import annotations

import json

from turbo_dllm.bundles.store import BundleStore, file_lock

SHA = "ab" * 32


def _leave_what_a_killed_install_leaves() -> BundleStore:
    store = BundleStore()
    staging = store.store_dir / ".staging-0123456789ab" / "bundle" / "lib"
    staging.mkdir(parents=True)
    (staging / "x.so").write_bytes(bytes(3000))
    store.downloads_dir.mkdir(parents=True)
    (store.downloads_dir / f"{SHA}.part").write_bytes(bytes(5000))
    return store


def test_status_and_verify_name_a_killed_installs_leftovers_and_their_fix(cli):
    store = _leave_what_a_killed_install_leaves()
    status = cli("bundle", "status")
    assert status.code == 0, status.err
    assert "leftover  store/.staging-0123456789ab (2.9 KiB): an unpack a killed install" in (
        status.out
    )
    assert f"leftover  downloads/{SHA}.part (4.9 KiB): a partial download" in status.out
    assert "the next `dllm bundle install`" in status.err
    assert f"bundle {SHA[:12]} resumes it" in status.err and "delete it" in status.err

    verify = cli("bundle", "verify")
    assert verify.code == 0, verify.err  # leftovers are no failed check
    assert ".staging-0123456789ab" in verify.err and f"{SHA}.part" in verify.err

    as_json = json.loads(cli("bundle", "status", "--json").out)
    assert sorted(item["path"] for item in as_json["leftovers"]) == sorted(
        [str(store.store_dir / ".staging-0123456789ab"), str(store.downloads_dir / f"{SHA}.part")]
    )
    assert all(item["bytes"] and item["fix"] for item in as_json["leftovers"])


def test_a_trash_copy_is_said_to_be_put_back_where_a_link_needs_it(cli):
    store = BundleStore()
    (store.store_dir / f".trash-{SHA}-0123456789ab").mkdir(parents=True)
    status = cli("bundle", "status")
    assert f"leftover  store/.trash-{SHA}-0123456789ab (0 bytes): a copy" in status.out
    assert "or puts it back where `active` or `previous` needs it" in status.err


def test_an_operation_in_progress_is_no_leftover(cli):
    store = _leave_what_a_killed_install_leaves()
    with file_lock(store.lock_path, 0, "an install in progress"):
        status = cli("bundle", "status")
    assert "leftover" not in status.out and "leftover" not in status.err


def test_no_leftovers_no_lines(cli):
    status = cli("bundle", "status")
    assert "leftover" not in status.out + status.err
    assert json.loads(cli("bundle", "status", "--json").out)["leftovers"] == []
