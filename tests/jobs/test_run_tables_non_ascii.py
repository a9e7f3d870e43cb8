"""`dllm run diff` and `dllm run list` with non-ASCII run names. The diff showed a JSON value
(the argv list) with its non-ASCII escaped, a run dir "runs/é a" as "runs/\\u00e9 a"."""

from __future__ import annotations

import re


def test_diff_shows_an_argv_with_non_ascii_as_written(cli, spec_file, workdir):
    for name, lr in (("é a", "0.001"), ("é b", "0.01")):
        result = cli(
            "launch", "--config", spec_file, "--backend", "slurm", "--run-dir", f"runs/{name}",
            "--set", f"optimizer.lr={lr}",
        )  # fmt: skip
        assert result.code == 0, result.err
    out = cli("run", "diff", "é a", "é b").out
    [argv] = [line for line in out.splitlines() if line[:4] == "argv"]
    _, left, right = re.split(r"\s{2,}", argv)
    assert "runs/é a" in left and "runs/é b" in right, argv
    assert "\\u" not in out
