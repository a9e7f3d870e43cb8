"""Air-gapped install end to end, with no network: mirror -> serve -> env sync -> bundle -> doctor.

Built here: the project's wheel, a fixture package, a real CPU bundle. The test manifest pins the
fixture wheel (locked by `dllm env lock`'s resolver from a local folder) and lists everything the
running environment already has (torch included) as `provided`, because torch must not be
downloaded: the fresh venv sees the running environment's site-packages through a .pth file.
Real clients (pip, uv) install the project from the served index too.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import sysconfig
import tempfile
from pathlib import Path

import pytest

from tests.envs.wheelfactory import make_wheel
from turbo_dllm import __version__
from turbo_dllm.envs.inventory import inspect_environment
from turbo_dllm.envs.lock import LockRequest, lock_environment
from turbo_dllm.envs.manifest import EnvManifest, Project, dump_manifest
from turbo_dllm.envs.uvtool import uv_binary

pytestmark = pytest.mark.slow

RELEASE = "v-test"


def run(*command, env=None, check=True, timeout=300, isolated=False) -> subprocess.CompletedProcess:
    """Run outside the checkout, so `python -c` cannot import turbo_dllm from the cwd;
    `isolated` also drops PYTHONPATH, so a venv's python sees only what was installed in it."""
    base = {k: v for k, v in os.environ.items() if not (isolated and k == "PYTHONPATH")}
    proc = subprocess.run(
        [str(c) for c in command],
        cwd=tempfile.gettempdir(),
        capture_output=True,
        text=True,
        env={**base, **(env or {})},
        timeout=timeout,
    )
    if check:
        assert proc.returncode == 0, f"{command}\n{proc.stdout}\n{proc.stderr}"
    return proc


def dllm(*args, **kwargs) -> subprocess.CompletedProcess:
    return run(sys.executable, "-m", "turbo_dllm", *args, **kwargs)


@pytest.fixture(scope="module")
def work(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("e2e")


@pytest.fixture(scope="module")
def uv_env(work) -> dict[str, str]:
    """A private uv cache: nothing is installed from a cache the mirror did not fill."""
    return {"UV_CACHE_DIR": str(work / "uv-cache")}


@pytest.fixture(scope="module")
def published(work, cpu_bundle_archive):
    from turbo_dllm.bundles.publish import publish

    result = publish([cpu_bundle_archive], release=RELEASE, mirror=work / "published")
    return work / "published", result.catalog_sha256


@pytest.fixture(scope="module")
def manifest_file(work, project_wheel, cpu_bundle_archive, uv_env) -> Path:
    wheels = work / "wheels-in"
    make_wheel(wheels, "dllm-fixture-a", "1.0")
    shutil.copy2(project_wheel, wheels)
    os.environ.update(uv_env)  # the resolver runs in this process
    manifest = lock_environment(
        LockRequest(
            target="cpu-x86_64",
            requirements=["dllm-fixture-a==1.0"],
            project=Project(name="turbo-dllm", version=__version__),
            index_url=None,
            extra_index_urls=[],
            find_links=[str(wheels)],
            offline=True,
        )
    )
    assert cpu_bundle_archive.name.endswith(f"-{manifest.bundle_target}.tar.zst")
    keep_out = {"turbo-dllm", "pip", "dllm-fixture-a"}
    provided = [
        {"name": d.name, "version": d.version}
        # A fresh interpreter, not this process: importing setuptools (cpp_extension does) puts
        # its vendored packages on sys.path, which the venv's base interpreter does not see.
        for d in inspect_environment(sys.executable).distributions
        if d.name not in keep_out
    ]
    manifest = EnvManifest.model_validate({**manifest.model_dump(), "provided": provided})
    path = work / "cpu-x86_64.toml"
    path.write_text(dump_manifest(manifest))
    return path


@pytest.fixture(scope="module")
def mirror(work, manifest_file, published):
    root, catalog_sha = published
    dest = work / "mirror"
    created = dllm(
        "mirror", "create", dest, "--release", RELEASE, "--manifest", manifest_file,
        "--wheels-from", work / "wheels-in", "--from", root, "--catalog-sha256", catalog_sha,
        "--json",
    )  # fmt: skip
    summary = json.loads(created.stdout)
    assert summary["files"]["bundle"] == 1 and summary["files"]["wheel"] == 2
    assert summary["project"]["version"] == __version__
    return dest, catalog_sha


@pytest.fixture(scope="module")
def served(mirror):
    root, _ = mirror
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "turbo_dllm",
            "mirror",
            "serve",
            str(root),
            "--port",
            "0",
            "--quiet",
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        line = proc.stdout.readline()
        match = re.search(r" at (http://127\.0\.0\.1:\d+)/ ", line)
        assert match, (line, proc.stderr.read() if proc.poll() is not None else "")
        yield match[1]
    finally:
        proc.terminate()
        proc.wait(timeout=30)


def parent_site_packages() -> list[str]:
    paths = sysconfig.get_paths()
    return sorted({paths["purelib"], paths["platlib"]})


def test_air_gapped_install_from_a_served_mirror(work, mirror, served, uv_env, tmp_path):
    _, catalog_sha = mirror
    assert dllm("mirror", "verify", served).returncode == 0  # over HTTP too

    # A fresh venv that sees the running environment's packages (torch is never downloaded).
    venv = work / "venv"
    run(uv_binary(), "venv", venv, "--python", sys.executable, "--quiet", "--no-config")
    (site,) = (venv / "lib").glob("python3.*/site-packages")
    (site / "_parent_env.pth").write_text("\n".join(parent_site_packages()) + "\n")

    synced = dllm("env", "sync", "--mirror", served, "--offline", "--venv", venv, "--json",
                  env=uv_env)  # fmt: skip
    report = json.loads(synced.stdout)
    assert report["target"] == "cpu-x86_64" and report["clean"] is True
    assert report["project"] == f"turbo-dllm {__version__} from {served}"
    python = venv / "bin" / "python"
    where = run(
        python, "-c", "import turbo_dllm, dllm_fixture_a; print(turbo_dllm.__file__)", isolated=True
    )
    assert where.stdout.strip().startswith(str(venv))  # the mirror's wheel, not the checkout

    # The venv's own dllm installs the bundle from the same server and is ready.
    home = {"DLLM_HOME": str(tmp_path / "home")}
    venv_dllm = venv / "bin" / "dllm"
    installed = run(venv_dllm, "bundle", "install", "--auto", "--release", RELEASE,
                    "--index", served, "--catalog-sha256", catalog_sha, "--json", env=home, isolated=True)  # fmt: skip
    bundle = json.loads(installed.stdout)
    assert bundle["index"] == served and bundle["installed"]["sha256"] == bundle["bundle"]["sha256"]
    doctor = run(venv_dllm, "doctor", "--json", env=home, check=False, isolated=True)
    checks = {c["name"]: c for c in json.loads(doctor.stdout)["checks"]}
    assert doctor.returncode == 0, doctor.stdout
    assert checks["environment"]["status"] == "pass", checks["environment"]
    assert all(c["status"] != "fail" for c in checks.values())

    # Drift: one package at another version; check names it, doctor warns (still ready).
    drift_wheels = tmp_path / "drift"
    make_wheel(drift_wheels, "dllm-fixture-a", "1.1")
    run(uv_binary(), "pip", "install", "--python", python, "--no-config", "--no-index",
        "--find-links", drift_wheels, "dllm-fixture-a==1.1", env=uv_env)  # fmt: skip
    checked = run(venv_dllm, "env", "check", "--json", env=home, check=False, isolated=True)
    assert checked.returncode == 1
    assert json.loads(checked.stdout)["mismatched"] == [
        {"name": "dllm-fixture-a", "expected": "1.0", "found": "1.1"}
    ]
    doctor = run(venv_dllm, "doctor", "--json", env=home, check=False, isolated=True)
    checks = {c["name"]: c for c in json.loads(doctor.stdout)["checks"]}
    assert doctor.returncode == 0
    assert checks["environment"]["status"] == "warn"
    assert "dllm-fixture-a 1.1 != 1.0" in checks["environment"]["detail"]


def test_pip_and_uv_install_from_the_served_index(served, tmp_path):
    pip_target = tmp_path / "pip-target"
    run(sys.executable, "-m", "pip", "--isolated", "install", "--no-cache-dir", "--index-url",
        f"{served}/simple", "--no-deps", "--target", pip_target, "turbo-dllm",
        env={"PIP_CONFIG_FILE": os.devnull})  # fmt: skip
    assert (pip_target / "turbo_dllm" / "__init__.py").is_file()

    uv_target = tmp_path / "uv-target"
    run(uv_binary(), "pip", "install", "--no-config", "--index-url", f"{served}/simple",
        "--no-deps", "--target", uv_target, "turbo-dllm",
        env={"UV_CACHE_DIR": str(tmp_path / "uv-cache")})  # fmt: skip
    assert (uv_target / "turbo_dllm" / "__init__.py").is_file()
    # Hash-pinned installs work too: the index's #sha256= fragments match the files.
    run(sys.executable, "-m", "pip", "--isolated", "download", "--no-cache-dir", "--index-url",
        f"{served}/simple", "--no-deps", "-d", tmp_path / "dl", "dllm-fixture-a==1.0",
        env={"PIP_CONFIG_FILE": os.devnull})  # fmt: skip
    assert list((tmp_path / "dl").glob("dllm_fixture_a-1.0-*.whl"))
