"""Tokens/s of `dllm data prepare` against `datasets.map(batched=True)` on >= 100 MB of real text.

The corpus is built from text already on the machine: the Python sources and docs under
`sys.prefix`, one JSONL record per file, in sorted path order. A byte-level BPE tokenizer is
trained on the first few MB with `tokenizers` and saved as a transformers folder; both sides use
that same fast tokenizer:

- baseline: `datasets.load_dataset("json")` -> `Dataset.map(tokenizer(...), batched=True)` ->
  numpy concatenation of the ids (a flat token stream, nothing packed or hashed);
- turbo-dllm: `turbo_dllm.data.prepare.prepare` (jsonl source, text records, eos separators,
  packing into 2048-token rows, loss masks, document index, sha256 + fingerprint, manifest).

Both start from the same JSONL file; each run is a fresh process whose timing covers loading the
tokenizer, reading, tokenizing and producing the tokens (library imports happen before the clock
starts). With `--repeat N` the two pipelines alternate N times, each side going first in turn,
and the best time of each counts (the host may be shared); CPU seconds (process + children) are
reported too.
The script checks that both produced the same token stream, prints a table and writes JSON
(`--out`).

    python benchmarks/data_prepare.py [--mb 100] [--workers auto] [--repeat 1] [--out r.json]
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from benchmarks.provenance import cpu_model, git_commit  # noqa: E402

SPECIALS = ["<|dllm_eos|>", "<|dllm_pad|>", "<|dllm_mask|>"]


def build_corpus(out: Path, megabytes: float) -> tuple[int, int]:
    """Write Python sources/docs under sys.prefix as JSONL until `megabytes` of text."""
    want = int(megabytes * 1e6)
    roots = sorted({Path(sys.prefix).resolve(), Path(sys.base_prefix).resolve()})
    size = files = 0
    with open(out, "w", encoding="utf-8") as handle:
        for root in roots:
            for path in sorted(root.rglob("*")):
                if path.suffix not in (".py", ".rst", ".txt", ".md") or not path.is_file():
                    continue
                try:
                    text = path.read_text(encoding="utf-8")
                except (UnicodeDecodeError, OSError):
                    continue
                if not text.strip() or any(s in text for s in SPECIALS):
                    continue
                handle.write(json.dumps({"text": text}) + "\n")
                size += len(text.encode("utf-8"))
                files += 1
                if size >= want:
                    return size, files
    raise SystemExit(f"only {size / 1e6:.1f} MB of text under {roots}; lower --mb")


def train_tokenizer(corpus: Path, folder: Path, sample_mb: float = 8.0, vocab: int = 16384) -> None:
    from benchmarks.bpe import train_byte_level_bpe

    def sample():
        seen = 0
        with open(corpus, encoding="utf-8") as handle:
            for line in handle:
                text = json.loads(line)["text"]
                seen += len(text)
                yield text
                if seen >= sample_mb * 1e6:
                    return

    train_byte_level_bpe(folder, vocab, SPECIALS, texts=sample())


def _cpu_seconds() -> float:
    """CPU time of this process, its threads and its reaped children (pool workers)."""
    own = resource.getrusage(resource.RUSAGE_SELF)
    kids = resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + kids.ru_utime + kids.ru_stime


def run_baseline(corpus: Path, tokenizer: Path, cache: Path, num_proc: int | None) -> dict:
    import datasets
    from transformers import AutoTokenizer

    datasets.disable_progress_bars()
    datasets.disable_caching()
    cpu = _cpu_seconds()
    started = time.perf_counter()
    tok = AutoTokenizer.from_pretrained(str(tokenizer))
    ds = datasets.load_dataset("json", data_files=str(corpus), split="train", cache_dir=str(cache))
    ds = ds.map(
        lambda batch: tok(batch["text"], add_special_tokens=False),
        batched=True,
        remove_columns=ds.column_names,
        num_proc=num_proc,
    )
    ids = np.concatenate(
        [np.asarray(row, dtype=np.uint32) for row in ds.with_format("numpy")["input_ids"]]
    )
    seconds = time.perf_counter() - started
    return {"seconds": seconds, "cpu": _cpu_seconds() - cpu, "tokens": int(ids.size), "ids": ids}


def run_turbo(corpus: Path, tokenizer: Path, out: Path, workers: str | int) -> dict:
    from turbo_dllm.data.artifact import DataArtifact
    from turbo_dllm.data.prepare import prepare
    from turbo_dllm.data.spec import validate_prepare_document

    spec = validate_prepare_document(
        {
            "source": {"kind": "jsonl", "paths": [str(corpus)]},
            "tokenizer": {"kind": "huggingface", "path": str(tokenizer)},
            "packing": {"seq_len": 2048, "block_size": 16, "align": "none"},
            "output": {"path": str(out), "overwrite": True},
            "workers": workers,
        },
        "benchmark",
    )
    cpu = _cpu_seconds()
    started = time.perf_counter()
    result = prepare(spec, progress=False)
    seconds = time.perf_counter() - started
    cpu = _cpu_seconds() - cpu
    # The content tokens (documents without their eos separator), to compare with the baseline.
    artifact = DataArtifact(result.path)
    stream = np.asarray(artifact.tokens).reshape(-1)
    docs = np.asarray(artifact.documents)
    keep = np.zeros(len(stream), bool)
    starts, lengths = docs[:, 0], docs[:, 1] - 1
    covered = (
        np.repeat(starts, lengths)
        + np.arange(lengths.sum())
        - np.repeat(np.cumsum(lengths) - lengths, lengths)
    )
    keep[covered] = True
    return {
        "seconds": seconds,
        "cpu": cpu,
        "tokens": int(lengths.sum()),
        "ids": stream[keep],
        "workers": result.workers,
        "fingerprint": result.manifest.fingerprint,
    }


def _child(args) -> int:
    """One timed run in a fresh process (imports done before timing); result JSON on stdout."""
    import datasets  # noqa: F401  (import cost is not what we measure)
    from transformers import AutoTokenizer  # noqa: F401  (transformers imports lazily)

    import turbo_dllm.data.prepare  # noqa: F401

    work = Path(args.workdir)
    if args.child == "baseline":
        shutil.rmtree(work / "hf-cache", ignore_errors=True)
        num_proc = os.cpu_count() if args.num_proc else None
        run = run_baseline(work / "corpus.jsonl", work / "tokenizer", work / "hf-cache", num_proc)
    else:
        workers = args.workers if args.workers == "auto" else int(args.workers)
        run = run_turbo(work / "corpus.jsonl", work / "tokenizer", work / "artifact", workers)
    np.save(work / f"ids-{args.child}.npy", run.pop("ids"))
    print(json.dumps(run))
    return 0


def _timed(work: Path, which: str, *extra: str) -> dict:
    command = [sys.executable, __file__, "--child", which, "--workdir", str(work), *extra]
    out = subprocess.run(command, capture_output=True, text=True)
    if out.returncode:
        raise SystemExit(f"{which} run failed:\n{out.stderr[-3000:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--mb", type=float, default=100.0, help="corpus size in MB (>= 100)")
    parser.add_argument("--workers", default="auto", help="turbo-dllm workers (default auto)")
    parser.add_argument("--repeat", type=int, default=1, help="alternate runs, keep the best")
    parser.add_argument("--out", help="write the results as JSON here")
    parser.add_argument("--workdir", help="keep corpus, tokenizer and outputs here")
    parser.add_argument(
        "--parallel-baseline",
        action="store_true",
        help="also time the baseline with map(num_proc=CPU count)",
    )
    parser.add_argument("--child", choices=["baseline", "turbo"], help=argparse.SUPPRESS)
    parser.add_argument("--num-proc", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        return _child(args)

    work = Path(args.workdir) if args.workdir else Path(tempfile.mkdtemp(prefix="dllm-bench-"))
    work.mkdir(parents=True, exist_ok=True)
    try:
        corpus = work / "corpus.jsonl"
        t = time.perf_counter()
        text_bytes, files = build_corpus(corpus, args.mb)
        print(
            f"corpus: {files:,} files, {text_bytes / 1e6:.1f} MB ({time.perf_counter() - t:.1f} s)"
        )
        t = time.perf_counter()
        train_tokenizer(corpus, work / "tokenizer")
        print(f"tokenizer: byte-level BPE 16k trained on 8 MB ({time.perf_counter() - t:.1f} s)")

        runs: dict[str, list[dict]] = {"baseline": [], "turbo": [], "parallel": []}
        for attempt in range(args.repeat):
            # Alternate which side goes first, so a load change on a shared host hits both.
            order = ["baseline", "turbo"] if attempt % 2 == 0 else ["turbo", "baseline"]
            for which in order:
                extra = ["--workers", str(args.workers)] if which == "turbo" else []
                run = _timed(work, which, *extra)
                runs[which].append(run)
                print(
                    f"[{attempt + 1}] {which}: {run['seconds']:.1f} s wall, {run['cpu']:.1f} s cpu, "
                    f"load {os.getloadavg()[0]:.1f}"
                )
            same = np.array_equal(
                np.load(work / "ids-baseline.npy"), np.load(work / "ids-turbo.npy")
            )
            if not same:
                raise SystemExit("token streams differ between the baseline and turbo-dllm")
            if args.parallel_baseline:
                run = _timed(work, "baseline", "--num-proc")
                runs["parallel"].append(run)
                print(f"[{attempt + 1}] baseline num_proc={os.cpu_count()}: {run['seconds']:.1f} s")

        best = {k: min(v, key=lambda r: r["seconds"]) for k, v in runs.items() if v}
        # Each attempt ran both sides back to back: its ratio saw (nearly) the same host load.
        paired_b = [r["seconds"] for r in runs["baseline"]]
        paired_t = [r["seconds"] for r in runs["turbo"]]
        paired = [b / t for b, t in zip(paired_b, paired_t, strict=True)]
        tokens = best["baseline"]["tokens"]
        base_s = best["baseline"]["seconds"]
        rows = [("datasets.map(batched=True) + np.concatenate", best["baseline"])]
        if "parallel" in best:
            rows.append(
                (f"datasets.map(batched=True, num_proc={os.cpu_count()})", best["parallel"])
            )
        rows.append((f"dllm data prepare (workers={best['turbo']['workers']})", best["turbo"]))
        print()
        print(f"{'pipeline':<52} {'wall s':>7} {'cpu s':>7} {'tokens/s':>11} {'vs baseline':>12}")
        for name, run in rows:
            print(
                f"{name:<52} {run['seconds']:>7.1f} {run['cpu']:>7.1f} "
                f"{tokens / run['seconds']:>11,.0f} {base_s / run['seconds']:>11.2f}x"
            )
        print(
            f"paired ratios (baseline/turbo per attempt): {', '.join(f'{x:.2f}' for x in paired)}"
            f"; median {statistics.median(paired):.2f}"
        )
        result = {
            "benchmark": "data_prepare",
            "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d"),
            "commit": git_commit(),
            "hardware": f"{cpu_model()}, {os.cpu_count()} CPUs",
            "python": platform.python_version(),
            "corpus_bytes": text_bytes,
            "corpus_files": files,
            "tokens": tokens,
            "baseline": "datasets.load_dataset(json) + Dataset.map(tokenizer, batched=True) + "
            "np.concatenate (same tokenizer folder)",
            "baseline_seconds": round(base_s, 2),
            "baseline_cpu_seconds": round(best["baseline"]["cpu"], 2),
            "turbo_seconds": round(best["turbo"]["seconds"], 2),
            "turbo_cpu_seconds": round(best["turbo"]["cpu"], 2),
            "turbo_workers": best["turbo"]["workers"],
            "parallel_baseline_seconds": round(best["parallel"]["seconds"], 2)
            if "parallel" in best
            else None,
            "runs_seconds": {k: [round(r["seconds"], 2) for r in v] for k, v in runs.items()},
            "baseline_tokens_per_s": round(tokens / base_s),
            "turbo_tokens_per_s": round(tokens / best["turbo"]["seconds"]),
            "ratio": round(base_s / best["turbo"]["seconds"], 2),
            "paired_ratios": [round(b / t, 2) for b, t in zip(paired_b, paired_t, strict=True)],
            "median_paired_ratio": round(statistics.median(paired), 2),
            "cpu_ratio": round(best["baseline"]["cpu"] / best["turbo"]["cpu"], 2),
            "fingerprint": best["turbo"]["fingerprint"],
            "same_tokens": True,
        }
        print(json.dumps(result, indent=2))
        if args.out:
            Path(args.out).write_text(json.dumps(result, indent=2) + "\n")
    finally:
        if not args.workdir:
            shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
