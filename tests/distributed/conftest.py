"""The modules with a selected test, for the shared runs of `harness.errors_per_world`."""

from __future__ import annotations

from tests.distributed import harness


def pytest_collection_finish(session):
    modules = (getattr(item, "module", None) for item in session.items)
    harness.SELECTED = {module.__name__ for module in modules if module is not None}
