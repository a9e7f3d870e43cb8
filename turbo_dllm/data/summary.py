"""Look inside an artifact: decoded samples with supervised spans (`inspect`) and statistics.

Decoding uses the artifact's own copy of its tokenizer (Hugging Face tokenizers are copied into
`tokenizer/` at prepare time; the byte-level one is built in), so an artifact can be inspected on
any machine.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np

from turbo_dllm.data.artifact import DataArtifact, tokenizer_file
from turbo_dllm.errors import DllmError
from turbo_dllm.fsutil import sha256_file

__all__ = [
    "Span",
    "compute_stats",
    "describe_dropped",
    "load_decoder",
    "plot_stats",
    "sample_spans",
    "spans_json",
]


@dataclass(frozen=True)
class Span:
    """A run of tokens in one sequence with the same segment and supervision."""

    segment: int  # document id within the sequence (the loader's doc_ids)
    supervised: bool
    padding: bool
    tokens: int
    text: str


def load_decoder(artifact: DataArtifact):
    """Something with `.decode(ids) -> str` for the artifact's tokenizer."""
    kind = artifact.manifest.tokenizer.kind
    if kind == "byte_level":
        from turbo_dllm.data.tokenizers import ByteLevelTokenizer

        return ByteLevelTokenizer()
    folder = artifact.root / "tokenizer"
    if not folder.is_dir():
        raise DllmError(
            f"{artifact.root}: the artifact has no tokenizer/ folder to decode with",
            hint="copy the artifact whole (tokenizer/ too); `dllm data validate` checks it",
        )
    for name, info in artifact.manifest.tokenizer_files.items():
        file = tokenizer_file(artifact.root, name)
        if file is None or not file.is_file() or sha256_file(file) != info.sha256:
            raise DllmError(
                f"{artifact.root}: tokenizer/{name} is missing or changed since prepare",
                hint="`dllm data validate` checks the whole artifact",
            )
    from transformers import AutoTokenizer
    from transformers.utils import logging as hf_logging

    hf_logging.set_verbosity_error()
    try:
        tokenizer = AutoTokenizer.from_pretrained(str(folder), local_files_only=True)
    except Exception as error:  # transformers raises many types for a bad folder
        raise DllmError(
            f"{artifact.root}: cannot load its tokenizer/: {error}",
            hint=f"`dllm data validate {artifact.root}` names the tokenizer file that changed; "
            "prepare the artifact again (output.overwrite: true) to replace it",
        ) from None

    class _Decoder:
        def decode(self, ids) -> str:
            return tokenizer.decode([int(i) for i in ids], skip_special_tokens=False)

    return _Decoder()


def sample_spans(artifact: DataArtifact, row: int, decoder) -> list[Span]:
    """Sequence `row` cut wherever the segment, supervision or padding changes."""
    if not 0 <= row < len(artifact):
        raise DllmError(f"sequence {row} is out of range (the artifact has {len(artifact)})")
    tokens, mask, segments = artifact.row(row)
    padding = artifact.padding(row)
    key = np.stack([segments, mask.astype(np.int32), padding.astype(np.int32)], axis=1)
    cuts = np.flatnonzero((key[1:] != key[:-1]).any(axis=1)) + 1
    spans = []
    for start, end in zip(np.r_[0, cuts], np.r_[cuts, len(tokens)], strict=True):
        is_pad = bool(padding[start])
        text = "" if is_pad else decoder.decode(tokens[start:end])
        spans.append(Span(int(segments[start]), bool(mask[start]), is_pad, int(end - start), text))
    return spans


def spans_json(spans: list[Span]) -> list[dict[str, Any]]:
    return [asdict(s) for s in spans]


def compute_stats(artifact: DataArtifact) -> dict[str, Any]:
    """Token, document and supervision counts plus a document length histogram (log2 bins)."""
    manifest = artifact.manifest
    lengths = np.asarray(artifact.documents[:, 1])
    total = manifest.num_sequences * manifest.seq_len
    doc_tokens = int(lengths.sum())
    supervised = int(np.asarray(artifact.loss_mask, dtype=np.uint8).sum(dtype=np.int64))
    top = int(lengths.max()) if len(lengths) else 1
    edges = [2**k for k in range(int(np.ceil(np.log2(max(top, 2)))) + 2)]
    counts, _ = np.histogram(lengths, bins=edges)
    s = manifest.stats
    return {
        "fingerprint": manifest.fingerprint,
        "sequences": manifest.num_sequences,
        "seq_len": manifest.seq_len,
        "tokens": doc_tokens,
        "padding_tokens": total - doc_tokens,
        "padding_fraction": (total - doc_tokens) / total if total else 0.0,
        "documents": len(lengths),
        "records": s.records,
        "supervised_tokens": supervised,
        "supervised_fraction": supervised / doc_tokens if doc_tokens else 0.0,
        "document_length": {
            "min": int(lengths.min()) if len(lengths) else 0,
            "mean": float(lengths.mean()) if len(lengths) else 0.0,
            "max": top if len(lengths) else 0,
            "histogram": {"edges": edges, "counts": [int(c) for c in counts]},
        },
        "truncated_documents": s.truncated_documents,
        "truncated_tokens": s.truncated_tokens,
        "empty_documents": s.empty_documents,
        "dropped_unsupervised_documents": s.dropped_unsupervised_documents,
        "special_token_text": s.special_token_text,
        "skipped": dict(s.skipped),
        "supervision": manifest.supervision,
    }


def describe_dropped(empty: int, unsupervised: int) -> str:
    """Documents that left no trace in the artifact although their records were fine (empty:
    nothing to say)."""
    parts = [f"{empty:,} empty"] if empty else []
    if unsupervised:
        parts.append(f"{unsupervised:,} with no supervised token left after truncation")
    return ", ".join(parts)


def plot_stats(stats: dict[str, Any], out: str | Path) -> Path:
    """Write the length histogram and token breakdown as a PNG."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        raise DllmError("--plot needs matplotlib", hint="pip install matplotlib") from None
    if str(out).endswith("/") or Path(out).name in ("", "..") or Path(out).is_dir():
        raise DllmError(f"--plot {str(out)!r} is a folder", hint="name the image file: OUT.png")
    out = Path(out)
    if not out.suffix:  # matplotlib would append .png itself; name the file it really writes
        out = out.with_name(out.name + ".png")
    hist = stats["document_length"]["histogram"]
    fig, (left, right) = plt.subplots(1, 2, figsize=(11, 4), width_ratios=[3, 1])
    formats = fig.canvas.get_supported_filetypes()
    if out.suffix[1:].lower() not in formats:
        plt.close(fig)
        raise DllmError(
            f"--plot {str(out)!r}: cannot write {out.suffix!r} images",
            hint=f"end the name in one of: {', '.join('.' + f for f in sorted(formats))}",
        )
    left.bar(
        range(len(hist["counts"])),
        hist["counts"],
        tick_label=[f"<{e}" for e in hist["edges"][1:]],
    )
    left.set_xlabel("document length (tokens)")
    left.set_ylabel("documents")
    left.tick_params(axis="x", labelrotation=60, labelsize=7)
    left.set_title(f"{stats['documents']:,} documents in {stats['sequences']:,} sequences")
    supervised = stats["supervised_tokens"]
    parts = [supervised, stats["tokens"] - supervised, stats["padding_tokens"]]
    right.bar(
        ["supervised", "context", "padding"],
        parts,
        color=["tab:green", "tab:gray", "w"],
        edgecolor="k",
    )
    right.set_title("tokens")
    fig.tight_layout()
    try:
        out.parent.mkdir(parents=True, exist_ok=True)
        fig.savefig(out, dpi=110)
    except OSError as error:  # a folder in the way, no permission, a full disk
        raise DllmError(
            f"cannot write the plot to {str(out)!r}: {error.strerror or error}",
            hint="choose a --plot path in a folder you can write",
        ) from None
    finally:
        plt.close(fig)
    return out
