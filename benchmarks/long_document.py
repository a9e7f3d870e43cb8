"""Peak memory and time of `dllm data prepare` on one long document of token ids.

A 1-D token file without `document_separator_id` is one document. It now reaches the workers in
pieces of `turbo_dllm.data.sources.PIECE_IDS` ids; the baseline, in the same run, is the same
prepare with pieces larger than the file (the whole document at once, as before the pieces).
Each side runs in a fresh process (peak RSS: the process or its largest worker, whichever is
higher); the script checks that both wrote the same arrays.

    python benchmarks/long_document.py --ids 50000000 --workers 2 --out long_document.json
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np

CHILD = """
import json, resource, sys, time
from turbo_dllm.data import sources
from turbo_dllm.data.prepare import prepare
from turbo_dllm.data.spec import load_prepare_spec

if sys.argv[2] != "default":
    sources.PIECE_IDS = int(sys.argv[2])
start = time.perf_counter()
result = prepare(load_prepare_spec(sys.argv[1]), progress=False)
seconds = time.perf_counter() - start
peak = max(resource.getrusage(who).ru_maxrss for who in (resource.RUSAGE_SELF, resource.RUSAGE_CHILDREN))
print(json.dumps({"seconds": seconds, "peak_mb": peak / 1024, "tokens": result.manifest.stats.tokens}))
"""


def run(config: Path, piece: str) -> dict:
    done = subprocess.run(
        [sys.executable, "-c", CHILD, str(config), piece], capture_output=True, text=True
    )
    if done.returncode:
        raise SystemExit(done.stderr)
    return json.loads(done.stdout.splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ids", type=int, default=50_000_000, help="ids in the file (uint16)")
    parser.add_argument("--workers", default="2")
    parser.add_argument("--seq-len", type=int, default=4096)
    parser.add_argument("--piece", default="default", help="ids per piece (default: PIECE_IDS)")
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="long-document-"))
    np.random.default_rng(0).integers(0, 256, args.ids).astype("<u2").tofile(work / "ids.bin")
    results = {}
    for name, piece in (("pieces", args.piece), ("whole document", str(args.ids + 1))):
        config = work / f"{name.replace(' ', '_')}.yaml"
        config.write_text(
            json.dumps(
                {
                    "source": {"kind": "token_ids", "paths": ["ids.bin"], "dtype": "uint16"},
                    "tokenizer": {"kind": "byte_level"},
                    "packing": {"seq_len": args.seq_len, "block_size": 32, "prepend_bos": True},
                    "output": {"path": f"out-{config.stem}"},
                    "workers": int(args.workers) if args.workers.isdigit() else args.workers,
                }
            )
        )
        results[name] = run(config, piece)
        print(
            f"{name:15s} {results[name]['seconds']:7.2f} s  peak {results[name]['peak_mb']:8.0f} MB"
        )
    same = all(
        (work / "out-pieces" / f).read_bytes() == (work / "out-whole_document" / f).read_bytes()
        for f in ("tokens.bin", "loss_mask.bin", "documents.bin")
    )
    whole, pieces = results["whole document"], results["pieces"]
    print(
        f"same arrays: {same}; memory {whole['peak_mb'] / pieces['peak_mb']:.1f}x less, "
        f"time {whole['seconds'] / pieces['seconds']:.1f}x faster"
    )
    if args.out:
        args.out.write_text(json.dumps({"ids": args.ids, "same_arrays": same, **results}, indent=1))
    if not same:
        raise SystemExit("the two artifacts differ")


if __name__ == "__main__":
    main()
