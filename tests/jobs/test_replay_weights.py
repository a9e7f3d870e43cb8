"""A replay pins the model.path weights: their content hashes are in the manifest, and a changed
file refuses `dllm launch --manifest` with a field diff."""

from __future__ import annotations

import json
import shutil
import textwrap

import torch

from tests.helpers import assert_user_error
from turbo_dllm.jobs import provenance
from turbo_dllm.jobs.manifest import RunManifest, write_manifest

SPEC = """
launch:
  seed: 0
model:
  family: qwen3
  path: {path}
  from_config: null
objective:
  name: block_diffusion
  block_size: 16
data:
  synthetic:
    num_sequences: 32
    vocab_size: 512
  seq_len: 64
training:
  micro_batch_size: 2
  steps: 4
scheduler:
  warmup_steps: 1
"""


def save_model(folder) -> None:
    from turbo_dllm.families.decoder.runtime import build_model
    from turbo_dllm.registry import get_family
    from turbo_dllm.train.weights import materialize, save_hf

    config = get_family("qwen3").resolve_config(
        path=None, from_config="tiny", overrides={"num_hidden_layers": 1, "hidden_size": 32}
    )
    model = materialize(build_model(config, None), torch.device("cpu"), seed=0)
    save_hf(model.state_dict(), config, folder)


def record(cli, workdir):
    """A dry-run launch's manifest, written into a run dir as a launch would."""
    spec = workdir / "train.yaml"
    spec.write_text(textwrap.dedent(SPEC.format(path=workdir / "model")))
    result = cli("launch", "--config", spec, "--dry-run", "--json")
    assert result.code == 0, result.err
    manifest = RunManifest.model_validate(json.loads(result.out)["manifest"])
    (workdir / "recorded").mkdir()
    return write_manifest(manifest, workdir / "recorded"), manifest


def test_manifest_hashes_the_model_files_without_their_paths(cli, workdir):
    save_model(workdir / "model")
    _, manifest = record(cli, workdir)
    assert sorted(manifest.weights.files) == ["config.json", "model.safetensors"]
    shutil.copytree(workdir / "model", workdir / "moved")
    moved = provenance.weights_ref(str(workdir / "moved"))
    assert moved["files"] == manifest.weights.files  # content only: the folder name is not in it


def test_replay_refuses_changed_weights_with_a_field_diff(cli, workdir):
    save_model(workdir / "model")
    path, manifest = record(cli, workdir)
    assert cli("launch", "--manifest", path, "--dry-run").code == 0
    save_hf_state = workdir / "model/model.safetensors"
    recorded_hash = manifest.weights.files["model.safetensors"]
    shutil.rmtree(workdir / "model")
    save_model(workdir / "model")  # same shape, same seed: byte-identical, so no drift
    assert cli("launch", "--manifest", path, "--dry-run").code == 0
    data = bytearray(save_hf_state.read_bytes())
    data[-1] ^= 0xFF  # one weight changed
    save_hf_state.write_bytes(bytes(data))
    changed = provenance.weights_ref(str(workdir / "model"))["files"]["model.safetensors"]
    result = cli("launch", "--manifest", path, "--dry-run")
    assert_user_error(
        result,
        "replay of run",
        f"weights.files.model.safetensors: {recorded_hash} -> {changed}",
    )
