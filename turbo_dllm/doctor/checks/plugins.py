"""The families and objectives other installed packages add (entry points), and broken ones."""

from __future__ import annotations

from turbo_dllm.doctor import CheckResult, DoctorContext, register_check

__all__: list[str] = []


@register_check(order=70)
def plugins(ctx: DoctorContext) -> CheckResult:
    from turbo_dllm import registry

    loaded = [
        f"{kind} {name} from {source}" for (kind, name), source in registry.PLUGINS.sources.items()
    ]
    broken = [
        f"{kind} {name!r}: {why}"
        for kind, problems in registry.PLUGINS.problems.items()
        for name, why in problems.items()
    ]
    # Loaded, but its descriptor's module imports torch (plugins.TORCH_AT_IMPORT says the fix).
    heavy = list(registry.PLUGINS.warnings.values())
    if broken or heavy:
        # A warning: a broken plugin takes only its own names away; a RunSpec naming one fails
        # its own validation with the same reason.
        fixes = [registry.PLUGIN_FIX] if broken else []
        if heavy:
            fixes.append(
                "move the torch imports of that plugin's descriptor module into its runtime module"
            )
        return CheckResult(
            "plugins", "warn", "; ".join(broken + heavy + loaded), fix="; ".join(fixes)
        )
    return CheckResult("plugins", "pass", "; ".join(loaded) or "none installed")
