"""`dllm run plot` draws the held-out loss (`eval_loss`, the `eval:` section) beside the
training loss."""

from __future__ import annotations

import json

import pytest

from turbo_dllm.jobs.plot import plot_run

plt = pytest.importorskip("matplotlib.pyplot")


def _run(folder, eval_steps):
    folder.mkdir()
    lines = []
    for step in range(1, 7):
        record = {"step": step, "loss": 4.0 - 0.1 * step, "tokens_per_s": 10.0, "mem_gb": 1.0}
        if step in eval_steps:
            record["eval_loss"] = 4.5 - 0.1 * step
        lines.append(json.dumps(record))
    (folder / "metrics.jsonl").write_text("\n".join(lines) + "\n")
    return folder


def test_the_loss_plot_holds_the_held_out_loss(tmp_path, monkeypatch):
    drawn = {}
    subplots = plt.subplots

    def capture(*args, **kwargs):
        figure, axes = subplots(*args, **kwargs)
        drawn[len(drawn)] = axes
        return figure, axes

    monkeypatch.setattr(plt, "subplots", capture)
    written = plot_run(_run(tmp_path / "evaluated", {2, 4, 6}))
    assert (tmp_path / "evaluated/plots/loss.png") in written
    loss_axes = drawn[0]
    assert [line.get_label() for line in loss_axes.lines] == ["training", "held-out (eval_loss)"]
    held_out = loss_axes.lines[1]
    assert list(held_out.get_xdata()) == [2, 4, 6]
    assert list(held_out.get_ydata()) == pytest.approx([4.3, 4.1, 3.9])
    drawn.clear()
    plot_run(_run(tmp_path / "plain", set()))
    assert len(drawn[0].lines) == 1  # a run without evaluations: the training loss alone
