"""`dllm run list | show | diff | plot` over run dirs written by `dllm launch` (and the metrics
of `dllm train --run-dir` runs)."""

from __future__ import annotations

import json
import sys

from tests.helpers import assert_user_error


def slurm_run(cli, spec_file, *extra):
    """A real run dir (manifest, spec, script) without starting workers: the SLURM backend."""
    result = cli(
        "launch", "--config", spec_file, "--backend", "slurm", "--nproc-per-node", "1", *extra
    )
    assert result.code == 0, result.err
    return result


def write_metrics(run_dir, losses):
    lines = [
        {"step": i + 1, "loss": loss, "tokens_per_s": 1000.0 + i, "mem_gb": 0.5, "lr": 1e-3}
        for i, loss in enumerate(losses)
    ]
    (run_dir / "metrics.jsonl").write_text("".join(json.dumps(x) + "\n" for x in lines))


def test_list_show_diff(cli, spec_file, workdir):
    assert "no recorded runs under runs/" in cli("run", "list").out
    slurm_run(cli, spec_file, "--set", "launch.name=first")
    slurm_run(cli, spec_file, "--set", "training.steps=6", "--set", "launch.name=second")
    by_name = {
        json.loads((d / "manifest.json").read_text())["spec"]["launch"]["name"]: d
        for d in (workdir / "runs").iterdir()
    }
    first, second = by_name["first"], by_name["second"]
    write_metrics(first, [5.0, 4.5, 4.25])

    listing = json.loads(cli("run", "list", "--json").out)
    runs = {r["name"]: r for r in listing["runs"]}
    assert runs["first"]["steps_done"] == 3 and runs["first"]["steps_total"] == 4
    assert runs["first"]["last_loss"] == 4.25
    assert runs["second"]["steps_done"] is None and runs["second"]["status"] == "not submitted"
    text = cli("run", "list").out
    assert first.name in text and "3/4" in text and "4.2500" in text

    shown = cli("run", "show", first.name[:-2])  # a unique prefix is enough
    assert shown.code == 0, shown.err
    assert f"run          {first.name} (first)" in shown.out
    assert "progress     3/4 steps, last loss 4.2500" in shown.out
    assert "backend      slurm" in shown.out
    whole = json.loads(cli("run", "show", str(first), "--json").out)
    assert whole["format"] == "turbo_dllm.run_manifest.v1"

    diff = json.loads(cli("run", "diff", first.name, second.name, "--json").out)
    spec_fields = {item["field"]: item for item in diff["diff"]["spec"]}
    assert spec_fields["spec.training.steps"]["recorded"] == 4
    assert spec_fields["spec.training.steps"]["current"] == 6
    assert diff["diff"]["inputs"] == []
    human = cli("run", "diff", first.name, second.name)
    assert "spec.training.steps" in human.out and "identical" in human.out


def test_show_unknown_or_ambiguous_run(cli, spec_file, workdir):
    assert_user_error(cli("run", "show", "nope"), "no run 'nope' under runs")
    slurm_run(cli, spec_file)
    slurm_run(cli, spec_file)
    assert_user_error(cli("run", "show", "2"), "matches 2 runs")


def test_plot_writes_pngs(cli, spec_file, workdir):
    slurm_run(cli, spec_file)
    [run_dir] = (workdir / "runs").iterdir()
    assert_user_error(cli("run", "plot", run_dir.name), "has no metrics yet")
    write_metrics(run_dir, [5.0, 4.0, 3.5])
    result = cli("run", "plot", run_dir.name)
    assert result.code == 0, result.err
    for name in ("loss.png", "tokens_per_s.png", "memory.png"):
        png = run_dir / "plots" / name
        assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
        assert f"wrote {png}" in result.out


def test_a_dllm_train_run_dir_is_listed_and_plotted_without_a_manifest(cli, spec_file, workdir):
    result = cli("train", "--config", spec_file, "--run-dir", "runs/plain")
    assert result.code == 0, result.err
    slurm_run(cli, spec_file, "--set", "launch.name=recorded")
    listing = json.loads(cli("run", "list", "--json").out)
    assert [r["name"] for r in listing["runs"]] == ["recorded"]
    assert listing["without_manifest"] == ["runs/plain"]  # as the runs' paths: under --root
    assert "without a manifest" in cli("run", "list").out and "plain" in cli("run", "list").out
    for ref in ("plain", "runs/plain"):  # by name under the root, or as a path
        plotted = cli("run", "plot", ref)
        assert plotted.code == 0, plotted.err
        assert (workdir / "runs" / "plain" / "plots" / "loss.png").read_bytes()[:4] == b"\x89PNG"
    # what needs the manifest says why it is missing
    assert_user_error(cli("run", "show", "plain"), "has no manifest.json", "dllm run plot")


def test_plot_without_matplotlib_is_a_clear_error(cli, spec_file, workdir, monkeypatch):
    slurm_run(cli, spec_file)
    [run_dir] = (workdir / "runs").iterdir()
    write_metrics(run_dir, [5.0])
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # import now raises ImportError
    assert_user_error(cli("run", "plot", run_dir.name), "needs matplotlib", "pip install")


def test_plot_into_a_file_is_a_clear_error(cli, spec_file, workdir):
    slurm_run(cli, spec_file)
    [run_dir] = (workdir / "runs").iterdir()
    write_metrics(run_dir, [5.0])
    (workdir / "taken").write_text("x")
    result = cli("run", "plot", run_dir.name, "--out", workdir / "taken")
    assert_user_error(result, "cannot create plot folder", "--out")


def test_dllm_train_resumes_a_recorded_run_only_with_its_spec(cli, spec_file, workdir):
    """Another spec would append steps the manifest does not describe (`run list`: 9/6)."""
    slurm_run(cli, spec_file)
    [run_dir] = (workdir / "runs").iterdir()
    other = cli("train", "--config", spec_file, "--run-dir", run_dir, "--set", "training.steps=6")
    assert_user_error(other, "recorded by `dllm launch` with another spec", "spec.yaml")
    assert not (run_dir / "metrics.jsonl").exists()
    same = cli("train", "--config", run_dir / "spec.yaml", "--run-dir", run_dir)
    assert same.code == 0, same.err
    listing = json.loads(cli("run", "list", "--json").out)
    assert [(r["steps_done"], r["steps_total"]) for r in listing["runs"]] == [(4, 4)]
