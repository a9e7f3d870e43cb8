"""`dllm run list | show ID | diff A B | plot ID [ID ...]`: look at recorded runs (default root ./runs)."""

from __future__ import annotations

from turbo_dllm.cli._output import emit_json, group


def register(subparsers) -> None:
    commands = group(subparsers, "run", "list, inspect, compare and plot recorded runs")

    def add(name: str, help: str, func, *positional: str):
        p = commands.add_parser(name, help=help, description=help)
        for arg in positional:
            p.add_argument(arg, help="run id (or a unique prefix), or a run dir")
        p.add_argument("--root", default=None, help="folder holding run dirs (default runs)")
        p.set_defaults(func=func)
        return p

    p = add("list", "list runs with their status, steps and last loss", _list)
    p.add_argument("--json", action="store_true")
    p = add("show", "a run's manifest summary, plan and latest metrics", _show, "run")
    p.add_argument("--json", action="store_true", help="print the whole manifest")
    p = add("diff", "two runs' manifests side by side (fields that differ)", _diff, "a", "b")
    p.add_argument("--json", action="store_true")
    p = add(
        "plot",
        "PNG plots of loss, tokens/s and memory from metrics.jsonl; several runs: their curves "
        "on one plot each",
        _plot,
    )
    p.add_argument(
        "run",
        nargs="+",
        help="run id (or a unique prefix), or a run dir; more than one: overlaid, one colour "
        "and legend entry per run",
    )
    p.add_argument(
        "--out",
        default=None,
        help="folder for the PNGs (default <run>/plots; several runs: <first run>/plots/"
        "vs-<other runs>)",
    )


def _list(args) -> int:
    from pathlib import Path

    from turbo_dllm.cli._output import shell_path
    from turbo_dllm.jobs.runs import (
        DEFAULT_ROOT,
        check_root,
        data_artifacts,
        list_runs,
        unreadable_runs,
        unrecorded_runs,
    )

    root = args.root or DEFAULT_ROOT
    if args.root is not None or Path(root).exists():  # no ./runs yet: nothing launched here
        check_root(root)
    runs, unrecorded = list_runs(root), unrecorded_runs(root)
    unreadable = unreadable_runs(root, runs)
    if args.json:
        emit_json(
            {
                "root": root,
                "runs": [r.to_json() for r in runs],
                "without_manifest": [str(p) for p in unrecorded],
                "unreadable_manifest": [str(p) for p in unreadable],
            }
        )
        return 0
    if unrecorded:
        print(
            "without a manifest (`dllm train --run-dir` runs; `dllm run plot` reads them): "
            + ", ".join(p.name for p in unrecorded)
        )
    if unreadable:
        print(
            "with a record that cannot be read (manifest.json, or its result, launcher or "
            "SLURM record: `dllm run show ID` says which and why): "
            + ", ".join(p.name for p in unreadable)
        )
    if not runs:
        print(f"no recorded runs under {root}/ (start one with `dllm launch --config F`)")
        if (Path(root) / "manifest.json").is_file():  # --root runs/<id>: a run dir itself
            print(
                f"{root} is a run dir itself, not a folder of runs: dllm run show {shell_path(root)}"
                f" (its folder: --root {shell_path(Path(root).absolute().parent)})"
            )
        artifacts = data_artifacts(root)
        if artifacts:
            print(
                "data artifacts, not runs (`dllm data inspect`): "
                + ", ".join(p.name for p in artifacts)
            )
        return 0
    rows = [("run", "name", "created", "layout", "steps", "loss", "status", "replay of")]
    for r in runs:
        steps = f"{r.steps_done if r.steps_done is not None else 0}/{r.steps_total}"
        loss = f"{r.last_loss:.4f}" if isinstance(r.last_loss, (int, float)) else "-"
        rows.append(
            (
                r.path.name,  # what `run show` takes: a moved or copied run keeps its old id
                r.name or "-",
                r.created_at,
                f"{r.backend} {r.processes}",
                steps,
                loss,
                r.status_detail,
                r.replay_of or "-",
            )
        )
    rows = [tuple(_visible(cell) for cell in row) for row in rows]
    widths = [max(_width(row[i]) for row in rows) for i in range(len(rows[0]))]
    for row in rows:  # plain columns: never truncated, easy to grep
        print(
            "  ".join(_pad(cell, width) for cell, width in zip(row, widths, strict=True)).rstrip()
        )
    return 0


def _show(args) -> int:
    from turbo_dllm.jobs.describe import describe_manifest, describe_plan
    from turbo_dllm.jobs.manifest import read_manifest
    from turbo_dllm.jobs.runs import find_run, resume_where, summarize

    run_dir = find_run(args.run, _root(args))
    manifest = read_manifest(run_dir)
    if args.json:
        emit_json(manifest.model_dump(mode="json"))
        return 0
    summary = summarize(run_dir, manifest)
    for line in describe_manifest(manifest):
        print(line)
    steps = summary.steps_done if summary.steps_done is not None else 0
    loss = f", last loss {summary.last_loss:.4f}" if summary.last_loss is not None else ""
    print(f"progress     {steps}/{summary.steps_total} steps{loss}; {summary.status_detail}")
    if summary.exit_code is not None:
        at = f" at {summary.finished_at}" if summary.finished_at else ""
        by = ", by a `dllm train --run-dir` resume" if summary.resumed else ""
        print(f"ended        exit status {summary.exit_code}{at}{by}")
    if summary.resumable and summary.resume_with:
        # It stopped early (SIGTERM, its time budget, Ctrl-C, a kill, SLURM): its checkpoints
        # are there to go on from.
        where = resume_where(manifest)
        where = f"{where}: " if where else ""
        print(f"resume       {where}{summary.resume_with}")
    if summary.slurm_job_id:
        state = f" ({summary.slurm_state})" if summary.slurm_state else ""
        print(f"slurm job    {summary.slurm_job_id}{state}")
    print()
    for line in describe_plan(manifest.plan):
        print(line)
    return 0


def _diff(args) -> int:
    from turbo_dllm.jobs.manifest import read_manifest
    from turbo_dllm.jobs.runs import diff_manifests, find_run

    a = read_manifest(find_run(args.a, _root(args)))
    b = read_manifest(find_run(args.b, _root(args)))
    groups = diff_manifests(a, b)
    if args.json:
        emit_json(
            {
                "a": a.run_id,
                "b": b.run_id,
                "diff": {
                    name: [item.model_dump(mode="json") for item in items]
                    for name, items in groups.items()
                },
            }
        )
        return 0
    rows = [("field", a.run_id, b.run_id)]
    for name, items in groups.items():
        if items:
            rows.append((f"# {name}", "", ""))
            rows += [(i.field, *_cells(i.recorded, i.current)) for i in items]
    rows = [tuple(_visible(cell) for cell in row) for row in rows]
    widths = [max(_width(row[i]) for row in rows) for i in range(2)]
    for field, left, right in rows:
        print(f"{_pad(field, widths[0])}  {_pad(left, widths[1])}  {right}".rstrip())
    if not groups["inputs"]:
        print("inputs (host, packages, bundle, data, code): identical")
    return 0


def _plot(args) -> int:
    from turbo_dllm.jobs.plot import plot_runs
    from turbo_dllm.jobs.runs import find_run

    runs = [find_run(ref, _root(args), manifest=False) for ref in args.run]
    for path in plot_runs(runs, args.out):
        print(f"wrote {path}")
    return 0


def _root(args) -> str:
    from turbo_dllm.jobs.runs import DEFAULT_ROOT

    return args.root or DEFAULT_ROOT


_CELL = 72  # characters of a value in `dllm run diff`'s table


def _width(text: str) -> int:
    """The columns `text` takes on a terminal: a wide character (数据, a CJK run dir) takes two,
    a combining mark none. Padded by its length, a row with one pushed its next columns out."""
    import unicodedata

    return sum(
        0 if unicodedata.combining(c) else 2 if unicodedata.east_asian_width(c) in "WF" else 1
        for c in text
    )


def _visible(text: str) -> str:
    """A cell on one line, as it reads: a control character in a name (a run dir with a line
    break or a tab split its row; an escape sequence recoloured the terminal) as Python writes
    it in a string, `\\n`, `\\t`, `\\x1b`."""
    import unicodedata

    if not any(unicodedata.category(c) == "Cc" for c in text):
        return text
    return "".join(repr(c)[1:-1] if unicodedata.category(c) == "Cc" else c for c in text)


def _pad(text: str, width: int) -> str:
    return text + " " * (width - _width(text))


def _cells(left, right) -> tuple[str, str]:
    """Two differing values as table cells. Long ones are cut around where they first differ:
    cut at their start, two argv lists differing only in a late --set read the same."""
    texts = [_text(left), _text(right)]
    if texts[0] == texts[1]:  # differ by type only ("1" and 1): as JSON, the string quoted
        texts = [_text(left, quoted=True), _text(right, quoted=True)]
    if all(len(t) <= _CELL for t in texts):
        return texts[0], texts[1]
    first = next(
        (i for i, (x, y) in enumerate(zip(*texts, strict=False)) if x != y), min(map(len, texts))
    )
    start = max(0, min(first - 20, max(map(len, texts)) - (_CELL - 3)))
    return _cut(texts[0], start), _cut(texts[1], start)


def _cut(text: str, start: int) -> str:
    if len(text) <= _CELL and start == 0:
        return text
    head = "..." if start > 0 else ""
    body = text[start : start + _CELL - len(head) - 3]
    return head + body + ("..." if start + len(body) < len(text) else "")


def _text(value, *, quoted: bool = False) -> str:
    """A value as a cell: `-` for none, a string as it is (`quoted`: as JSON), else JSON, its
    text as written (an argv list with a run dir "runs/é" read "runs/\\u00e9")."""
    import json

    if value is None:
        return "-"
    if isinstance(value, str) and not quoted:
        return value
    return json.dumps(value, sort_keys=True, ensure_ascii=False)
