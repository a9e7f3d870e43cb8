"""PNG plots of a run's metrics.jsonl: loss (and the held-out loss where the run evaluated),
throughput and memory against the step; of several runs (a run and its replay, two learning
rates), their curves on one plot, one colour and legend entry per run."""

from __future__ import annotations

import io
import math
import os
from pathlib import Path
from typing import Any

from turbo_dllm.errors import DllmError
from turbo_dllm.fsutil import write_atomic
from turbo_dllm.paths import use_matplotlib_config_dir
from turbo_dllm.train.metrics import METRICS_NAME, read_metrics

__all__ = ["PLOTS", "plot_run", "plot_runs", "run_labels"]

# file name -> (metric key, y label)
PLOTS: dict[str, tuple[str, str]] = {
    "loss.png": ("loss", "loss"),
    "tokens_per_s.png": ("tokens_per_s", "tokens / s"),
    "memory.png": ("mem_gb", "memory (GB)"),
}


def plot_run(run_dir: Path, out_dir: Path | None = None) -> list[Path]:
    """Write one PNG per metric that the run logged; returns their paths."""
    return plot_runs([Path(run_dir)], out_dir)


def plot_runs(run_dirs: list[Path], out_dir: Path | None = None) -> list[Path]:
    """Write one PNG per metric that any of the runs logged, each run's curve in its own colour
    with a legend entry named by its run (`run_labels`); one run is plotted as `plot_run` always
    did. Default folder: <run>/plots for one run; for several, <first run>/plots/vs-<others>
    (the first run's own plots stay as they are)."""
    run_dirs = [Path(run_dir) for run_dir in run_dirs]
    runs = []
    for run_dir in run_dirs:
        records = _last_per_step(read_metrics(run_dir))
        if not records:
            raise _nothing_to_plot(run_dir)
        runs.append(records)
    labels = run_labels(run_dirs)
    several = len(run_dirs) > 1
    use_matplotlib_config_dir()
    # Files, no display: Agg. A user's MPLBACKEND has no say (one matplotlib does not know was
    # a ValueError traceback while it was imported).
    os.environ["MPLBACKEND"] = "agg"
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        raise DllmError(
            "plotting needs matplotlib, which is not installed",
            hint="python -m pip install matplotlib",
        ) from None
    if out_dir:
        out_dir = Path(out_dir)
    elif several:
        out_dir = run_dirs[0] / "plots" / compare_folder_name(labels[1:])
    else:
        out_dir = run_dirs[0] / "plots"
    try:
        out_dir.mkdir(parents=True, exist_ok=True)
    except OSError as error:  # --out names a file, or a folder we cannot write
        from turbo_dllm.errors import describe_os_error

        why, _ = describe_os_error(error)  # names the file in the way, not "[Errno 17] ..."
        raise DllmError(
            f"cannot create plot folder {out_dir}: {why}",
            hint="pass --out a folder (or a path to make one) that you can write",
        ) from None
    written = []
    for name, (key, label) in PLOTS.items():
        curves = [
            (run_label, records, [(r["step"], r[key]) for r in records if _number(r.get(key))])
            for run_label, records in zip(labels, runs, strict=True)
        ]
        if not any(points for _, _, points in curves):
            continue
        figure, axes = plt.subplots(figsize=(7, 4), dpi=100)
        legend = False
        entries: list[tuple[Any, str]] = []  # (line, its legend text)
        for index, (run_label, records, points) in enumerate(curves):
            if not points:
                continue
            colour = f"C{index % 10}" if several else None
            # A line through one point draws nothing: a run after its first logged step.
            marker = "o" if len(points) == 1 else None
            line = axes.plot(
                [p[0] for p in points],
                [p[1] for p in points],
                linewidth=1.5,
                marker=marker,
                color=colour,
                label=run_label if several else None,
            )[0]
            if several:
                entries.append((line, run_label))
            held_out = [(r["step"], r["eval_loss"]) for r in records if _number(r.get("eval_loss"))]
            if key == "loss" and held_out:  # the evaluations (`eval:`) beside the training loss
                xs, ys = zip(*held_out, strict=True)
                if several:  # the run's colour, dashed
                    line.set_label(f"{run_label} (training)")
                    dashed = axes.plot(
                        xs, ys, linewidth=1.5, marker="o", linestyle="--", color=colour,
                        label=f"{run_label} (held-out)",
                    )[0]  # fmt: skip
                    entries[-1:] = [(line, line.get_label()), (dashed, dashed.get_label())]
                else:
                    line.set_label("training")
                    held = axes.plot(
                        xs, ys, linewidth=1.5, marker="o", label="held-out (eval_loss)"
                    )[0]
                    entries += [(line, "training"), (held, "held-out (eval_loss)")]
                legend = True
        # Run names are text, as written: handed to legend() with their lines (an automatic
        # legend leaves out a label that starts with "_", a run dir _base), and not read as
        # mathtext (a run dir "lr $1e-3$" lost its dollars; one "a $\x$" ended the plot with
        # matplotlib's ParseFatalException traceback).
        if several or legend:
            shown = axes.legend(
                [line for line, _ in entries], [_drawable(text) for _, text in entries]
            )
            for text in shown.get_texts():
                text.set_parse_math(False)
        axes.set_xlabel("step")
        axes.set_ylabel(label)
        title = f"{' vs '.join(labels) if several else run_dirs[0].name}: {label}"
        axes.set_title(_drawable(title), parse_math=False)
        axes.grid(alpha=0.3)
        figure.tight_layout()
        path = out_dir / name
        # Whole or not at all: savefig wrote the file as it drew it, and a plot stopped (Ctrl-C,
        # a full disk) left a torn PNG in place of the last whole one.
        image = io.BytesIO()
        figure.savefig(image, format="png")
        plt.close(figure)
        write_atomic(path, image.getvalue())
        written.append(path)
    if not written:  # steps logged, but none of the plotted values: it said nothing, exit 0
        which = str(run_dirs[0]) if not several else ", ".join(map(str, run_dirs))
        raise DllmError(
            f"{which}'s metrics.jsonl has steps but no finite "
            + ", ".join(key for key, _ in PLOTS.values())
            + " values to plot",
            hint="the trainer logs them every logging step; this file was written by something "
            "else, or every value is NaN",
        )
    return written


# The longest file name most file systems take (NAME_MAX, in bytes).
NAME_MAX = 255


def compare_folder_name(others: list[str]) -> str:
    """`vs-<other runs>`, the folder of several runs' plots beside the first run's. One name
    over NAME_MAX bytes (twelve runs of default ids, or a few long or non-ASCII names) could not
    be made ("File name too long"): it keeps the runs that fit, whole, then says how many more
    and a digest of them all, so that another set of runs gets another folder."""
    import hashlib

    words = [label.replace("/", "_") for label in others]
    name = "vs-" + "-".join(words)
    if len(os.fsencode(name)) <= NAME_MAX:  # a name's bytes on disk (a Latin-1 one's too)
        return name
    digest = hashlib.sha256(os.fsencode("\0".join(others))).hexdigest()[:12]
    kept: list[str] = []
    for count, word in enumerate(words):
        tail = f"-and-{len(words) - count - 1}-more-{digest}"
        if len(os.fsencode("vs-" + "-".join([*kept, word]) + tail)) > NAME_MAX:
            break
        kept.append(word)
    if not kept:  # one name too long by itself: as much of it as fits
        tail = f"-and-{len(words) - 1}-more-{digest}"
        first = words[0]
        while len(os.fsencode("vs-" + first + tail)) > NAME_MAX:
            first = first[:-1]
        kept = [first]
    return "vs-" + "-".join(kept) + f"-and-{len(words) - len(kept)}-more-{digest}"


def _drawable(text: str) -> str:
    """`text` as matplotlib can draw it: a byte of a name that is not UTF-8 (a Latin-1 run dir
    `caf\\xe9`, a lone surrogate to Python) as U+FFFD; matplotlib's font code ended the plot with
    a TypeError traceback on it."""
    return text.encode("utf-8", "surrogateescape").decode("utf-8", "replace")


def run_labels(run_dirs: list[Path]) -> list[str]:
    """What the legend calls each run: its run dir's name (the run id), or, where two runs
    share a name (runs/a/x and runs/b/x), the path that tells them apart."""
    names = [Path(run_dir).name for run_dir in run_dirs]
    return [
        name if names.count(name) == 1 else str(run_dir)
        for name, run_dir in zip(names, run_dirs, strict=True)
    ]


def _nothing_to_plot(run_dir: Path) -> DllmError:
    """Why no record has a step: the file is missing or empty, or it has lines of which none is
    a readable record ("missing or empty" was said of a file whose every line was damaged), or
    its records carry no step."""
    path = run_dir / METRICS_NAME
    hint = _no_steps_hint(run_dir)
    if not path.is_file():
        return DllmError(f"{run_dir} has no metrics yet ({METRICS_NAME} is missing)", hint=hint)
    try:
        lines = [line for line in path.read_bytes().splitlines() if line.strip()]
    except OSError as error:
        return DllmError(f"cannot read {path}: {error}", hint="check the file's permissions")
    if not lines:
        return DllmError(f"{run_dir} has no metrics yet ({METRICS_NAME} is empty)", hint=hint)
    count = f"{len(lines)} line{'s' if len(lines) != 1 else ''}"
    if not read_metrics(run_dir):
        return DllmError(
            f"{run_dir}'s {METRICS_NAME} has {count} and none is a readable record (each is "
            "torn, not a JSON object, or has a step that is not an integer)",
            hint="the trainer writes one JSON object per logged step; this file was damaged or "
            "written by something else",
        )
    return DllmError(
        f"{run_dir}'s {METRICS_NAME} has {count} and none is a record with a step",
        hint="the trainer writes a record with its step at every logging step; this file was "
        "written by something else",
    )


def _no_steps_hint(run_dir: Path) -> str:
    """Why a run has logged no step, where its manifest tells: a SLURM script never submitted
    (the hint said to check logging.jsonl, of a run that had not run), or a spec that logs
    none (`logging.jsonl: false`)."""
    import shlex

    hint = "plots need at least one logged step; check logging.jsonl in the spec"
    try:
        from turbo_dllm.jobs.manifest import read_manifest
        from turbo_dllm.jobs.runs import summarize

        manifest = read_manifest(run_dir)
        run = summarize(run_dir, manifest, ask_slurm=False)
    except (DllmError, OSError):  # no manifest (a `dllm train --run-dir` run), or damaged
        return hint
    if run.status == "not submitted" and manifest.plan.slurm is not None:
        return (
            f"it has not run: its SLURM script was never submitted (sbatch "
            f"{shlex.quote(manifest.plan.slurm.script)}); plot it once it has logged a step"
        )
    if manifest.spec.get("logging", {}).get("jsonl") is False:
        return "its spec has logging.jsonl: false, so it writes no metrics.jsonl to plot"
    return hint


def _last_per_step(records: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """After a restart a step may be logged again; the last record of a step wins. A step is
    an int that is not a bool (`read_metrics` skips such records already; so does this)."""
    by_step: dict[int, dict[str, Any]] = {}
    for record in records:
        step = record.get("step")
        if isinstance(step, int) and not isinstance(step, bool):
            by_step[step] = record
    return [by_step[step] for step in sorted(by_step)]


def _number(value: Any) -> bool:
    """A finite number: NaN and inf (a diverged loss) are left out, which joins the line over
    them; an inf point broke it, and a metric of only infs was an empty plot."""
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)
