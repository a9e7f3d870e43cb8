"""`dllm export --checkpoint C --out DIR`: a training checkpoint as a Hugging Face folder."""

from __future__ import annotations

from turbo_dllm.cli._output import emit_json

# turbo_dllm.train.weights.DEFAULT_MAX_SHARD_SIZE, spelled here: the CLI's parsers are built
# without importing torch.
DEFAULT_MAX_SHARD_SIZE = "50GB"


def register(subparsers) -> None:
    p = subparsers.add_parser(
        "export",
        help="write a checkpoint's model as a Hugging Face folder",
        description="Write config.json + model.safetensors (HF layout) from a training checkpoint, "
        "with the tokenizer and generation_config.json of the model folder (or data artifact) "
        "it was trained from. Weights larger than --max-shard-size are split as transformers' "
        "save_pretrained splits them: model-00001-of-0000N.safetensors ... and "
        "model.safetensors.index.json.",
    )
    p.add_argument(
        "--checkpoint",
        required=True,
        help="a checkpoints/step_<N> folder (or a checkpoints/ folder or a run dir: its latest)",
    )
    p.add_argument("--out", required=True, help="new folder to write")
    p.add_argument(
        "--dtype",
        choices=("float32", "bfloat16"),
        default=None,
        help="weights dtype (default: the training parameter dtype)",
    )
    p.add_argument(
        "--max-shard-size",
        metavar="SIZE",
        default=DEFAULT_MAX_SHARD_SIZE,
        help="largest safetensors file before the weights are split into shards, as "
        'transformers\' max_shard_size: "5GB", "500MB" (decimal units) or bytes; a tensor is '
        "never split (default: %(default)s, transformers' default; the Hub takes files up to "
        "50GB)",
    )
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=_export)


def _export(args) -> int:
    from turbo_dllm.train.checkpoint import resolve_checkpoint
    from turbo_dllm.train.export import export_checkpoint

    # A run dir or checkpoints/ folder exports its newest complete step: say which one it was
    # (the one read: a run training into the folder may prune the newest while it is read).
    read: list = []
    out = export_checkpoint(
        args.checkpoint,
        args.out,
        dtype=args.dtype,
        max_shard_size=args.max_shard_size,
        read=read,
    )
    source = read[0] if read else resolve_checkpoint(args.checkpoint)
    if args.json:
        files = sorted(p.name for p in out.iterdir())
        emit_json({"out": str(out), "checkpoint": str(source), "files": files})
    else:
        print(f"wrote {out} from {source}")
    return 0
