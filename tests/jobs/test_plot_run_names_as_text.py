"""`dllm run plot` writes run names as text. matplotlib read a `$...$` in a title or legend
as mathtext: a run dir "q $\\nope$" ended the plot with a ParseFatalException traceback (exit
1), "lr $1e-3$" lost its dollars; and its automatic legend left out a run dir named "_base"
(a label that starts with "_")."""

from __future__ import annotations

import json

import pytest

pytest.importorskip("matplotlib")


def _run(root, name: str, losses: list[float]):
    run = root / name
    run.mkdir(parents=True)
    records = [{"step": step, "loss": loss} for step, loss in enumerate(losses, 1)]
    (run / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    return run


@pytest.fixture
def drawn(monkeypatch):
    """The title and legend texts of every figure the plot closes, as drawn."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    seen: list[tuple[str, list[str], bool]] = []
    close = plt.close

    def record(figure=None):
        axes = figure.axes[0]
        legend = axes.get_legend()
        texts = [axes.title, *(legend.get_texts() if legend else [])]
        seen.append(
            (
                axes.get_title(),
                [t.get_text() for t in legend.get_texts()] if legend else [],
                any(t._preprocess_math(t.get_text())[1] for t in texts),
            )
        )
        return close(figure)

    monkeypatch.setattr(plt, "close", record)
    return seen


def test_dollar_and_underscore_run_names_are_drawn_as_written(cli, tmp_path, drawn):
    first = _run(tmp_path, "q $\\nope$", [3.0, 2.5])
    second = _run(tmp_path, "_base", [3.1, 2.4])
    result = cli("run", "plot", first, second, "--out", tmp_path / "plots")
    assert result.code == 0, result.err
    title, legend, math = drawn[0]
    assert title == "q $\\nope$ vs _base: loss"
    assert legend == ["q $\\nope$", "_base"]
    assert not math
    single = cli("run", "plot", _run(tmp_path, "lr $1e-3$", [3.0]))
    assert single.code == 0, single.err
    assert drawn[-1][0].startswith("lr $1e-3$: ") and not drawn[-1][2]


def test_a_run_dir_whose_name_is_not_utf8_is_plotted(tmp_path, drawn):
    import os

    from turbo_dllm.jobs.plot import plot_runs

    run = _run(tmp_path, os.fsdecode(b"caf\xe9"), [3.0, 2.5])  # a Latin-1 name
    other = _run(tmp_path, "b", [3.1, 2.4])
    assert plot_runs([run])  # matplotlib's TypeError traceback before
    assert drawn[-1][0] == "caf\ufffd: loss"
    assert plot_runs([other, run])
    assert drawn[-1][1] == ["b", "caf\ufffd"]
