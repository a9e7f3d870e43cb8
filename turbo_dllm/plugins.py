"""Families and objectives from other installed packages, through entry points.

A package adds a family by declaring, in its pyproject.toml,

    [project.entry-points."turbo_dllm.families"]
    my_lm = "my_package.family:MY_LM"

where `MY_LM` is a `turbo_dllm.families.base.Family` named `my_lm` (an entry point's name is its
family's name). Objectives alike, in the group `turbo_dllm.objectives` (an `Objective`). Every
`dllm` process, launched workers included, loads these descriptors when the registry is
imported, so their modules must be torch-free and cheap; a family's torch half
(`runtime_module`) is imported only when it is used.

A plugin that fails to import (an exception, or `sys.exit()` at import), is not a descriptor
(or one whose fields are of other types than `Family` / `Objective` declare: a string where a
tuple of names goes, ...), is named otherwise than its entry point, takes a name already taken
or names objectives or axes nobody defines (or an objective whose own plugin was left out) is
left out with the reason: `dllm doctor` shows it, and a RunSpec naming it gets it instead of
"unknown". One broken package never takes the others' families away.
"""

from __future__ import annotations

import sys
from collections.abc import Mapping
from dataclasses import dataclass, field

from turbo_dllm.families.base import AXES, Family, Objective, import_failure

__all__ = ["GROUPS", "TORCH_AT_IMPORT", "Plugins", "load_plugins", "unreadable_packages"]

GROUPS = {"family": "turbo_dllm.families", "objective": "turbo_dllm.objectives"}

# Said of a plugin whose descriptor's module imported torch (seen where torch was not imported
# before it loaded): the commands that promise a torch-free start and import the registry
# (`dllm config validate | schema`, tests/cli/test_torch_free_start.py) then wait for torch's
# import, and stop on a host without it. The plugin is loaded all the same.
TORCH_AT_IMPORT = (
    "loading its descriptor imported torch, so every dllm command that reads a RunSpec (`dllm "
    "config validate`, `dllm doctor`) imports torch too; move the torch imports of that module "
    "into its runtime module (build_model and the functions the trainer calls), which is "
    "imported only when a model is built"
)


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
    # (kind, name) -> what is wrong with a plugin that loaded all the same (its descriptor's
    # module imported torch: `TORCH_AT_IMPORT`)
    warnings: dict[tuple[str, str], str] = field(default_factory=dict)


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
                article = "an" if kind == "objective" else "a"
                why = f"{sources[0]}: turbo-dllm has {article} {kind} of that name already"
            else:
                had_torch = "torch" in sys.modules
                value, why = _load(points[0], kind, kind_type)
                if why is None:
                    loaded[name] = value
                    plugins.sources[kind, name] = sources[0]
                    if not had_torch and "torch" in sys.modules:
                        plugins.warnings[kind, name] = (
                            f"{kind} {name!r} from {sources[0]}: {TORCH_AT_IMPORT}"
                        )
                    continue
                why = f"{sources[0]}: {why}"
            plugins.problems[kind][name] = why
    known = {*builtin_objectives, *plugins.objectives}
    for name, family in list(plugins.families.items()):
        why = _unknown_names(family, known, plugins.problems["objective"])
        if why is not None:
            del plugins.families[name]
            plugins.warnings.pop(("family", name), None)
            plugins.problems["family"][name] = f"{plugins.sources.pop(('family', name))}: {why}"
    return plugins


def unreadable_packages() -> list[str]:
    """The installed packages whose entry_points.txt cannot be parsed (a line without `=`),
    each as "NAME VERSION (PATH)". One such file ends importlib.metadata's listing of every
    package's entry points, so every program that lists them (pydantic at its first model, our
    plugin loading) fails on it with a TypeError far from the cause."""
    from importlib.metadata import distributions

    broken = []
    for dist in distributions():
        try:
            dist.entry_points  # noqa: B018 - parsed on access
        except Exception as error:  # whatever the parser raised on that file
            where = getattr(dist, "_path", None)
            file = f"{where}/entry_points.txt" if where is not None else "entry_points.txt"
            broken.append(
                f"{dist.metadata['Name']} {dist.version} ({file}: {type(error).__name__}: {error})"
            )
    return broken


def _load(point, kind: str, kind_type: type) -> tuple[object, str | None]:
    """The entry point's descriptor, or why it cannot be used."""
    try:
        value = point.load()
    except BaseException as error:  # a plugin's own bug: left out, never a crash of every command
        why = import_failure(error)
        if why is None:
            raise
        return None, why
    if not isinstance(value, kind_type):
        return None, (
            f"it is a {type(value).__name__}, not a turbo_dllm.families.base.{kind_type.__name__}"
        )
    wrong = _field_problems(value)
    if wrong:
        return None, f"its {kind} descriptor has fields of the wrong type: {'; '.join(wrong)}"
    if value.name != point.name:
        return (
            None,
            f"its {kind} is named {value.name!r}: an entry point's name must be its {kind}'s",
        )
    return value, None


# The fields of a descriptor that hold names: a collection of strings, never one string (which
# Python would read letter by letter: `model_types="my_lm"` would read any model_type that is a
# part of "my_lm", `objectives="block_diffusion"` name 15 one-letter objectives).
_NAME_FIELDS = ("model_types", "objectives", "axes", "model_options", "config_keys")


def _field_problems(value: Family | Objective) -> list[str]:
    """The fields of a plugin's descriptor whose types are not the ones `Family` / `Objective`
    declare (a dataclass does not check them, and a wrong one fails far from the plugin, or
    not at all)."""
    found = []

    def want(field_name: str, ok: bool, wanted: str) -> None:
        if not ok:
            got = getattr(value, field_name)
            found.append(f"{field_name} is {type(got).__name__} {got!r:.60}, not {wanted}")

    want("name", isinstance(value.name, str) and value.name != "", "a non-empty str")
    want("summary", isinstance(value.summary, str), "a str")
    want("runtime_module", isinstance(value.runtime_module, str), "a module path (str)")
    if isinstance(value, Objective):
        block = value.stream_block_size
        want(
            "stream_block_size",
            block is None or (type(block) is int and block > 0),
            "None or a positive int",
        )
        return found
    for name in _NAME_FIELDS:
        names = getattr(value, name)
        want(
            name,
            isinstance(names, (tuple, list, set, frozenset))
            and all(isinstance(n, str) for n in names),
            "a tuple of str (write ('name',) for one)"
            if name != "axes"
            else "a frozenset of str (write frozenset({'fsdp'}) for one)",
        )
    want(
        "presets",
        isinstance(value.presets, Mapping)
        and all(isinstance(p, Mapping) for p in value.presets.values()),
        "a mapping of preset name to config.json dict",
    )
    want("axis_reasons", isinstance(value.axis_reasons, Mapping), "a mapping of axis to str")
    want("read_config", callable(value.read_config), "a function (config.json dict -> config)")
    for name in ("rules", "configure"):
        want(name, getattr(value, name) is None or callable(getattr(value, name)), "a function")
    rules = value.input_rules
    want(
        "input_rules",
        rules is None or (isinstance(rules, str) and ":" in rules),
        'None or "module:function"',
    )
    return found


def _unknown_names(family: Family, objectives: set[str], left_out: Mapping[str, str]) -> str | None:
    """Objectives or axes a plugin family names that nothing defines (a typo would otherwise
    surface only when a RunSpec asks for it), or objectives whose own plugin was left out."""
    broken = [o for o in family.objectives if o not in objectives and o in left_out]
    if broken:
        return "; ".join(
            f"its objective {o!r} could not be loaded from its plugin: {left_out[o]}"
            for o in broken
        )
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
