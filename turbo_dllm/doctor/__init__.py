"""Readiness checks shared by `dllm doctor`, `dllm launch` and the trainer.

A check is a function `(DoctorContext) -> CheckResult | list[CheckResult]` registered with
`@register_check`. Check modules live in `turbo_dllm.doctor.checks` and are all imported when the
checks run, so a new capability adds its checks by adding a module there.
"""

from __future__ import annotations

import importlib
import pkgutil
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Literal

__all__ = ["CheckResult", "DoctorContext", "Report", "register_check", "run_checks"]

# skip: not checked, because what the check needs is missing for a reason another check reports
# with the fix (a RunSpec that did not load: the config check; torch that does not import: the
# torch check). Never changes readiness on its own.
Status = Literal["pass", "warn", "fail", "skip"]


@dataclass(frozen=True)
class CheckResult:
    name: str
    status: Status
    detail: str
    fix: str | None = None

    def __post_init__(self) -> None:
        if self.status in ("warn", "fail") and not self.fix:
            raise ValueError(f"check {self.name!r} reported {self.status} without a fix line")


@dataclass
class DoctorContext:
    """What the checks may look at. `spec` is set when a config was given and parsed."""

    config_path: Path | None = None
    spec: Any = None  # RunSpec
    config_error: str | None = None
    config_hint: str | None = None  # the loader's fix for `config_error`
    config_hint_fixes: bool = False  # the hint is the fix (no field to edit: another kind of file)
    world_size: int | None = None
    overrides: list[str] = field(default_factory=list)  # --set KEY=VALUE, applied to the spec
    run_dir: Path | None = None
    extras: dict[str, Any] = field(default_factory=dict)

    def config_args(self) -> str:
        """` --config F --set K=V ...` as given, for a fix's command that reads the same run."""
        import shlex

        args = f" --config {shlex.quote(str(self.config_path))}"
        return args + "".join(f" --set {shlex.quote(o)}" for o in self.overrides)

    def without_spec(self, name: str, what: str) -> CheckResult:
        """The result of a check that needs the RunSpec where there is none: given and not
        loaded, a skip (the config check fails, saying why); not given, a pass of the host-only
        report that says how to check it."""
        if self.config_path is not None:
            return CheckResult(
                name,
                "skip",
                f"not checked: the RunSpec did not load (see the config check) ({what})",
            )
        return CheckResult(name, "pass", f"no RunSpec given (pass --config to check {what})")

    @property
    def prod(self) -> bool:
        return self.spec is not None and self.spec.launch.kind == "prod"


@dataclass(frozen=True)
class Report:
    results: list[CheckResult]

    @property
    def ready(self) -> bool:
        return all(r.status != "fail" for r in self.results)

    def to_json(self) -> dict[str, Any]:
        return {
            "format": "turbo_dllm.doctor.v1",
            "ready": self.ready,
            "checks": [asdict(r) for r in self.results],
        }


CheckFunction = Callable[[DoctorContext], "CheckResult | list[CheckResult]"]
_REGISTRY: list[tuple[int, str, CheckFunction]] = []
_NAMES: dict[CheckFunction, str] = {}


def register_check(order: int, name: str | None = None) -> Callable[[CheckFunction], CheckFunction]:
    """Register a check; lower `order` runs (and prints) first. `name`: the name it reports
    under, where that is not its function's with spaces (said for a check that could not run)."""

    def decorate(func: CheckFunction) -> CheckFunction:
        _REGISTRY.append((order, f"{func.__module__}.{func.__qualname__}", func))
        if name is not None:
            _NAMES[func] = name
        return func

    return decorate


def _load_check_modules() -> None:
    from turbo_dllm.doctor import checks

    for info in pkgutil.iter_modules(checks.__path__):
        importlib.import_module(f"{checks.__name__}.{info.name}")


def run_checks(context: DoctorContext) -> Report:
    _load_check_modules()
    results: list[CheckResult] = []
    for _, _, func in sorted(_REGISTRY, key=lambda item: (item[0], item[1])):
        try:
            outcome = func(context)
        except ImportError as error:
            # A check that needs torch where torch does not import (the torch check says why,
            # with its fix): not checked, said as such, not a traceback that ends the report.
            if not _is_torch(error):
                raise
            outcome = CheckResult(
                _check_name(func),
                "skip",
                f"not checked: it needs torch, which does not import (see the torch check) "
                f"({error})",
            )
        results.extend(outcome if isinstance(outcome, list) else [outcome])
    return Report(results)


def _is_torch(error: ImportError) -> bool:
    name = error.name or ""
    return name == "torch" or name.startswith("torch.")


def _check_name(func: CheckFunction) -> str:
    """The name a check reports under, for one that could not run: register_check's `name`,
    else its function's ("compile_cache": "compile cache")."""
    return _NAMES.get(func) or func.__name__.replace("_", " ")
