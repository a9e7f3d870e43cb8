"""`dllm --help` and the config commands (`dllm config validate | schema`) import no torch
(docs/architecture.md, layers): they start in a fraction of torch's own import time, and run on
a login node or in a lean environment without it. Nothing held them to it before."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from tests.jobs.conftest import SMALL_SPEC

# Runs each command line in turn in ONE fresh interpreter (as `dllm` would, in-process) and
# reports, after each, its exit status and whether torch has been imported so far: the first
# command that imports it is named.
PROGRAM = """
import json, sys
from turbo_dllm.cli import main
report = []
for argv in json.loads(sys.argv[1]):
    try:
        code = main(argv)
    except SystemExit as exit_:  # --help, argparse usage errors
        code = exit_.code
    report.append({"argv": argv, "code": code, "torch": "torch" in sys.modules})
print(json.dumps(report))
"""


ROOT = Path(__file__).parents[2]
RECIPES = ROOT / "turbo_dllm" / "config" / "recipes"


def _run(commands: list[list[str]], cwd) -> list[dict]:
    # This checkout's turbo_dllm, whichever one the interpreter has installed.
    path = os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH")) if p)
    proc = subprocess.run(
        [sys.executable, "-c", PROGRAM, json.dumps(commands)],
        cwd=cwd,
        env={**os.environ, "PYTHONPATH": path},
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout.splitlines()[-1])


def test_help_and_the_config_commands_import_no_torch(tmp_path):
    spec = tmp_path / "train.yaml"
    spec.write_text(SMALL_SPEC)
    # Every packaged recipe: each family and objective, with its family's validation rules.
    # (A prod recipe's placeholder revision, all zeros, is refused until it names a commit.)
    recipes = [
        ["config", "validate", "--config", str(path), "--json"]
        + (["--set", f"model.revision={'ab' * 20}"] if "0" * 40 in path.read_text() else [])
        for path in sorted(RECIPES.glob("*/*.yaml"))
    ]
    assert len(recipes) >= 6, RECIPES
    commands = [
        ["--help"],
        ["config", "--help"],
        ["config", "validate", "--help"],
        ["config", "schema"],
        ["config", "validate", "--config", str(spec)],
        ["config", "validate", "--config", str(spec), "--json", "--world-size", "1"],
        # A spec refused (exit 2) imports no torch on its way to the error either.
        ["config", "validate", "--config", str(spec), "--set", "training.steps=0"],
        *recipes,
    ]
    report = _run(commands, tmp_path)
    codes = [entry["code"] for entry in report]
    assert codes[:6] == [0] * 6 and codes[6] == 2 and codes[7:] == [0] * len(recipes), report
    first = next((entry["argv"] for entry in report if entry["torch"]), None)
    assert first is None, f"`dllm {' '.join(first)}` imported torch"
