"""doctor's model check for a model.path that is not there: it said "model folder config not
found: '<path>/config.json'" (fix: "point model.path at a Hugging Face folder holding
config.json"), of a folder that does not exist at all."""

from __future__ import annotations

import json
import shlex

from tests.train.util import write_config


def test_a_missing_model_folder_is_named_as_missing(cli, tmp_path):
    folder = tmp_path / "weights dir" / "qwen"
    config = write_config(tmp_path / "train.yaml", f"model.path={folder}", "model.from_config=null")
    result = cli("doctor", "--config", config, "--json")
    model = {c["name"]: c for c in json.loads(result.out)["checks"]}["model"]
    assert result.code == 1 and model["status"] == "fail"
    assert model["detail"] == f"model.path {folder}: no such folder"
    assert f"in {shlex.quote(str(folder))}, or set model.path" in model["fix"]
    folder.mkdir(parents=True)  # there, but no config.json: the loader's own message
    model = {c["name"]: c for c in json.loads(cli("doctor", "--config", config, "--json").out)[
        "checks"
    ]}["model"]  # fmt: skip
    assert model["status"] == "fail" and "config.json" in model["detail"], model
    assert "no such folder" not in model["detail"]


def test_a_model_path_naming_a_file_is_named_as_one(cli, tmp_path):
    """It was "cannot read '<file>/config.json': [Errno 20] Not a directory", fix "a part of that
    path is a file, not a folder: choose another path"."""
    weights = tmp_path / "model.safetensors"
    weights.write_bytes(b"x")
    config = write_config(
        tmp_path / "train.yaml", f"model.path={weights}", "model.from_config=null"
    )
    result = cli("doctor", "--config", config, "--json")
    model = {c["name"]: c for c in json.loads(result.out)["checks"]}["model"]
    assert result.code == 1 and model["status"] == "fail"
    assert model["detail"] == f"model.path {weights}: a file, not a folder"
    assert model["fix"].startswith("set model.path to the folder that holds the Hugging Face")
    assert "Errno" not in model["detail"]
