"""`dllm mirror create | verify | serve`: one folder with wheels, manifests, catalogs and bundles."""

from __future__ import annotations

import sys
from pathlib import Path

from turbo_dllm.cli._output import emit_json, group, shell_path


def register(subparsers) -> None:
    commands = group(subparsers, "mirror", "offline mirrors: wheels, manifests, catalogs, bundles")

    p = commands.add_parser(
        "create",
        help="build a mirror folder for a release and its targets",
        description="Copy the targets' environment manifests, the wheels they pin (PEP 503 "
        "index), the release catalog and the targets' bundles into DIR, with MIRROR.json "
        "listing every file and its sha256.",
    )
    p.add_argument("dest", metavar="DIR")
    p.add_argument("--release", required=True, help="bundle release, e.g. v0.1.0")
    p.add_argument(
        "--targets",
        default="auto",
        help="comma-separated target names, `all`, or auto (this host's; default)",
    )
    p.add_argument(
        "--manifest",
        action="append",
        default=[],
        help="use this manifest file for its target (repeatable; instead of the packaged one)",
    )
    p.add_argument(
        "--with-wheels", action="store_true", help="download pinned wheels from their indexes"
    )
    p.add_argument(
        "--wheels-from", help="folder of wheels to take pinned (and project) wheels from"
    )
    p.add_argument(
        "--from",
        dest="source",
        help="where the release's catalog and bundles come from (URL or folder)",
    )
    p.add_argument(
        "--catalog-sha256", help="trust this catalog hash (release not in releases.lock)"
    )
    p.add_argument(
        "--pack",
        action="append",
        dest="packs",
        default=[],
        type=Path,
        help="a compile-cache pack to carry in packs/ (repeatable; see `dllm cache pack`)",
    )
    p.add_argument(
        "--force",
        action="store_true",
        help="replace the mirror at DIR (a folder of other files is never replaced)",
    )
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=_create)

    p = commands.add_parser(
        "verify",
        help="re-hash every file of a mirror against MIRROR.json and the locks",
        description="Exit 0 when every file matches, 1 when problems were found, 2 on error.",
    )
    p.add_argument("mirror", metavar="DIR|URL")
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=_verify)

    p = commands.add_parser(
        "serve",
        help="serve a mirror over HTTP (PEP 503 index at /simple/)",
        description="Serve DIR with a threaded HTTP server on 127.0.0.1 (pass --host 0.0.0.0 to "
        "expose it). pip/uv: --index-url http://HOST:PORT/simple; dllm: --mirror http://HOST:PORT",
    )
    p.add_argument("mirror", metavar="DIR")
    p.add_argument(
        "--port", type=int, default=8000, help="TCP port (default 8000; 0: any free port)"
    )
    p.add_argument(
        "--host",
        default="127.0.0.1",
        help="address to listen on (default 127.0.0.1; 0.0.0.0 or :: for every interface)",
    )
    p.add_argument("--quiet", action="store_true", help="do not log requests")
    p.set_defaults(func=_serve)


def _create(args) -> int:
    from turbo_dllm.mirror.create import MirrorPlan, create_mirror
    from turbo_dllm.mirror.release import add_release, mirror_manifests

    manifests = mirror_manifests(args.targets, args.manifest)
    plan = MirrorPlan(
        dest=Path(args.dest),
        release=args.release,
        manifests=manifests,
        with_wheels=args.with_wheels,
        wheels_from=Path(args.wheels_from) if args.wheels_from else None,
        bundles_from=args.source,
        catalog_sha256=args.catalog_sha256,
        packs=args.packs,
        force=args.force,
    )
    index = create_mirror(plan, add_release=add_release)
    counts: dict[str, int] = {}
    for entry in index.files:
        counts[entry.kind] = counts.get(entry.kind, 0) + 1
    if args.json:
        emit_json(
            {
                "mirror": str(plan.dest),
                "release": index.release,
                "targets": index.targets,
                "files": counts,
                "project": index.project.model_dump() if index.project else None,
                "notes": plan.notes,
            }
        )
        return 0
    print(
        f"wrote {plan.dest}: release {index.release}, targets {', '.join(index.targets)}; "
        + ", ".join(f"{n} {kind}" for kind, n in sorted(counts.items()))
    )
    for note in plan.notes:
        print(f"note: {note}")
    dest = shell_path(plan.dest)
    print(f"next: dllm mirror verify {dest} && dllm mirror serve {dest}")
    return 0


def _verify(args) -> int:
    from turbo_dllm.mirror.verify import verify_mirror

    report = verify_mirror(args.mirror)
    if args.json:
        emit_json(report.to_json())
        return 0 if report.ok else 1
    for problem in report.problems:
        print(f"problem: {problem}")
    for note in report.notes:
        print(f"note: {note}")
    count = len(report.problems)
    state = "ok" if report.ok else f"{count} problem{'' if count == 1 else 's'}"
    print(f"{args.mirror}: {report.checked_files} files checked, {state}")
    if report.fix:
        print(f"fix: {report.fix}", file=sys.stderr)
    return 0 if report.ok else 1


def _carried(root: Path) -> tuple[bool, list[str]]:
    """Whether the mirror at `root` carries wheels (a pip/uv index), and the releases whose
    catalogs it carries, from its MIRROR.json (one that cannot be read: wheels assumed, no
    releases, as before; `dllm mirror verify` names what is wrong with it)."""
    from turbo_dllm.errors import DllmError
    from turbo_dllm.mirror.source import open_mirror

    try:
        index = open_mirror(root).index()
    except DllmError:
        return True, []
    wheels = index.has_wheels
    releases = sorted(
        {f.path.split("/")[1] for f in index.of_kind("catalog") if f.path.count("/") == 2}
    )
    return wheels, releases


def _serve(args) -> int:
    from turbo_dllm.mirror.serve import MirrorServer

    server = MirrorServer(args.mirror, host=args.host, port=args.port, quiet=args.quiet)
    wheels, releases = _carried(server.root)
    if wheels:
        print(
            f"serving {server.root} at {server.url}/ (pip/uv index: {server.client_url}/simple/)",
            flush=True,
        )
        # Printed to be run on the nodes: a wildcard address (0.0.0.0) names this host instead.
        print(f"install: dllm env sync --mirror {server.client_url} --offline", flush=True)
    else:  # no simple/ index: `env sync --mirror` and pip/uv would be refused or find nothing
        print(
            f"serving {server.root} at {server.url}/ (no wheels: no pip/uv index, nothing for "
            "`dllm env sync --mirror`; a mirror made --with-wheels or --wheels-from DIR has them)",
            flush=True,
        )
    for release in releases:
        print(
            f"bundles: dllm bundle install --auto --index {server.client_url} --release {release}",
            flush=True,
        )
    try:
        server.serve_forever()
    except KeyboardInterrupt:
        print("stopped", file=sys.stderr)
    finally:
        server.httpd.server_close()
    return 0
