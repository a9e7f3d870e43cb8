"""Pack finished documents into fixed-length sequences, streaming, independent of chunking.

The artifact is one long token stream cut into rows of `seq_len`. Each document is placed at a
stream position; the gaps are padding (pad token, loss mask 0):

- `align: block` starts every document on a multiple of `block_size`, so no diffusion block
  mixes the end of one document with the start of the next.
- `overflow: split` lets documents run across row boundaries (pretraining: nothing wasted).
  `truncate` / `reject` keep each document inside one row: one that does not fit in the space
  left starts the next row (documents longer than a row were already cut or refused upstream).

Placement depends only on the document sequence, never on how it was chunked, which is what makes
the artifact identical for any worker count. The document index (stream start, length) is what the
loader turns into per-token document ids.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

__all__ = ["Packer"]


def _align_up(values: np.ndarray | int, multiple: int):
    return -(-values // multiple) * multiple


class Packer:
    def __init__(
        self,
        *,
        seq_len: int,
        block_size: int,
        align: bool,
        split: bool,
        pad_id: int,
        token_dtype: str,
        write_rows: Callable[[np.ndarray, np.ndarray], None],
    ) -> None:
        self.seq_len = seq_len
        self.block_size = block_size if align else 1
        self.split = split
        self.pad_id = pad_id
        self.write_rows = write_rows
        self.rows = 0
        self._base = 0  # stream position of _tokens[0]; a multiple of seq_len
        self._pos = 0  # where the next document may start
        self._end = 0  # where the last document placed ends
        self._tokens = np.zeros(0, token_dtype)
        self._mask = np.zeros(0, np.uint8)
        self._doc_starts: list[np.ndarray] = []
        self._doc_lengths: list[np.ndarray] = []

    def add(
        self,
        tokens: np.ndarray,
        mask: np.ndarray,
        lengths: np.ndarray,
        continues_previous: bool = False,
    ) -> None:
        """Place finished documents (flat tokens + mask, one length each) after the last one;
        with `continues_previous` the first goes on where the last one placed stopped (a later
        piece of one long document: no gap, one index entry; `overflow: split` only)."""
        if not len(lengths):
            return
        if continues_previous:
            if not self.split or not self._doc_lengths:
                raise ValueError("only a document placed under overflow: split goes on")
            n = int(lengths[0])
            at = slice(self._end - self._base, self._end + n - self._base)
            self._grow(at.stop)
            self._tokens[at], self._mask[at] = tokens[:n], mask[:n]
            self._doc_lengths[-1][-1] += n
            self._end += n
            self._pos = int(_align_up(self._end, self.block_size))
            tokens, mask, lengths = tokens[n:], mask[n:], lengths[1:]
            if not len(lengths):
                self._flush((self._end - self._base) // self.seq_len)
                return
        steps = _align_up(lengths, self.block_size)
        if self.split:
            places = self._pos + np.concatenate([[0], np.cumsum(steps)[:-1]])
            self._pos += int(steps.sum())
        else:
            places = np.empty(len(lengths), np.int64)
            pos, row = self._pos, self.seq_len
            for d, (n, step) in enumerate(zip(lengths.tolist(), steps.tolist(), strict=True)):
                if pos % row + n > row:
                    pos = _align_up(pos, row)
                places[d] = pos
                pos += step
            self._pos = pos
        self._grow(self._pos - self._base)
        starts_in = np.concatenate([[0], np.cumsum(lengths)[:-1]])
        dest = np.repeat(places - starts_in - self._base, lengths) + np.arange(len(tokens))
        self._tokens[dest] = tokens
        self._mask[dest] = mask
        self._doc_starts.append(places.astype(np.int64))
        self._doc_lengths.append(lengths.astype(np.int64))
        self._end = int(places[-1] + lengths[-1])
        # Rows up to the last document's end only: a piece that continues it goes there.
        self._flush((self._end - self._base) // self.seq_len)

    def finish(self) -> np.ndarray:
        """Pad and write the last row; return the document index, shape (documents, 2)."""
        if self._pos > self._base:
            rows = -(-(self._pos - self._base) // self.seq_len)
            self._grow(rows * self.seq_len)
            self._flush(rows)
        if not self._doc_starts:
            return np.zeros((0, 2), np.int64)
        return np.stack([np.concatenate(self._doc_starts), np.concatenate(self._doc_lengths)], 1)

    def _grow(self, size: int) -> None:
        extra = size - len(self._tokens)
        if extra > 0:
            self._tokens = np.concatenate(
                [self._tokens, np.full(extra, self.pad_id, self._tokens.dtype)]
            )
            self._mask = np.concatenate([self._mask, np.zeros(extra, np.uint8)])

    def _flush(self, rows: int) -> None:
        if rows <= 0:
            return
        size = rows * self.seq_len
        self.write_rows(self._tokens[:size], self._mask[:size])
        self._tokens = self._tokens[size:].copy()
        self._mask = self._mask[size:].copy()
        self._base += size
        self.rows += rows
