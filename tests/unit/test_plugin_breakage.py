"""Family plugins that break the contract in ways the first audits left open: a module that
exits at import, a runtime whose build_model or layers return the wrong thing, a descriptor
module that imports torch.

Each plugin is a distribution made by hand in tmp_path (a `.dist-info` folder with its entry
points beside the package), as in test_plugin_contract.py.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.unit.test_plugin_contract import _distribution, _load

REPO = Path(__file__).resolve().parents[2]


def _dllm(site: Path, *args: str, cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "turbo_dllm", *args],
        env={
            **os.environ,
            "OMP_NUM_THREADS": "1",
            "PYTHONPATH": os.pathsep.join([str(site), str(REPO)]),
        },
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=120,
    )


_SPEC = (
    "model: {{family: {family}, from_config: tiny}}\n"
    "data: {{synthetic: {{vocab_size: 64}}, seq_len: 64}}\n"
    "objective: {{name: block_diffusion, block_size: 16}}\n"
)

_EXITING = {
    "__init__.py": "",
    "quiet.py": """\
        import sys

        sys.exit()
        """,
    "loud.py": """\
        raise SystemExit(3)
        """,
    "odd.py": """\
        class Odd(BaseException):
            pass


        raise Odd("not an Exception")
        """,
    "fine.py": """\
        from dataclasses import replace

        from turbo_dllm.families.decoder import QWEN3

        FINE = replace(QWEN3, name="fine")
        """,
}
_EXITING_POINTS = """\
[turbo_dllm.families]
quiet = exiting_plugin.quiet:FAMILY
loud = exiting_plugin.loud:FAMILY
odd = exiting_plugin.odd:FAMILY
fine = exiting_plugin.fine:FINE
"""


def test_a_plugin_that_exits_at_import_is_left_out_naming_its_entry_point(tmp_path, monkeypatch):
    """A module calling sys.exit() at import raised SystemExit through `load_plugins`, which
    caught Exception only: every command that imports the registry ended there, with the
    plugin's exit status (0 for `sys.exit()`) and nothing said."""
    site = _distribution(tmp_path / "site", "exiting-plugin", _EXITING_POINTS, _EXITING)
    found = _load(monkeypatch, site)
    problems = found.problems["family"]
    assert set(found.families) == {"fine"}
    assert "exiting-plugin 0.4 (exiting_plugin.quiet:FAMILY)" in problems["quiet"]
    assert "importing it called sys.exit(None)" in problems["quiet"]
    assert "exiting-plugin 0.4 (exiting_plugin.loud:FAMILY)" in problems["loud"]
    assert "importing it called sys.exit(3)" in problems["loud"]
    assert "importing it failed: Odd: not an Exception" in problems["odd"]


def test_ctrl_c_while_a_plugin_imports_is_not_taken_for_a_broken_plugin(tmp_path, monkeypatch):
    from turbo_dllm.families.base import import_failure
    from turbo_dllm.sigterm import Terminated

    assert import_failure(KeyboardInterrupt()) is None
    assert import_failure(Terminated()) is None
    assert import_failure(SystemExit(0)) is not None
    site = _distribution(
        tmp_path / "site",
        "interrupted-plugin",
        "[turbo_dllm.families]\ncut = interrupted_plugin:F\n",
        {"__init__.py": "raise KeyboardInterrupt\n"},
    )
    with pytest.raises(KeyboardInterrupt):
        _load(monkeypatch, site)


def test_dllm_config_validate_reports_a_plugin_that_exits_at_import(tmp_path):
    """End to end: `dllm config validate` on a spec naming the family exited 0 with no output
    (the plugin's `sys.exit()`); it is now refused with the plugin's reason, exit 2, and a spec
    naming a built-in family still validates."""
    site = _distribution(tmp_path / "site", "exiting-plugin", _EXITING_POINTS, _EXITING)
    (tmp_path / "quiet.yaml").write_text(_SPEC.format(family="quiet"))
    proc = _dllm(site, "config", "validate", "--config", "quiet.yaml", cwd=tmp_path)
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert "family 'quiet' could not be loaded from its plugin" in proc.stderr
    assert "exiting-plugin 0.4 (exiting_plugin.quiet:FAMILY)" in proc.stderr
    assert "importing it called sys.exit(None)" in proc.stderr
    assert "Traceback" not in proc.stderr
    (tmp_path / "fine.yaml").write_text(_SPEC.format(family="fine"))
    proc = _dllm(site, "config", "validate", "--config", "fine.yaml", cwd=tmp_path)
    assert proc.returncode == 0, proc.stdout + proc.stderr


_MISBUILT = {
    "__init__.py": """\
        from dataclasses import replace

        from turbo_dllm.families.decoder import QWEN3

        NO_MODULE = replace(QWEN3, name="no_module", runtime_module="misbuilt_plugin.no_module")
        LISTED = replace(QWEN3, name="listed", runtime_module="misbuilt_plugin.listed")
        DETACHED = replace(QWEN3, name="detached", runtime_module="misbuilt_plugin.detached")
        """,
    # build_model returns the model's parts in a dict (the trainer wants the module itself).
    "no_module.py": """\
        from turbo_dllm.families.decoder import runtime as _decoder


        def build_model(config, backend, dtype=None):
            return {"model": _decoder.build_model(config, backend, dtype)}


        def __getattr__(name):
            return getattr(_decoder, name)
        """,
    # layers returns a plain list of the blocks, not the model's ModuleList.
    "listed.py": """\
        from turbo_dllm.families.decoder import runtime as _decoder


        def layers(model):
            return list(model.model.layers)


        def __getattr__(name):
            return getattr(_decoder, name)
        """,
    # layers returns a new ModuleList holding the blocks: wrapping it changes nothing.
    "detached.py": """\
        from torch import nn

        from turbo_dllm.families.decoder import runtime as _decoder


        def layers(model):
            return nn.ModuleList(list(model.model.layers))


        def __getattr__(name):
            return getattr(_decoder, name)
        """,
}
_MISBUILT_POINTS = """\
[turbo_dllm.families]
no_module = misbuilt_plugin:NO_MODULE
listed = misbuilt_plugin:LISTED
detached = misbuilt_plugin:DETACHED
"""


def test_a_runtime_returning_the_wrong_thing_is_refused_where_it_returns_it(tmp_path, monkeypatch):
    """A build_model that returned a dict went on into the trainer (`runtime.layers(model)`,
    `materialize`), which stopped with an AttributeError traceback naming neither the family
    nor the plugin; a layers() of a plain list failed later still, or (a new ModuleList)
    trained with no checkpointing or FSDP wrapping of the model's own blocks."""
    from turbo_dllm import registry
    from turbo_dllm.errors import DllmError

    site = _distribution(tmp_path / "site", "misbuilt-plugin", _MISBUILT_POINTS, _MISBUILT)
    found = _load(monkeypatch, site)
    assert set(found.families) == {"no_module", "listed", "detached"}
    config = registry.get_family("qwen3").resolve_config(path=None, from_config="tiny")

    with pytest.raises(DllmError) as error:
        found.families["no_module"].runtime().build_model(config, None)
    message = error.value.message
    assert "model family 'no_module' (from plugin misbuilt-plugin 0.4)" in message
    assert "build_model returned a dict ({'model': DecoderLM(" in message
    assert "not a torch.nn.Module" in message
    assert "on_meta_device" in error.value.hint

    runtime = found.families["listed"].runtime()
    model = runtime.build_model(config, None)
    with pytest.raises(DllmError) as error:
        runtime.layers(model)
    assert "model family 'listed' (from plugin misbuilt-plugin 0.4)" in error.value.message
    assert "layers(model) returned a list ([" in error.value.message

    runtime = found.families["detached"].runtime()
    with pytest.raises(DllmError, match="not a part of the model"):
        runtime.layers(runtime.build_model(config, None))

    # A built-in family's runtime passes its results through unchanged.
    runtime = registry.get_family("qwen3").runtime()
    model = runtime.build_model(config, None)
    assert runtime.layers(model) is model.model.layers


def test_dllm_train_reports_a_build_model_that_returns_no_module(tmp_path):
    """End to end, as a user runs it: `dllm train` stopped with a traceback from inside the
    trainer; it now prints the family's error and exits 2."""
    from tests.train.util import write_config

    site = _distribution(tmp_path / "site", "misbuilt-plugin", _MISBUILT_POINTS, _MISBUILT)
    write_config(tmp_path / "train.yaml", "model.family=no_module")
    proc = _dllm(site, "train", "--config", "train.yaml", "--run-dir", "run", cwd=tmp_path)
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert "Traceback" not in proc.stderr
    assert "model family 'no_module' (from plugin misbuilt-plugin 0.4)" in proc.stderr
    assert "build_model returned a dict" in proc.stderr


_HEAVY = {
    "__init__.py": "",
    "family.py": """\
        from dataclasses import replace

        import torch  # the mistake: the descriptor's module imports the torch half

        from turbo_dllm.families.decoder import QWEN3

        HEAVY = replace(QWEN3, name="heavy", summary=f"the decoder, torch {torch.__version__}")
        """,
    "light.py": """\
        from dataclasses import replace

        from turbo_dllm.families.decoder import QWEN3

        LIGHT = replace(QWEN3, name="light")
        """,
}
_HEAVY_POINTS = """\
[turbo_dllm.families]
heavy = heavy_plugin.family:HEAVY
light = heavy_plugin.light:LIGHT
"""


def test_a_plugin_descriptor_that_imports_torch_is_named_with_the_fix(tmp_path):
    """docs/architecture.md: a plugin's descriptor module must be torch-free, as `dllm config
    validate` and `--help` start without torch (tests/cli/test_torch_free_start.py). One that
    imported torch loaded without a word, and every command reading a RunSpec then imported
    torch (seconds; a failure on a login node without it). It still loads, and `dllm config
    validate` and `dllm doctor` name it and say how to fix it."""
    site = _distribution(tmp_path / "site", "heavy-plugin", _HEAVY_POINTS, _HEAVY)
    (tmp_path / "heavy.yaml").write_text(_SPEC.format(family="heavy"))
    # One fresh interpreter (torch is imported once): `dllm config validate --json`, then the
    # doctor's plugins check, whose result goes to a file.
    proc = subprocess.run(
        [sys.executable, "-c", _VALIDATE_THEN_DOCTOR, "heavy.yaml", "check.json"],
        env={**os.environ, "PYTHONPATH": os.pathsep.join([str(site), str(REPO)])},
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert json.loads(proc.stdout)["model"]["family"] == "heavy"  # stdout: the one object
    warnings = [line for line in proc.stderr.splitlines() if "warning" in line]
    assert len(warnings) == 1, proc.stderr
    assert "dllm: warning: plugin family 'heavy' from heavy-plugin 0.4" in warnings[0]
    assert "(heavy_plugin.family:HEAVY)" in warnings[0]
    assert "loading its descriptor imported torch" in warnings[0]
    assert "move the torch imports of that module into its runtime module" in warnings[0]

    result = json.loads((tmp_path / "check.json").read_text())
    assert result["status"] == "warn"
    assert "family 'heavy' from heavy-plugin 0.4" in result["detail"]
    assert "family light from heavy-plugin 0.4" in result["detail"]  # loaded as usual
    assert "pip show" not in result["fix"]  # nothing is broken
    assert "runtime module" in result["fix"]


def test_the_torch_import_warning_is_said_by_rank_0_only(tmp_path):
    """Under torchrun every worker imports the registry: the warning was printed once per rank
    (8 copies on one node). Ranks other than 0 now stay quiet; rank 0 (and a plain command,
    RANK unset: the test above) says it."""
    site = _distribution(tmp_path / "site", "heavy-plugin", _HEAVY_POINTS, _HEAVY)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(site), str(REPO)])}
    code = "import turbo_dllm.registry as r; print(sorted(r.FAMILIES))"
    for rank, said in (("1", False), ("0", True)):
        proc = subprocess.run(
            [sys.executable, "-c", code],
            env={**env, "RANK": rank},
            cwd=tmp_path,
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert proc.returncode == 0, proc.stderr
        assert "'heavy'" in proc.stdout  # loaded all the same
        assert ("loading its descriptor imported torch" in proc.stderr) is said, proc.stderr


_VALIDATE_THEN_DOCTOR = """
import json, sys
from pathlib import Path
from turbo_dllm.cli import main
code = main(["config", "validate", "--config", sys.argv[1], "--json"])
from turbo_dllm.doctor.checks.plugins import plugins
result = plugins(None)
Path(sys.argv[2]).write_text(
    json.dumps({"status": result.status, "detail": result.detail, "fix": result.fix})
)
sys.exit(code)
"""


def test_a_package_with_a_malformed_entry_points_file_is_named(tmp_path):
    """An installed package whose entry_points.txt has a line without `=` ended every command
    that reads a RunSpec with a TypeError from deep in importlib.metadata (pydantic lists the
    entry points at its first model, as our plugin loading does): no word of which package
    (found by the doctor audit). The command names it and the fix, exit 2."""
    info = tmp_path / "site" / "x-1.0.dist-info"
    info.mkdir(parents=True)
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: x\nVersion: 1.0\n")
    (info / "entry_points.txt").write_text("[turbo_dllm.families]\nmy_lm\n")
    proc = subprocess.run(
        [sys.executable, "-m", "turbo_dllm", "config", "schema"],
        env={**os.environ, "PYTHONPATH": os.pathsep.join([str(tmp_path / "site"), str(REPO)])},
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 2, proc.stderr
    assert "Traceback" not in proc.stderr
    assert f"x 1.0 ({info}/entry_points.txt: TypeError" in proc.stderr
    assert "hint: reinstall that package (pip install --force-reinstall NAME)" in proc.stderr
