"""`dllm bundle fingerprint | build | publish | install | list | status | verify | uninstall |
rollback | deactivate`."""

from __future__ import annotations

import sys
import time
from pathlib import Path

from turbo_dllm import __version__
from turbo_dllm.cli._output import emit_json, group, shell_path

DEFAULT_RELEASE = f"v{__version__}"
LOCK_TIMEOUT_HELP = (
    "seconds to wait for the bundle store's lock while another bundle command holds it "
    "(default 60; 0 or more)"
)


def register(subparsers) -> None:
    commands = group(
        subparsers, "bundle", "native-kernel bundles: fingerprint, build, install", quick_exit=True
    )

    p = commands.add_parser("fingerprint", help="print this host's fingerprint")
    p.add_argument("--no-overrides", action="store_true", help="ignore DLLM_OVERRIDE_* variables")
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=_fingerprint)

    p = commands.add_parser("build", help="compile the native ops and pack a bundle")
    p.add_argument("--target", default="auto", help="a name from bundles/targets.toml, or auto")
    out = p.add_mutually_exclusive_group(required=True)
    out.add_argument("--out", type=Path, help="folder for the .tar.zst archive")
    out.add_argument(
        "--check",
        type=Path,
        metavar="CATALOG",
        help="rebuild and compare with this host's entry in a release catalog.toml",
    )
    p.add_argument("--op", action="append", dest="ops", help="build only this op (repeatable)")
    p.add_argument("--verbose", action="store_true", help="show compiler commands and output")
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=_build)

    p = commands.add_parser("publish", help="add bundles to a mirror folder and its catalog")
    p.add_argument("archives", nargs="+", type=Path)
    p.add_argument("--release", required=True)
    p.add_argument("--mirror", required=True, type=Path, help="mirror folder (created if needed)")
    p.add_argument("--lock", type=Path, help="also pin the release in this releases.lock")
    p.add_argument(
        "--pack",
        action="append",
        dest="packs",
        default=[],
        type=Path,
        help="also publish this compile-cache pack in MIRROR/packs/ (repeatable)",
    )
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=_publish)

    p = commands.add_parser("install", help="install the bundle for this host from an index")
    p.add_argument("--release", default=DEFAULT_RELEASE, help=f"default: {DEFAULT_RELEASE}")
    choice = p.add_mutually_exclusive_group(required=True)
    choice.add_argument("--auto", action="store_true", help="pick the bundle for this host")
    choice.add_argument("--target", help="install this catalog target (must fit the host)")
    source = p.add_mutually_exclusive_group()
    source.add_argument("--index", help="https://, http:// or file:// URL (or $DLLM_BUNDLE_INDEX)")
    source.add_argument("--mirror", help="a mirror folder")
    p.add_argument("--catalog-sha256", help="trust a catalog not pinned in releases.lock")
    p.add_argument(
        "--offline",
        action="store_true",
        help="contact no network host: folders, file:// and 127.0.0.1 only (or DLLM_OFFLINE=1)",
    )
    p.add_argument(
        "--build",
        choices=["missing"],
        help="missing: when no published bundle fits (or no index is reachable), build this "
        "host's bundle from the package's sources, self-test and install it",
    )
    p.add_argument("--dry-run", action="store_true", help="print the choice and stop")
    p.add_argument("--lock-timeout", type=float, default=60.0, help=LOCK_TIMEOUT_HELP)
    p.add_argument(
        "--retries",
        type=int,
        default=4,
        help="retries of each download, the catalog's and the bundle's (each resumes; "
        "default 4; 0: one attempt)",
    )
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=_install)

    p = commands.add_parser("list", help="installed bundles")
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=_list)

    p = commands.add_parser("status", help="the active bundle and whether it fits this host")
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=_status)

    p = commands.add_parser("verify", help="re-hash installed bundles against their bundle.json")
    p.add_argument(
        "bundle", nargs="?", help="bundle id or sha256 prefix, 6+ characters (default: all)"
    )
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=_verify)

    p = commands.add_parser("uninstall", help="remove an installed, inactive bundle")
    p.add_argument("bundle", help="bundle id or sha256 prefix (6+ characters)")
    p.add_argument("--lock-timeout", type=float, default=60.0, help=LOCK_TIMEOUT_HELP)
    p.set_defaults(func=_uninstall)

    p = commands.add_parser("rollback", help="make the previous bundle active again")
    p.add_argument("--lock-timeout", type=float, default=60.0, help=LOCK_TIMEOUT_HELP)
    p.set_defaults(func=_rollback)

    p = commands.add_parser(
        "deactivate",
        help="make no bundle active (it stays installed; rollback re-activates it)",
    )
    p.add_argument("--lock-timeout", type=float, default=60.0, help=LOCK_TIMEOUT_HELP)
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=_deactivate)


def _fingerprint(args) -> int:
    from turbo_dllm.host import collect_fingerprint

    fingerprint = collect_fingerprint(apply_overrides=not args.no_overrides)
    if args.json:
        emit_json(fingerprint.model_dump(mode="json"))
        return 0
    data = fingerprint.model_dump(mode="json")
    for key in ("python", "python_tag", "platform", "glibc", "torch", "torch_cuda", "cxx11_abi"):
        print(f"{key:<11} {data[key] if data[key] is not None else '-'}")
    print(f"{'driver':<11} {data['driver'] or '-'}")
    if fingerprint.gpus:
        for gpu in fingerprint.gpus:
            print(f"{'gpu ' + str(gpu.index):<11} {gpu.name} ({gpu.arch})")
    else:
        print(f"{'gpus':<11} none")
    print(f"{'nccl':<11} {data['nccl'] or '-'}")
    print(f"{'triton':<11} {data['triton'] or '-'}")
    if fingerprint.overrides:
        print(f"overridden by DLLM_OVERRIDE_*: {', '.join(fingerprint.overrides)}")
    for note in fingerprint.notes:
        print(f"note: {note}", file=sys.stderr)
    return 0


def _build(args) -> int:
    from turbo_dllm.bundles.build import build_bundle

    if args.check:
        return _build_check(args)
    result = build_bundle(
        args.out,
        target=args.target,
        ops=args.ops,
        verbose=args.verbose,
        log=lambda line: print(line, file=sys.stderr),
    )
    if args.json:
        emit_json(
            {
                "archive": str(result.archive),
                "sha256": result.sha256,
                "size": result.size,
                "target": str(result.target),
                "ops": [op.name for op in result.manifest.ops],
            }
        )
        return 0
    print(f"built {result.archive}")
    print(f"  target {result.target}, {result.size} bytes, sha256 {result.sha256}")
    print(
        f"next: dllm bundle publish {shell_path(result.archive)} --release {DEFAULT_RELEASE} "
        "--mirror DIR"
    )
    return 0


def _build_check(args) -> int:
    from turbo_dllm.bundles.build import check_build
    from turbo_dllm.errors import DllmError

    if args.ops:
        raise DllmError(
            "--check rebuilds every op of the target; drop --op",
            hint="dllm bundle build --check CATALOG (without --op)",
        )
    check = check_build(
        args.check,
        target=args.target,
        verbose=args.verbose,
        log=lambda line: print(line, file=sys.stderr),
    )
    if args.json:
        emit_json(
            {
                "identical": check.identical,
                "target": str(check.result.target),
                "sha256": check.result.sha256,
                "published_sha256": check.published.sha256,
                "differing_files": check.differing_files,
            }
        )
    elif check.identical:
        print(f"identical  {check.published.file}")
        print(f"  sha256 {check.result.sha256}: this host rebuilt the published bundle exactly")
    else:
        print(f"DIFFERENT  {check.published.file}")
        print(f"  rebuilt   sha256 {check.result.sha256}")
        print(f"  published sha256 {check.published.sha256}")
        if check.differing_files is not None:
            print(
                f"  files that differ: {', '.join(check.differing_files) or 'none (bundle.json)'}"
            )
        print(
            "  same sources (the release's commit) and the same toolchain (compiler, torch, "
            "Python) must give the same bytes; compare `dllm bundle fingerprint` and the "
            "published bundle.json's build section",
            file=sys.stderr,
        )
    return 0 if check.identical else 1


def _publish(args) -> int:
    from turbo_dllm.bundles.catalog import check_pin, pin_release, read_lock_to_pin
    from turbo_dllm.bundles.publish import publish

    check_catalog = None
    if args.lock:  # an unusable lock file is an error before anything is published
        _, lock = read_lock_to_pin(args.lock)

        def check_catalog(sha256: str) -> None:  # a release pinned to another catalog too
            check_pin(args.lock, lock, args.release, sha256)

    checked = []
    if (
        args.packs
    ):  # compile-cache packs (turbo_dllm.cache): all verified before anything is written
        from turbo_dllm.cache.packs import check_packs

        checked = check_packs(args.packs)
    result = publish(
        args.archives, release=args.release, mirror=args.mirror, check_catalog=check_catalog
    )
    packs = []
    if checked:
        from turbo_dllm.cache.packs import copy_packs

        packs = copy_packs(checked, args.mirror)
    pinned = pin_release(args.lock, args.release, result.catalog_sha256) if args.lock else None
    shipped = _shipped_pin(args.release)  # what this installed turbo-dllm's own lock says
    if args.json:
        emit_json(
            {
                "release": result.release,
                "catalog": str(result.catalog),
                "catalog_sha256": result.catalog_sha256,
                "added": [str(e.target) for e in result.added],
                "unchanged": [str(e.target) for e in result.unchanged],
                "packs": [str(p) for p in packs],
                "pinned": pinned,
                "shipped_pin": shipped,
            }
        )
        return 0
    for entry in result.added:
        print(f"added     {entry.file}")
    for entry in result.unchanged:
        print(f"unchanged {entry.file}")
    for pack in packs:
        print(f"pack      {pack.name}")
    print(f"catalog   {result.catalog}")
    print(f"sha256    {result.catalog_sha256}")
    if args.lock:
        print(f"pinned {args.release} in {args.lock}" if pinned else f"{args.lock} already pins it")
    elif shipped == result.catalog_sha256:  # it printed the line to add, already there
        print(f"releases.lock already pins {args.release} to this catalog (shipped lock)")
    else:
        print(
            f'releases.lock line: "{args.release}" = {{ catalog_sha256 = "{result.catalog_sha256}" }}'
        )
        if shipped is not None:
            print(
                f"warning: this turbo-dllm's releases.lock pins {args.release} to another "
                f"catalog ({shipped}): its installs refuse this one; publish under a new "
                "release name",
                file=sys.stderr,
            )
    # A release the shipped lock pins to this catalog needs no --catalog-sha256.
    trust = "" if shipped == result.catalog_sha256 else f" --catalog-sha256 {result.catalog_sha256}"
    print(
        f"install: dllm bundle install --release {args.release} --auto "
        f"--mirror {shell_path(args.mirror)}{trust}"
    )
    return 0


def _shipped_pin(release: str) -> str | None:
    """The catalog sha256 the releases.lock shipped in this package pins `release` to, if any
    (an unreadable lock: None; install says what is wrong with it)."""
    from turbo_dllm.bundles.catalog import read_releases_lock
    from turbo_dllm.errors import DllmError

    try:
        pin = read_releases_lock().releases.get(release)
    except DllmError:
        return None
    return pin.catalog_sha256 if pin else None


def _check_lock_timeout(args) -> None:
    """A negative --lock-timeout gave up at once with "waited -5 s"; nan waited forever."""
    if not args.lock_timeout >= 0:
        from turbo_dllm.errors import DllmError

        raise DllmError(
            f"--lock-timeout must be 0 or more seconds, got {args.lock_timeout:g}",
            hint="pass the seconds to wait for the store's lock (0: do not wait), or leave it out",
        )


def _progress():
    """A rich progress bar on stderr when it is a terminal; otherwise silence."""
    if not sys.stderr.isatty():
        return None, None
    from rich.progress import BarColumn, DownloadColumn, Progress, TransferSpeedColumn

    bar = Progress(
        "[progress.description]{task.description}",
        BarColumn(),
        DownloadColumn(),
        TransferSpeedColumn(),
        transient=True,
    )
    task = None

    def update(done: int, total: int) -> None:
        nonlocal task
        if task is None:
            task = bar.add_task("download", total=total)
        bar.update(task, completed=done)

    return bar, update


def _install(args) -> int:
    from turbo_dllm.host.probes import start_gpu_probe

    start_gpu_probe()  # nvidia-smi's wait overlaps the imports and the catalog fetch below
    from turbo_dllm.bundles.target import BundleTarget
    from turbo_dllm.errors import DllmError

    if args.build and args.target:
        raise DllmError(
            "--build missing builds this host's own target; use it with --auto",
            hint="dllm bundle install --auto --build missing (or drop --build for --target)",
        )
    if args.retries < 0:  # else no attempt is made and the error blames the download
        raise DllmError(
            f"--retries must be 0 or more, got {args.retries}",
            hint="0 tries each download once; leave --retries out for the default",
        )
    _check_lock_timeout(args)
    target = BundleTarget.parse(args.target) if args.target else None
    if args.dry_run:
        return _install_planned(args, target)
    from turbo_dllm.bundles.store import BundleStore
    from turbo_dllm.sigterm import Terminated, unwinding_on_sigterm

    store = BundleStore()
    store.check_folders()  # a file in the way of the store: said before any download or build
    before = store.active_sha256()
    started = time.time()
    # SIGTERM (`kill`, `timeout`, a scheduler) unwinds like Ctrl-C: the staging folder goes and
    # the lock is released; the renames that install and activate wait for neither
    # (`run_install`). One line then says what the interruption left.
    with unwinding_on_sigterm():
        try:
            return _install_planned(args, target)
        except (KeyboardInterrupt, Terminated) as stop:
            print(_interrupted(store, stop, before, started), file=sys.stderr, flush=True)
            if isinstance(stop, KeyboardInterrupt):
                return 130  # as `dllm: interrupted`
            raise  # and the process ends by SIGTERM, as it would have (exit status 143)


def _active_label(store) -> tuple[str | None, str]:
    """The sha256 `active` names (None: none) and how to name it: `ID (SHA12)`."""
    from turbo_dllm.errors import DllmError

    sha = store.active_sha256()
    if sha is None:
        return None, "none"
    try:
        bundle = store.active()
    except DllmError:  # a damaged entry: still the one `active` names
        bundle = None
    return sha, f"{bundle.bundle_id} ({sha[:12]})" if bundle is not None else sha[:12]


def _interrupted(store, stop: BaseException, before: str | None, started: float) -> str:
    """What an install stopped by Ctrl-C or SIGTERM left: nothing changed (the usual case),
    or, when the signal came while the bundle was being put in place (which it waits for),
    the bundle it activated. A partial download is said to be kept only when this install
    wrote to it (written since `started`): another bundle's, left long ago, is not this one's."""
    by = "Ctrl-C" if isinstance(stop, KeyboardInterrupt) else "SIGTERM"
    now, label = _active_label(store)
    if now != before and now is not None:
        return (
            f"dllm: bundle install interrupted by {by} after it had installed and activated "
            f"{label}; `dllm bundle rollback` returns to the bundle active before"
        )
    active = f"the active bundle is still {label}" if now else "no bundle is active"
    parts = list(store.downloads_dir.glob("*.part")) if store.downloads_dir.is_dir() else []
    kept = (
        "; the partial download is kept: the same command resumes it"
        if any(p.stat().st_size and p.stat().st_mtime >= started - 1 for p in parts)
        else ""
    )
    return f"dllm: bundle install interrupted by {by}: nothing changed ({active}){kept}"


def _install_planned(args, target) -> int:
    from turbo_dllm.bundles.install import plan_install, run_install
    from turbo_dllm.bundles.resolve import BundleUnavailable

    try:
        plan = plan_install(
            args.release,
            index=args.index or args.mirror,
            target=target,
            catalog_sha256=args.catalog_sha256,
            offline=args.offline,
            retries=args.retries,
        )
    except BundleUnavailable as error:
        if args.build != "missing":
            raise
        return _build_missing(args, error)
    if args.dry_run:
        if args.json:
            emit_json({"dry_run": True, **plan.to_json()})
        else:
            print(f"release {plan.release} from {plan.source.location}")
            print(plan.resolution.trace())
            print(f"would install {plan.entry.file} ({plan.entry.size} bytes)")
        return 0
    bar, update = _progress()
    try:
        if bar is not None:
            with bar:
                result = run_install(
                    plan, lock_timeout_s=args.lock_timeout, retries=args.retries, progress=update
                )
        else:
            result = run_install(plan, lock_timeout_s=args.lock_timeout, retries=args.retries)
    except BundleUnavailable as error:  # the catalog lists an archive the index lacks
        if args.build != "missing":
            raise
        return _build_missing(args, error)
    if args.json:
        emit_json(
            {
                "dry_run": False,
                **plan.to_json(),
                "installed": result.bundle.to_json(),
                "previous": result.previous.to_json() if result.previous else None,
                "reused": result.reused,
                "already_active": result.already_active,
            }
        )
        return 0
    if result.already_active:  # it said "activated" of the bundle that was active all along
        print(
            f"already installed and active: {result.bundle.bundle_id} "
            f"({result.bundle.short_sha}), every file intact; nothing changed"
        )
        return 0
    verb = "activated (already in the store)" if result.reused else "installed and activated"
    print(f"{verb} {result.bundle.bundle_id} ({result.bundle.short_sha})")
    if result.previous:
        print(f"previous: {result.previous.bundle_id} (dllm bundle rollback returns to it)")
    return 0


def _build_missing(args, reason) -> int:
    """`--build missing` after `reason` (a BundleUnavailable): build, verify, install."""
    from turbo_dllm.bundles.install import build_and_install, check_build_fits_described_host

    print(f"no published bundle: {reason.message.splitlines()[0]}", file=sys.stderr)
    check_build_fits_described_host()  # before "would build" / "building"
    if args.dry_run:
        if args.json:
            emit_json({"dry_run": True, "build": True, "reason": reason.message})
        else:
            print("would build this host's bundle from the package's sources (--build missing)")
        return 0
    print(
        "building this host's bundle from the package's sources (--build missing)", file=sys.stderr
    )
    result = build_and_install(
        lock_timeout_s=args.lock_timeout, log=lambda line: print(line, file=sys.stderr)
    )
    if args.json:
        emit_json(
            {
                "dry_run": False,
                "build": True,
                "reason": reason.message,
                "installed": result.bundle.to_json(),
                "previous": result.previous.to_json() if result.previous else None,
                "reused": False,
            }
        )
        return 0
    print(
        f"built, self-tested, installed and activated {result.bundle.bundle_id} "
        f"({result.bundle.short_sha}), {result.bundle.record.provenance}"
    )
    if result.previous:
        print(f"previous: {result.previous.bundle_id} (dllm bundle rollback returns to it)")
    return 0


def _list(args) -> int:
    from turbo_dllm.bundles.store import BundleStore, DamagedBundle

    store = BundleStore()
    store.check_folders()  # a file in the way read as "no bundles installed"
    states = store.states()
    entries = store.entries()  # a damaged entry is listed (marked), not an error

    if args.json:
        listed = []
        for entry in entries:
            state = states.get(entry.sha256)
            if isinstance(entry, DamagedBundle):
                listed.append(
                    {
                        "sha256": entry.sha256,
                        "path": str(entry.path),
                        "state": state,
                        "damaged": entry.problem,
                        "fix": store.repair_hint(entry.sha256),
                    }
                )
            else:
                listed.append({**entry.to_json(), "state": state, "damaged": None})
        emit_json({"bundles": listed})
        return 0
    if not entries:
        from turbo_dllm.kernels.loader import install_command

        # the command as it runs when pasted: `--index URL` to fill in without DLLM_BUNDLE_INDEX
        print(f"no bundles installed (next: {install_command()})")
        return 0
    for entry in entries:
        state = states.get(entry.sha256, "")
        if isinstance(entry, DamagedBundle):
            print(f"{entry.short_sha}  {state:<8}  DAMAGED: {entry.problem}")
            print(f"fix {entry.short_sha}: {store.repair_hint(entry.sha256)}", file=sys.stderr)
            continue
        built = "  (built on this host)" if entry.record.provenance != "published" else ""
        print(
            f"{entry.short_sha}  {state:<8}  {entry.bundle_id}  {entry.record.installed_at}{built}"
        )
    return 0


def _status(args) -> int:
    from turbo_dllm.bundles.store import BundleStore, DamagedBundle, InstalledBundle
    from turbo_dllm.host import collect_fingerprint
    from turbo_dllm.kernels.loader import install_command

    store = BundleStore()
    store.check_folders()
    # A damaged active bundle is an error naming the fix (its kernels cannot load; one without
    # bundle.json read "none"); a damaged previous one is shown as such (it was an error, or
    # "none" without bundle.json).
    active, previous = store.linked("active"), store.linked("previous")
    if isinstance(active, DamagedBundle):
        from turbo_dllm.errors import DllmError

        raise DllmError(
            f"the active bundle {active.short_sha} is damaged: {active.problem}",
            hint=store.repair_hint(active.sha256),
        )
    host = collect_fingerprint()
    differences = [str(d) for d in active.target.differences(host)] if active else []
    if args.json:
        emit_json(
            {
                "active": active.to_json() if active else None,
                "previous": _status_json(store, previous),
                "fits_host": bool(active) and not differences,
                "differences": differences,
                "host": host.summary(),
                "leftovers": [item.to_json() for item in store.leftovers()],
            }
        )
        return 0
    print(f"host      {host.summary()}")
    if active is None:
        again = (
            f"dllm bundle rollback activates {previous.bundle_id}"
            if isinstance(previous, InstalledBundle)
            else install_command()  # pasted without DLLM_BUNDLE_INDEX, it names `--index URL`
        )
        print(f"active    none ({again})")
    else:
        fit = "fits this host" if not differences else "DOES NOT fit: " + "; ".join(differences)
        print(f"active    {active.bundle_id} ({active.short_sha}), {fit}")
    if isinstance(previous, DamagedBundle):
        print(f"previous  DAMAGED ({previous.short_sha}): {previous.problem}")
        print(f"fix: {store.repair_hint(previous.sha256)}", file=sys.stderr)
    else:
        print(f"previous  {previous.bundle_id if previous else 'none'}")
    _print_leftovers(store, sys.stdout)
    return 0


def _print_leftovers(store, out) -> None:
    """What killed operations left in the store (`status`: on stdout, `verify`: on stderr, a
    note beside its report), each with its fix on stderr."""
    from turbo_dllm.fsutil import human_size

    for item in store.leftovers():
        shown = item.path.relative_to(store.root)
        print(f"leftover  {shown} ({human_size(item.bytes)}): {item.what}", file=out)
        print(f"fix {shown}: {item.fix}", file=sys.stderr)


def _status_json(store, entry) -> dict | None:
    from turbo_dllm.bundles.store import DamagedBundle

    if isinstance(entry, DamagedBundle):
        return {
            "sha256": entry.sha256,
            "path": str(entry.path),
            "damaged": entry.problem,
            "fix": store.repair_hint(entry.sha256),
        }
    return entry.to_json() if entry else None


def _verify(args) -> int:
    from turbo_dllm.bundles.store import BundleStore, InstalledBundle

    store = BundleStore()
    store.check_folders()
    bundles = [store.find_entry(args.bundle)] if args.bundle else store.entries()
    report = {}
    for b in bundles:
        if isinstance(b, InstalledBundle):
            report[f"{b.bundle_id}@{b.short_sha}"] = store.verify(b)
        else:  # a store entry whose bundle.json or install.json cannot be read
            report[f"damaged@{b.short_sha}"] = [b.problem]
    ok = all(not problems for problems in report.values())
    # Each failing bundle's own fix: installing it again replaces the damaged copy (the hint
    # said to uninstall it first, and named no command to install it with).
    fixes = {
        name: store.repair_hint(b.sha256)
        for b, (name, problems) in zip(bundles, report.items(), strict=True)
        if problems
    }
    if args.json:
        emit_json({"ok": ok, "bundles": report, "fixes": fixes})
    else:
        if not bundles:
            print("no bundles installed")
        for name, problems in report.items():
            print(f"{'ok  ' if not problems else 'FAIL'}  {name}")
            for problem in problems:
                print(f"      {problem}")
        for name, fix in fixes.items():
            print(f"fix {name}: {fix}", file=sys.stderr)
        _print_leftovers(store, sys.stderr)
    return 0 if ok else 1


def _uninstall(args) -> int:
    from turbo_dllm.bundles.store import BundleStore, InstalledBundle

    _check_lock_timeout(args)
    store = BundleStore()
    with store.locked(args.lock_timeout):
        removed = store.uninstall(args.bundle)
    earlier = (
        " (already removed: a bundle command run after the killed uninstall finished it)"
        if store.removed_earlier
        else ""
    )
    if isinstance(removed, InstalledBundle):
        print(f"uninstalled {removed.bundle_id} ({removed.short_sha}){earlier}")
    else:
        print(f"uninstalled damaged store entry {removed.short_sha} ({removed.problem}){earlier}")
    return 0


def _rollback(args) -> int:
    from turbo_dllm.bundles.store import BundleStore

    _check_lock_timeout(args)
    store = BundleStore()
    with store.locked(args.lock_timeout):
        bundle = store.rollback()
    print(f"active: {bundle.bundle_id} ({bundle.short_sha})")
    return 0


def _deactivate(args) -> int:
    from turbo_dllm.bundles.store import BundleStore, InstalledBundle

    _check_lock_timeout(args)
    store = BundleStore()
    with store.locked(args.lock_timeout):
        bundle = store.deactivate()
    if args.json:
        emit_json({"deactivated": _status_json(store, bundle)})
        return 0
    if bundle is None:
        print("no bundle is active: nothing to deactivate")
        return 0
    if isinstance(bundle, InstalledBundle):
        print(f"deactivated {bundle.bundle_id} ({bundle.short_sha}); no bundle is active now")
    else:
        print(f"deactivated the damaged bundle {bundle.short_sha}; no bundle is active now")
    print(
        f"it stays installed: `dllm bundle rollback` re-activates it, "
        f"`dllm bundle uninstall {bundle.short_sha}` removes it"
    )
    return 0
