"""Environment manifests: one target's exact Python packages, locked, synced and checked with uv.

`manifest` is the format (`turbo_dllm.env_manifest.v1`), `lock` resolves it, `sync` installs it
into a venv, `check` compares an environment with it. Importing this package is cheap.
"""

from turbo_dllm.envs.check import Drift, compare
from turbo_dllm.envs.manifest import EnvManifest, dump_manifest, load_manifest, parse_manifest

__all__ = ["Drift", "EnvManifest", "compare", "dump_manifest", "load_manifest", "parse_manifest"]
