"""The run manifest: what it pins, how it is written and read, how drift is found."""

from __future__ import annotations

import json
import subprocess
import threading

import pytest

from tests.helpers import assert_user_error
from turbo_dllm.errors import DllmError
from turbo_dllm.jobs import provenance
from turbo_dllm.jobs.drift import differ, flatten, manifest_drift
from turbo_dllm.jobs.manifest import (
    CodeVersion,
    DataRef,
    DriftItem,
    WeightsRef,
    read_manifest,
    spec_sha256,
    write_exclusive,
    write_manifest,
)


@pytest.fixture
def manifest(cli, spec_file):
    result = cli("launch", "--config", spec_file, "--dry-run", "--json")
    assert result.code == 0, result.err
    from turbo_dllm.jobs.manifest import RunManifest

    return RunManifest.model_validate(json.loads(result.out)["manifest"])


def test_manifest_pins_every_input(manifest, spec_file):
    import torch

    import turbo_dllm

    assert manifest.format == "turbo_dllm.run_manifest.v1"
    assert manifest.spec["training"]["steps"] == 4
    assert manifest.spec_sha256 == spec_sha256(manifest.spec)
    assert manifest.host["format"] == "turbo_dllm.fingerprint.v1"
    assert manifest.packages["torch"] == torch.__version__
    assert manifest.packages["pydantic"]
    assert manifest.code.package_version == turbo_dllm.__version__
    assert manifest.seeds == {"launch.seed": 0}
    assert manifest.data is None  # synthetic data: the spec itself pins it
    assert manifest.argv == ["dllm", "launch", "--config", str(spec_file)]


def test_spec_hash_ignores_where_the_run_goes(manifest):
    moved = {**manifest.spec, "launch": {**manifest.spec["launch"], "run_dir": "/elsewhere"}}
    assert spec_sha256(moved) == manifest.spec_sha256
    changed = {**manifest.spec, "training": {**manifest.spec["training"], "steps": 5}}
    assert spec_sha256(changed) != manifest.spec_sha256


def test_write_is_atomic_exclusive_and_read_back(manifest, tmp_path):
    folder = tmp_path / "run"
    folder.mkdir()
    path = write_manifest(manifest, folder)
    assert read_manifest(folder) == manifest
    assert [p.name for p in folder.iterdir()] == ["manifest.json"]  # no temp file left
    with pytest.raises(DllmError, match="already exists"):
        write_manifest(manifest, folder)
    assert read_manifest(path) == manifest
    assert [p.name for p in folder.iterdir()] == ["manifest.json"]


def test_concurrent_exclusive_writers_have_one_winner(tmp_path):
    target = tmp_path / "x.json"
    outcomes: list[str] = []

    def write(payload: bytes) -> None:
        try:
            write_exclusive(target, payload)
            outcomes.append("won")
        except DllmError:
            outcomes.append("lost")

    threads = [threading.Thread(target=write, args=(bytes([65 + i]) * 1000,)) for i in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert sorted(outcomes) == ["lost"] * 7 + ["won"]
    assert len(set(target.read_bytes())) == 1  # one writer's whole payload


def test_edited_manifest_is_refused(cli, manifest, tmp_path):
    document = manifest.model_dump(mode="json")
    document["spec"]["training"]["steps"] = 999
    path = tmp_path / "manifest.json"
    path.write_text(json.dumps(document))
    with pytest.raises(DllmError, match="spec_sha256 does not match"):
        read_manifest(path)
    assert_user_error(cli("launch", "--manifest", path), "not a valid run manifest")
    path.write_text(json.dumps({"format": "turbo_dllm.data.v1"}))
    assert_user_error(cli("launch", "--manifest", path), "is not a run manifest")


def test_a_runspec_given_as_the_manifest_is_named_as_one(cli, spec_file, tmp_path):
    """`dllm launch --manifest train.yaml`: was 'cannot read run manifest ... Expecting value'
    with the hint that the file is torn or was edited."""
    result = cli("launch", "--manifest", spec_file)
    assert_user_error(
        result, f"{str(spec_file)!r} is a YAML file, not a run manifest", f"--config {spec_file}"
    )
    assert "torn" not in result.err
    torn = tmp_path / "manifest.json"  # a JSON manifest cut short is still called torn
    torn.write_text('{"format": "turbo')
    assert_user_error(cli("launch", "--manifest", torn), "cannot read run manifest", "torn")


def _with(manifest, **update):
    return manifest.model_copy(update=update)


def test_drift_names_each_changed_field(manifest):
    assert manifest_drift(manifest, manifest) == []
    packages = {**manifest.packages, "torch": "0.0.1", "newpkg": "1.0"}
    host = {**manifest.host, "glibc": "9.99"}
    code = CodeVersion(package_version="0.0.0", git_commit="f" * 40, diff_sha256="0" * 64)
    data = DataRef(artifact="/d", fingerprint="abc", num_sequences=1, seq_len=64, vocab_size=260)
    current = _with(manifest, packages=packages, host=host, code=code, data=data)
    fields = [item.field for item in manifest_drift(manifest, current)]
    assert fields == [
        "host.glibc",
        "packages.newpkg",
        "packages.torch",
        "data",
        "code.package_version",
        "code.git_commit",
        "code.diff_sha256",
    ]
    [torch] = [i for i in manifest_drift(manifest, current) if i.field == "packages.torch"]
    assert torch.recorded == manifest.packages["torch"] and torch.current == "0.0.1"


def test_bundle_drift(manifest):
    from turbo_dllm.jobs.manifest import BundleRef

    one = BundleRef(bundle_id="0.1.0-cpu", sha256="a" * 64, target="cpu")
    other = BundleRef(bundle_id="0.1.0-cpu", sha256="b" * 64, target="cpu")
    drift = manifest_drift(_with(manifest, bundle=one), _with(manifest, bundle=other))
    assert [(i.field, i.recorded, i.current) for i in drift] == [
        ("bundle.sha256", "a" * 64, "b" * 64)
    ]
    [appeared] = manifest_drift(manifest, _with(manifest, bundle=one))
    assert appeared.field == "bundle" and appeared.recorded is None
    assert appeared.current == {"bundle_id": "0.1.0-cpu", "sha256": "a" * 64}


def test_drift_ignores_what_names_a_machine_rather_than_describes_it(manifest):
    current = _with(manifest, host={**manifest.host, "hostname": "other-node"})
    assert manifest_drift(manifest, current) == []


def test_flatten_paths():
    assert flatten({"a": {"b": 1, "c": [{"d": 2}]}, "e": [1, 2]}) == {
        "a.b": 1,
        "a.c[0].d": 2,
        "e": [1, 2],
    }


# --- code version ------------------------------------------------------------------------------


def _git(repo, *args):
    subprocess.run(
        ["git", "-c", "user.name=t", "-c", "user.email=t@example.com", "-C", str(repo), *args],
        check=True,
        capture_output=True,
    )


@pytest.fixture
def checkout(tmp_path):
    repo = tmp_path / "repo"
    package = repo / "pkg"
    package.mkdir(parents=True)
    (package / "__init__.py").write_text("x = 1\n")
    (repo / ".gitignore").write_text("runs/\n")
    _git(repo, "init", "-q")
    _git(repo, "add", ".")
    _git(repo, "commit", "-q", "-m", "init")
    return repo, package


def test_code_version_tracks_commit_diff_and_untracked_files(checkout):
    repo, package = checkout
    clean = provenance._git_state(package)
    assert len(clean["git_commit"]) == 40 and clean["dirty"] is False

    (package / "__init__.py").write_text("x = 2\n")
    edited = provenance._git_state(package)
    assert edited["dirty"] and edited["diff_sha256"] != clean["diff_sha256"]
    assert edited["git_commit"] == clean["git_commit"]

    (package / "new.py").write_text("y = 1\n")
    untracked = provenance._git_state(package)
    assert untracked["diff_sha256"] != edited["diff_sha256"]
    (package / "new.py").write_text("y = 2\n")
    assert provenance._git_state(package)["diff_sha256"] != untracked["diff_sha256"]

    (package / "new.py").unlink()
    (repo / "runs").mkdir()
    (repo / "runs" / "metrics.jsonl").write_text("{}\n")  # ignored: not code
    assert provenance._git_state(package) == edited


def test_code_version_is_null_outside_a_checkout(tmp_path):
    package = tmp_path / "site-packages" / "pkg"
    package.mkdir(parents=True)
    (package / "__init__.py").write_text("")
    assert provenance._git_state(package) == {
        "git_commit": None,
        "diff_sha256": None,
        "dirty": None,
    }


def test_code_version_is_null_for_an_untracked_package_inside_a_repo(checkout):
    repo, _ = checkout
    venv_package = repo / ".venv" / "pkg"
    venv_package.mkdir(parents=True)
    (venv_package / "__init__.py").write_text("")
    (repo / ".gitignore").write_text("runs/\n.venv/\n")
    assert provenance._git_state(venv_package)["git_commit"] is None


def test_installed_packages_uses_canonical_names():
    packages = provenance.installed_packages()
    assert "turbo-dllm" in packages and "pyyaml" in packages
    assert list(packages) == sorted(packages)


def test_drift_tells_values_of_another_type_apart(manifest):
    """Inputs compared with Python's `==`: a host field recorded `true` and now `1` (or `1` and
    `1.0`) was no drift, so a replay ran on inputs whose type had changed. Compared as JSON,
    they differ; values that would print alike in the replay's refusal are printed as JSON."""
    pairs = {"flag": (True, 1), "count": ("1", 1), "ratio": (1, 1.0), "gone": ("(none)", None)}
    recorded = _with(manifest, host={**manifest.host, **{k: v[0] for k, v in pairs.items()}})
    current = _with(manifest, host={**manifest.host, **{k: v[1] for k, v in pairs.items()}})
    drift = manifest_drift(recorded, current)
    assert [(i.field, i.recorded, i.current) for i in drift] == [
        ("host.count", "1", 1),
        ("host.flag", True, 1),
        ("host.gone", "(none)", None),
        ("host.ratio", 1, 1.0),
    ]
    assert [type(i.recorded) for i in drift] == [str, bool, str, int]
    assert [str(i) for i in drift] == [
        'host.count: "1" -> 1',
        "host.flag: true -> 1",
        'host.gone: "(none)" -> null',
        "host.ratio: 1 -> 1.0",
    ]
    assert manifest_drift(current, current) == []
    # Every group (packages, bundle, data, weights, code: typed fields) compares through this.
    assert differ(True, 1) and differ(1, 1.0) and differ("1", 1) and differ(None, "")
    assert not differ({"a": 1, "b": [True]}, {"b": [True], "a": 1})
    # Ordinary differences read as before: strings as they are, none as (none).
    assert str(DriftItem(field="packages.torch", recorded="2.1", current=None)) == (
        "packages.torch: 2.1 -> (none)"
    )


def test_a_vanished_folder_reads_as_its_path_and_file_count(manifest):
    """A weights folder (or resume checkpoint) that vanished was one item holding only its
    files' hashes, printed as one long line of JSON without the folder's path."""
    weights = {"path": "/models/tiny", "files": {"config.json": "ab" * 32, "model.bin": "cd" * 32}}
    recorded = _with(manifest, weights=WeightsRef(**weights))
    (item,) = [i for i in manifest_drift(recorded, manifest) if i.field == "weights"]
    assert item.recorded == weights and item.current is None
    assert str(item) == "weights: /models/tiny (2 files) -> (none)"


def test_replay_refuses_an_input_whose_type_changed(cli, manifest, workdir):
    """`dllm launch --manifest` over a manifest whose host recorded `cxx11_abi: 1` where this host
    says `true`: refused as drift (it replayed silently), the values shown apart."""
    assert manifest.host["cxx11_abi"] in (True, False)
    document = manifest.model_dump(mode="json")
    document["host"]["cxx11_abi"] = int(manifest.host["cxx11_abi"])
    path = workdir / "recorded.json"
    path.write_text(json.dumps(document))
    now = json.dumps(manifest.host["cxx11_abi"])
    refused = cli("launch", "--manifest", path, "--dry-run")
    assert_user_error(refused, "refused: 1 input drifted")
    assert f"host.cxx11_abi: {int(manifest.host['cxx11_abi'])} -> {now}" in refused.err
    document["host"]["cxx11_abi"] = manifest.host["cxx11_abi"]
    path.write_text(json.dumps(document))
    assert cli("launch", "--manifest", path, "--dry-run").code == 0
