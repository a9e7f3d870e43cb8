"""`dllm model add-mask-token FOLDER`: give a local model folder the mask token diffusion needs."""

from __future__ import annotations

from turbo_dllm.cli._output import emit_json, group


def register(subparsers) -> None:
    # Like every group: without a subcommand, its help (argparse said "the following arguments
    # are required: model_command").
    commands = group(subparsers, "model", "prepare local model folders for training")
    p = commands.add_parser(
        "add-mask-token",
        help="add a mask token to a Qwen3.8 folder's tokenizer and record it in config.json",
        description="Add the mask token to the tokenizer (its id is the old tokenizer length, "
        "which the embedding must cover) and record mask_token_id and the migration "
        "(dllm_mask_token*) in config.json. In place; running it twice changes nothing.",
    )
    p.add_argument("folder", help="a local Hugging Face model folder (config.json + tokenizer)")
    p.add_argument("--mask-token", default="<|mask|>", help="the token (default <|mask|>)")
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=_add_mask_token)


def _add_mask_token(args) -> int:
    from turbo_dllm.families.qwen3_8.mask_token import migrate_mask_token

    record = migrate_mask_token(args.folder, args.mask_token)
    if args.json:
        emit_json(record)
    else:
        print(f"mask token {record['dllm_mask_token']!r} has id {record['mask_token_id']}")
    return 0
