"""`dllm env lock | sync | check | list`: pinned Python environments per target (uv)."""

from __future__ import annotations

import shlex
from pathlib import Path

from turbo_dllm.cli._output import emit_json, group, shell_path


def register(subparsers) -> None:
    commands = group(subparsers, "env", "pinned Python environments per target (uv)")

    p = commands.add_parser(
        "lock",
        help="resolve a target's environment with uv and write manifests/<target>.toml",
        description="Resolve the project's dependencies for a target (its Python, platform and "
        "torch build) with uv, wheels only, and write the manifest: every package's version and "
        "the sha256 of every wheel that fits the target, plus the indexes used.",
    )
    p.add_argument("--target", required=True, help="an entry of bundles/targets.toml")
    p.add_argument("--output", help="manifest file (default: manifests/<target>.toml)")
    p.add_argument(
        "--from-environment",
        action="store_true",
        help="lock what the running environment has installed instead of resolving "
        "(each package by its wheel sha256 where recorded, else its RECORD sha256, else "
        "name+version; the manifest says which)",
    )
    p.add_argument("--python-version", help="Python X.Y to lock for (default: this one)")
    p.add_argument("--torch", help="torch version to pin, e.g. 2.13.0 (default: the running one)")
    p.add_argument("--cuda", help="CUDA build of torch, for a target that lists several")
    p.add_argument(
        "--extra",
        action="append",
        dest="extras",
        help="project extra to include (repeatable; default: data, env)",
    )
    p.add_argument("--index-url", default=None, help="default index (default: PyPI)")
    p.add_argument("--no-index", action="store_true", help="use no default index")
    p.add_argument(
        "--extra-index-url",
        action="append",
        default=None,
        help="extra index (repeatable; default: PyTorch's index for the target's torch build)",
    )
    p.add_argument(
        "--no-torch-index", action="store_true", help="do not add PyTorch's index for torch"
    )
    p.add_argument(
        "--find-links",
        action="append",
        default=[],
        help="folder or page of wheels to resolve from too (recorded in the manifest)",
    )
    p.add_argument("--python-platform", help="uv --python-platform (default: from the target)")
    p.add_argument("--offline", action="store_true", help="resolve from local sources only")
    p.add_argument(
        "--check",
        action="store_true",
        help="resolve nothing: exit 1 if the manifest (--output, default manifests/<target>.toml) "
        "is stale, i.e. pyproject.toml's dependencies changed since it was locked or its pins "
        "no longer meet them; 0 if it is current",
    )
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=_lock)

    p = commands.add_parser(
        "sync",
        help="create or update a venv to exactly a target's manifest (uv, hashes required)",
        description="Install exactly the manifest's packages into a virtual environment with uv "
        "(hashes required, wheels only) and remove the packages it does not list.",
    )
    p.add_argument("--target", default="auto", help="target name, or auto (default)")
    p.add_argument("--manifest", help="use this manifest file instead of a packaged one")
    p.add_argument("--mirror", help="install only from this mirror (folder or http URL)")
    p.add_argument("--offline", action="store_true", help="contact nothing but the mirror")
    p.add_argument("--venv", default=".venv", help="the virtual environment (default: .venv)")
    p.add_argument(
        "--python",
        help="interpreter to create the venv with (default: this one); an existing venv keeps "
        "its own: a --python of another Python version is refused",
    )
    p.add_argument(
        "--system-site-packages",
        action="store_true",
        default=None,
        help="let the venv see the base interpreter's packages (needed for `provided` ones)",
    )
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=_sync)

    p = commands.add_parser(
        "check",
        help="compare an environment with its target's manifest (exit 1 on drift)",
        description="List missing, mismatched and extra packages of the running environment "
        "(or --python's) against the manifest of its target. Exit 0 clean, 1 drift, 2 error.",
    )
    p.add_argument(
        "--target",
        default=None,
        help="target name, or auto (default: the manifest a synced venv records, else auto)",
    )
    p.add_argument("--manifest", help="compare with this manifest file")
    p.add_argument("--mirror", help="take the manifest from this mirror")
    p.add_argument("--python", help="check this interpreter's environment instead of this one")
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=_check)

    p = commands.add_parser(
        "requirements",
        help="print a manifest as requirements.txt (hash-pinned), e.g. for `pip download`",
    )
    p.add_argument("--target", default="auto", help="target name, or auto (default)")
    p.add_argument("--manifest", help="use this manifest file")
    p.add_argument("--mirror", help="take the manifest from this mirror")
    p.add_argument(
        "--no-sources", action="store_true", help="omit the --index-url/--find-links lines"
    )
    p.set_defaults(func=_requirements)

    p = commands.add_parser("list", help="list the available environment manifests")
    p.add_argument("--mirror", help="list a mirror's manifests")
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=_list)


def _mirror(location):
    if not location:
        return None
    from turbo_dllm.mirror.source import open_mirror

    return open_mirror(location)


def _lock(args) -> int:
    from turbo_dllm.envs.lock import DEFAULT_EXTRAS, DEFAULT_INDEX, LockRequest, lock_environment
    from turbo_dllm.errors import DllmError

    resolving = {
        "--python-version": args.python_version,
        "--torch": args.torch,
        "--cuda": args.cuda,
        "--extra": args.extras,
        "--index-url": args.index_url,
        "--no-index": args.no_index,
        "--extra-index-url": args.extra_index_url,
        "--no-torch-index": args.no_torch_index,
        "--find-links": args.find_links,
        "--python-platform": args.python_platform,
        "--offline": args.offline,
    }
    given = [flag for flag, value in resolving.items() if value]
    if args.check:
        if given:  # the check reads the manifest's own extras and pins: these would be ignored
            raise DllmError(
                f"--check compares the manifest (with the extras it was locked with) with "
                f"pyproject.toml; {', '.join(given)} only shape a resolution",
                hint="drop them; to lock with them, drop --check",
            )
        return _lock_check(args)
    if args.from_environment:
        from turbo_dllm.envs.freeze import lock_from_environment

        if given:
            raise DllmError(
                f"--from-environment locks what is installed; {', '.join(given)} only "
                "shape a resolution",
                hint="drop them, or drop --from-environment to resolve with uv",
            )

        manifest = lock_from_environment(args.target)
        return _write_manifest(args, manifest)
    extra_indexes = args.extra_index_url
    if args.no_torch_index:
        extra_indexes = extra_indexes or []
    request = LockRequest(
        target=args.target,
        extras=tuple(args.extras) if args.extras else DEFAULT_EXTRAS,
        python_version=args.python_version,
        torch_version=args.torch,
        cuda=args.cuda,
        index_url=None if args.no_index else (args.index_url or DEFAULT_INDEX),
        extra_index_urls=extra_indexes,
        find_links=args.find_links,
        python_platform=args.python_platform,
        offline=args.offline,
    )
    return _write_manifest(args, lock_environment(request))


def _manifest_path(args, target: str) -> Path:
    from turbo_dllm.envs.targets import source_root
    from turbo_dllm.errors import DllmError

    if args.output:
        return Path(args.output)
    root = source_root()
    if root is None:
        raise DllmError("where does the manifest go?", hint="pass --output FILE")
    return root / "manifests" / f"{target}.toml"


def _lock_check(args) -> int:
    from turbo_dllm.envs.lock import lock_staleness
    from turbo_dllm.envs.manifest import load_manifest
    from turbo_dllm.errors import DllmError

    if args.from_environment:
        raise DllmError(
            "--check compares the manifest with pyproject.toml; it locks nothing",
            hint="drop --from-environment",
        )
    path = _manifest_path(args, args.target)
    if not path.is_file():
        output = f" --output {shell_path(str(path))}" if args.output else ""
        raise DllmError(
            f"no manifest at {path}",
            hint=f"lock it: dllm env lock --target {args.target}{output}",
        )
    manifest = load_manifest(path)
    if manifest.target != args.target:
        raise DllmError(
            f"{path} is the manifest of target {manifest.target}, not {args.target}",
            hint=f"check it as --target {manifest.target}",
        )
    stale = lock_staleness(manifest)
    relock = (
        f"dllm env lock --target {manifest.target} --from-environment  # on the target host"
        if not manifest.resolver.startswith("uv ")
        else shlex.join(
            ["dllm", "env", "lock", "--target", manifest.target, *_relock_flags(manifest)]
        )
        + (f" --output {shell_path(str(path))}" if args.output else "")
    )
    if args.json:
        emit_json(
            {
                "manifest": str(path),
                "fresh": stale.fresh,
                "added": stale.added,
                "removed": stale.removed,
                "unsatisfied": stale.unsatisfied,
                "fix": None if stale.fresh else relock,
            }
        )
    elif stale.fresh:
        print(f"{path} is current with pyproject.toml")
    else:
        print(f"{path} is stale against pyproject.toml:")
        for line in stale.added:
            print(f"  + {line}  (asked now, not locked from)")
        for line in stale.removed:
            print(f"  - {line}  (locked from, no longer asked)")
        for line in stale.unsatisfied:
            print(f"  ! {line}")
        print(f"fix: {relock}")
    return 0 if stale.fresh else 1


def _relock_flags(manifest) -> list[str]:
    """The `dllm env lock` flags that resolve `manifest` again as it was: its Python, torch and
    extras, and the sources it records (the first simple index as the default one, the others
    as extra indexes in place of PyTorch's, find-links folders)."""
    from urllib.parse import unquote, urlparse

    from turbo_dllm.envs.lock import DEFAULT_EXTRAS, DEFAULT_INDEX

    flags = ["--python-version", manifest.python]
    torch = manifest.pin("torch")
    if torch is not None:
        flags += ["--torch", torch.version.split("+")[0]]
    if sorted(manifest.project.extras) != sorted(DEFAULT_EXTRAS):
        for extra in manifest.project.extras:
            flags += ["--extra", extra]
    simple = [i.url for i in manifest.indexes if i.kind == "simple"]
    if not simple:
        flags.append("--no-index")
    elif simple[0] != DEFAULT_INDEX:
        flags += ["--index-url", simple[0]]
    extras = simple[1:]
    for url in extras:
        flags += ["--extra-index-url", url]
    if not extras:
        flags.append("--no-torch-index")
    for index in manifest.indexes:
        if index.kind == "find-links":
            url = urlparse(index.url)
            flags += ["--find-links", unquote(url.path) if url.scheme == "file" else index.url]
    return flags


def _write_manifest(args, manifest) -> int:
    from turbo_dllm.envs.manifest import dump_manifest
    from turbo_dllm.fsutil import write_atomic

    output = _manifest_path(args, manifest.target)
    output.parent.mkdir(parents=True, exist_ok=True)
    # atomically: a lock killed while writing must not leave a torn manifest where the old was
    write_atomic(output, dump_manifest(manifest))
    if args.json:
        emit_json(
            {
                "manifest": str(output),
                "target": manifest.target,
                "packages": len(manifest.packages),
                "sha256": manifest.content_sha256(),
            }
        )
    else:
        torch = manifest.pin("torch") or next(
            (p for p in manifest.provided if p.name == "torch"), None
        )
        provided = f" + {len(manifest.provided)} provided" if manifest.provided else ""
        print(
            f"wrote {output}: {len(manifest.packages)} packages{provided}"
            + (f", torch {torch.version}" if torch else "")
            + f" ({manifest.resolver})"
        )
    return 0


def _sync_command(args, target: str) -> str:
    """This sync as a line that does it again from any folder: the venv's mark keeps it, and
    a sync that is killed is then finished by pasting it (`envs.incomplete`)."""
    import shlex

    def absolute(path: str) -> str:
        return path if "://" in path else str(Path(path).absolute())

    words = ["dllm", "env", "sync"]
    if args.manifest:
        words += ["--manifest", absolute(args.manifest)]
    else:
        words += ["--target", target]
    if args.mirror:
        words += ["--mirror", absolute(args.mirror)] + (["--offline"] if args.offline else [])
    if args.python:
        words += ["--python", absolute(args.python) if "/" in args.python else args.python]
    if args.system_site_packages:
        words.append("--system-site-packages")
    return shlex.join([*words, "--venv", str(Path(args.venv).absolute())])


def _sync(args) -> int:
    from turbo_dllm.envs.select import select_manifest
    from turbo_dllm.envs.sync import sync_environment

    mirror = _mirror(args.mirror)
    manifest = select_manifest(args.target, mirror=mirror, manifest_file=args.manifest)
    result = sync_environment(
        manifest,
        args.venv,
        python=args.python,
        mirror=mirror,
        offline=args.offline,
        system_site_packages=args.system_site_packages,
        command=_sync_command(args, manifest.target),
    )
    if args.json:
        emit_json(
            {
                "target": manifest.target,
                "manifest_sha256": manifest.content_sha256(),
                "venv": str(result.venv),
                "python": str(result.python),
                "created": result.created,
                "packages": result.installed,
                "removed": result.removed,
                "project": result.project,
                "clean": result.drift.clean if result.drift else None,
                "notes": result.notes,
            }
        )
        return 0
    verb = "created" if result.created else "updated"
    print(f"{verb} {result.venv}: {result.installed} packages of {manifest.target}")
    if result.removed:
        print(f"removed: {', '.join(result.removed)}")
    if result.project:
        print(f"installed {result.project}")
    for note in result.notes:
        print(f"note: {note}")
    print(f"activate: . {shlex.quote(str(result.venv / 'bin' / 'activate'))}")
    return 0


def _check(args) -> int:
    from turbo_dllm.envs.check import compare, drift_fixes
    from turbo_dllm.envs.inventory import inspect_environment
    from turbo_dllm.envs.select import SYNCED_COPY, environment_manifest, recorded_manifest_path

    environment = inspect_environment(args.python)
    manifest, origin = environment_manifest(
        environment.prefix, args.target, mirror=_mirror(args.mirror), manifest_file=args.manifest
    )
    drift = compare(manifest, environment)
    # The sync that restores the manifest compared here (a synced venv's own copy included).
    if args.manifest:
        source = f"--manifest {shlex.quote(args.manifest)}"
    elif args.mirror:
        source = f"--mirror {shlex.quote(args.mirror)} --target {manifest.target}"
    elif origin.startswith(SYNCED_COPY):
        source = f"--manifest {shlex.quote(str(recorded_manifest_path(environment.prefix)))}"
    else:
        source = f"--target {manifest.target}"
    fixes = drift_fixes(manifest, drift, environment, sync_source=source)
    if args.json:
        emit_json(
            {
                **drift.to_json(),
                "manifest": origin,
                "environment": environment.prefix,
                "fixes": fixes,
            }
        )
        return 0 if drift.clean else 1
    print(f"{environment.prefix} against {manifest.target} ({origin})")
    print(drift.summary())
    for m in drift.mismatched:
        print(f"  mismatched  {m.name}: installed {m.found}, manifest {m.expected}")
    for m in drift.missing:
        print(f"  missing     {m.name}=={m.version}")
    for e in drift.extra:
        print(f"  extra       {e.name} {e.version}")
    for fix in fixes:
        if fix.startswith("dllm env sync") and drift.extra:
            # The venv becomes exactly the manifest: a dev venv's pytest and ruff go too (said
            # after a shell comment sign, so the line still runs as pasted).
            names = [e.name for e in drift.extra]
            count = f"{len(names)} extra package{'' if len(names) == 1 else 's'}"
            listed = ", ".join(names[:4]) + (", ..." if len(names) > 4 else "")
            fix = f"{fix}  # also uninstalls the {count}: {listed}"
        print(f"fix: {fix}")
    return 0 if drift.clean else 1


def _requirements(args) -> int:
    from turbo_dllm.envs.select import select_manifest
    from turbo_dllm.envs.sync import mirror_project_line

    mirror = _mirror(args.mirror)
    manifest = select_manifest(args.target, mirror=mirror, manifest_file=args.manifest)
    if mirror is not None and not args.no_sources:
        mirror.require_wheels(otherwise=", or pass --no-sources for the pins alone")
    # Refused as `dllm env sync` refuses it (a mirror of another release), before any line.
    project_line, _ = mirror_project_line(manifest, mirror)
    print(f"# {manifest.target} ({manifest.bundle_target}), sha256 {manifest.content_sha256()}")
    if manifest.provided:
        # Not pins: the file installs none of them (pip and uv skip `#` lines), said so that a
        # file of no pins at all (a manifest locked --from-environment) is not a silent no-op.
        if args.manifest:
            source = f"--manifest {shlex.quote(args.manifest)}"
        elif args.mirror:
            source = f"--mirror {shlex.quote(args.mirror)} --target {manifest.target}"
        else:
            source = f"--target {manifest.target}"
        count = len(manifest.provided)
        what = f"{count} package{'' if count == 1 else 's'}"
        if not manifest.packages:
            what = f"all {what}" if count > 1 else f"the one {what}"
        print(
            f"# {what} of manifest {manifest.target} {'is' if count == 1 else 'are'} provided by "
            f"the base interpreter and not listed here (check them: dllm env check {source})"
        )
    if mirror is None:
        print(manifest.requirements_txt(sources=not args.no_sources), end="")
        return 0
    # From a mirror: its own index (not the ones the pins were resolved from), and the
    # project's wheel the mirror carries, hash-pinned like every other line.
    if not args.no_sources:
        print(f"--index-url {mirror.simple_url}")
    print(manifest.requirements_txt(), end="")
    if project_line is None:
        print(f"# mirror {mirror.location} carries no {manifest.project.name} wheel")
    else:
        print(project_line)
    return 0


def _list(args) -> int:
    from turbo_dllm.envs.select import available_targets

    found = available_targets(_mirror(args.mirror))
    if args.json:
        emit_json({"manifests": found})
        return 0
    for target, where in sorted(found.items()):
        print(f"{target}  {where}")
    if not found:
        print("no environment manifests (create one with `dllm env lock --target NAME`)")
    return 0
