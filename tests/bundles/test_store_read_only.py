"""A DLLM_HOME whose bundle store cannot be written (a read-only mount, a forbidden folder):
every command that changes the store stops before changing anything. Rollback, deactivate,
uninstall and an install that has to change the store printed the bare OS error of the lock
file ("'.../install.lock': Read-only file system", hint "choose a path on a writable one"),
which named neither DLLM_HOME nor that nothing changed; now they say both."""

from __future__ import annotations

import pytest

from tests.bundles.test_store_faults import read_only_home  # noqa: F401 - a fixture
from tests.helpers import assert_user_error
from turbo_dllm.bundles.store import BundleStore


@pytest.mark.parametrize(
    "command",
    [
        ["bundle", "rollback"],
        ["bundle", "deactivate"],
        ["bundle", "uninstall", "0123456789ab"],
    ],
    ids=["rollback", "deactivate", "uninstall"],
)
def test_a_read_only_store_names_dllm_home_and_that_nothing_changed(
    cli,
    read_only_home,  # noqa: F811 - the fixture's value
    command,
):
    read_only_home()
    result = cli(*command)
    store = BundleStore()
    assert_user_error(
        result,
        f"cannot take the bundle store's lock {store.lock_path}: Read-only file system",
        "nothing was changed",
        "hint: that file system is read-only: point DLLM_HOME at a writable one",
        "mounted at",
    )
