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


def _columns(line: str) -> list[int]:
    """The terminal columns where each of a table row's cells starts."""
    import unicodedata

    starts, column, gap = [0], 0, 0
    for char in line:
        if char == " ":
            gap += 1
        elif gap >= 2:
            starts.append(column)
        if char != " ":
            gap = 0
        column += 2 if unicodedata.east_asian_width(char) in "WF" else 1
    return starts


def test_list_and_diff_align_columns_after_wide_characters(cli, spec_file, workdir):
    for name in ("数据", "ab"):
        result = cli(
            "launch", "--config", spec_file, "--backend", "slurm", "--run-dir", f"runs/{name}"
        )
        assert result.code == 0, result.err
    listed = cli("run", "list").out.splitlines()
    assert len(listed) == 3 and len({tuple(_columns(line)[:2]) for line in listed}) == 1, listed
    rows = [line for line in cli("run", "diff", "数据", "ab").out.splitlines() if "# " not in line]
    starts = {tuple(_columns(line)[:3]) for line in rows if len(_columns(line)) >= 3}
    assert len(starts) == 1, rows


def test_a_control_character_in_a_run_name_keeps_its_row_on_one_line(cli, spec_file, workdir):
    name = "a\nb\tc\x1b[31md"
    result = cli("launch", "--config", spec_file, "--backend", "slurm", "--run-dir", "runs/x")
    assert result.code == 0, result.err
    (workdir / "runs" / "x").rename(workdir / "runs" / name)  # a SLURM run dir takes no \n
    listed = cli("run", "list").out.splitlines()
    assert len(listed) == 2 and listed[1].startswith("a\\nb\\tc\\x1b[31md  "), listed
