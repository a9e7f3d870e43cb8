"""`dllm run plot --out` naming a file (or a path through one) says which file is in the way.
Before: "cannot create plot folder out.png: [Errno 17] File exists: 'out.png'", Python's
exception text, with the hint "pass --out a writable folder"."""

from __future__ import annotations

import json

import pytest

from tests.helpers import assert_user_error


@pytest.mark.parametrize("out", ["taken", "taken/plots"])
def test_an_out_through_a_file_names_the_file(cli, tmp_path, monkeypatch, out):
    monkeypatch.chdir(tmp_path)
    run_dir = tmp_path / "runs" / "r"
    run_dir.mkdir(parents=True)
    records = [{"step": s, "loss": 5.0 - s, "tokens_per_s": 10.0} for s in (1, 2)]
    (run_dir / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    (tmp_path / "taken").write_text("not a folder")
    result = cli("run", "plot", run_dir, "--out", out)
    assert_user_error(
        result,
        f"dllm: error: cannot create plot folder {out}: ",
        "('taken' is a file, not a folder)\n",
        "hint: pass --out a folder",
    )
    assert "[Errno" not in result.err
