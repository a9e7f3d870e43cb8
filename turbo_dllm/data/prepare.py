"""`dllm data prepare`: one PrepareSpec -> one verified artifact folder.

Reads the source in the main process, tokenizes in a pool (`pipeline`), packs the results in
order (`packing`) while streaming the arrays into a staging folder (`writer`), then writes the
manifest with the fingerprint and renames the folder into place. Any failure, including Ctrl-C,
leaves no artifact and the previous one (if any) untouched.
"""

from __future__ import annotations

import os
import re
import shutil
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from turbo_dllm.data.artifact import ARRAY_FILES, DataManifest, compute_fingerprint
from turbo_dllm.data.pipeline import ChunkResult, TokenizePool, WorkerConfig
from turbo_dllm.data.sources import open_source
from turbo_dllm.data.spec import (
    MAX_TOKEN_ID,
    PrepareSpec,
    PromptCompletionRecords,
    TextSource,
    TokensRecords,
)
from turbo_dllm.data.summary import describe_dropped
from turbo_dllm.data.tokenizers import has_generation_markers, load_tokenizer
from turbo_dllm.data.writer import ArrayWriter, check_target, staged_artifact, write_json
from turbo_dllm.errors import DllmError
from turbo_dllm.fsutil import fsync_dir, sha256_file
from turbo_dllm.sigterm import unwinding_on_sigterm

__all__ = ["PrepareResult", "prepare", "resolve_workers", "token_dtype_for"]

_MAX_AUTO_WORKERS = 32


@dataclass(frozen=True)
class PrepareResult:
    path: Path
    manifest: DataManifest
    seconds: float
    workers: int

    @property
    def tokens_per_second(self) -> float:
        return self.manifest.stats.tokens / max(self.seconds, 1e-9)


def resolve_workers(workers: int | str) -> int:
    """`auto`: one tokenizer process per CPU this process may run on (at most 32)."""
    if workers == "auto":
        try:
            usable = len(os.sched_getaffinity(0))
        except AttributeError:  # not on Linux
            usable = os.cpu_count() or 1
        return max(1, min(usable, _MAX_AUTO_WORKERS))
    return int(workers)


def token_dtype_for(vocab_size: int, special_tokens: dict[str, int]) -> str:
    """The artifact's token type: uint16 when every id fits (vocab <= 65536), else uint32.

    A vocabulary (or a mask_token_id, which widens it) past uint32 is refused before anything
    is written: its ids would wrap around when stored.
    """
    if vocab_size <= 1 << 16:
        return "uint16"
    if vocab_size <= MAX_TOKEN_ID + 1:
        return "uint32"
    largest = max(special_tokens.items(), key=lambda item: item[1])
    raise DllmError(
        f"a vocabulary of {vocab_size:,} ids (the {largest[0]} token is {largest[1]:,}) does not "
        f"fit the artifact's tokens: uint32 holds ids up to {MAX_TOKEN_ID:,}",
        hint="set tokenizer.mask_token_id to a spare id the model's embedding covers (below "
        "its vocab_size), or tokenizer.mask_token to an unused token",
    )


def _columns(spec: PrepareSpec) -> list[str] | None:
    """Top-level columns a tabular source must read (others are never decoded)."""
    records = spec.record_spec
    if isinstance(records, PromptCompletionRecords):
        paths = [records.prompt_field, records.completion_field]
    elif isinstance(records, TokensRecords):
        paths = [records.field] + ([records.loss_mask_field] if records.loss_mask_field else [])
    else:
        paths = [records.field]
    return sorted({p.split(".")[0] for p in paths})


def _check_chat_template(spec: PrepareSpec, tokenizer) -> None:
    if spec.record_spec.kind != "chat" or tokenizer.kind != "huggingface":
        return
    template = tokenizer.chat_template
    if not template:
        raise DllmError(
            f"chat records need a chat template, and the tokenizer at {spec.tokenizer.path!r} "
            "has none",
            hint="add a chat_template to its tokenizer_config.json (or chat_template.jinja)",
        )
    if spec.supervision == "assistant_only" and not has_generation_markers(template):
        raise DllmError(
            "supervision assistant_only needs a chat template that marks assistant spans with "
            "{% generation %} ... {% endgeneration %}; this template has no such markers, and "
            "turbo-dllm never guesses the spans",
            hint="use a template with generation markers, or supervision: full",
        )


class _Progress:
    """Progress on stderr: a live rich bar on a terminal, else a plain line every 30 s (logs)."""

    LOG_EVERY_S = 30.0

    def __init__(self, total: int | None, unit: str, enabled: bool) -> None:
        self.started = self._logged = time.perf_counter()
        self.tokens = 0
        self.documents = 0
        self.enabled = enabled
        self._bar = None
        if not enabled or not sys.stderr.isatty():
            return
        from rich.console import Console
        from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

        self._bar = Progress(
            TextColumn("[bold]prepare[/]"),
            BarColumn(),
            TextColumn("{task.percentage:>5.1f}%" if total else "{task.completed:,} " + unit),
            TextColumn("{task.fields[documents]:,} docs"),
            TextColumn("{task.fields[tokens]:,} tokens"),
            TextColumn("{task.fields[rate]}"),
            TimeElapsedColumn(),
            console=Console(stderr=True),
        )
        self._task = self._bar.add_task("prepare", total=total, documents=0, tokens=0, rate="")
        self._bar.start()

    def advance(self, units: int, result: ChunkResult) -> None:
        self.tokens += int(result.lengths.sum())
        self.documents += len(result.lengths) - result.continues_previous
        if not self.enabled:
            return
        now = time.perf_counter()
        rate = f"{self.tokens / max(now - self.started, 1e-9):,.0f} tok/s"
        if self._bar is not None:
            self._bar.update(
                self._task, advance=units, documents=self.documents, tokens=self.tokens, rate=rate
            )
        elif now - self._logged >= self.LOG_EVERY_S:
            self._logged = now
            print(
                f"prepare: {self.documents:,} documents, {self.tokens:,} tokens, {rate}",
                file=sys.stderr,
                flush=True,
            )

    def close(self) -> None:
        if self._bar is not None:
            self._bar.stop()


def prepare(spec: PrepareSpec, *, progress: bool = True) -> PrepareResult:
    """Run one data preparation job; return the published artifact's manifest."""
    started = time.perf_counter()
    target = Path(spec.output.path).resolve()
    check_target(target, spec.output.overwrite)  # fail before any work
    tokenizer = load_tokenizer(spec.tokenizer)
    _check_chat_template(spec, tokenizer)
    if spec.packing.prepend_bos and "bos" not in tokenizer.special_tokens:
        raise DllmError(
            "packing.prepend_bos is set but the tokenizer has no bos token",
            hint="set tokenizer.bos_token, or packing.prepend_bos: false",
        )
    separator = getattr(spec.source, "document_separator_id", None)
    if separator is not None and separator >= tokenizer.tokenizer_vocab_size:
        # No valid id file holds it: every file would read as one document, silently.
        raise DllmError(
            f"source.document_separator_id {separator:,} is outside the tokenizer's vocabulary "
            f"(0..{tokenizer.tokenizer_vocab_size - 1:,}), so no file of its token ids holds it",
            hint="set source.document_separator_id to the id that separates the documents (the "
            "tokenizer's eos, usually), or leave it unset for files of one document each",
        )
    token_dtype = token_dtype_for(tokenizer.vocab_size, tokenizer.special_tokens)
    source = open_source(
        spec.source, _columns(spec), output=target, text_ids=tokenizer.text_vocab_size
    )
    workers = resolve_workers(spec.workers)
    config = WorkerConfig(
        tokenizer=spec.tokenizer,
        records=spec.record_spec,
        supervision=spec.supervision,
        seq_len=spec.packing.seq_len,
        overflow=spec.packing.overflow,
        separator=spec.packing.separator,
        prepend_bos=spec.packing.prepend_bos,
        special_tokens=tokenizer.special_tokens,
        vocab_size=tokenizer.tokenizer_vocab_size,
        token_dtype=token_dtype,
        on_error=spec.on_error,
    )
    with (
        unwinding_on_sigterm(),  # SIGTERM too removes the staging folder, then ends dllm
        _os_errors_explained(),
        staged_artifact(target, spec.output.overwrite) as staging,
    ):
        fields = _write_arrays(spec, config, tokenizer, source, staging, workers, progress)
        fields.update(
            num_sequences=fields["arrays"]["tokens"]["shape"][0],
            seq_len=spec.packing.seq_len,
            block_size=spec.packing.block_size,
            vocab_size=tokenizer.vocab_size,
            special_tokens=dict(sorted(tokenizer.special_tokens.items())),
            tokenizer=tokenizer.identity(),
            supervision=spec.supervision,
            packing={
                "align": spec.packing.align,
                "overflow": spec.packing.overflow,
                "separator": spec.packing.separator,
                "prepend_bos": spec.packing.prepend_bos,
            },
            source={**source.provenance(), "records": spec.record_spec.kind},
            tokenizer_files=_copy_tokenizer(tokenizer.files(), staging / "tokenizer"),
        )
        fields["fingerprint"] = compute_fingerprint(fields)
        manifest = DataManifest.model_validate(
            {"format": "turbo_dllm.data.v1", "producer": _producer(), **fields}
        )
        write_json(staging / "manifest.json", manifest.model_dump(mode="json"))
    return PrepareResult(target, manifest, time.perf_counter() - started, workers)


@contextmanager
def _os_errors_explained() -> Iterator[None]:
    """A disk that fills up or a file that vanishes mid-job is the user's to fix, not a bug."""
    try:
        yield
    except OSError as error:
        where = f"{error.filename}: " if error.filename else ""
        raise DllmError(
            f"data prepare failed: {where}{error.strerror or error}",
            hint="check free space and permissions; no artifact was written",
        ) from None


def _write_arrays(
    spec: PrepareSpec,
    config: WorkerConfig,
    tokenizer,
    source,
    staging: Path,
    workers: int,
    progress: bool,
) -> dict[str, Any]:
    from turbo_dllm.data.packing import Packer

    seq_len = spec.packing.seq_len
    tokens_out = ArrayWriter(staging / ARRAY_FILES["tokens"], config.token_dtype, (seq_len,))
    mask_out = ArrayWriter(staging / ARRAY_FILES["loss_mask"], "uint8", (seq_len,))

    def write_rows(tokens: np.ndarray, mask: np.ndarray) -> None:
        tokens_out.write(tokens)
        mask_out.write(mask)

    packer = Packer(
        seq_len=seq_len,
        block_size=spec.packing.block_size,
        align=spec.packing.align == "block",
        split=spec.packing.overflow == "split",
        pad_id=config.special_tokens["pad"],
        token_dtype=config.token_dtype,
        write_rows=write_rows,
    )
    counts = dict(
        records=0,
        empty_documents=0,
        truncated_documents=0,
        truncated_tokens=0,
        dropped_unsupervised_documents=0,
        special_token_text=0,
        supervised_tokens=0,
    )
    skipped: dict[str, int] = {}
    try:
        with TokenizePool(config, workers, tokenizer) as pool:
            bar = _Progress(source.total, source.unit, progress)
            try:
                for chunk, result in pool.results(source.chunks()):
                    if result.error is not None:
                        raise DllmError(result.error, hint=_bad_record_hint(spec, result))
                    packer.add(
                        result.tokens, result.loss_mask, result.lengths, result.continues_previous
                    )
                    counts["records"] += result.records
                    counts["empty_documents"] += result.empty_documents
                    counts["truncated_documents"] += result.truncated_documents
                    counts["truncated_tokens"] += result.truncated_tokens
                    counts["dropped_unsupervised_documents"] += result.dropped_unsupervised
                    counts["special_token_text"] += result.special_token_text
                    counts["supervised_tokens"] += int(result.loss_mask.sum(dtype=np.int64))
                    for reason, n in result.skipped.items():
                        skipped[reason] = skipped.get(reason, 0) + n
                    bar.advance(chunk.advance, result)
            finally:
                bar.close()
        documents = packer.finish()
    except BaseException:
        tokens_out.abort()
        mask_out.abort()
        raise
    if not len(documents):
        detail = f"; skipped: {_format_counts(skipped)}" if skipped else ""
        if dropped := describe_dropped(
            counts["empty_documents"], counts["dropped_unsupervised_documents"]
        ):
            detail += f"; dropped: {dropped}"
        raise DllmError(
            f"no documents: {counts['records']} record{'s' if counts['records'] != 1 else ''} "
            f"read, none became a document{detail}",
            hint="check the source paths, records.field and supervision",
        )
    docs_out = ArrayWriter(staging / ARRAY_FILES["documents"], "int64", (2,))
    docs_out.write(documents)
    arrays = {
        "tokens": tokens_out.finish(),
        "loss_mask": mask_out.finish(),
        "documents": docs_out.finish(),
    }
    total_tokens = int(documents[:, 1].sum())
    stats = {
        **counts,
        "documents": len(documents),
        "tokens": total_tokens,
        "padding_tokens": packer.rows * seq_len - total_tokens,
        "skipped": dict(sorted(skipped.items())),
    }
    return {"arrays": arrays, "stats": stats}


def _bad_record_hint(spec: PrepareSpec, result: ChunkResult) -> str:
    skip = ", or set on_error: skip to count and skip bad records"
    if spec.on_error == "skip":  # (under skip: a document of token ids read in parts)
        skip = ""
    if result.error_reason == "mask_token_in_data" and spec.record_spec.kind != "tokens":
        # Not the record's fault: the tokenizer encodes ordinary text to the mask token, and
        # would do so in record after record.
        how = (
            "the tokenizer encodes this text to the mask token, so the mask token is one that "
            "text holds: set tokenizer.mask_token to an unused special token of the tokenizer, "
            "or tokenizer.mask_token_id to a spare id past its vocabulary"
        )
        if spec.tokenizer.special_tokens_in_text == "control":
            how += (
                " (or tokenizer.special_tokens_in_text: text, which keeps a special token's "
                "literal string text)"
            )
        return how + skip.replace("bad records", "such records")
    if (
        result.error_reason == "too_large"
        and isinstance(spec.source, TextSource)
        and spec.source.unit == "document"
    ):
        # A whole file is the document (an enwik8 or a concatenated corpus): the limit bounds
        # what one document may hold in memory.
        return (
            "under source.unit: document each file is one document, read whole: cut the file "
            "into smaller ones, or set source.unit: line (one document per line)" + skip
        )
    if result.error_reason == "missing_field" and (named := _misnamed_field(spec, result.error)):
        return named + "; else fix that record" + skip
    return "fix that record" + skip


_MISSING_FIELD = re.compile(r"missing field '([^']+)': .* has no '([^']+)' \(keys: ([^)]*)\)")


def _misnamed_field(spec: PrepareSpec, error: str | None) -> str | None:
    """A records field that names a key the record lacks, where the record has one of a close
    name (`records.field: txt`, the records holding `text`): most likely the spec's misspelling,
    not every record's fault, yet the hint said only "fix that record"."""
    import difflib

    found = _MISSING_FIELD.search(error or "")
    if found is None:
        return None
    path, part, keys = found.groups()
    records = spec.record_spec
    names = [n for n, v in records.model_dump().items() if n != "kind" and v == path]
    close = difflib.get_close_matches(part, [k.strip() for k in keys.split(",")], n=1)
    if not names or not close:
        return None
    fixed = ".".join([*path.split(".")[:-1], close[0]]) if path.endswith(part) else None
    if fixed is None:
        return None
    return f"did you mean records.{names[0]}: {fixed}? (the record has {close[0]!r})"


def _format_counts(counts: dict[str, int]) -> str:
    return ", ".join(f"{reason} {n}" for reason, n in sorted(counts.items()))


def _copy_tokenizer(files: dict[str, Path], folder: Path) -> dict[str, dict[str, Any]]:
    """Copy the tokenizer's files (by their path in its folder: a named chat template's is
    additional_chat_templates/<name>.jinja) into `folder`; the manifest's record of each."""
    if not files:
        return {}
    folder.mkdir()
    out = {}
    for name, file in files.items():
        copy = folder / name
        if not copy.parent.is_dir():
            copy.parent.mkdir()
        shutil.copyfile(file, copy)
        with open(copy, "rb") as handle:  # on disk before the artifact is published
            os.fsync(handle.fileno())
        out[name] = {"bytes": copy.stat().st_size, "sha256": sha256_file(copy)}
    for inner in sorted({(folder / name).parent for name in files}, reverse=True):
        fsync_dir(inner)
    return out


def _producer() -> str:
    from turbo_dllm import __version__

    return f"turbo-dllm {__version__}"
