"""What is installed in a Python environment: the running one, or another interpreter's.

Another interpreter is asked through a small stdlib-only script (it may not have turbo-dllm), so
`dllm env check --python .venv/bin/python` and `dllm env sync` read a venv from the outside
with the same code path as the in-process check.
"""

from __future__ import annotations

import json
import subprocess
from dataclasses import dataclass
from pathlib import Path

from turbo_dllm.errors import DllmError

__all__ = ["Environment", "Installed", "folder_given_as_python", "inspect_environment"]

_PROBE_TIMEOUT_S = 120

# Runs inside the inspected interpreter: stdlib only, prints one JSON object on a line of its
# own after _MARK (whatever the interpreter's startup prints before it, a .pth, a
# sitecustomize, is not the answer).
_MARK = "dllm-env-probe:"
_PROBE = r"""
import hashlib, json, sys, os
_MARK = "dllm-env-probe:"
from importlib import metadata
seen = {}
for dist in metadata.distributions():
    name = dist.metadata["Name"]
    if not name:
        continue
    key = name.lower().replace("_", "-").replace(".", "-")
    while "--" in key:
        key = key.replace("--", "-")
    if key in seen:
        continue  # the first one on sys.path is the one that imports
    path = getattr(dist, "_path", None)
    location = os.path.realpath(str(path)) if path is not None else ""
    record = dist.read_text("RECORD")
    record_sha256 = hashlib.sha256(record.encode()).hexdigest() if record else None
    wheel = None  # (file name, sha256) when the installer recorded the wheel it installed
    try:
        direct = json.loads(dist.read_text("direct_url.json") or "null")
    except ValueError:
        direct = None
    if isinstance(direct, dict):
        info = direct.get("archive_info") or {}
        digest = (info.get("hashes") or {}).get("sha256")
        if not digest and str(info.get("hash", "")).startswith("sha256="):
            digest = info["hash"][len("sha256="):]
        filename = direct.get("url", "").rsplit("/", 1)[-1]
        if digest and filename.endswith(".whl"):
            wheel = [filename, digest]
    seen[key] = {"name": key, "version": dist.version, "location": location,
                 "record_sha256": record_sha256, "wheel": wheel}
print(_MARK + json.dumps({
    "python": "%d.%d" % sys.version_info[:2],
    "executable": sys.executable,
    "prefix": os.path.realpath(sys.prefix),
    "base_prefix": os.path.realpath(sys.base_prefix),
    "distributions": sorted(seen.values(), key=lambda d: d["name"]),
}))
"""


@dataclass(frozen=True)
class Installed:
    name: str  # PEP 503 normalized
    version: str
    location: str
    record_sha256: str | None = None  # sha256 of its RECORD: the installed files and their hashes
    wheel: tuple[str, str] | None = None  # (file name, sha256) when direct_url.json recorded it

    def __post_init__(self) -> None:
        if isinstance(self.wheel, list):  # from the probe's JSON
            object.__setattr__(self, "wheel", tuple(self.wheel))


@dataclass(frozen=True)
class Environment:
    python: str  # major.minor
    executable: str
    prefix: str
    base_prefix: str
    distributions: tuple[Installed, ...]

    @property
    def is_venv(self) -> bool:
        return self.prefix != self.base_prefix

    def own(self, dist: Installed) -> bool:
        """Installed in this environment itself, not inherited from the base interpreter."""
        if not self.is_venv:
            return True
        return Path(dist.location).is_relative_to(self.prefix)

    def get(self, name: str) -> Installed | None:
        return next((d for d in self.distributions if d.name == name), None)


def _parse(payload: dict) -> Environment:
    return Environment(
        python=payload["python"],
        executable=payload["executable"],
        prefix=payload["prefix"],
        base_prefix=payload["base_prefix"],
        distributions=tuple(Installed(**d) for d in payload["distributions"]),
    )


def folder_given_as_python(python: str | Path) -> DllmError | None:
    """`--python .venv` (the venv, not its interpreter) failed with "Permission denied", which
    sent users looking at file modes: say it is a folder, and name the interpreter inside."""
    folder = Path(python)
    if not folder.is_dir():
        return None
    inside = [folder / "bin" / "python", folder / "Scripts" / "python.exe"]
    found = next((path for path in inside if path.is_file()), None)
    return DllmError(
        f"--python {folder} is a folder, not a Python interpreter",
        hint=f"pass the interpreter in it: --python {found}"
        if found
        else "pass --python with the path of an interpreter (e.g. .venv/bin/python)",
    )


def inspect_environment(python: str | Path | None = None) -> Environment:
    """The distributions visible to `python` (default: this interpreter), first on path wins."""
    if python is None:
        namespace: dict = {}
        import contextlib
        import io

        buffer = io.StringIO()
        with contextlib.redirect_stdout(buffer):
            exec(compile(_PROBE, "<env-probe>", "exec"), namespace)
        return _parse(json.loads(buffer.getvalue().removeprefix(_MARK)))
    executable = str(python)
    try:
        proc = subprocess.run(
            [executable, "-I", "-c", _PROBE],
            capture_output=True,
            text=True,
            errors="replace",
            timeout=_PROBE_TIMEOUT_S,
        )
    except OSError as error:
        raise folder_given_as_python(executable) or DllmError(
            f"cannot run Python at {executable}: {error}",
            hint="pass --python with the path of an interpreter (e.g. .venv/bin/python)",
        ) from error
    except subprocess.TimeoutExpired:
        raise DllmError(
            f"{executable} did not list its packages within {_PROBE_TIMEOUT_S} s",
            hint="pass --python with a working interpreter",
        ) from None
    if proc.returncode != 0:
        raise DllmError(
            f"{executable} could not list its packages: {proc.stderr.strip()[-500:]}",
            hint="pass --python with a working interpreter",
        )
    answers = [line for line in proc.stdout.splitlines() if line.startswith(_MARK)]
    try:
        return _parse(json.loads(answers[-1][len(_MARK) :]))
    except (IndexError, ValueError, KeyError, TypeError):
        # exit 0 without the probe's answer: not a Python (`--python /bin/true`), or one that
        # did not run it as written
        said = next((line.strip() for line in proc.stdout.splitlines() if line.strip()), "")
        said = f"its output began {said[:120]!r}" if said else "it printed nothing"
        raise DllmError(
            f"{executable} did not list its packages ({said}): is it a Python interpreter?",
            hint="pass --python with the path of an interpreter (e.g. .venv/bin/python)",
        ) from None
