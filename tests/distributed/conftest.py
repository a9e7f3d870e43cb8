"""The modules with a selected test, for the shared runs of `harness.errors_per_world`, and
that shared run started in the background (tests/prefetch.py)."""

from __future__ import annotations

from tests import prefetch
from tests.distributed import harness
from tests.helpers import ROOT


def pytest_collection_finish(session):
    modules = (getattr(item, "module", None) for item in session.items)
    harness.SELECTED = {module.__name__ for module in modules if module is not None}
    if session.config.option.collectonly:
        return
    shared = sorted({module for module, _, _ in harness._DECLARED.values()} & harness.SELECTED)
    if len(shared) > 1:
        work = session.config._tmp_path_factory.mktemp("shared-cases")
        prefetch.submit(
            harness.SHARED_KEY,
            harness.shared_command(shared),
            work=work,
            env={"PYTHONPATH": str(ROOT)},
            timeout=1800,
        )
