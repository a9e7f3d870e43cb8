"""`dllm run plot A B ...` writes several runs' plots to <A>/plots/vs-<others>. Twelve runs of
default ids (or a few long or non-ASCII names) made that name longer than a file name may be,
and the plot failed with "File name too long" unless given --out."""

from __future__ import annotations

import json

import pytest

from turbo_dllm.jobs.plot import NAME_MAX, compare_folder_name


def _run(root, name: str):
    run = root / "runs" / name
    run.mkdir(parents=True)
    lines = [json.dumps({"step": s, "loss": 3.0 - s / 10}) for s in (1, 2)]
    (run / "metrics.jsonl").write_text("\n".join(lines) + "\n")
    return run


def test_a_sweep_of_default_run_ids_plots_without_out(cli, workdir):
    pytest.importorskip("matplotlib")
    runs = [_run(workdir, f"20261206T1028{i}Z-d730{i}") for i in range(10, 23)]
    result = cli("run", "plot", *runs)
    assert result.code == 0, result.err
    [folder] = [p for p in (runs[0] / "plots").iterdir() if p.is_dir()]
    assert len(folder.name.encode()) <= NAME_MAX
    assert folder.name.startswith(f"vs-{runs[1].name}-{runs[2].name}-")
    assert (folder / "loss.png").is_file()


def test_long_non_ascii_names_are_shortened_and_told_apart():
    others = ["数" * 70, "据" * 70]  # 210 bytes each
    name = compare_folder_name(others)
    assert len(name.encode()) <= NAME_MAX and name.startswith("vs-" + "数" * 70 + "-and-1-more-")
    assert compare_folder_name(["数" * 70, "é" * 70]) != name
    alone = compare_folder_name(["数" * 84, "b"])  # one name too long for the folder by itself
    assert len(alone.encode()) <= NAME_MAX and alone.startswith("vs-数数")
    assert compare_folder_name(["a", "b/c"]) == "vs-a-b_c"  # short names: as before
