"""Documents of token ids longer than PIECE_IDS go through prepare in pieces (bounded memory) and
make the artifact they made whole: the oracle is the same prepare with pieces larger than any
document."""

from __future__ import annotations

import numpy as np
import pytest

from tests.data.helpers import documents, prepare_config, write_config
from turbo_dllm.data import sources
from turbo_dllm.data.artifact import DataArtifact
from turbo_dllm.errors import DllmError

SEQ_LEN = 64
PIECE = 64  # at least seq_len, as PIECE_IDS (MAX_SEQ_LEN) is
EOS = 257
RNG = np.random.default_rng(0)


def _ids(n: int) -> np.ndarray:
    return RNG.integers(0, 256, n).astype("<u2")  # byte-level ids, no eos among them


def _stream_with_separator() -> np.ndarray:
    """Short and long documents (one exactly a piece, one a piece and one id), EOS-separated."""
    docs = [_ids(5), _ids(1000), _ids(PIECE), _ids(PIECE + 1), _ids(30), _ids(3 * PIECE + 7)]
    return np.concatenate([np.append(d, EOS).astype("<u2") for d in docs])


def _prepare(tmp_path, name: str, piece: int, monkeypatch, **sections):
    monkeypatch.setattr(sources, "PIECE_IDS", piece)
    config = write_config(tmp_path / name, **sections)
    return prepare_config(config)


def _same_artifact(whole, pieced) -> None:
    a, b = DataArtifact(whole.path), DataArtifact(pieced.path)
    for field in ("tokens", "loss_mask", "documents"):
        assert np.array_equal(np.asarray(getattr(a, field)), np.asarray(getattr(b, field))), field
    assert whole.manifest.stats == pieced.manifest.stats


def _source(tmp_path, array: np.ndarray, separator: int | None) -> dict:
    for name in ("whole", "pieced"):
        (tmp_path / name).mkdir(parents=True, exist_ok=True)
        array.tofile(tmp_path / name / "ids.bin")
    source = {"kind": "token_ids", "paths": ["ids.bin"], "dtype": "uint16"}
    if separator is not None:
        source["document_separator_id"] = separator
    return source


@pytest.mark.parametrize(
    "packing",
    [
        {"prepend_bos": True},  # split, block-aligned, eos after the last piece only
        {"align": "none", "separator": "none"},
        {"overflow": "truncate", "prepend_bos": True},
    ],
    ids=["split", "unaligned", "truncate"],
)
def test_a_file_without_separator_is_one_document_made_in_pieces(tmp_path, monkeypatch, packing):
    source = _source(tmp_path, _ids(1000), None)
    sections = dict(source=source, packing={"seq_len": SEQ_LEN, "block_size": 8, **packing})
    whole = _prepare(tmp_path, "whole", 10**9, monkeypatch, **sections)
    pieced = _prepare(tmp_path, "pieced", PIECE, monkeypatch, **sections, workers=2)
    _same_artifact(whole, pieced)
    stats = pieced.manifest.stats
    assert (stats.records, stats.documents) == (1, 1)
    if packing.get("overflow") == "truncate":
        assert (stats.truncated_documents, stats.tokens) == (1, SEQ_LEN)
    else:
        (tokens, _), = documents(pieced.path)  # fmt: skip
        assert len(tokens) == 1000 + packing.get("prepend_bos", False) + (
            packing.get("separator", "eos") == "eos"
        )


@pytest.mark.parametrize("overflow", ["split", "truncate"])
def test_long_documents_between_short_ones_are_made_as_whole(tmp_path, monkeypatch, overflow):
    source = _source(tmp_path, _stream_with_separator(), EOS)
    sections = dict(
        source=source,
        packing={"seq_len": SEQ_LEN, "block_size": 8, "overflow": overflow, "prepend_bos": True},
    )
    whole = _prepare(tmp_path, "whole", 10**9, monkeypatch, **sections)
    pieced = _prepare(tmp_path, "pieced", PIECE, monkeypatch, **sections)
    _same_artifact(whole, pieced)
    assert pieced.manifest.stats.documents == 6


def test_reject_skips_a_long_document_once_and_keeps_the_rest(tmp_path, monkeypatch):
    source = _source(tmp_path, _stream_with_separator(), EOS)
    sections = dict(
        source=source,
        packing={"seq_len": SEQ_LEN, "block_size": 8, "overflow": "reject"},
        on_error="skip",
    )
    whole = _prepare(tmp_path, "whole", 10**9, monkeypatch, **sections)
    pieced = _prepare(tmp_path, "pieced", PIECE, monkeypatch, **sections)
    _same_artifact(whole, pieced)
    stats = pieced.manifest.stats
    assert stats.skipped == {"too_long": 4}  # 1000, 64 + eos, 65 and 199 ids
    assert (stats.records, stats.documents) == (6, 2)


def test_reject_stops_at_a_long_document_with_its_length(tmp_path, monkeypatch):
    source = _source(tmp_path, _ids(1000), None)
    with pytest.raises(DllmError, match=r"ids.bin row 0: 1,000 tokens, more than packing.seq_len"):
        _prepare(
            tmp_path,
            "pieced",
            PIECE,
            monkeypatch,
            source=source,
            packing={"seq_len": SEQ_LEN, "block_size": 8, "overflow": "reject"},
        )


def test_a_bad_id_in_a_later_piece_stops_even_under_skip(tmp_path, monkeypatch):
    """Its first pieces are written when a later one turns out bad: the document cannot be
    left out any more, so skip stops there, saying why."""
    ids = _ids(1000)
    ids[700] = 300  # past the byte-level vocabulary
    source = _source(tmp_path, ids, None)
    with pytest.raises(DllmError) as error:
        _prepare(tmp_path, "pieced", PIECE, monkeypatch, source=source, on_error="skip")
    assert "token id 300 is outside the vocabulary" in error.value.message
    assert "a document of 1,000 token ids, read in parts" in error.value.message
    assert error.value.hint == "fix that record"  # skip is on already


def test_the_benchmark_runs_both_sides_and_checks_their_arrays(tmp_path):
    import subprocess
    import sys

    out = tmp_path / "long.json"
    done = subprocess.run(
        [sys.executable, "benchmarks/long_document.py", "--ids", "20000", "--piece", "3000",
         "--seq-len", "256", "--workers", "1", "--out", str(out)],
        capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    result = __import__("json").loads(out.read_text())
    assert result["same_arrays"] is True
    assert result["pieces"]["tokens"] == result["whole document"]["tokens"] == 20000 + 2
