"""A run dir whose name is not UTF-8, listed with a strict stdout (PYTHONIOENCODING=utf-8:strict,
as some locales set it): `dllm run list` ended with a UnicodeEncodeError traceback (found by the
odd-paths audit). The name is written back as the bytes it was made of."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def test_a_non_utf8_run_name_prints_as_its_bytes_under_a_strict_stdout(tmp_path):
    run = os.fsencode(tmp_path / "runs") + b"/caf\xe9"
    os.makedirs(run)
    with open(run + b"/metrics.jsonl", "w") as metrics:
        metrics.write('{"step": 1, "loss": 2.0}\n')
    proc = subprocess.run(
        [sys.executable, "-m", "turbo_dllm", "run", "list"],
        cwd=tmp_path,
        env={**os.environ, "PYTHONIOENCODING": "utf-8:strict", "PYTHONPATH": str(REPO)},
        capture_output=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr.decode(errors="replace")
    assert b"Traceback" not in proc.stderr
    assert b"caf\xe9" in proc.stdout
