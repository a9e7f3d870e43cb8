"""The package's layers import downward only, and no two parts import each other.

docs/architecture.md, "Layers": foundation (errors, fsutil, digests, sigterm, formats, records,
locations, paths) -> host -> config (RunSpec, registry and plugins, the torch-free half of every
family) -> data, bundles, project_init -> kernels, envs, cache -> mirror -> train (and the torch
half of every family) -> doctor -> jobs -> cli. Imports inside functions count too (they are dependencies all the same); only
`if TYPE_CHECKING:` blocks are left out.
"""

from __future__ import annotations

import ast
from collections import defaultdict
from pathlib import Path

import turbo_dllm

ROOT = Path(turbo_dllm.__file__).parent
LEVELS = {
    "foundation": 0,
    "host": 1,
    "config": 2,
    "registry": 2,
    "plugins": 2,
    "families": 2,
    "data": 3,
    "bundles": 3,
    "project_init": 3,
    "kernels": 4,
    "envs": 4,
    "cache": 4,
    "mirror": 5,
    "train": 6,
    "families.torch": 6,
    "doctor": 7,
    "jobs": 8,
    "cli": 9,
    "__main__": 9,
}
FOUNDATION = {"errors", "fsutil", "digests", "sigterm", "formats", "records", "locations", "paths"}
# A family folder's torch-free half is its descriptor (`__init__`) and `config`; every other
# module in it (model, parallelize plan, runtime, losses, export...) is trainer-level code.
FAMILY_TORCH_FREE = {"config"}


def module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT.parent).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def part_of(module: str) -> str:
    """The layer unit a module belongs to (`turbo_dllm.train.x` -> `train`)."""
    parts = module.split(".")[1:]
    if not parts or parts[0] in FOUNDATION:
        return "foundation"
    if parts[0] == "families" and len(parts) >= 3 and parts[2] not in FAMILY_TORCH_FREE:
        return "families.torch"
    return parts[0]


def imports_of(path: Path, known: set[str]) -> set[str]:
    tree = ast.parse(path.read_text(encoding="utf-8"))
    skipped: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            skipped.update(id(sub) for sub in ast.walk(node))
    found: set[str] = set()
    for node in ast.walk(tree):
        if id(node) in skipped:
            continue
        if isinstance(node, ast.Import):
            found.update(a.name for a in node.names if a.name.startswith("turbo_dllm"))
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            if not node.module.startswith("turbo_dllm"):
                continue
            # `from turbo_dllm import registry` imports the module turbo_dllm.registry.
            for alias in node.names:
                candidate = f"{node.module}.{alias.name}"
                found.add(candidate if candidate in known else node.module)
    return found


def graph() -> dict[str, set[tuple[str, str]]]:
    files = sorted(ROOT.rglob("*.py"))
    known = {module_name(p) for p in files}
    edges: dict[str, set[tuple[str, str]]] = defaultdict(set)
    for path in files:
        source = module_name(path)
        for target in imports_of(path, known):
            a, b = part_of(source), part_of(target)
            if a != b:
                edges[a].add((b, f"{source} -> {target}"))
    return edges


def test_every_part_has_a_layer():
    parts = {part_of(module_name(p)) for p in ROOT.rglob("*.py")}
    assert parts <= set(LEVELS), sorted(parts - set(LEVELS))


def test_imports_only_go_down_the_layers():
    upward = [
        why
        for source, targets in graph().items()
        for target, why in targets
        if LEVELS[target] > LEVELS[source]
    ]
    assert upward == [], "\n".join(sorted(upward))


def test_no_two_parts_import_each_other():
    edges = {a: {b for b, _ in targets} for a, targets in graph().items()}
    cycles = sorted(
        f"{a} <-> {b}" for a in edges for b in edges[a] if a < b and a in edges.get(b, ())
    )
    assert cycles == []
