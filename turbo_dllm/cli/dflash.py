"""`dllm dflash ...`: speculative drafters (docs/dflash.md).

dllm dflash eval --target DIR --drafter DIR --data ARTIFACT   lossless speculative decoding
"""

from __future__ import annotations

from turbo_dllm.cli._output import add_overrides, emit_json
from turbo_dllm.cli.export import DEFAULT_MAX_SHARD_SIZE


def register(subparsers) -> None:
    group = subparsers.add_parser(
        "dflash",
        help="speculative drafters: evaluate, export, target features",
        description="DFlash speculative drafters (docs/dflash.md).",
    )
    commands = group.add_subparsers(dest="dflash_command", required=True, metavar="COMMAND")

    p = commands.add_parser(
        "eval",
        help="greedy decoding with the target alone vs with a drafter (lossless, tau, speedup)",
        description="Decode held-out prompts greedily with the target alone (KV cache) and with "
        "the drafter proposing blocks that the target verifies in one forward each; assert the "
        "two outputs are identical and report tau (tokens per target forward), tokens/s of "
        "both, the speedup and the histogram of tokens gained per forward. The drafter is a "
        "DFlash drafter folder or an autoregressive causal LM folder (the baseline).",
    )
    p.add_argument("--target", required=True, help="the target's Hugging Face folder")
    p.add_argument("--drafter", required=True, help="a DFlash drafter or a small causal LM folder")
    p.add_argument("--data", required=True, help="a data artifact of held-out text (prompts)")
    p.add_argument(
        "--block-size",
        type=int,
        default=None,
        help="tokens per verify forward (default: the DFlash drafter's; required for an AR one)",
    )
    p.add_argument(
        "--draft-steps",
        type=int,
        default=1,
        help="DFlash drafter forwards per block: each but the last shows its most confident "
        "guesses to the next (for drafters trained with objective.reveal_blocks)",
    )
    p.add_argument("--max-new-tokens", type=int, default=64)
    p.add_argument("--num-prompts", type=int, default=8)
    p.add_argument("--prompt-len", type=int, default=32)
    p.add_argument("--device", default=None, help="default: cuda if available, else cpu")
    p.add_argument("--dtype", choices=("float32", "bfloat16"), default="float32")
    p.add_argument(
        "--allow-other-target",
        action="store_true",
        help="evaluate a drafter whose export records another target than --target (refused "
        "by default: its tau would be a transfer to other weights, not the drafter's)",
    )
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=_eval)

    p = commands.add_parser(
        "export",
        help="write a drafter checkpoint as the folder SGLang and vLLM serve",
        description="config.json (DFlashDraftModel or DFlash2DraftModel, as trained, with "
        "dflash_config), model.safetensors without the target's tensors (past "
        "--max-shard-size: model-00001-of-0000N.safetensors ... and "
        "model.safetensors.index.json, as `dllm export` shards them), generation_config.json "
        "and the tokenizer's files where the run's data artifact (or model folder) has them, and "
        "training_export.json (provenance and the sha256 of every file written).",
    )
    p.add_argument(
        "--checkpoint",
        required=True,
        help="a checkpoints/step_<N> folder (or a checkpoints/ folder or a run dir: its latest)",
    )
    p.add_argument("--out", required=True, help="new folder to write")
    p.add_argument("--target", default=None, help="check the fit and record the target's hash")
    p.add_argument("--dtype", choices=("float32", "bfloat16"), default=None)
    p.add_argument(
        "--max-shard-size",
        metavar="SIZE",
        default=DEFAULT_MAX_SHARD_SIZE,
        help="largest safetensors file before the weights are split into shards, as "
        '`dllm export --max-shard-size`: "5GB", "500MB" (decimal units) or bytes; a tensor is '
        "never split (default: %(default)s)",
    )
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=_export)

    p = commands.add_parser(
        "prepare-features",
        help="run the target over a drafter run's data once and store its features",
        description="Write a feature artifact (turbo_dllm.dflash_features.v1: compact rows, "
        "sharded, fingerprinted; atomic and resumable) for the drafter RunSpec F; set "
        "model.dflash.features to it and training reads it instead of running the target.",
    )
    p.add_argument("--config", required=True, help="the drafter's train.yaml (a dflash RunSpec)")
    p.add_argument("--out", required=True, help="new folder to write")
    add_overrides(p)
    p.add_argument(
        "--rows-per-shard",
        type=int,
        default=128,
        help="rows a shard file holds; two shards are in memory at most (default 128)",
    )
    p.add_argument(
        "--batch-rows",
        type=int,
        default=None,
        help="rows the target runs in one forward (default: training.micro_batch_size)",
    )
    p.add_argument("--device", default=None, help="default: cuda if available, else cpu")
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=_prepare_features)


def _eval(args) -> int:
    from turbo_dllm.families.dflash.speculative import evaluate

    report = evaluate(
        args.target,
        args.drafter,
        args.data,
        block_size=args.block_size,
        draft_steps=args.draft_steps,
        max_new_tokens=args.max_new_tokens,
        num_prompts=args.num_prompts,
        prompt_len=args.prompt_len,
        device=args.device,
        dtype=args.dtype,
        allow_other_target=args.allow_other_target,
    )
    if args.json:
        emit_json(report.to_dict())
        return 0
    if report.other_target:
        print(
            "note: the drafter was trained against another target than --target (its "
            "training_export.json's target_fingerprint): tau measures it on other weights"
        )
    asked = (
        f" (of --num-prompts {report.prompts_requested}: the data holds no more)"
        if report.prompts_requested not in (None, report.prompts)
        else ""
    )
    print(
        f"{report.drafter_kind} drafter, block {report.block_size}: lossless over "
        f"{report.prompts} prompts{asked} x {report.new_tokens // report.prompts} tokens"
    )
    spread = f" +- {report.tau_stderr:.3f}" if report.tau_stderr is not None else ""
    print(
        f"tau {report.tau:.3f}{spread} tokens per target forward ({report.target_forwards} "
        "forwards; +- one standard error over the prompts)"
    )
    print(
        f"tokens/s: target alone {report.target_tokens_per_s:.1f}, speculative "
        f"{report.speculative_tokens_per_s:.1f} (speedup {report.speedup:.2f}x)"
    )
    hist = ", ".join(f"{k}: {v}" for k, v in sorted(report.accepted_histogram.items()))
    print(f"tokens per forward: {hist}")
    return 0


def _export(args) -> int:
    from turbo_dllm.families.dflash.export import export_drafter
    from turbo_dllm.train.checkpoint import resolve_checkpoint

    # A run dir or checkpoints/ folder exports its newest complete step: say which one it was.
    source = resolve_checkpoint(args.checkpoint)
    out = export_drafter(
        source,
        args.out,
        target=args.target,
        dtype=args.dtype,
        max_shard_size=args.max_shard_size,
    )
    if args.json:
        files = sorted(p.name for p in out.iterdir())
        emit_json({"out": str(out), "checkpoint": str(source), "files": files})
    else:
        print(f"wrote {out} from {source}")
    return 0


def _prepare_features(args) -> int:
    from turbo_dllm.data.spec import load_training_spec
    from turbo_dllm.families.dflash.features import prepare_features, read_features_manifest

    spec = load_training_spec(args.config, args.overrides)
    out = prepare_features(
        spec,
        args.out,
        rows_per_shard=args.rows_per_shard,
        batch_rows=args.batch_rows,
        device=args.device,
        progress=True,
    )
    manifest = read_features_manifest(out)
    if args.json:
        emit_json({"out": str(out), "fingerprint": manifest.fingerprint, "rows": manifest.num_rows})
    else:
        print(f"wrote {out} ({manifest.num_rows} rows, fingerprint {manifest.fingerprint[:16]})")
    return 0
