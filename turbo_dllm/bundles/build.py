"""`dllm bundle build`: compile every native op for one target and pack a verified bundle.

Each op is compiled in a child process (which also loads the library and checks it against the
torch reference), copied to `lib/<op>.so`, hashed into `bundle.json` together with its source
hash, torch.ops namespace and the build provenance, and packed into
`turbo-dllm-kernels-<version>-<target>.tar.zst`. Compiler outputs are cached per namespace under
`dllm_home()/build`, so rebuilding unchanged sources only relinks.

Builds are reproducible: the same sources built with the same toolchain give a byte-identical
archive in any folder at any time (the compiler maps this host's folders out of the library,
`pack_bundle` fixes member order, times and owners). `check_build` is how anyone verifies a
published entry: rebuild here, compare with the catalog's sha256.
"""

from __future__ import annotations

import shutil
import sys
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from turbo_dllm import __version__
from turbo_dllm.bundles.archive import make_output_dir, pack_bundle
from turbo_dllm.bundles.catalog import CatalogEntry
from turbo_dllm.bundles.manifest import (
    BuildProvenance,
    BundleFile,
    BundleManifest,
    BundleOp,
    archive_name,
)
from turbo_dllm.bundles.target import BundleTarget
from turbo_dllm.bundles.targets import pick_build_target
from turbo_dllm.errors import DllmError
from turbo_dllm.fsutil import sha256_file
from turbo_dllm.host import collect_fingerprint
from turbo_dllm.paths import dllm_home

__all__ = ["BuildCheck", "BuildResult", "build_bundle", "check_build"]


@dataclass(frozen=True)
class BuildResult:
    archive: Path
    sha256: str
    size: int
    manifest: BundleManifest

    @property
    def target(self) -> BundleTarget:
        return self.manifest.target


def build_bundle(
    out_dir: Path,
    *,
    target: str = "auto",
    ops: list[str] | None = None,
    verbose: bool = False,
    log: Callable[[str], None] | None = None,
) -> BuildResult:
    """Build every op (or `ops`, each once) for `target` into `out_dir`; `log` receives
    progress lines. What the arguments get wrong (an unknown op, an op not written for the
    target's GPUs, no op to compile) is an error before `out_dir` is made or anything is
    compiled."""
    from turbo_dllm.bundles.native import load_native_op, native_op_names

    names = list(dict.fromkeys(ops or native_op_names()))  # `--op x --op x`: built once
    if not names:
        raise DllmError(
            "no native ops found to build",
            hint="the package's native/ sources are missing: reinstall turbo-dllm "
            "(`pip install --force-reinstall turbo-dllm`)",
        )
    chosen = [load_native_op(name) for name in names]

    try:
        import torch  # the build uses the running torch; import it so the fingerprint is exact
    except ImportError as error:  # `--build missing` in a venv without torch: not a traceback
        raise DllmError(
            f"building a bundle compiles against the running torch, and this Python "
            f"({sys.executable}) cannot import it ({error})",
            hint="install torch into this environment first (the version the bundle is for), "
            "or install a bundle built elsewhere: dllm bundle install --auto",
        ) from None

    from turbo_dllm.bundles.compile import check_ninja_paths, namespace_for, run_compile_subprocess

    host = collect_fingerprint(apply_overrides=False)
    _, bundle_target = pick_build_target(target, host)
    for op in chosen:
        unsupported = [a for a in bundle_target.archs if a not in op.spec.cuda_archs]
        if unsupported:
            raise DllmError(
                f"op {op.spec.name!r} is not written for {'+'.join(map(str, unsupported))} "
                f"(its spec lists {', '.join(map(str, op.spec.cuda_archs)) or 'no GPU'})",
                hint=f"add the architecture to native/{op.spec.name}/op.toml once qualified",
            )
    if all(op.spec.is_triton for op in chosen):
        raise DllmError(
            f"a bundle needs at least one compiled (C++) op for its provenance; "
            f"{', '.join(names)} {'is a Triton op' if len(names) == 1 else 'are Triton ops'}",
            hint="add a C++ op with --op (or build every op: no --op)",
        )
    for op in chosen:  # a path ninja cannot take: said before anything is made or compiled
        if not op.spec.is_triton:
            check_ninja_paths(op, bundle_target.archs)
    make_output_dir(out_dir)
    bundle_ops: list[BundleOp] = []
    files: list[BundleFile] = []
    compiled_ops = []
    with tempfile.TemporaryDirectory(prefix=".dllm-bundle-", dir=out_dir) as staging_name:
        staging = Path(staging_name)
        (staging / "lib").mkdir()
        for op in chosen:
            name = op.spec.name
            source_sha = op.source_sha256()
            namespace = namespace_for(source_sha, "bundle", str(bundle_target))
            if op.spec.is_triton:
                if not bundle_target.archs:  # GPU kernels only; the reference is the CPU twin
                    if log:
                        log(f"skipping {name}: Triton kernels have no CPU target")
                    continue
                if log:
                    log(f"packing the Triton op {name} for {bundle_target} ...")
                shipped = _pack_triton_op(op, staging, verbose=verbose)
                files.extend(shipped)
                bundle_ops.append(
                    BundleOp(
                        name=name,
                        namespace=namespace,
                        library=shipped[0].path,
                        source_sha256=source_sha,
                        devices=("cuda",),
                        archs=bundle_target.archs,
                    )
                )
                continue
            if log:
                log(f"compiling {name} for {bundle_target} ...")
            compiled = run_compile_subprocess(
                name,
                namespace=namespace,
                build_dir=dllm_home() / "build" / namespace,
                archs=bundle_target.archs,
                verbose=verbose,
            )
            relative = f"lib/{name}.so"
            shutil.copyfile(compiled.library, staging / relative)
            files.append(
                BundleFile(
                    path=relative,
                    sha256=sha256_file(staging / relative),
                    size=(staging / relative).stat().st_size,
                )
            )
            bundle_ops.append(
                BundleOp(
                    name=name,
                    namespace=namespace,
                    library=relative,
                    source_sha256=source_sha,
                    devices=compiled.devices,
                    archs=bundle_target.archs,
                )
            )
            compiled_ops.append(compiled)
        if not compiled_ops:
            raise DllmError(
                "a bundle needs at least one compiled (C++) op for its provenance",
                hint="add a C++ op with --op (or build every op: no --op)",
            )
        first = compiled_ops[0]
        manifest = BundleManifest(
            name=archive_name(__version__, bundle_target).removesuffix(".tar.zst"),
            version=__version__,
            target=bundle_target,
            files=tuple(files),
            ops=tuple(bundle_ops),
            build=BuildProvenance(
                turbo_dllm=__version__,
                cxx=first.cxx,
                nvcc=first.nvcc,
                cflags=first.cflags,
                cuda_cflags=first.cuda_cflags,
                torch=torch.__version__,
                cuda=torch.version.cuda,
                host=host,
            ),
        )
        archive = pack_bundle(manifest, staging, out_dir / archive_name(__version__, bundle_target))
    return BuildResult(archive, sha256_file(archive), archive.stat().st_size, manifest)


@dataclass(frozen=True)
class BuildCheck:
    """A rebuild compared with a published catalog entry."""

    result: BuildResult
    published: CatalogEntry
    differing_files: tuple[str, ...] | None  # None when the published archive was not at hand

    @property
    def identical(self) -> bool:
        return self.result.sha256 == self.published.sha256


def check_build(
    catalog_file: Path,
    *,
    target: str = "auto",
    verbose: bool = False,
    log: Callable[[str], None] | None = None,
) -> BuildCheck:
    """Rebuild this host's target and compare it with its entry in `catalog_file`.

    When the published archive sits where a mirror keeps it (`<root>/bundles/<file>`, the catalog
    being `<root>/releases/<release>/catalog.toml`), a mismatch also names the files that differ.
    """
    from turbo_dllm.bundles.archive import read_archive_manifest
    from turbo_dllm.bundles.catalog import parse_catalog

    try:
        data = catalog_file.read_bytes()
    except OSError as error:
        raise DllmError(
            f"cannot read the catalog {catalog_file}: {error.strerror}",
            hint="pass a release's catalog.toml, e.g. bundles/releases/v0.1.0/catalog.toml",
        ) from None
    catalog = parse_catalog(data, str(catalog_file))
    # Which entry this host rebuilds, known before minutes of compiling.
    _, bundle_target = pick_build_target(target, collect_fingerprint(apply_overrides=False))
    entry = next((e for e in catalog.bundles if e.target == bundle_target), None)
    if entry is None:
        listed = ", ".join(str(e.target) for e in catalog.bundles) or "none"
        raise DllmError(
            f"release {catalog.release} has no bundle for {bundle_target}, the target this "
            f"host builds (the catalog lists: {listed})",
            hint="rebuild under the Python and torch of a listed target",
        )
    with tempfile.TemporaryDirectory(prefix="dllm-build-check-") as tmp:
        result = build_bundle(Path(tmp), target=target, verbose=verbose, log=log)
        differing = None
        published = catalog_file.parent.parent.parent / "bundles" / entry.file
        if entry.sha256 != result.sha256 and published.is_file():
            theirs = {f.path: f.sha256 for f in read_archive_manifest(published).files}
            ours = {f.path: f.sha256 for f in result.manifest.files}
            differing = tuple(
                sorted(p for p in set(theirs) | set(ours) if theirs.get(p) != ours.get(p))
            )
        # Report the rebuilt archive by name only: the temporary folder is gone on return.
        kept = BuildResult(Path(result.archive.name), result.sha256, result.size, result.manifest)
    return BuildCheck(kept, entry, differing)


def _pack_triton_op(op, staging: Path, *, verbose: bool) -> list[BundleFile]:
    """Copy a Triton op's sources to `triton/<op>/` (the first is its module) and, where this
    host has a GPU, check the kernels against the reference; that compiles them, into a fresh
    Triton cache whose entries ship as `triton/<op>/compiled/<key>/` (bundles/triton_cache.py),
    so hosts of this target launch them without compiling."""
    import os
    import subprocess
    import sys

    from turbo_dllm.bundles.triton_cache import collect

    folder = staging / "triton" / op.name
    folder.mkdir(parents=True)
    for path in op.triton_source_paths():
        shutil.copyfile(path, folder / path.name)
    with tempfile.TemporaryDirectory(prefix=".dllm-triton-cache-") as cache:
        command = [sys.executable, "-m", "turbo_dllm.kernels.selftest", "--op", op.name]
        env = {**os.environ, "TRITON_CACHE_DIR": cache}
        proc = subprocess.run(command, capture_output=not verbose, text=True, env=env)
        if proc.returncode != 0:
            raise DllmError(
                f"the Triton op {op.name!r} failed its self-test: "
                f"{(proc.stderr or '').strip()[-3000:]}",
                hint="the kernels are wrong for this GPU/Triton; do not ship them",
            )
        for relative, data in collect(Path(cache)).items():
            (folder / "compiled" / relative).parent.mkdir(parents=True, exist_ok=True)
            (folder / "compiled" / relative).write_bytes(data)
    sources = [f"triton/{op.name}/{path.name}" for path in op.triton_source_paths()]
    compiled = sorted(
        p.relative_to(staging).as_posix() for p in (folder / "compiled").rglob("*") if p.is_file()
    )
    return [
        BundleFile(path=relative, sha256=sha256_file(staging / relative),
                   size=(staging / relative).stat().st_size)
        for relative in sources + compiled
    ]  # fmt: skip
