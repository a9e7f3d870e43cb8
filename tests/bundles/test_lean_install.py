"""`dllm bundle install` stays lean: its process never imports what it does not need (issue 3:
an install must take a fraction of the time of `pip install` of a wheel of the same size)."""

from __future__ import annotations

import json
import subprocess
import sys

from tests.bundles.server import MirrorServer

# Each costs a visible share of an install's ~0.1 s: pydantic and its models, requests (+urllib3),
# torch and numpy, transformers, rich, filelock, tomlkit, yaml, importlib.metadata, dataclasses
# (creating one runs exec for every generated method), packaging (its version regex takes
# milliseconds to compile; a version already in canonical form needs none of it), and
# http.client with the email and ssl packages it imports (~10 ms; a loopback mirror is read
# with a plain socket), and the idna codec (getaddrinfo imports it for a str host).
HEAVY = (
    "pydantic", "requests", "urllib3", "torch", "numpy", "transformers", "rich", "filelock",
    "tomlkit", "yaml", "importlib.metadata", "dataclasses", "packaging", "http.client", "email",
    "ssl", "encodings.idna",
)  # fmt: skip

PROGRAM = """
import json, sys
from turbo_dllm.cli import main
code = main(sys.argv[1:])
print(json.dumps({"code": code, "modules": sorted(sys.modules)}))
"""


def test_install_from_a_loopback_mirror_imports_nothing_heavy(mirror):
    root, catalog_sha = mirror
    with MirrorServer(root) as server:
        proc = subprocess.run(
            [sys.executable, "-c", PROGRAM, "bundle", "install", "--release", "v-test", "--auto",
             "--index", server.url, "--catalog-sha256", catalog_sha],
            capture_output=True, text=True, check=True,
        )  # fmt: skip
    *_, last = proc.stdout.splitlines()
    report = json.loads(last)
    assert report["code"] == 0, proc.stderr
    assert "installed and activated" in proc.stdout
    loaded = [m for m in HEAVY if m in report["modules"]]
    assert loaded == [], f"dllm bundle install imported {loaded}"
