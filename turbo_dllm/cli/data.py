"""`dllm data prepare | validate | inspect | stats | schema`."""

from __future__ import annotations

import sys

from turbo_dllm.cli._output import (
    add_overrides,
    check_overrides_have_config,
    emit_json,
    emit_schema,
    group,
)


def register(subparsers) -> None:
    commands = group(subparsers, "data", "prepare, check and look inside training data artifacts")

    p = commands.add_parser("prepare", help="tokenize and pack a dataset into an artifact")
    p.add_argument("--config", required=True, help="prepare.yaml")
    add_overrides(p, "workers=4")
    p.add_argument("--json", action="store_true", help="print the result as one JSON object")
    p.set_defaults(func=_prepare)

    p = commands.add_parser(
        "validate",
        help="recompute hashes and fingerprint; with --config, check against a RunSpec",
        description="Recompute an artifact's hashes and fingerprint and check its structure; "
        "with --config (and its --set values, as `dllm launch` takes them), check that it fits "
        "a RunSpec. Exit status: 0 every check passed, 1 a check failed (the artifact is "
        "damaged, or does not fit --config), 2 bad input (no artifact at that path, a --config "
        "that does not load).",
    )
    p.add_argument("artifact", help="artifact folder")
    p.add_argument("--config", help="RunSpec (train.yaml) the artifact must fit")
    add_overrides(p, "data.seq_len=512")
    p.add_argument("--json", action="store_true", help="print the result as one JSON object")
    p.set_defaults(func=_validate)

    p = commands.add_parser("inspect", help="decoded sequences with supervised spans marked")
    p.add_argument("artifact", help="artifact folder")
    p.add_argument("--n", type=int, default=3, help="how many sequences (default 3)")
    p.add_argument("--start", type=int, default=0, help="first sequence to show")
    p.add_argument("--json", action="store_true", help="print the result as one JSON object")
    p.set_defaults(func=_inspect)

    p = commands.add_parser("stats", help="tokens, documents, supervision, length histogram")
    p.add_argument("artifact", help="artifact folder")
    p.add_argument(
        "--plot",
        metavar="OUT.png",
        help="also write the histogram as an image (format from the extension: .png, .svg, "
        ".pdf, ...; no extension: .png)",
    )
    p.add_argument("--json", action="store_true", help="print the result as one JSON object")
    p.set_defaults(func=_stats)

    p = commands.add_parser("schema", help="print the prepare.yaml JSON Schema (for editors)")
    p.set_defaults(func=_schema)


def _prepare(args) -> int:
    from turbo_dllm.data.prepare import prepare
    from turbo_dllm.data.spec import load_prepare_spec
    from turbo_dllm.data.summary import describe_dropped

    spec = load_prepare_spec(args.config, args.overrides)
    result = prepare(spec)
    manifest = result.manifest
    if args.json:
        emit_json(
            {
                "path": str(result.path),
                "fingerprint": manifest.fingerprint,
                "num_sequences": manifest.num_sequences,
                "seq_len": manifest.seq_len,
                "vocab_size": manifest.vocab_size,
                "special_tokens": manifest.special_tokens,
                "stats": manifest.stats.model_dump(mode="json"),
                "seconds": round(result.seconds, 3),
                "tokens_per_second": round(result.tokens_per_second, 1),
                "workers": result.workers,
            }
        )
        return 0
    s = manifest.stats
    supervised = s.supervised_tokens / s.tokens if s.tokens else 0.0
    padding = s.padding_tokens / (manifest.num_sequences * manifest.seq_len)
    print(f"wrote {result.path}")
    print(
        f"  {manifest.num_sequences:,} sequences x {manifest.seq_len} tokens; "
        f"{s.documents:,} documents from {s.records:,} records"
    )
    print(
        f"  {s.tokens:,} tokens, {supervised:.1%} supervised, {padding:.1%} padding"
        + (
            f", {s.truncated_documents:,} truncated ({s.truncated_tokens:,} tokens cut)"
            if s.truncated_documents
            else ""
        )
    )
    if s.skipped:
        print("  skipped: " + ", ".join(f"{k} {v:,}" for k, v in s.skipped.items()))
    if dropped := describe_dropped(s.empty_documents, s.dropped_unsupervised_documents):
        print(f"  dropped: {dropped}")
    if s.special_token_text:
        print(f"  warning: {_special_text_warning(s.special_token_text, spec)}")
    print(f"  fingerprint {manifest.fingerprint}")
    print(
        f"  {result.seconds:.1f} s, {result.tokens_per_second:,.0f} tokens/s, "
        f"{result.workers} worker{'s' if result.workers > 1 else ''}"
    )
    return 0


def _special_text_warning(count: int, spec) -> str:
    became = (
        "became those control tokens"
        if spec.tokenizer.special_tokens_in_text == "control"
        else "were tokenized as plain text"
    )
    return (
        f"{count:,} documents hold the literal string of a special token (like <|endoftext|>) "
        f"and {became}; tokenizer.special_tokens_in_text chooses"
    )


def _family_problems(spec, artifact: str) -> list[str]:
    """The family's input rules on `artifact` (packed rows it cannot train, a mask token that
    is not its checkpoint's): what `dllm train` and `dllm launch` would refuse."""
    from turbo_dllm.registry import get_family

    data = spec.data.model_copy(update={"artifact": str(artifact), "synthetic": None})
    spec = spec.model_copy(update={"data": data})
    problems = get_family(spec.model.family).input_problems(spec)
    return [f"{path}: {message}" for path, message in problems]


def _validate(args) -> int:
    """Exit 0: the artifact checked clean (and fits `--config`); 1: a failed check (an artifact
    that is there but damaged, or does not fit the RunSpec); 2: bad input (no artifact at that
    path, a RunSpec that does not load), as every `dllm` error."""
    from turbo_dllm.data.artifact import ArtifactDamaged, verify

    check_overrides_have_config(args)
    try:
        manifest = verify(args.artifact)
    except ArtifactDamaged as damaged:
        return _validate_failed(args, damaged.message, damaged.problems, damaged.hint)
    checked: list[str] = []
    if args.config:
        from turbo_dllm.config.load import load_runspec, read_yaml
        from turbo_dllm.data.compat import artifact_problems
        from turbo_dllm.data.spec import check_not_a_prepare_spec

        check_not_a_prepare_spec(read_yaml(args.config), args.config)
        spec = load_runspec(args.config, args.overrides)
        found = artifact_problems(manifest, spec)
        found += _family_problems(spec, args.artifact)
        if found:
            lines = "\n".join(f"  - {p}" for p in found)
            sets = " with its --set values" if args.overrides else ""
            return _validate_failed(
                args,
                f"data artifact {args.artifact!r} does not fit {args.config}{sets}:\n{lines}",
                found,
                "change the RunSpec fields above, or prepare the data again to match",
            )
        checked = ["seq_len", "block_size", "vocab", "mask_token", "family_inputs"]
    if args.json:
        emit_json(
            {
                "valid": True,
                "artifact": args.artifact,
                "fingerprint": manifest.fingerprint,
                "num_sequences": manifest.num_sequences,
                "seq_len": manifest.seq_len,
                "config": args.config,
                "checked_against_config": checked,
            }
        )
        return 0
    print(
        f"ok: {args.artifact}: {manifest.num_sequences:,} sequences x {manifest.seq_len}, "
        f"vocab {manifest.vocab_size}, mask {manifest.special_tokens['mask']}"
    )
    print(f"  fingerprint {manifest.fingerprint} (hashes and fingerprint recomputed)")
    if args.config:
        print(f"  fits {args.config}: {', '.join(checked)}")
    return 0


def _validate_failed(args, message: str, problems: list[str], fix: str | None) -> int:
    """A failed check's report, as `dllm bundle verify` / `mirror verify` give theirs: what
    failed on stdout, the fix on stderr (`--json`: one object with both), exit 1."""
    if args.json:
        emit_json(
            {
                "valid": False,
                "artifact": args.artifact,
                "config": args.config,
                "problems": problems,
                "fix": fix,
            }
        )
        return 1
    print(f"FAIL: {message}")
    if fix:
        print(f"fix: {fix}", file=sys.stderr)
    return 1


def _inspect(args) -> int:
    from turbo_dllm.data.artifact import DataArtifact
    from turbo_dllm.data.summary import load_decoder, sample_spans, spans_json
    from turbo_dllm.errors import DllmError

    if args.n < 1:
        raise DllmError(
            f"--n must be at least 1, got {args.n}", hint="--n N shows N sequences from --start"
        )
    if args.start < 0:
        raise DllmError(
            f"--start must be 0 or more, got {args.start}",
            hint="sequences are numbered from 0 (`dllm data stats` counts them)",
        )
    artifact = DataArtifact(args.artifact)
    decoder = load_decoder(artifact)
    rows = range(args.start, min(args.start + args.n, len(artifact)))
    if not rows:
        raise DllmError(
            f"--start {args.start} is past the last sequence ({len(artifact) - 1})",
            hint=f"--start 0 to {len(artifact) - 1}",
        )
    samples = [(row, sample_spans(artifact, row, decoder)) for row in rows]
    if args.json:
        emit_json(
            {
                "artifact": args.artifact,
                "supervision": artifact.manifest.supervision,
                "samples": [{"index": row, "spans": spans_json(spans)} for row, spans in samples],
            }
        )
        return 0
    from rich.console import Console
    from rich.text import Text

    console = Console(highlight=False, soft_wrap=True)
    console.print(
        f"[bold]{args.artifact}[/]: supervision {artifact.manifest.supervision}; "
        "⟦supervised⟧ (green), context (plain), ¦ document boundary, ░ padding",
        markup=True,
    )
    for row, spans in samples:
        text = Text()
        previous = None
        for span in spans:
            if previous is not None and span.segment != previous:
                text.append(" ¦ ", style="bold magenta")
            previous = span.segment
            if span.padding:
                text.append(f"░ pad x{span.tokens}", style="dim")
            elif span.supervised:
                text.append("⟦" + span.text + "⟧", style="green")
            else:
                text.append(span.text)
        supervised = sum(s.tokens for s in spans if s.supervised)
        console.rule(f"sequence {row} ({supervised} supervised tokens)")
        console.print(text)
    return 0


def _stats(args) -> int:
    from turbo_dllm.data.artifact import DataArtifact
    from turbo_dllm.data.summary import compute_stats, describe_dropped, plot_stats

    stats = compute_stats(DataArtifact(args.artifact))
    if args.plot:
        from turbo_dllm.paths import use_matplotlib_config_dir

        use_matplotlib_config_dir()  # before plot_stats imports matplotlib
    plot = str(plot_stats(stats, args.plot)) if args.plot else None
    if args.json:
        emit_json({**stats, "plot": plot})
        return 0
    length = stats["document_length"]
    print(f"{args.artifact}  (fingerprint {stats['fingerprint'][:16]})")
    print(f"  sequences        {stats['sequences']:,} x {stats['seq_len']}")
    print(f"  documents        {stats['documents']:,} (from {stats['records']:,} records)")
    print(f"  tokens           {stats['tokens']:,}")
    print(
        f"  supervised       {stats['supervised_tokens']:,} "
        f"({stats['supervised_fraction']:.1%}, {stats['supervision']})"
    )
    print(f"  padding          {stats['padding_tokens']:,} ({stats['padding_fraction']:.1%})")
    print(
        f"  truncated        {stats['truncated_documents']:,} documents, "
        f"{stats['truncated_tokens']:,} tokens"
    )
    if stats["skipped"]:
        print("  skipped          " + ", ".join(f"{k} {v:,}" for k, v in stats["skipped"].items()))
    if dropped := describe_dropped(
        stats["empty_documents"], stats["dropped_unsupervised_documents"]
    ):
        print(f"  dropped          {dropped}")
    if stats["special_token_text"]:
        print(
            f"  special text     {stats['special_token_text']:,} documents hold a special token's literal string"
        )
    print(f"  document length  min {length['min']}, mean {length['mean']:.1f}, max {length['max']}")
    hist = length["histogram"]
    widest = max(hist["counts"]) or 1
    for low, high, count in zip(hist["edges"][:-1], hist["edges"][1:], hist["counts"], strict=True):
        if count:
            bar = "#" * max(1, round(40 * count / widest))
            print(f"    [{low:>7}, {high:>7})  {count:>8,}  {bar}")
    if plot:
        print(f"  plot             {plot}", file=sys.stderr)
    return 0


def _schema(args) -> int:
    from turbo_dllm.data.spec import PrepareSpec

    emit_schema(PrepareSpec)
    return 0
