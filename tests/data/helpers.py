"""Helpers for the data tests: write a prepare.yaml, run it, read documents back."""

from __future__ import annotations

import gzip
import json
from pathlib import Path
from typing import Any

import numpy as np
import yaml

from turbo_dllm.data.artifact import DataArtifact


def write_jsonl(path: Path, rows: list[Any], gz: bool = False) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    text = "".join(json.dumps(r) + "\n" for r in rows)
    if gz:
        with gzip.open(path, "wt", encoding="utf-8") as handle:
            handle.write(text)
    else:
        path.write_text(text, encoding="utf-8")
    return path


def write_config(folder: Path, name: str = "prepare.yaml", **sections: Any) -> Path:
    """A prepare.yaml with byte-level defaults; `sections` override top-level keys."""
    document: dict[str, Any] = {
        "source": {"kind": "jsonl", "paths": ["data.jsonl"]},
        "tokenizer": {"kind": "byte_level"},
        "packing": {"seq_len": 64, "block_size": 8},
        "output": {"path": "out"},
        "workers": 1,
    }
    document.update(sections)
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / name
    path.write_text(yaml.safe_dump(document, sort_keys=False), encoding="utf-8")
    return path


def prepare_config(config: Path, overrides: list[str] | None = None):
    from turbo_dllm.data.prepare import prepare
    from turbo_dllm.data.spec import load_prepare_spec

    return prepare(load_prepare_spec(config, overrides), progress=False)


def documents(path: Path) -> list[tuple[np.ndarray, np.ndarray]]:
    """Every document of an artifact as (tokens, loss mask), read back through its index."""
    artifact = DataArtifact(path)
    flat = np.asarray(artifact.tokens).reshape(-1)
    mask = np.asarray(artifact.loss_mask).reshape(-1)
    return [
        (flat[s : s + n].astype(np.int64), mask[s : s + n].astype(bool))
        for s, n in np.asarray(artifact.documents).tolist()
    ]


def byte_doc(text: str, eos: bool = True) -> list[int]:
    return list(text.encode("utf-8")) + ([257] if eos else [])


def leftovers(folder: Path) -> list[str]:
    """Anything a failed prepare might have left next to its output (staging, backups)."""
    return sorted(p.name for p in folder.iterdir() if p.name.startswith(".out"))
