"""`prepare.yaml`: the typed description of one `dllm data prepare` job.

Strict pydantic models (unknown keys are errors). Sections with several kinds (`source`,
`records`, `tokenizer`) are tagged by `kind`; the loader validates each section against the one
model its `kind` names, so an unknown key is reported at its plain path (`source.pathz`) with the
nearest valid name, exactly like the RunSpec. Rules that relate several sections (a text source
with chat records, assistant_only with text records, ...) are collected by `problems()` into one
report. Relative paths resolve against the folder of the YAML file (a `--set` value's against the
current folder, as for RunSpecs).
"""

from __future__ import annotations

import difflib
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    PositiveInt,
    ValidationError,
    create_model,
    field_validator,
)
from pydantic_core import PydanticCustomError

from turbo_dllm.config.runspec import MAX_SEQ_LEN as RUNSPEC_MAX_SEQ_LEN
from turbo_dllm.errors import DllmError

# The largest token id an artifact can hold: its tokens are uint16 or uint32.
MAX_TOKEN_ID = (1 << 32) - 1

__all__ = [
    "ByteLevelTokenizerSpec",
    "ChatRecords",
    "HuggingFaceSource",
    "HuggingFaceTokenizerSpec",
    "JsonlSource",
    "MAX_SEQ_LEN",
    "MAX_TOKEN_ID",
    "OutputSpec",
    "PackingSpec",
    "ParquetSource",
    "PrepareSpec",
    "PromptCompletionRecords",
    "TextRecords",
    "TextSource",
    "TokenIdsSource",
    "TokensRecords",
    "load_prepare_spec",
    "load_training_spec",
    "problems",
    "validate_prepare_document",
]

Supervision = Literal["full", "assistant_only", "completion_only", "provided"]


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, validate_default=True)


def _as_list(value: Any) -> Any:
    """Accept `paths: a.jsonl` as shorthand for `paths: [a.jsonl]`."""
    return [value] if isinstance(value, str) else value


def _or_one_string(schema: dict[str, Any]) -> None:
    """The JSON Schema of a list field that `_as_list` lets be one string: an editor checking
    prepare.yaml against `dllm data schema` flagged `paths: a.jsonl`, which prepare reads."""
    if "anyOf" in schema:  # an optional list: [array, null]
        schema["anyOf"].insert(0, {"type": "string"})
        return
    array = {key: schema.pop(key) for key in ("type", "items", "minItems") if key in schema}
    schema["anyOf"] = [{"type": "string"}, array]


# --- sources -----------------------------------------------------------------------------------


class _FileSource(_Strict):
    paths: list[str] = Field(
        min_length=1,
        description="Files or glob patterns (`**` recurses), read in sorted order.",
        json_schema_extra=_or_one_string,
    )

    _paths_as_list = field_validator("paths", mode="before")(_as_list)


class JsonlSource(_FileSource):
    """One JSON object per line; `.jsonl.gz` is decompressed on the fly."""

    kind: Literal["jsonl"]


class ParquetSource(_FileSource):
    kind: Literal["parquet"]


class TextSource(_FileSource):
    """Plain UTF-8 text: each file is one document, or each non-empty line is one."""

    kind: Literal["text"]
    unit: Literal["document", "line"] = "document"


class TokenIdsSource(_FileSource):
    """Token ids: `.npy` (1-D: one document, 2-D: one per row), `.bin` (raw array of `dtype`),
    `.jsonl` or `.jsonl.gz` (one JSON list of ids per line)."""

    kind: Literal["token_ids"]
    dtype: Literal["uint16", "uint32", "int32", "int64"] | None = Field(
        None, description="Element type of `.bin` files (required for them)."
    )
    document_separator_id: int | None = Field(
        None,
        ge=0,
        description="Split 1-D arrays into documents at this id (the id itself is dropped).",
    )


class HuggingFaceSource(_Strict):
    """A `datasets` dataset: a `save_to_disk` folder (`path`), local `data_files`, or a Hub name."""

    kind: Literal["huggingface"]
    path: str | None = Field(None, description="Folder written by Dataset.save_to_disk.")
    name: str | None = Field(
        None,
        description="Hub dataset name, or a builder (json, parquet, csv, text) with data_files.",
    )
    config: str | None = Field(None, description="Dataset configuration name.")
    data_files: list[str] | None = Field(
        None,
        min_length=1,
        description="Local files or globs for a builder.",
        json_schema_extra=_or_one_string,
    )
    split: str = "train"
    revision: str | None = Field(None, description="Pinned Hub revision.")
    streaming: bool = Field(False, description="Iterate without materialising an Arrow cache.")

    _data_files_as_list = field_validator("data_files", mode="before")(_as_list)


SourceSpec = Annotated[
    HuggingFaceSource | JsonlSource | ParquetSource | TextSource | TokenIdsSource,
    Field(discriminator="kind"),
]

# --- records ------------------------------------------------------------------------------------


class TextRecords(_Strict):
    kind: Literal["text"]
    field: str = Field("text", description="Dotted path to the text (`meta.body`, `turns.0`).")


class ChatRecords(_Strict):
    kind: Literal["chat"]
    field: str = Field("messages", description="Dotted path to a list of {role, content}.")


class PromptCompletionRecords(_Strict):
    kind: Literal["prompt_completion"]
    prompt_field: str = "prompt"
    completion_field: str = "completion"


class TokensRecords(_Strict):
    kind: Literal["tokens"]
    field: str = Field("input_ids", description="Dotted path to a list of token ids.")
    loss_mask_field: str | None = Field(
        None, description="Dotted path to a 0/1 list as long as the ids (supervision: provided)."
    )


RecordsSpec = Annotated[
    ChatRecords | PromptCompletionRecords | TextRecords | TokensRecords,
    Field(discriminator="kind"),
]

# --- tokenizer ----------------------------------------------------------------------------------


class ByteLevelTokenizerSpec(_Strict):
    """Built in: ids 0..255 are bytes, 256 <|bos|>, 257 <|eos|>, 258 <|pad|>, 259 <|mask|>."""

    kind: Literal["byte_level"]
    special_tokens_in_text: Literal["text"] = Field(
        "text", description="Always text: byte-level text never produces a special token."
    )


class HuggingFaceTokenizerSpec(_Strict):
    """A local tokenizer folder loaded with transformers (never downloaded)."""

    kind: Literal["huggingface"]
    path: str = Field(description="Local folder with tokenizer.json / tokenizer_config.json.")
    mask_token: str | None = Field(None, description="Default: the tokenizer's mask token.")
    mask_token_id: int | None = Field(
        None,
        ge=0,
        le=MAX_TOKEN_ID,
        description="An id (may be past the vocabulary, e.g. a spare embedding row); at most "
        "4,294,967,295, the largest id an artifact's uint32 tokens hold.",
    )
    eos_token: str | None = Field(None, description="Default: the tokenizer's eos token.")
    pad_token: str | None = Field(None, description="Default: the tokenizer's pad token, or eos.")
    bos_token: str | None = Field(None, description="Default: the tokenizer's bos token.")
    special_tokens_in_text: Literal["text", "control", "error"] = Field(
        "text",
        description="What a special token's literal string in the data (`<|endoftext|>` typed "
        "into a document) becomes. text: ordinary text, never that token (the safe default); "
        "control: that special token; error: a bad record. Chat records go through the chat "
        "template, which cannot keep it as text: under text they are bad records too. Records "
        "that hold one are counted in the artifact's stats.special_token_text.",
    )


TokenizerSpec = Annotated[
    ByteLevelTokenizerSpec | HuggingFaceTokenizerSpec, Field(discriminator="kind")
]

# --- packing, output ----------------------------------------------------------------------------


MAX_SEQ_LEN = (
    RUNSPEC_MAX_SEQ_LEN  # 4M tokens, past any context trained here; stops runaway artifacts
)


class PackingSpec(_Strict):
    seq_len: PositiveInt = Field(
        le=MAX_SEQ_LEN,
        description="Tokens per training sequence (at most 4,194,304: every row, even the last, "
        "is written in full).",
    )
    block_size: PositiveInt = Field(description="Diffusion block size; seq_len is a multiple.")
    align: Literal["block", "none"] = Field(
        "block", description="block: every document starts on a block boundary (pad before)."
    )
    overflow: Literal["split", "truncate", "reject"] = Field(
        "split",
        description="split: documents flow across sequence boundaries; truncate/reject: every "
        "document lies in one sequence, longer ones are cut to seq_len or are an error.",
    )
    separator: Literal["eos", "none"] = Field(
        "eos", description="eos: end every document with the eos token (unless it already does)."
    )
    prepend_bos: bool = Field(
        False, description="Start every document with the bos token (unless it has one already)."
    )


class OutputSpec(_Strict):
    path: str = Field(description="Artifact folder to write.")
    overwrite: bool = Field(False, description="Replace an existing artifact (kept until success).")


class PrepareSpec(_Strict):
    """One data preparation job. Sections: source, records, tokenizer, supervision, packing, output."""

    source: SourceSpec
    records: RecordsSpec | None = Field(
        None, description="Default: tokens for a token_ids source, else text (field: text)."
    )
    tokenizer: TokenizerSpec
    supervision: Supervision = "full"
    packing: PackingSpec
    output: OutputSpec
    workers: PositiveInt | Literal["auto"] = Field(
        "auto", description="Tokenizer processes; 1 runs in-process; auto = usable CPUs (max 32)."
    )
    on_error: Literal["stop", "skip"] = Field(
        "stop", description="stop at the first bad record (file:line), or count and skip it."
    )

    @field_validator("workers", mode="wrap")
    @classmethod
    def _one_workers_error(cls, value: Any, handler: Any) -> Any:
        """One plain message instead of one per union member (`workers.constrained-int`)."""
        try:
            return handler(value)
        except ValidationError:
            raise PydanticCustomError(
                "workers", "Input should be a positive integer or 'auto'"
            ) from None

    @property
    def record_spec(self) -> ChatRecords | PromptCompletionRecords | TextRecords | TokensRecords:
        """`records`, with its default filled in from the source kind."""
        if self.records is not None:
            return self.records
        if self.source.kind == "token_ids":
            return TokensRecords(kind="tokens")
        return TextRecords(kind="text")


# --- loading ------------------------------------------------------------------------------------

_KINDS: dict[str, dict[str, type[BaseModel]]] = {
    "source": {
        "huggingface": HuggingFaceSource,
        "jsonl": JsonlSource,
        "parquet": ParquetSource,
        "text": TextSource,
        "token_ids": TokenIdsSource,
    },
    "records": {
        "chat": ChatRecords,
        "prompt_completion": PromptCompletionRecords,
        "text": TextRecords,
        "tokens": TokensRecords,
    },
    "tokenizer": {"byte_level": ByteLevelTokenizerSpec, "huggingface": HuggingFaceTokenizerSpec},
}
_NARROWED: dict[tuple[type[BaseModel] | None, ...], type[PrepareSpec]] = {}


def _narrowed_model(document: dict[str, Any], source: str) -> type[PrepareSpec]:
    """PrepareSpec with each tagged section narrowed to the model its `kind` names.

    Validating against the concrete model keeps error paths plain (`source.pathz`, not
    `source.jsonl.pathz`), so the shared formatter can suggest the nearest key.
    """
    chosen: dict[str, type[BaseModel] | None] = {}
    bad: list[str] = []
    for section, kinds in _KINDS.items():
        value = document.get(section)
        if not isinstance(value, dict):
            chosen[section] = None
            continue
        if "kind" not in value:  # pydantic's own words: "Unable to extract tag using ..."
            bad.append(f"  - {section}.kind: missing (valid: {', '.join(sorted(kinds))})")
            continue
        kind = value["kind"]
        if not isinstance(kind, str) or kind not in kinds:  # a list or a map is no kind either
            close = difflib.get_close_matches(str(kind), list(kinds), n=1, cutoff=0.5)
            guess = f"; did you mean {close[0]!r}?" if close else ""
            bad.append(
                f"  - {section}.kind: unknown kind {kind!r}{guess} (valid: {', '.join(sorted(kinds))})"
            )
            continue
        chosen[section] = kinds[kind]
    if bad:
        count = len(bad)
        raise DllmError(
            f"{source} has {count} problem{'s' if count > 1 else ''}:\n" + "\n".join(bad),
            hint="see docs/data.md for every source, records and tokenizer kind",
        )
    key = tuple(chosen.values())
    if key not in _NARROWED:
        fields: dict[str, Any] = {}
        for section, model in chosen.items():
            if model is None:
                continue
            default = None if section == "records" else ...
            annotation = model | None if section == "records" else model
            fields[section] = (annotation, default)
        _NARROWED[key] = create_model("PrepareSpec", __base__=PrepareSpec, **fields)
    return _NARROWED[key]


def _sections_of(document: Any, model: type[BaseModel], other: type[BaseModel]) -> list[str]:
    """The top-level keys of `document` when all are `model`'s and none is `other`'s, else []."""
    if not isinstance(document, dict) or not document:
        return []
    keys = {str(k) for k in document}
    if keys <= set(model.model_fields) and not keys & set(other.model_fields):
        return sorted(keys)
    return []


def check_not_a_runspec(document: Any, source: str) -> None:
    """The starter project has a train.yaml beside its prepare.yaml: given one for the other,
    each of its sections was an unknown key with a wrong 'did you mean' (training: packing)."""
    from turbo_dllm.config.runspec import RunSpec

    if sections := _sections_of(document, RunSpec, PrepareSpec):
        raise DllmError(
            f"{source} is a training config (a RunSpec: {', '.join(sections)}), not a prepare.yaml",
            hint="`dllm data prepare --config` reads a prepare.yaml (source, tokenizer, "
            "packing, output); `dllm init DIR` writes one",
        )


def check_not_a_prepare_spec(document: Any, source: str, hint: str | None = None) -> None:
    """The reverse mix-up: a prepare.yaml where a RunSpec (train.yaml) is read; `hint` says
    what the command reads the RunSpec for."""
    from turbo_dllm.config.runspec import RunSpec

    if sections := _sections_of(document, PrepareSpec, RunSpec):
        raise DllmError(
            f"{source} is a data preparation config ({', '.join(sections)}), not a training "
            "config (RunSpec)",
            hint=hint
            or "--config names the RunSpec (train.yaml) whose data.seq_len, objective and "
            "model the artifact must fit",
        )


def load_training_spec(
    path: str | Path, overrides: list[str] | None = None, world_size: int | None = None
):
    """`config.load.load_runspec` for a command handed a RunSpec file (train, launch, config
    validate...): a prepare.yaml given there (the two sit side by side in a project) is said as
    such, not as its sections listed as unknown keys with wrong guesses ('tokenizer: did you
    mean optimizer?'). Here, not in `load_runspec`: config sits below data."""
    import shlex

    from turbo_dllm.config.load import load_runspec, read_yaml

    check_not_a_prepare_spec(
        read_yaml(path),
        str(path),
        hint=f"--config names a RunSpec (train.yaml); run this file with "
        f"`dllm data prepare --config {shlex.quote(str(path))}`",
    )
    return load_runspec(path, overrides, world_size=world_size)


def validate_prepare_document(
    document: dict[str, Any], source: str, base_dir: Path | None = None
) -> PrepareSpec:
    """Validate a parsed prepare document; relative paths become absolute against `base_dir`."""
    from turbo_dllm.config.load import load_model

    check_not_a_runspec(document, source)
    try:
        spec = load_model(_narrowed_model(document, source), document, source)
    except DllmError as error:
        raise DllmError(
            error.message,
            hint="`dllm data schema` and docs/data.md describe every prepare.yaml field",
        ) from None
    if base_dir is not None:
        spec = _resolve_paths(spec, base_dir)
    found = problems(spec)
    if found:
        lines = "\n".join(f"  - {p}" for p in found)
        raise DllmError(
            f"{source} has {len(found)} problem{'s' if len(found) > 1 else ''}:\n{lines}",
            hint="docs/data.md says which fields go together (records and supervision, "
            "packing sizes, source options)",
        )
    return spec


def load_prepare_spec(path: str | Path, overrides: list[str] | None = None) -> PrepareSpec:
    """Read, override (`--set k=v`), validate and path-resolve a prepare.yaml."""
    from turbo_dllm.config.load import apply_overrides, command_line_paths, read_yaml

    path = Path(path)
    document = apply_overrides(read_yaml(path), overrides or [])
    # A --set path is the shell's (against the current folder), as for RunSpecs; one written
    # in the file stays relative to the file (`_resolve_paths`).
    command_line_paths(document, overrides or [], _PATH_FIELDS, Path.cwd())
    return validate_prepare_document(document, str(path), path.resolve().parent)


# The prepare.yaml fields that name files (`_resolve_paths`).
_PATH_FIELDS = (
    "source.path",
    "source.data_files",
    "source.paths",
    "output.path",
    "tokenizer.path",
)


def _resolve_paths(spec: PrepareSpec, base_dir: Path) -> PrepareSpec:
    from turbo_dllm.config.load import absolute_path

    def absolute(value: str) -> str:
        return absolute_path(value, base_dir)

    source = spec.source
    update: dict[str, Any] = {}
    if isinstance(source, HuggingFaceSource):
        if source.path is not None:
            update["path"] = absolute(source.path)
        if source.data_files is not None:
            update["data_files"] = [absolute(p) for p in source.data_files]
    else:
        update["paths"] = [absolute(p) for p in source.paths]
    changes: dict[str, Any] = {
        "source": source.model_copy(update=update),
        "output": spec.output.model_copy(update={"path": absolute(spec.output.path)}),
    }
    if isinstance(spec.tokenizer, HuggingFaceTokenizerSpec):
        changes["tokenizer"] = spec.tokenizer.model_copy(
            update={"path": absolute(spec.tokenizer.path)}
        )
    return spec.model_copy(update=changes)


# --- cross-section rules ------------------------------------------------------------------------

_SUPERVISION_FOR_RECORDS = {
    "text": {"full"},
    "chat": {"full", "assistant_only"},
    "prompt_completion": {"full", "completion_only"},
    "tokens": {"full", "provided"},
}


def problems(spec: PrepareSpec) -> list[str]:
    """Every rule that relates several sections, as `path: message` lines."""
    found: list[str] = []
    source, records, packing = spec.source, spec.record_spec, spec.packing

    if packing.seq_len % packing.block_size:
        found.append(
            f"packing.seq_len: {packing.seq_len} is not a multiple of "
            f"packing.block_size ({packing.block_size})"
        )
    allowed = _SUPERVISION_FOR_RECORDS[records.kind]
    if spec.supervision not in allowed:
        found.append(
            f"supervision: {spec.supervision!r} does not apply to {records.kind} records "
            f"(allowed: {', '.join(sorted(allowed))})"
        )
    if spec.supervision == "provided" and isinstance(records, TokensRecords):
        if records.loss_mask_field is None:
            found.append("records.loss_mask_field: supervision 'provided' needs a loss mask field")
    if isinstance(source, TextSource) and not (
        isinstance(records, TextRecords) and records.field == "text"
    ):
        found.append(
            "records: a text source gives plain text; use records {kind: text} (or leave it out)"
        )
    if isinstance(source, TokenIdsSource):
        if not isinstance(records, TokensRecords) or records.field != "input_ids":
            found.append(
                "records: a token_ids source gives token ids; use records {kind: tokens} "
                "(or leave it out); for JSON objects with ids use source kind jsonl"
            )
        elif records.loss_mask_field is not None:
            found.append(
                "records.loss_mask_field: a token_ids source has no loss masks; use a jsonl or "
                "parquet source with records {kind: tokens, loss_mask_field: ...}"
            )
        if any(p.endswith(".bin") for p in source.paths) and source.dtype is None:
            found.append("source.dtype: .bin token files need their element type")
    if isinstance(source, HuggingFaceSource):
        if (source.path is None) == (source.name is None and source.data_files is None):
            found.append(
                "source: set exactly one of source.path (a save_to_disk folder) or "
                "source.name / source.data_files"
            )
        if source.path is not None and source.data_files is not None:
            found.append("source.data_files: not used with source.path (a save_to_disk folder)")
    if isinstance(spec.tokenizer, HuggingFaceTokenizerSpec):
        tok = spec.tokenizer
        if tok.mask_token is not None and tok.mask_token_id is not None:
            found.append("tokenizer: set at most one of mask_token and mask_token_id")
    return found
