"""Benchmark: `dllm bundle install --auto` from a loopback mirror vs `pip install` of a wheel of
the same size from the same server, plus sha256 verify throughput.

    python benchmarks/bundle_install.py [--archive A.tar.zst] [--sizes 0,64] [--repeats 5]
    python benchmarks/bundle_install.py --pad compressible --sizes 172   # ~64 MiB archive

Both installers run as fresh processes (startup included) against one stdlib HTTP server on
127.0.0.1, each into an empty destination: `dllm` into a new DLLM_HOME, pip with --target into a
new folder, --no-deps --no-index --no-cache-dir. The bundle is the real one built for this host
(`dllm bundle build --target auto`, or --archive), padded with incompressible bytes to reach the
larger sizes; the wheel holds the same number of random bytes (stored, not compressed). With
`--pad compressible` the padding compresses like native code instead (~2.7x at the bundle's zstd
level; the real CPU bundle's kernel 3.4x), so zstd decompresses for real, and the wheel holds the
same padding file deflated, as real wheels are (its size is then about the archive's). Prints a
table and writes JSON (--out, default runs/benchmarks/bundle_install.json). Both sides get one
untimed warm-up run and then run with warm bytecode caches, as installed packages do; each
repeat runs the two back to back (alternating which goes first), and `paired_ratio` is the
median of the per-repeat ratios.
Targets from the issue: install <= 0.3x pip, verify >= 1 GB/s.
"""

from __future__ import annotations

import argparse
import base64
import hashlib
import json
import os
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import zipfile
from datetime import datetime, timezone
from functools import partial
from http.server import SimpleHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from benchmarks.provenance import cpu_model, git_commit  # noqa: E402
from turbo_dllm.bundles.archive import extract_bundle, pack_bundle  # noqa: E402
from turbo_dllm.bundles.manifest import BundleFile, archive_name  # noqa: E402
from turbo_dllm.bundles.publish import publish  # noqa: E402
from turbo_dllm.fsutil import sha256_file  # noqa: E402

MIB = 1024 * 1024


class _QuietHandler(SimpleHTTPRequestHandler):
    def log_message(self, format, *args):
        pass


def serve(root: Path, kind: str = "stdlib") -> tuple[ThreadingHTTPServer, str]:
    from turbo_dllm.mirror.serve import MirrorRequestHandler

    handler = _QuietHandler
    if kind == "mirror":
        handler = type("QuietMirror", (MirrorRequestHandler,), {"quiet": True})
    server = ThreadingHTTPServer(("127.0.0.1", 0), partial(handler, directory=str(root)))
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server, f"http://127.0.0.1:{server.server_address[1]}"


def random_file(path: Path, size: int) -> None:
    with path.open("wb") as handle:
        left = size
        while left:
            step = min(left, 16 * MIB)
            handle.write(os.urandom(step))
            left -= step


# Random bytes mapped onto 6 letters: ~2.6 bits of entropy per byte, no long matches.
_SIX_LETTERS = bytes(97 + i % 6 for i in range(256))


def compressible_file(path: Path, size: int) -> None:
    with path.open("wb") as handle:
        left = size
        while left:
            step = min(left, 16 * MIB)
            handle.write(os.urandom(step).translate(_SIX_LETTERS))
            left -= step


def padded_bundle(base: Path, pad_bytes: int, work: Path, fill=random_file) -> Path:
    """The base bundle plus `data/pad.bin` (`fill` writes it), as a valid bundle (new version)."""
    if pad_bytes == 0:
        return base
    root = work / f"unpacked-{pad_bytes}"
    manifest = extract_bundle(base, root)
    (root / "data").mkdir()
    pad = root / "data" / "pad.bin"
    fill(pad, pad_bytes)
    version = f"{manifest.version}.post{pad_bytes // MIB}"
    manifest = manifest.model_copy(
        update={
            "version": version,
            "name": archive_name(version, manifest.target).removesuffix(".tar.zst"),
            "files": (
                *manifest.files,
                BundleFile(path="data/pad.bin", sha256=sha256_file(pad), size=pad_bytes),
            ),
        }
    )
    return pack_bundle(manifest, root, work / "archives" / archive_name(version, manifest.target))


def wheel_of_size(path: Path, size: int, pad: bytes | None = None) -> Path:
    """A valid pure-Python wheel whose file is `size` bytes (+/- a few hundred) of random bytes,
    stored; or, given `pad`, one holding that file deflated."""
    name, version = "dllm_bench_pad", "1.0"
    files: dict[str, bytes] = {
        f"{name}/__init__.py": b"",
        f"{name}-{version}.dist-info/METADATA": f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n".encode(),
        f"{name}-{version}.dist-info/WHEEL": b"Wheel-Version: 1.0\nGenerator: bench\nRoot-Is-Purelib: true\nTag: py3-none-any\n",
    }
    overhead = 1024
    files[f"{name}/pad.bin"] = os.urandom(max(0, size - overhead)) if pad is None else pad
    record = [
        f"{n},sha256={base64.urlsafe_b64encode(hashlib.sha256(d).digest()).rstrip(b'=').decode()},{len(d)}"
        for n, d in files.items()
    ]
    record.append(f"{name}-{version}.dist-info/RECORD,,")
    files[f"{name}-{version}.dist-info/RECORD"] = ("\n".join(record) + "\n").encode()
    path.parent.mkdir(parents=True, exist_ok=True)
    method = zipfile.ZIP_STORED if pad is None else zipfile.ZIP_DEFLATED
    with zipfile.ZipFile(path, "w", method) as archive:
        for member, data in files.items():
            archive.writestr(member, data)
    return path


def timed(command: list[str], env: dict[str, str], cwd: Path) -> tuple[float, float]:
    """(wall seconds, CPU seconds user+sys) of one child process, run in `cwd` (not the source
    tree: `python -m` puts the working directory first on sys.path)."""
    import resource

    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    start = time.perf_counter()
    proc = subprocess.run(command, env=env, cwd=cwd, capture_output=True, text=True)
    elapsed = time.perf_counter() - start
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if proc.returncode != 0:
        raise SystemExit(f"command failed: {' '.join(command)}\n{proc.stdout}\n{proc.stderr}")
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return elapsed, cpu


def verify_throughput(work: Path, size: int, repeats: int = 3) -> dict[str, float]:
    """sha256 GB/s, best of `repeats`: our streamed file hash (`sha256_file`, the one installs
    and `dllm bundle verify` use; page cache warm) and hashlib over bytes already in memory."""
    path = work / "verify.bin"
    random_file(path, size)
    sha256_file(path)  # warm the page cache

    def best(fn) -> float:
        times = []
        for _ in range(repeats):
            start = time.perf_counter()
            fn()
            times.append(time.perf_counter() - start)
        return size / min(times) / 1e9

    streamed = best(lambda: sha256_file(path))
    data = path.read_bytes()
    memory = best(lambda: hashlib.sha256(data).hexdigest())
    path.unlink()
    return {"bytes": size, "streamed_file_gb_s": streamed, "hashlib_memory_gb_s": memory}


def build_archive(work: Path) -> Path:
    from turbo_dllm.bundles.build import build_bundle

    print(
        "building the bundle for this host (dllm bundle build --target auto) ...", file=sys.stderr
    )
    return build_bundle(work / "dist", log=lambda line: print(line, file=sys.stderr)).archive


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--archive", type=Path, help="a bundle for this host (default: build one)")
    parser.add_argument(
        "--sizes", default="0,64", help="MiB of padding per case; 0 = the real bundle"
    )
    parser.add_argument(
        "--pad",
        choices=["random", "compressible"],
        default="random",
        help="padding bytes: random (stored by zstd and in the wheel) or compressible like "
        "native code (~2.7x; the wheel then holds the same file deflated)",
    )
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument(
        "--server",
        choices=("stdlib", "mirror"),
        default="stdlib",
        help="the loopback server both installers fetch from: the standard library's "
        "SimpleHTTPRequestHandler, or `dllm mirror serve`'s handler (sendfile)",
    )
    parser.add_argument(
        "--python",
        type=Path,
        default=None,
        help="the interpreter both installers run under, e.g. a venv where turbo-dllm is "
        "installed from its wheel as users have it (`pip wheel --no-deps .`, then pip install "
        "torch and the wheel there); default: this interpreter with this source tree first on "
        "PYTHONPATH (in a development checkout, its editable-install finder loads at every "
        "start-up, pip's included)",
    )
    parser.add_argument("--verify-mib", type=int, default=1024)
    parser.add_argument(
        "--out", type=Path, default=ROOT / "runs" / "benchmarks" / "bundle_install.json"
    )
    args = parser.parse_args(argv)

    work = Path(tempfile.mkdtemp(prefix="dllm-bench-"))
    python = str(args.python or sys.executable)
    env = dict(os.environ)
    if args.python is None:  # the source tree's turbo_dllm, not an installed one
        env["PYTHONPATH"] = f"{ROOT}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"
    env.pop("DLLM_BUNDLE_INDEX", None)
    # Both sides run with bytecode caches, as installed packages do (this environment may set
    # PYTHONDONTWRITEBYTECODE, which would make every run recompile turbo-dllm from source).
    env.pop("PYTHONDONTWRITEBYTECODE", None)
    env["PYTHONPYCACHEPREFIX"] = str(work / "pycache")
    try:
        base = args.archive or build_archive(work)
        mirror = work / "mirror"
        cases = []
        for mib in (int(s) for s in args.sizes.split(",")):
            fill = random_file if args.pad == "random" else compressible_file
            archive = padded_bundle(base, mib * MIB, work, fill)
            release = f"bench-{mib}"
            result = publish([archive], release=release, mirror=mirror)
            size = result.added[0].size if result.added else archive.stat().st_size
            pad = None  # random: a stored wheel of the archive's size
            if args.pad == "compressible" and mib:  # the same padding file, deflated
                pad = (work / f"unpacked-{mib * MIB}" / "data" / "pad.bin").read_bytes()
            wheel = wheel_of_size(
                mirror / "wheels" / f"pad{mib}" / "dllm_bench_pad-1.0-py3-none-any.whl", size, pad
            )
            cases.append((mib, release, result.catalog_sha256, size, wheel))
        server, url = serve(mirror, args.server)
        rows = []
        try:
            for mib, release, catalog_sha, size, wheel in cases:
                dllm_times, pip_times, dllm_cpu, pip_cpu = [], [], [], []
                for repeat in range(-1, args.repeats):  # -1: untimed warm-up (bytecode caches)
                    # Back to back, so each pair sees about the same host load; the order
                    # alternates so neither side always runs second.
                    home = work / f"home-{mib}-{repeat}"
                    dllm = [
                        python, "-m", "turbo_dllm", "bundle", "install", "--release", release,
                        "--auto", "--index", url, "--catalog-sha256", catalog_sha,
                    ]  # fmt: skip
                    pip = [
                        python, "-m", "pip", "install", "-q", "--no-deps", "--no-index",
                        "--no-cache-dir", "--disable-pip-version-check", "--target",
                        str(work / f"site-{mib}-{repeat}"), f"{url}/{wheel.relative_to(mirror).as_posix()}",
                    ]  # fmt: skip
                    if repeat % 2:
                        pip_run = timed(pip, env, work)
                        dllm_run = timed(dllm, {**env, "DLLM_HOME": str(home)}, work)
                    else:
                        dllm_run = timed(dllm, {**env, "DLLM_HOME": str(home)}, work)
                        pip_run = timed(pip, env, work)
                    if repeat >= 0:
                        dllm_times.append(dllm_run[0])
                        pip_times.append(pip_run[0])
                        dllm_cpu.append(dllm_run[1])
                        pip_cpu.append(pip_run[1])
                    shutil.rmtree(home, ignore_errors=True)
                    shutil.rmtree(work / f"site-{mib}-{repeat}", ignore_errors=True)
                dllm_s, pip_s = statistics.median(dllm_times), statistics.median(pip_times)
                rows.append(
                    {
                        "padding_mib": mib,
                        "archive_bytes": size,
                        "wheel_bytes": wheel.stat().st_size,
                        "dllm_install_s": dllm_s,
                        "pip_install_s": pip_s,
                        "ratio": dllm_s / pip_s,
                        "paired_ratio": statistics.median(
                            d / p for d, p in zip(dllm_times, pip_times, strict=True)
                        ),
                        "dllm_cpu_s": statistics.median(dllm_cpu),
                        "pip_cpu_s": statistics.median(pip_cpu),
                        "cpu_ratio": statistics.median(dllm_cpu) / statistics.median(pip_cpu),
                        "dllm_runs_s": dllm_times,
                        "pip_runs_s": pip_times,
                    }
                )
        finally:
            server.shutdown()
        verify = verify_throughput(work, args.verify_mib * MIB)
    finally:
        shutil.rmtree(work, ignore_errors=True)

    report = {
        "benchmark": "bundle_install",
        "date": datetime.now(timezone.utc).strftime("%Y-%m-%d"),
        "commit": git_commit(),
        "host": f"{platform.processor() or platform.machine()}, {os.cpu_count()} cores, Python {platform.python_version()}",
        "cpu": cpu_model(),
        "python": python,
        "pip": subprocess.run(
            [python, "-m", "pip", "--version"], capture_output=True, text=True
        ).stdout.split(" from ")[0],
        "baseline": "pip install --no-deps --no-index --no-cache-dir --target of a same-size wheel, same HTTP server",
        "repeats": args.repeats,
        "pad": args.pad,
        "cases": rows,
        "verify": verify,
    }
    print(
        f"{'archive':>12} {'dllm wall':>10} {'pip wall':>10} {'ratio':>6} {'paired':>6} "
        f"{'dllm cpu':>10} {'pip cpu':>10} {'ratio':>6}   (medians of {args.repeats})"
    )
    for row in rows:
        print(
            f"{row['archive_bytes'] / MIB:>8.2f} MiB {row['dllm_install_s']:>8.3f} s "
            f"{row['pip_install_s']:>8.3f} s {row['ratio']:>5.2f}x {row['paired_ratio']:>5.2f}x "
            f"{row['dllm_cpu_s']:>8.3f} s {row['pip_cpu_s']:>8.3f} s {row['cpu_ratio']:>5.2f}x"
        )
    print(
        f"sha256 verify: {verify['streamed_file_gb_s']:.2f} GB/s streamed from file, "
        f"{verify['hashlib_memory_gb_s']:.2f} GB/s hashlib in memory "
        f"({verify['bytes'] // MIB} MiB, best of 3)"
    )
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(report, indent=2) + "\n")
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
