"""A DFlash drafter's feature artifact (`model.dflash.features`) is pinned in the run manifest
by what its features.json records (the content fingerprint over its inputs and every shard's
sha256, and the sha256 of features.json), and a replay against an artifact regenerated at the
same path with other content is refused field by field, as one against other data is. Before,
the manifest recorded only the path, and the replay trained from other features without a
word of drift. Manifests from before the field are not compared."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import yaml

from tests.dflash.conftest import one_thread
from tests.dflash.helpers import drafter_document, stdlib_artifact, train_target
from tests.helpers import assert_user_error
from turbo_dllm.families.dflash.features import read_features_manifest
from turbo_dllm.fsutil import sha256_file
from turbo_dllm.jobs import provenance
from turbo_dllm.jobs.manifest import RunManifest, write_manifest


@pytest.fixture(scope="module", autouse=True)
def _one_thread():
    """torch at one intra-op thread here, as in tests/dflash (whose conftest says why)."""
    with one_thread():
        yield


@pytest.fixture(scope="module")
def world(tmp_path_factory, _one_thread):
    """A 2-step target and its data: two stdlib sources (about 70 rows) are enough for feature
    artifacts whose shards differ (8 and 4 rows a shard), and each row is one target forward."""
    root = tmp_path_factory.mktemp("drafter-world")
    artifact = stdlib_artifact(root, files=("keyword.py", "bisect.py"))
    return {"artifact": artifact, "target": train_target(artifact, root, steps=2)}


@pytest.fixture
def pinned_code(monkeypatch):
    code = provenance.code_version()  # others may edit this checkout while the test runs
    monkeypatch.setattr(provenance, "code_version", lambda: dict(code))


def prepare(cli, config: Path, out: Path, rows_per_shard: int) -> None:
    result = cli(
        "dflash", "prepare-features", "--config", config, "--out", out,
        "--rows-per-shard", str(rows_per_shard),
    )  # fmt: skip
    assert result.code == 0, result.err


def record(cli, config: Path, run_dir: str, *args: str) -> tuple[Path, RunManifest]:
    """A dry-run launch's manifest, written into its run dir as a launch would."""
    result = cli("launch", "--config", config, "--run-dir", run_dir, "--dry-run", "--json", *args)
    assert result.code == 0, result.err
    manifest = RunManifest.model_validate(json.loads(result.out)["manifest"])
    Path(run_dir).mkdir()
    return write_manifest(manifest, Path(run_dir)), manifest


def test_a_regenerated_feature_artifact_refuses_the_replay(cli, world, workdir, pinned_code):
    config = workdir / "drafter.yaml"
    config.write_text(
        yaml.safe_dump(
            drafter_document(world["target"], world["artifact"], "checkpoint.interval=null")
        )
    )
    features = workdir / "features"
    prepare(cli, config, features, rows_per_shard=8)
    made = read_features_manifest(features)
    path, manifest = record(cli, config, "a", "--set", f"model.dflash.features={features}")
    assert manifest.features.model_dump() == {
        "artifact": str(features),
        "fingerprint": made.fingerprint,
        "manifest_sha256": sha256_file(features / "features.json"),
        "target_fingerprint": made.target_fingerprint,
        "data_fingerprint": made.data_fingerprint,
        "num_rows": made.num_rows,
        "teacher": made.teacher,
    }
    same = cli("launch", "--manifest", path, "--dry-run", "--json")
    assert same.code == 0, same.err
    assert json.loads(same.out)["drift"] == []

    # The same target and data, made again into the same folder in other shards: an artifact
    # the spec takes (a launch of it passes), but not the one the run trained from.
    shutil.rmtree(features)
    prepare(cli, config, features, rows_per_shard=4)
    remade = read_features_manifest(features)
    assert remade.fingerprint != made.fingerprint
    result = cli("launch", "--manifest", path, "--dry-run")
    assert_user_error(
        result,
        "2 inputs drifted",
        f"features.fingerprint: {made.fingerprint} -> {remade.fingerprint}",
        "features.manifest_sha256: ",
        "hint: restore the recorded model.dflash.features artifact",
    )
    allowed = cli("launch", "--manifest", path, "--dry-run", "--json", "--allow-drift")
    assert allowed.code == 0, allowed.err
    drift = json.loads(allowed.out)["manifest"]["replay_of"]["drift"]
    assert [item["field"] for item in drift] == ["features.fingerprint", "features.manifest_sha256"]

    # Gone: the replay says the artifact is, as it says of a vanished data artifact.
    shutil.rmtree(features)
    assert_user_error(cli("launch", "--manifest", path, "--dry-run"), "  - features: {")

    # A manifest written before the field (its file has no `features` key, nor the later
    # `recorded_inputs`): not compared.
    document = json.loads(path.read_text())
    del document["features"], document["recorded_inputs"]
    Path("old").mkdir()
    (Path("old") / "manifest.json").write_text(json.dumps(document))
    prepare(cli, config, features, rows_per_shard=4)
    result = cli("launch", "--manifest", "old/manifest.json", "--dry-run")
    assert result.code == 0, result.err


def test_online_features_record_none(cli, world, workdir, pinned_code):
    config = workdir / "drafter.yaml"
    config.write_text(
        yaml.safe_dump(
            drafter_document(world["target"], world["artifact"], "checkpoint.interval=null")
        )
    )
    _, manifest = record(cli, config, "b")
    assert manifest.features is None and manifest.records("features")
