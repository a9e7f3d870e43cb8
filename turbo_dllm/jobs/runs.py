"""Run dirs as data: find, list, summarize and compare the runs under a root (default ./runs)."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from turbo_dllm.errors import DllmError
from turbo_dllm.jobs.drift import flat_diff, manifest_drift
from turbo_dllm.jobs.manifest import MANIFEST_NAME, DriftItem, RunManifest, read_manifest

__all__ = [
    "DEFAULT_ROOT",
    "RunSummary",
    "diff_manifests",
    "find_run",
    "list_runs",
    "read_metrics",
    "read_result",
    "summarize",
]

DEFAULT_ROOT = "runs"
METRICS_NAME = "metrics.jsonl"


@dataclass(frozen=True)
class RunSummary:
    run_id: str
    path: Path
    name: str | None
    created_at: str
    backend: str
    processes: str
    steps_done: int | None
    steps_total: int
    last_loss: float | None
    exit_code: int | None
    replay_of: str | None

    @property
    def status(self) -> str:
        if self.exit_code is None:
            return "no result"  # still running, submitted to SLURM, or its launcher was killed
        return "ok" if self.exit_code == 0 else f"exit {self.exit_code}"

    def to_json(self) -> dict[str, Any]:
        return {
            "run_id": self.run_id,
            "path": str(self.path),
            "name": self.name,
            "created_at": self.created_at,
            "backend": self.backend,
            "processes": self.processes,
            "steps_done": self.steps_done,
            "steps_total": self.steps_total,
            "last_loss": self.last_loss,
            "exit_code": self.exit_code,
            "status": self.status,
            "replay_of": self.replay_of,
        }


def find_run(ref: str | Path, root: str | Path = DEFAULT_ROOT) -> Path:
    """A run dir from a path, an id under `root`, or a unique part of one (e.g. its short id)."""
    path = Path(ref)
    if path.name == MANIFEST_NAME and path.is_file():
        return path.parent.resolve()
    if (path / MANIFEST_NAME).is_file():
        return path.resolve()
    root = Path(root)
    candidates = sorted(
        p.parent for p in root.glob(f"*/{MANIFEST_NAME}") if str(ref) in p.parent.name
    )
    exact = [p for p in candidates if p.name == str(ref)]
    if exact:
        return exact[0].resolve()
    if len(candidates) == 1:
        return candidates[0].resolve()
    if candidates:
        raise DllmError(
            f"{str(ref)!r} matches {len(candidates)} runs under {root}: "
            + ", ".join(p.name for p in candidates[:8]),
            hint="give more of the run id",
        )
    raise DllmError(
        f"no run {str(ref)!r} under {root}",
        hint="`dllm run list` shows the runs; pass --root for another folder, or a run dir path",
    )


def list_runs(root: str | Path = DEFAULT_ROOT) -> list[RunSummary]:
    root = Path(root)
    if not root.is_dir():
        return []
    summaries = []
    for manifest_path in sorted(root.glob(f"*/{MANIFEST_NAME}")):
        try:
            summaries.append(summarize(manifest_path.parent))
        except DllmError:
            continue  # not ours or damaged; `dllm run show` explains it
    return sorted(summaries, key=lambda s: (s.created_at, s.run_id))


def summarize(run_dir: Path, manifest: RunManifest | None = None) -> RunSummary:
    manifest = manifest or read_manifest(run_dir)
    metrics = read_metrics(run_dir)
    last = metrics[-1] if metrics else {}
    result = read_result(run_dir)
    plan = manifest.plan
    return RunSummary(
        run_id=manifest.run_id,
        path=Path(run_dir),
        name=manifest.spec.get("launch", {}).get("name"),
        created_at=manifest.created_at,
        backend=plan.backend,
        processes=f"{plan.nnodes}x{plan.nproc_per_node}",
        steps_done=last.get("step"),
        steps_total=int(manifest.spec["training"]["steps"]),
        last_loss=last.get("loss"),
        exit_code=None if result is None else result.get("exit_code"),
        replay_of=manifest.replay_of.run_id if manifest.replay_of else None,
    )


def read_metrics(run_dir: Path) -> list[dict[str, Any]]:
    """metrics.jsonl records in file order; a torn last line (a run still writing) is skipped."""
    path = Path(run_dir) / METRICS_NAME
    if not path.is_file():
        return []
    records = []
    for line in path.read_text(encoding="utf-8", errors="replace").splitlines():
        if not line.strip():
            continue
        try:
            record = json.loads(line)
        except json.JSONDecodeError:
            continue
        if isinstance(record, dict):
            records.append(record)
    return records


def read_result(run_dir: Path) -> dict[str, Any] | None:
    path = Path(run_dir) / "result.json"
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (OSError, json.JSONDecodeError):
        return None


def diff_manifests(a: RunManifest, b: RunManifest) -> dict[str, list[DriftItem]]:
    """Two manifests side by side, grouped: replay-relevant inputs first, then spec and plan.

    Each run's own id and dir are replaced by placeholders inside spec and plan, so paths that
    only say "this run" do not bury the differences that matter; they show once under "run".
    """
    dump_a, dump_b = _placeholders(a), _placeholders(b)
    return {
        "inputs": manifest_drift(a, b),
        "spec": flat_diff(dump_a["spec"], dump_b["spec"], "spec"),
        "plan": flat_diff(dump_a["plan"], dump_b["plan"], "plan"),
        "run": [
            DriftItem(field="run_dir", recorded=a.plan.run_dir, current=b.plan.run_dir),
            *(
                item
                for key in ("run_id", "created_at", "argv", "seeds", "replay_of")
                for item in flat_diff({key: dump_a.get(key)}, {key: dump_b.get(key)})
            ),
        ],
    }


def _placeholders(manifest: RunManifest) -> dict[str, Any]:
    run_dir, run_id = manifest.plan.run_dir, manifest.run_id

    def swap(value: Any) -> Any:
        if isinstance(value, str):
            return value.replace(run_dir, "<run_dir>").replace(run_id, "<run_id>")
        if isinstance(value, dict):
            return {k: swap(v) for k, v in value.items()}
        if isinstance(value, list):
            return [swap(v) for v in value]
        return value

    dump = manifest.model_dump(mode="json")
    return {**dump, "spec": swap(dump["spec"]), "plan": swap(dump["plan"])}
