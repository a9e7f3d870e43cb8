"""`dllm run plot RUN [RUN ...]` overlays several runs' curves: one colour and legend entry per
run, named by run. Before, `run plot` took one run (a second was a usage error)."""

from __future__ import annotations

import json

import pytest

from tests.helpers import assert_user_error

plt = pytest.importorskip("matplotlib.pyplot")


def _run(root, name, lr_scale, *, evaluated=False, memory=True):
    folder = root / "runs" / name
    folder.mkdir(parents=True)
    records = []
    for step in range(1, 5):
        record = {"step": step, "loss": 4.0 - lr_scale * step, "tokens_per_s": 10.0 * lr_scale}
        if memory:
            record["mem_gb"] = 1.0
        if evaluated and step % 2 == 0:
            record["eval_loss"] = 4.5 - lr_scale * step
        records.append(record)
    (folder / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    return folder


@pytest.fixture
def drawn(monkeypatch):
    """The axes of every figure drawn, in order (loss, tokens/s, memory)."""
    axes_drawn = []
    subplots = plt.subplots

    def capture(*args, **kwargs):
        figure, axes = subplots(*args, **kwargs)
        axes_drawn.append(axes)
        return figure, axes

    monkeypatch.setattr(plt, "subplots", capture)
    return axes_drawn


def test_two_runs_are_overlaid_one_colour_and_legend_entry_each(cli, tmp_path, monkeypatch, drawn):
    monkeypatch.chdir(tmp_path)
    _run(tmp_path, "lr-small", 0.1)
    _run(tmp_path, "lr-large", 0.5, memory=False)
    result = cli("run", "plot", "lr-small", "lr-large", "--out", "compare")
    assert result.code == 0, result.err
    out = tmp_path / "compare"
    assert sorted(p.name for p in out.iterdir()) == ["loss.png", "memory.png", "tokens_per_s.png"]
    names = ("loss.png", "tokens_per_s.png", "memory.png")
    assert result.out.splitlines() == [f"wrote compare/{name}" for name in names]
    loss, speed, memory = drawn
    for axes in (loss, speed):
        assert [line.get_label() for line in axes.lines] == ["lr-small", "lr-large"]
        assert [t.get_text() for t in axes.get_legend().get_texts()] == ["lr-small", "lr-large"]
        colours = [line.get_color() for line in axes.lines]
        assert len(set(colours)) == 2
    assert list(loss.lines[1].get_ydata()) == pytest.approx([3.5, 3.0, 2.5, 2.0])
    # lr-large logged no memory: the memory plot holds lr-small's curve alone
    assert [line.get_label() for line in memory.lines] == ["lr-small"]
    assert not (tmp_path / "runs/lr-small/plots").exists()  # --out as for one run


def test_without_out_several_runs_go_beside_the_first_runs_plots(cli, tmp_path, monkeypatch, drawn):
    monkeypatch.chdir(tmp_path)
    first = _run(tmp_path, "base", 0.1, evaluated=True)
    _run(tmp_path, "replay", 0.1, evaluated=True)
    assert cli("run", "plot", "base").code == 0
    single = (first / "plots/loss.png").read_bytes()
    drawn.clear()
    result = cli("run", "plot", "base", "replay")
    assert result.code == 0, result.err
    assert (first / "plots/vs-replay/loss.png").is_file()
    assert (first / "plots/loss.png").read_bytes() == single  # the first run's own plot stays
    labels = [line.get_label() for line in drawn[0].lines]
    assert labels == [
        "base (training)",
        "base (held-out)",
        "replay (training)",
        "replay (held-out)",
    ]
    base_colour = drawn[0].lines[0].get_color()
    assert drawn[0].lines[1].get_color() == base_colour != drawn[0].lines[2].get_color()


def test_one_run_is_plotted_as_before(cli, tmp_path, monkeypatch, drawn):
    monkeypatch.chdir(tmp_path)
    run_dir = _run(tmp_path, "only", 0.1)
    assert cli("run", "plot", "only").code == 0
    assert (run_dir / "plots/loss.png").is_file()
    assert drawn[0].get_legend() is None and drawn[0].get_title() == "only: loss"


def test_a_run_with_nothing_to_plot_among_several_is_named(cli, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    _run(tmp_path, "good", 0.1)
    (tmp_path / "runs/empty").mkdir()
    (tmp_path / "runs/empty/metrics.jsonl").write_text("")
    result = cli("run", "plot", "good", "runs/empty")
    assert_user_error(result, "runs/empty has no metrics yet (metrics.jsonl is empty)")
    assert not (tmp_path / "runs/good/plots").exists()
