"""Tokenize raw chunks into finished documents, in a process pool, in input order.

A `ChunkProcessor` (one per worker) turns a `RawChunk` into a `ChunkResult`: the chunk's
documents as one flat token array + loss mask + lengths, each document already carrying its bos /
eos and cut to `seq_len` when the packing asks for it. Everything past record extraction is
vectorised numpy, so a worker spends its time in the tokenizer. `TokenizePool` runs the
processor over a chunk stream with N processes and yields results in submission order with a
bounded number in flight, so the output never depends on the worker count and memory stays flat.
"""

from __future__ import annotations

import multiprocessing
import os
import signal
import sys
from collections import Counter, deque
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from turbo_dllm.data.records import BadRecord, Extracted, extract
from turbo_dllm.data.sources import RawChunk

__all__ = ["ChunkProcessor", "ChunkResult", "TokenizePool", "WorkerConfig"]


@dataclass(frozen=True)
class WorkerConfig:
    """Everything a worker needs, picklable (pydantic sections + plain values)."""

    tokenizer: Any  # prepare.yaml tokenizer section
    records: Any  # prepare.yaml records section (defaults filled in)
    supervision: str
    seq_len: int
    overflow: str
    separator: str
    prepend_bos: bool
    special_tokens: dict[str, int]
    vocab_size: int  # the tokenizer's own ids, not a mask_token_id past them: data holds no other
    token_dtype: str
    on_error: str


@dataclass
class ChunkResult:
    tokens: np.ndarray  # flat, token_dtype
    loss_mask: np.ndarray  # flat, uint8
    lengths: np.ndarray  # int64, one per document
    records: int = 0
    empty_documents: int = 0
    truncated_documents: int = 0
    truncated_tokens: int = 0
    dropped_unsupervised: int = 0
    special_token_text: int = 0  # documents whose text holds a special token's literal string
    skipped: dict[str, int] = field(default_factory=dict)
    error: str | None = None  # "where: message" of the first bad record (on_error: stop)
    error_reason: str | None = None  # its reason code (`mask_token_in_data`, ...)
    # The first document goes on where the previous result's last one stopped (a later piece
    # of a long document of token ids, RawChunk.piece): one document, no gap between.
    continues_previous: bool = False


class ChunkProcessor:
    def __init__(self, config: WorkerConfig, tokenizer=None) -> None:
        from turbo_dllm.data.tokenizers import load_tokenizer

        self.config = config
        self.tokenizer = tokenizer if tokenizer is not None else load_tokenizer(config.tokenizer)

    # -- stage 1: records -> (flat ids, flat mask, lengths, record index per document) ---------

    def _assemble(
        self,
        values: list[tuple[int, Extracted]],
        errors: dict[int, tuple[str, str]],
        literals: dict[int, str],
    ) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        """Tokenize; `literals` gets the special token literal each record's text holds, if any."""
        config, tok = self.config, self.tokenizer
        kind = config.records.kind
        index = np.fromiter((i for i, _ in values), dtype=np.int64, count=len(values))
        if kind == "text":
            texts = [v.text for _, v in values]
            for (i, _), found in zip(values, tok.special_text(texts), strict=True):
                if found:
                    literals[i] = found
            flat, lengths = tok.encode_texts(texts)
            return flat, np.ones(len(flat), np.uint8), lengths, index
        if kind == "prompt_completion":
            texts = [t for _, v in values for t in v.prompt_completion]
            found = tok.special_text(texts)
            for k, (i, _) in enumerate(values):
                if found[2 * k] or found[2 * k + 1]:
                    literals[i] = found[2 * k] or found[2 * k + 1]
            flat, pieces = tok.encode_texts(texts)
            prompt_mask = 1 if config.supervision == "full" else 0
            flags = np.tile(np.array([prompt_mask, 1], np.uint8), len(values))
            mask = np.repeat(flags, pieces)
            lengths = pieces[0::2] + pieces[1::2]
            if config.supervision == "completion_only":
                for (i, _), n in zip(values, pieces[1::2], strict=True):
                    if n == 0:
                        errors[i] = ("no_supervised_tokens", "empty completion: nothing to learn")
            return flat, mask, lengths, index
        ids: list[np.ndarray] = []
        masks: list[np.ndarray] = []
        for i, value in values:
            if kind == "chat":
                said = [m[key] for m in value.messages for key in ("role", "content")]
                found = next((f for f in tok.special_text(said) if f), None)
                if found:
                    literals[i] = found
                want = config.supervision == "assistant_only"
                try:
                    doc, mask = tok.encode_chat(value.messages, assistant_mask=want)
                except Exception as error:  # Jinja raises TemplateError / TypeError / ...
                    errors[i] = ("bad_chat", f"the chat template failed: {error}")
                    doc, mask = np.zeros(0, np.int64), None
                if want and mask is not None and len(doc) and not mask.any():
                    errors[i] = (
                        "no_supervised_tokens",
                        "no assistant turn: the chat template marked no assistant tokens",
                    )
            else:
                doc, mask = value.ids, value.loss_mask
            ids.append(doc)
            masks.append(np.ones(len(doc), np.uint8) if mask is None else mask)
        lengths = np.fromiter(map(len, ids), dtype=np.int64, count=len(ids))
        flat = np.concatenate(ids) if ids else np.zeros(0, np.int64)
        return flat, (np.concatenate(masks) if masks else np.zeros(0, np.uint8)), lengths, index

    # -- stage 2: checks and finishing, vectorised over documents ------------------------------

    def process(self, chunk: RawChunk) -> ChunkResult:
        config = self.config
        # A piece of a long document (one item): bos only before its first piece, eos only
        # after its last. Such a document is longer than any row, so `truncate` keeps part of
        # its first piece and `reject` refuses it there: the later pieces then add nothing.
        offset, total = chunk.piece or (0, 0)
        later_piece = offset > 0
        if later_piece and config.overflow == "reject":
            return ChunkResult(np.zeros(0, config.token_dtype), np.zeros(0, np.uint8), _NONE)
        errors: dict[int, tuple[str, str]] = {}
        values: list[tuple[int, Extracted]] = []
        for i, item in enumerate(chunk.items):
            try:
                values.append((i, extract(chunk.payload, item, config.records, config.supervision)))
            except BadRecord as error:
                errors[i] = (error.reason, error.message)
        literals: dict[int, str] = {}
        flat, mask, lengths, record_of = self._assemble(values, errors, literals)
        result = ChunkResult(flat, mask, lengths, records=len(chunk.items) - later_piece)
        self._refuse_special_text(literals, errors)

        starts = np.concatenate([[0], np.cumsum(lengths)[:-1]]).astype(np.int64)
        keep = np.ones(len(lengths), bool)
        for d, i in enumerate(record_of):
            if i in errors:
                keep[d] = False
        empty = keep & (lengths == 0)
        result.empty_documents = int(empty.sum())
        keep &= ~empty

        # Token ids must fit the vocabulary and never be the mask token.
        specials = config.special_tokens
        bad = (flat < 0) | (flat >= config.vocab_size) | (flat == specials["mask"])
        if bad.any():
            positions = np.flatnonzero(bad)
            docs, first = np.unique(
                np.searchsorted(starts, positions, side="right") - 1, return_index=True
            )
            for d, position in zip(docs, positions[first], strict=True):
                i = int(record_of[d])
                if not keep[d]:
                    continue
                value = int(flat[position])
                if value == specials["mask"]:
                    errors[i] = (
                        "mask_token_in_data",
                        f"token {value} is the mask token; data must not contain it",
                    )
                else:
                    errors[i] = (
                        "token_out_of_range",
                        f"token id {value} is outside the vocabulary (0..{config.vocab_size - 1})",
                    )
                keep[d] = False
        if config.prepend_bos:
            # A document that starts with bos already (a chat template that writes
            # {{ bos_token }}, ids from a tokenizer that adds it) keeps that one, unsupervised
            # like the bos prepend_bos adds: never two in a row.
            leading = np.zeros(len(lengths), bool)
            nonempty = np.flatnonzero(lengths)
            leading[nonempty] = flat[starts[nonempty]] == specials["bos"]
            leading[: int(later_piece)] = False  # a later piece goes on mid-document
            if leading.any():
                mask = mask.copy()
                mask[starts[leading]] = 0
        if config.supervision != "full":
            supervised = _segment_sums(mask, lengths)
            for d in np.flatnonzero(keep & (supervised == 0)):
                i = int(record_of[d])
                errors.setdefault(i, ("no_supervised_tokens", "no supervised tokens"))
                keep[d] = False

        flat, mask, lengths, record_of = _select(flat, mask, lengths, record_of, keep)
        ends_here = chunk.piece is None or offset + len(chunk.items[0]) >= total
        flat, mask, lengths = self._add_specials(flat, mask, lengths, not later_piece, ends_here)
        if config.overflow != "split":
            # A piece's document is longer than PIECE_IDS, so than any row, whatever the piece.
            too_long = lengths > config.seq_len if chunk.piece is None else lengths >= 0
            if config.overflow == "reject":
                for d in np.flatnonzero(too_long):
                    errors[int(record_of[d])] = (
                        "too_long",
                        f"{total or int(lengths[d]):,} tokens, more than packing.seq_len "
                        f"({config.seq_len:,}); set packing.overflow to truncate or split",
                    )
                flat, mask, lengths, record_of = _select(flat, mask, lengths, record_of, ~too_long)
            elif later_piece:  # past the part of its document that `truncate` keeps
                result.truncated_tokens = int(lengths.sum())
                flat, mask, lengths = flat[:0], mask[:0], lengths[:0]
            elif too_long.any():
                result.truncated_documents = int(too_long.sum())
                result.truncated_tokens = int((lengths[too_long] - config.seq_len).sum())
                flat, mask, lengths = _truncate(flat, mask, lengths, config.seq_len)
                useful = _segment_sums(mask, lengths) > 0
                result.dropped_unsupervised = int((~useful).sum())
                flat, mask, lengths, record_of = _select(flat, mask, lengths, record_of, useful)

        if literals:
            result.special_token_text = int(np.isin(record_of, list(literals)).sum())
        # A bad piece cannot be skipped: the pieces before it are written already.
        bad_piece = chunk.piece is not None and any(r != "too_long" for r, _ in errors.values())
        if errors and (config.on_error == "stop" or bad_piece):
            first = min(errors)
            result.error = f"{chunk.where(first)}: {errors[first][1]}"
            result.error_reason = errors[first][0]
            if bad_piece and config.on_error != "stop":
                result.error += (
                    f" (a document of {total:,} token ids, read in parts: on_error: skip "
                    "cannot leave it out once its first parts are written)"
                )
        result.skipped = dict(Counter(reason for reason, _ in errors.values()))
        result.tokens = flat.astype(config.token_dtype)
        result.loss_mask = mask.astype(np.uint8, copy=False)
        result.lengths = lengths
        result.continues_previous = later_piece and len(lengths) > 0
        return result

    def _refuse_special_text(
        self, literals: dict[int, str], errors: dict[int, tuple[str, str]]
    ) -> None:
        """Make records holding a special token's literal string bad records where the spec's
        `special_tokens_in_text` says so (or where a chat template cannot keep it as text)."""
        mode = self.config.tokenizer.special_tokens_in_text
        chat = self.config.records.kind == "chat"
        if mode == "control" or not literals:
            return
        for i, found in list(literals.items()):
            if i in errors:
                continue
            if mode == "error":
                errors[i] = (
                    "special_token_text",
                    f"the text holds {found!r}, the literal string of a special token "
                    "(tokenizer.special_tokens_in_text: error)",
                )
            elif chat:
                errors[i] = (
                    "special_token_text",
                    f"a message holds {found!r}, the literal string of a special token, which "
                    "the chat template would turn into that token; set "
                    "tokenizer.special_tokens_in_text: control to accept it as the token",
                )
            else:
                continue
            del literals[i]

    def _add_specials(
        self,
        flat: np.ndarray,
        mask: np.ndarray,
        lengths: np.ndarray,
        first_starts: bool = True,
        last_ends: bool = True,
    ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Prepend bos (unsupervised) and append eos (supervised like the last token), each
        unless the document has it already; not before the first document unless
        `first_starts`, nor after the last unless `last_ends` (a piece of a longer document).
        Every document here holds at least one token."""
        config = self.config
        if not len(lengths):
            return flat, mask, lengths
        ends = np.cumsum(lengths)
        old_starts = ends - lengths
        if config.prepend_bos:  # not before a document that starts with bos already
            bos = (flat[old_starts] != config.special_tokens["bos"]).astype(np.int64)
        else:
            bos = np.zeros(len(lengths), np.int64)
        bos[0] *= first_starts
        eos_id = config.special_tokens["eos"]
        if config.separator == "eos":
            need_eos = (flat[ends - 1] != eos_id).astype(np.int64)
            need_eos[-1] *= last_ends
        else:
            need_eos = np.zeros(len(lengths), np.int64)
        if not bos.any() and not need_eos.any():
            return flat, mask, lengths
        new_lengths = lengths + bos + need_eos
        new_starts = np.concatenate([[0], np.cumsum(new_lengths)[:-1]])
        out = np.empty(int(new_lengths.sum()), np.int64)
        out_mask = np.empty(len(out), np.uint8)
        dest = np.repeat(new_starts + bos - old_starts, lengths) + np.arange(len(flat))
        out[dest] = flat
        out_mask[dest] = mask
        if bos.any():
            out[new_starts[bos == 1]] = config.special_tokens["bos"]
            out_mask[new_starts[bos == 1]] = 0
        tail = np.flatnonzero(need_eos)
        eos_at = new_starts[tail] + bos[tail] + lengths[tail]
        out[eos_at] = eos_id
        # Under full supervision every token but a bos is scored, the eos too (also after a
        # document that is a bos alone); else the eos is scored like the document's last token.
        out_mask[eos_at] = 1 if config.supervision == "full" else mask[ends[tail] - 1]
        return out, out_mask, new_lengths


_NONE = np.zeros(0, np.int64)  # no documents


def _segment_sums(values: np.ndarray, lengths: np.ndarray) -> np.ndarray:
    """Sum of `values` over each consecutive segment (empty segments sum to 0)."""
    totals = np.concatenate([[0], np.cumsum(values, dtype=np.int64)])
    ends = np.cumsum(lengths)
    return totals[ends] - totals[ends - lengths]


def _select(flat, mask, lengths, record_of, keep):
    if keep.all():
        return flat, mask, lengths, record_of
    tokens = np.repeat(keep, lengths)
    return flat[tokens], mask[tokens], lengths[keep], record_of[keep]


def _truncate(flat, mask, lengths, limit):
    starts = np.concatenate([[0], np.cumsum(lengths)[:-1]])
    offset = np.arange(len(flat)) - np.repeat(starts, lengths)
    tokens = offset < limit
    return flat[tokens], mask[tokens], np.minimum(lengths, limit)


# --- the pool -----------------------------------------------------------------------------------

_WORKER: ChunkProcessor | None = None
_INHERITED: ChunkProcessor | None = None  # set in the parent just before a fork


def _init_worker(config: WorkerConfig) -> None:
    global _WORKER
    # A prepare killed outright (SIGKILL, out of memory) left its workers tokenizing on, each
    # printing a BrokenPipeError traceback into the user's terminal as it handed back a chunk:
    # Linux now ends a worker with its parent.
    _end_with(os.getppid())
    # Ctrl-C reaches the whole process group: the parent turns it into `dllm: interrupted` and
    # terminates the pool; a worker of its own would print a KeyboardInterrupt traceback.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    # The parent's SIGTERM handler (prepare's cleanup) is not the worker's: terminate() ends
    # a worker with SIGTERM, which must end it quietly.
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    # Both came blocked from the parent (TokenizePool.__enter__): one that arrived since the
    # fork is delivered now, by these dispositions.
    _unblock(_STARTUP_SIGNALS)
    # One Rust thread per process: the pool is the parallelism.
    os.environ["TOKENIZERS_PARALLELISM"] = "false"
    os.environ["RAYON_NUM_THREADS"] = "1"
    inherited = _INHERITED
    # A forked worker reuses the parent's loaded tokenizer (copy-on-write) instead of loading
    # it again; a spawned one loads its own.
    _WORKER = inherited if inherited is not None and inherited.config == config else None
    if _WORKER is None:
        _WORKER = ChunkProcessor(config)


def _end_with(parent: int) -> None:
    """Ask Linux to SIGKILL this worker when its parent (`parent`, the prepare) ends; where it
    ended already, end now."""
    if sys.platform != "linux":
        return
    import ctypes

    try:
        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL, 0, 0, 0)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        return
    if os.getppid() != parent:
        os._exit(1)


# Blocked while the pool starts its workers, until each has set its own dispositions: one that
# reached a worker before then ran the parent's Python handler, or none at all (a signal the C
# handler took is dropped if the disposition becomes SIG_DFL before Python runs the handler),
# and a worker that missed terminate()'s SIGTERM kept `dllm data prepare` waiting forever.
_STARTUP_SIGNALS = {signal.SIGINT, signal.SIGTERM}


def _block(signals: set[int]) -> set[int]:
    """Block `signals` in this thread; return the mask before (empty where there are none)."""
    if not hasattr(signal, "pthread_sigmask"):
        return set()
    return set(signal.pthread_sigmask(signal.SIG_BLOCK, signals))


def _unblock(signals: set[int]) -> None:
    if hasattr(signal, "pthread_sigmask") and signals:
        signal.pthread_sigmask(signal.SIG_UNBLOCK, signals)


def _process(chunk: RawChunk) -> ChunkResult:
    assert _WORKER is not None
    return _WORKER.process(chunk)


def _context():
    # fork is cheap and inherits the imported libraries; elsewhere use the safe default.
    if sys.platform.startswith("linux"):
        return multiprocessing.get_context("fork")
    return multiprocessing.get_context("spawn")


class TokenizePool:
    """`workers` processes (1: this process) that process chunks and return results in order.

    The pool starts in `__enter__`, before the caller starts any thread of its own (a progress
    bar), so fork happens in a quiet process; `__exit__` terminates it, also on errors.
    """

    def __init__(self, config: WorkerConfig, workers: int, tokenizer=None) -> None:
        self.config = config
        self.workers = workers
        self.tokenizer = tokenizer  # an already loaded tokenizer for `config`, if any
        self._pool = None
        self._local: ChunkProcessor | None = None

    def __enter__(self) -> TokenizePool:
        if self.workers <= 1:
            self._local = ChunkProcessor(self.config, self.tokenizer)
            return self
        global _INHERITED
        context = _context()
        if context.get_start_method() == "fork":
            _INHERITED = ChunkProcessor(self.config, self.tokenizer)
        # Workers (forked, or spawned: the mask survives exec) and the pool's own threads start
        # with SIGINT/SIGTERM blocked; this thread gets any that arrived meanwhile once the
        # pool stands, as the caller's handler or the default action.
        blocked_before = _block(_STARTUP_SIGNALS)
        try:
            self._pool = context.Pool(
                self.workers, initializer=_init_worker, initargs=(self.config,)
            )
        finally:
            _INHERITED = None
            _unblock(_STARTUP_SIGNALS - blocked_before)
        return self

    def __exit__(self, *exc_info) -> None:
        if self._pool is not None:
            self._pool.terminate()
            self._pool.join()
            self._pool = None

    def results(self, chunks: Iterator[RawChunk]) -> Iterator[tuple[RawChunk, ChunkResult]]:
        """Process `chunks`, yielding (chunk, result) in input order, 2 x workers in flight."""
        if self._local is not None:
            for chunk in chunks:
                yield chunk, self._local.process(chunk)
            return
        assert self._pool is not None, "use TokenizePool as a context manager"
        pending: deque = deque()
        for chunk in chunks:
            pending.append((chunk, self._pool.apply_async(_process, (chunk,))))
            if len(pending) >= 2 * self.workers:
                done, result = pending.popleft()
                yield done, result.get()
        while pending:
            done, result = pending.popleft()
            yield done, result.get()
