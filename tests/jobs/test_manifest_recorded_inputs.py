"""A manifest says which later-added inputs it recorded (`recorded_inputs`: target_weights,
features, model_shape, resume), and a replay or `dllm run diff` compares two manifests only on
those both recorded. The check was "the manifest has the key": write_manifest writes every field
of its version, so the key said it only for the file as first written; the same manifest dumped
again (`dllm run show --json`, the model's own dump) had `"model_shape": null`, and its replay
was refused for a from_config file it never recorded, and `dllm run diff NEW OLD` listed the
old run's unrecorded inputs as removed. The old manifest here is written as the code before
b2983ef wrote it: every field of its version, `"target_weights": null` among them, and no
model_shape / resume / features / recorded_inputs."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from turbo_dllm.jobs import provenance
from turbo_dllm.jobs.drift import manifest_drift
from turbo_dllm.jobs.manifest import RunManifest, WeightsRef, read_manifest, write_manifest
from turbo_dllm.registry import get_family

LATER = ("model_shape", "resume", "features", "recorded_inputs")  # keys the old code did not write


@pytest.fixture
def pinned_code(monkeypatch):
    code = provenance.code_version()  # others may edit this checkout while the test runs
    monkeypatch.setattr(provenance, "code_version", lambda: dict(code))


@pytest.fixture
def shaped(cli, spec_file, workdir, pinned_code):
    """A spec whose model.from_config is a config.json, and a manifest of it recorded now
    (`runs/new`) and one as the code before b2983ef wrote it (`runs/old`)."""
    config = workdir / "shape.json"
    config.write_text(json.dumps(get_family("qwen3").presets["tiny"]))
    args = ("--config", spec_file, "--set", f"model.from_config={config}")
    documents = {}
    for name in ("new", "old"):
        result = cli("launch", "--dry-run", "--json", *args, "--run-dir", f"runs/{name}")
        assert result.code == 0, result.err
        documents[name] = json.loads(result.out)["manifest"]
    Path("runs/new").mkdir(parents=True)
    write_manifest(RunManifest.model_validate(documents["new"]), Path("runs/new"))
    old = {k: v for k, v in documents["old"].items() if k not in LATER}
    assert old["target_weights"] is None
    Path("runs/old").mkdir()
    Path("runs/old/manifest.json").write_text(json.dumps(old, indent=2, sort_keys=True) + "\n")
    return args


def test_an_old_manifest_dumped_again_still_did_not_record_the_later_inputs(cli, shaped):
    # `dllm run show --json` of the old run, replayed: the same job, no drift
    shown = cli("run", "show", "--json", "runs/old")
    assert shown.code == 0, shown.err
    assert json.loads(shown.out)["model_shape"] is None  # written, as every field is
    Path("shown.json").write_text(shown.out)
    replay = cli("launch", "--manifest", "shown.json", "--dry-run", "--json")
    assert replay.code == 0, replay.err
    assert json.loads(replay.out)["drift"] == []

    old = read_manifest("runs/old")
    again = RunManifest.model_validate(old.model_dump(mode="json"))
    new = read_manifest("runs/new")
    assert new.model_shape is not None
    assert manifest_drift(again, new) == manifest_drift(new, again) == []
    for manifest in (old, again):
        assert [manifest.records(g) for g in ("target_weights", "model_shape", "resume")] == [
            True,
            False,
            False,
        ]
    assert new.records("model_shape") and new.records("resume")


@pytest.mark.parametrize("order", [("runs/new", "runs/old"), ("runs/old", "runs/new")])
def test_run_diff_compares_an_old_manifest_only_on_what_it_recorded(cli, shaped, order):
    result = cli("run", "diff", "--json", *order)
    assert result.code == 0, result.err
    fields = [item["field"] for item in json.loads(result.out)["diff"]["inputs"]]
    assert fields == []


def test_a_later_input_recorded_as_none_is_still_compared(shaped):
    """null in a manifest that records the field is "none": a replay that finds one drifted."""
    new = read_manifest("runs/new")
    preset = new.model_copy(update={"model_shape": None})
    again = RunManifest.model_validate(json.loads(json.dumps(preset.model_dump(mode="json"))))
    assert again.records("model_shape")
    drift = manifest_drift(again, new)
    assert [item.field for item in drift] == ["model_shape"]
    shape = WeightsRef(path="x", files={"x.json": "0" * 64})
    assert [i.field for i in manifest_drift(new, new.model_copy(update={"resume": shape}))] == [
        "resume"
    ]
