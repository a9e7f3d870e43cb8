"""`dllm cache pack | install | list | verify | remove`: compile-cache packs (turbo_dllm.cache)."""

from __future__ import annotations

import os
import shlex
import sys
from pathlib import Path

from turbo_dllm.cli._output import add_overrides, check_overrides_have_config, emit_json, group

SHOWN_PROBLEMS = 20  # per pack, without --all: a wiped cache is one line per file (thousands)


LOCK_TIMEOUT_HELP = (
    "seconds to wait for the compile-packs lock while another install or remove holds it "
    "(default 60; 0 or more)"
)


def register(subparsers) -> None:
    commands = group(subparsers, "cache", "compile-cache packs: skip the first step's compiling")

    p = commands.add_parser("pack", help="pack the inductor and Triton caches a run produced")
    p.add_argument("--config", type=Path, help="the RunSpec the caches are for (keys the pack)")
    add_overrides(p)
    p.add_argument("--out", required=True, type=Path, help="folder for the .tar.zst pack")
    p.add_argument(
        "--warm",
        action="store_true",
        help="first run the spec's first step with fresh caches, and pack exactly those",
    )
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=_pack)

    p = commands.add_parser("install", help="verify a pack and add it to this host's cache")
    p.add_argument("pack", type=Path)
    p.add_argument("--config", type=Path, help="also refuse a pack made for another spec")
    add_overrides(p)
    p.add_argument("--lock-timeout", type=float, default=60.0, help=LOCK_TIMEOUT_HELP)
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=_install)

    p = commands.add_parser("list", help="installed packs (and, with --available, offered ones)")
    p.add_argument(
        "--available",
        action="store_true",
        help="also the packs on offer: in $DLLM_PACK_PATH folders and packs/ of a local "
        "$DLLM_BUNDLE_INDEX (a folder or file:// URL)",
    )
    p.add_argument(
        "--config",
        type=Path,
        help="with --available: judge offered packs against this spec too",
    )
    add_overrides(p)
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=_list)

    p = commands.add_parser("verify", help="re-hash installed packs' files in the cache")
    p.add_argument(
        "pack", nargs="?", help="sha256 prefix (6+ characters) or file name (default: all)"
    )
    p.add_argument(
        "--all",
        action="store_true",
        help=f"print every problem (default: the first {SHOWN_PROBLEMS} of each pack)",
    )
    p.add_argument("--json", action="store_true", help="every problem, as JSON")
    p.set_defaults(func=_verify)

    p = commands.add_parser("remove", help="delete an installed pack's files from the cache")
    p.add_argument("pack", help="sha256 prefix (6+ characters) or file name")
    p.add_argument("--lock-timeout", type=float, default=60.0, help=LOCK_TIMEOUT_HELP)
    p.set_defaults(func=_remove)


def _spec(args):
    """(spec, digest, compile-relevant part) of --config, or Nones."""
    check_overrides_have_config(args)
    if not args.config:
        return None, None, None
    from turbo_dllm.cache.key import compile_relevant, spec_digest
    from turbo_dllm.data.spec import load_training_spec

    spec = load_training_spec(args.config, args.overrides)
    return spec, spec_digest(spec), compile_relevant(spec)


def _caches() -> dict[str, Path]:
    from turbo_dllm.train.compile_cache import (
        INDUCTOR_CACHE_VARIABLE,
        TRITON_CACHE_VARIABLE,
        prepare_compile_cache,
    )

    settings = prepare_compile_cache()
    # Absolute: an install's record names them, and `verify` and `remove` may run elsewhere (a
    # relative DLLM_COMPILE_CACHE read as every file missing there, and removed nothing).
    return {
        "inductor": Path(os.path.abspath(settings[INDUCTOR_CACHE_VARIABLE])),
        "triton": Path(os.path.abspath(settings[TRITON_CACHE_VARIABLE])),
    }


def _pack(args) -> int:
    from turbo_dllm.cache.key import host_pack_key
    from turbo_dllm.cache.packs import make_pack
    from turbo_dllm.errors import DllmError
    from turbo_dllm.host import collect_fingerprint

    spec, digest, part = _spec(args)
    key = host_pack_key(collect_fingerprint(apply_overrides=False), digest)
    if args.warm:
        if spec is None:
            raise DllmError(
                "--warm runs the spec's first step: pass --config F",
                hint="dllm cache pack --config train.yaml --warm --out DIR",
            )
        from turbo_dllm.cache.warm import warm_caches, warm_folder
        from turbo_dllm.sigterm import unwinding_on_sigterm

        # SIGTERM (`timeout`, a scheduler's limit) unwinds: the step is killed and the folder
        # (a run dir with a checkpoint of the model, and the caches) removed.
        with unwinding_on_sigterm(), warm_folder() as tmp:
            folder = warm_caches(args.config, args.overrides, tmp, spec.topology.world_size)
            path, manifest = make_pack(
                {"inductor": folder / "inductor", "triton": folder / "triton"},
                args.out,
                key,
                spec=part,
            )
    else:
        path, manifest = make_pack(_caches(), args.out, key, spec=part)
    from turbo_dllm.fsutil import sha256_file

    sha256 = sha256_file(path)
    if args.json:
        emit_json(
            {
                "pack": str(path),
                "sha256": sha256,
                "files": len(manifest.files),
                "bytes": manifest.total_size,
                "key": manifest.key.model_dump(mode="json"),
            }
        )
        return 0
    print(f"packed {path}")
    print(f"  {len(manifest.files)} files, {manifest.total_size / 1e6:,.1f} MB, sha256 {sha256}")
    print(f"  for {manifest.key.label()}, spec {digest[:12] if digest else 'any (no --config)'}")
    # The remark is a shell comment: "(on a host ...)" after the command made the line, pasted
    # as printed, a bash syntax error.
    print(f"next: dllm cache install {shlex.quote(str(path))}   # on a host like this one")
    return 0


def _install(args) -> int:
    from turbo_dllm.cache.packs import install_pack
    from turbo_dllm.cli.bundle import _check_lock_timeout
    from turbo_dllm.host import collect_fingerprint

    _check_lock_timeout(args)
    _, digest, part = _spec(args)
    pack, added = install_pack(
        args.pack,
        _caches(),
        collect_fingerprint(),
        spec_sha256=digest,
        spec=part,
        lock_timeout_s=args.lock_timeout,
    )
    if args.json:
        emit_json({**pack.to_json(), "added": added})
        return 0
    kept = len(pack.manifest.files) - added
    print(f"installed {pack.manifest.file_name} ({pack.short_sha})")
    print(f"  {added} files added to {Path(pack.caches['inductor']).parent}, {kept} already there")
    return 0


def _list(args) -> int:
    from turbo_dllm.cache.packs import (
        PACKS_VARIABLE,
        available_packs,
        installed_packs,
        pack_folders,
        repair_hint,
        verify_pack,
    )
    from turbo_dllm.cli._output import shell_path
    from turbo_dllm.errors import DllmError

    check_overrides_have_config(args)
    if args.config and not args.available:  # else --config would be ignored without a word
        # Quoted, with the --set values given: `--config my run.yaml` named two files.
        sets = "".join(f" --set {shlex.quote(o)}" for o in args.overrides)
        raise DllmError(
            "--config judges the offered packs: it needs --available",
            hint=f"dllm cache list --available --config {shell_path(args.config)}{sets}",
        )
    packs = installed_packs()
    # Files of each pack not in the cache (sizes only, as doctor checks): an install killed
    # while moving them leaves its record, which read as a whole pack installed.
    missing = {p.sha256: len(verify_pack(p, hashes=False)) for p in packs}
    offered = []
    if args.available:
        from turbo_dllm.host import collect_fingerprint

        _, digest, _ = _spec(args)
        offered = available_packs(collect_fingerprint(), digest)
    if args.json:
        emit_json(
            {
                "installed": [
                    {
                        **p.to_json(),
                        "missing": missing[p.sha256],
                        **({"fix": repair_hint(p)} if missing[p.sha256] else {}),
                    }
                    for p in packs
                ],
                "available": [
                    {
                        "path": str(o.path),
                        "fits": o.fits,
                        "differences": [str(d) for d in o.differences],
                        **({"error": o.error, "fix": _offer_fix(o.path)} if o.error else {}),
                    }
                    for o in offered
                ],
            }
        )
        return 0
    if not packs:
        print("no compile-cache packs installed")
    for pack in packs:
        files, gone = len(pack.manifest.files), missing[pack.sha256]
        state = f"  INCOMPLETE: {gone} of {files} files missing or changed" if gone else ""
        print(
            f"{pack.short_sha}  {pack.manifest.key.label()}  {files} files  "
            f"{pack.installed_at}  {pack.manifest.file_name}{state}"
        )
        if gone:
            print(
                f"fix {pack.short_sha}: an install stopped partway, or the cache lost them: "
                f"{repair_hint(pack)} (dllm cache verify names the files)",
                file=sys.stderr,
            )
    if args.available and not offered:
        folders = (
            ", ".join(map(str, pack_folders()))
            or f"no ${PACKS_VARIABLE} folder, nor packs/ of a local $DLLM_BUNDLE_INDEX, exists"
        )
        print(f"no compile-cache packs on offer (looked in: {folders})")
    for offer in offered:
        if offer.error:  # listed like `dllm bundle list`'s damaged entries: marked, fix on stderr
            print(f"offered  {offer.path}: DAMAGED: {offer.error}")
            print(f"fix {offer.path.name}: {_offer_fix(offer.path)}", file=sys.stderr)
            continue
        verdict = "fits" if offer.fits else "; ".join(map(str, offer.differences))
        print(f"offered  {offer.path}: {verdict}")
    return 0


def _offer_fix(path: Path) -> str:
    """The fix for a pack on offer that cannot be read (`dllm cache install` refuses it)."""
    return f"replace {path} with a complete copy (or pack again: dllm cache pack), or delete it"


def _verify(args) -> int:
    from turbo_dllm.cache.packs import find_installed, installed_packs, repair_hint, verify_pack

    packs = [find_installed(args.pack)] if args.pack else installed_packs()
    report = {p.short_sha: verify_pack(p) for p in packs}
    ok = not any(report.values())
    # Each failing pack's own fix, keyed like `packs` (as `dllm bundle verify --json` does).
    fixes = {p.short_sha: repair_hint(p) for p in packs if report[p.short_sha]}
    if args.json:
        emit_json({"ok": ok, "packs": report, "fixes": fixes})
        return 0 if ok else 1
    if not packs:
        print("no compile-cache packs installed")
    for name, problems in report.items():
        if not problems:
            print(f"ok    {name}")
            continue
        print(f"FAIL  {name}  {len(problems)} problem{'' if len(problems) == 1 else 's'}")
        shown = problems if args.all else problems[:SHOWN_PROBLEMS]
        for problem in shown:
            print(f"      {problem}")
        if len(shown) < len(problems):
            print(f"      ... and {len(problems) - len(shown)} more (--all shows them)")
    for name, fix in fixes.items():
        print(f"fix {name}: {fix}", file=sys.stderr)
    return 0 if ok else 1


def _remove(args) -> int:
    from turbo_dllm.cache.packs import (
        find_installed,
        packs_locked,
        remove_damaged_record,
        remove_pack,
    )
    from turbo_dllm.cli.bundle import _check_lock_timeout

    _check_lock_timeout(args)
    with packs_locked(args.lock_timeout):
        damaged = remove_damaged_record(args.pack)
        if damaged is None:
            pack = find_installed(args.pack)
            removed = remove_pack(pack)
    if damaged is not None:
        print(
            f"removed the damaged record {damaged}; the files it added stay in the cache until "
            "the pack is installed again (that install takes them over, so removing it then "
            "deletes them)"
        )
        return 0
    print(f"removed {pack.manifest.file_name} ({pack.short_sha}): {removed} files deleted")
    return 0
