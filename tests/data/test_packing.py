"""Packing: placement rules, independence from chunking, and per-token document ids."""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.data.helpers import documents, prepare_config, write_config, write_jsonl
from turbo_dllm.data.artifact import DataArtifact
from turbo_dllm.data.packing import Packer

PAD = 99


def _pack(lengths, *, seq_len, block_size, align, split, chunks=None):
    rows: list[np.ndarray] = []
    masks: list[np.ndarray] = []
    packer = Packer(
        seq_len=seq_len,
        block_size=block_size,
        align=align,
        split=split,
        pad_id=PAD,
        token_dtype="uint16",
        write_rows=lambda t, m: (rows.append(t.copy()), masks.append(m.copy())),
    )
    docs = [np.full(n, i % 90, np.uint16) for i, n in enumerate(lengths)]
    cuts = chunks if chunks is not None else [len(docs)]
    start = 0
    for cut in [*cuts, len(docs)]:
        part = docs[start:cut]
        if part:
            flat = np.concatenate(part)
            packer.add(flat, np.ones(len(flat), np.uint8), np.array([len(d) for d in part]))
        start = max(start, cut)
    index = packer.finish()
    stream = np.concatenate(rows) if rows else np.zeros(0, np.uint16)
    return stream, np.concatenate(masks) if masks else np.zeros(0, np.uint8), index


def test_split_mode_aligns_documents_to_blocks():
    stream, mask, index = _pack([5, 10, 3], seq_len=16, block_size=4, align=True, split=True)
    assert index.tolist() == [[0, 5], [8, 10], [20, 3]]
    assert len(stream) == 32  # the last row is padded
    assert stream[5:8].tolist() == [PAD] * 3 and not mask[5:8].any()
    assert stream[8:18].tolist() == [1] * 10  # crosses the row boundary at 16


def test_split_mode_without_alignment_is_dense():
    stream, _, index = _pack([5, 10, 3], seq_len=16, block_size=4, align=False, split=True)
    assert index.tolist() == [[0, 5], [5, 10], [15, 3]]
    assert (stream[:18] != PAD).all() and len(stream) == 32


def test_fit_mode_starts_a_new_row_when_a_document_does_not_fit():
    _, _, index = _pack([10, 10, 16, 3], seq_len=16, block_size=1, align=False, split=False)
    assert index.tolist() == [[0, 10], [16, 10], [32, 16], [48, 3]]


@settings(max_examples=60, deadline=None)
@given(
    lengths=st.lists(st.integers(1, 40), min_size=1, max_size=30),
    cuts=st.lists(st.integers(0, 30), max_size=6),
    align=st.booleans(),
    split=st.booleans(),
)
def test_output_does_not_depend_on_chunking(lengths, cuts, align, split):
    if not split:
        lengths = [min(n, 32) for n in lengths]
    kwargs = dict(seq_len=32, block_size=8, align=align, split=split)
    whole = _pack(lengths, **kwargs)
    chunked = _pack(lengths, chunks=sorted(cuts), **kwargs)
    for a, b in zip(whole, chunked, strict=True):
        assert np.array_equal(a, b)
    stream, _, index = whole
    # Every document lies where the index says, and the index is a sorted, disjoint cover.
    for d, (start, n) in enumerate(index.tolist()):
        assert (stream[start : start + n] == d % 90).all()
        if not split:
            assert start // 32 == (start + n - 1) // 32  # inside one row
        if align:
            assert start % 8 == 0
    ends = index[:, 0] + index[:, 1]
    assert (index[1:, 0] >= ends[:-1]).all()


def _expected_doc_ids(artifact: DataArtifact, row: int) -> list[int]:
    """Naive reference: label each position by its document (or padding run), then renumber."""
    length = artifact.manifest.seq_len
    owner = []
    for pos in range(row * length, (row + 1) * length):
        label = None
        for d, (start, n) in enumerate(np.asarray(artifact.documents).tolist()):
            if start <= pos < start + n:
                label = ("doc", d)
        owner.append(label)
    ids, current = [], 0
    for i, label in enumerate(owner):
        if i and (label != owner[i - 1] or (label is None) != (owner[i - 1] is None)):
            current += 1
        ids.append(current)
    return ids


def test_doc_ids_separate_documents_and_padding(tmp_path):
    texts = ["a" * 5, "b" * 20, "c" * 3, "d" * 40, "e"]
    write_jsonl(tmp_path / "data.jsonl", [{"text": t} for t in texts])
    for align in ("block", "none"):
        config = write_config(
            tmp_path,
            packing={"seq_len": 32, "block_size": 8, "align": align},
            output={"path": f"out-{align}"},
        )
        artifact = DataArtifact(prepare_config(config).path)
        for row in range(len(artifact)):
            assert artifact.doc_ids(row).tolist() == _expected_doc_ids(artifact, row)
        # A document split across rows starts the next row as segment 0.
        assert artifact.doc_ids(1)[0] == 0


def test_truncate_keeps_each_document_in_one_row(tmp_path):
    write_jsonl(tmp_path / "data.jsonl", [{"text": "x" * 100}, {"text": "short"}])
    config = write_config(
        tmp_path, packing={"seq_len": 32, "block_size": 8, "overflow": "truncate"}
    )
    result = prepare_config(config)
    docs = documents(result.path)
    assert [len(t) for t, _ in docs] == [32, 6]
    stats = result.manifest.stats
    assert (stats.truncated_documents, stats.truncated_tokens) == (1, 101 - 32)
    assert result.manifest.num_sequences == 2


def test_bos_is_prepended_and_never_supervised(tmp_path):
    write_jsonl(tmp_path / "data.jsonl", [{"text": "hi"}])
    config = write_config(
        tmp_path, packing={"seq_len": 16, "block_size": 4, "prepend_bos": True, "separator": "none"}
    )
    ((tokens, mask),) = documents(prepare_config(config).path)
    assert tokens.tolist() == [256, ord("h"), ord("i")]
    assert mask.tolist() == [False, True, True]
