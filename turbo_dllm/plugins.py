"""Families and objectives from other installed packages, through entry points.

A package adds a family by declaring, in its pyproject.toml,

    [project.entry-points."turbo_dllm.families"]
    my_lm = "my_package.family:MY_LM"

where `MY_LM` is a `turbo_dllm.families.base.Family` named `my_lm` (an entry point's name is its
family's name). Objectives alike, in the group `turbo_dllm.objectives` (an `Objective`). Every
`dllm` process, launched workers included, loads these descriptors when the registry is
imported, so their modules must be torch-free and cheap; a family's torch half
(`runtime_module`) is imported only when it is used.

A plugin that fails to import, is not a descriptor, is named otherwise than its entry point,
takes a name already taken or names objectives or axes nobody defines is left out with the
reason: `dllm doctor` shows it, and a RunSpec naming it gets it instead of "unknown". One broken
package never takes the others' families away.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from turbo_dllm.families.base import AXES, Family, Objective

__all__ = ["GROUPS", "Plugins", "load_plugins"]

GROUPS = {"family": "turbo_dllm.families", "objective": "turbo_dllm.objectives"}


@dataclass(frozen=True)
class Plugins:
    """What the installed packages' entry points added, and what was left out and why."""

    families: dict[str, Family] = field(default_factory=dict)
    objectives: dict[str, Objective] = field(default_factory=dict)
    # (kind, name) -> "distribution version (module:attribute)", of every loaded plugin
    sources: dict[tuple[str, str], str] = field(default_factory=dict)
    # kind -> name -> why it was left out
    problems: dict[str, dict[str, str]] = field(
        default_factory=lambda: {kind: {} for kind in GROUPS}
    )


def load_plugins(
    builtin_families: Mapping[str, Family], builtin_objectives: Mapping[str, Objective]
) -> Plugins:
    """Load the entry points of both groups, leaving out (with the reason) what cannot be used."""
    from importlib.metadata import entry_points

    plugins = Plugins()
    found = {  # objectives first: the families name them
        "objective": (Objective, builtin_objectives, plugins.objectives),
        "family": (Family, builtin_families, plugins.families),
    }
    for kind, (kind_type, builtin, loaded) in found.items():
        declared: dict[str, list] = {}
        for point in entry_points(group=GROUPS[kind]):
            declared.setdefault(point.name, []).append(point)
        for name, points in declared.items():
            sources = [_source(point) for point in points]
            if len(points) > 1:
                why = f"declared by {' and '.join(sources)}: uninstall all but one of them"
            elif name in builtin:
                why = f"{sources[0]}: turbo-dllm has a {kind} of that name already"
            else:
                value, why = _load(points[0], kind, kind_type)
                if why is None:
                    loaded[name] = value
                    plugins.sources[kind, name] = sources[0]
                    continue
                why = f"{sources[0]}: {why}"
            plugins.problems[kind][name] = why
    known = {*builtin_objectives, *plugins.objectives}
    for name, family in list(plugins.families.items()):
        why = _unknown_names(family, known)
        if why is not None:
            del plugins.families[name]
            plugins.problems["family"][name] = f"{plugins.sources.pop(('family', name))}: {why}"
    return plugins


def _load(point, kind: str, kind_type: type) -> tuple[object, str | None]:
    """The entry point's descriptor, or why it cannot be used."""
    try:
        value = point.load()
    except Exception as error:  # a plugin's own bug: left out, never a crash of every command
        return None, f"importing it failed: {type(error).__name__}: {error}"
    if not isinstance(value, kind_type):
        return None, (
            f"it is a {type(value).__name__}, not a turbo_dllm.families.base.{kind_type.__name__}"
        )
    if value.name != point.name:
        return (
            None,
            f"its {kind} is named {value.name!r}: an entry point's name must be its {kind}'s",
        )
    return value, None


def _unknown_names(family: Family, objectives: set[str]) -> str | None:
    """Objectives or axes a plugin family names that nothing defines (a typo would otherwise
    surface only when a RunSpec asks for it)."""
    unknown = [o for o in family.objectives if o not in objectives]
    if unknown:
        return f"its objectives {unknown} are not defined by turbo-dllm or any plugin"
    axes = sorted(set(family.axes) - set(AXES))
    if axes:
        return f"its axes {axes} are not topology axes ({', '.join(AXES)})"
    return None


def _source(point) -> str:
    dist = getattr(point, "dist", None)
    package = f"{dist.name} {dist.version}" if dist is not None else "an unnamed package"
    return f"{package} ({point.value})"
