"""What we write atomically keeps the umask's modes, not mkstemp's 0600 / mkdtemp's 0700: on
shared storage, other users can read catalogs, mirrors, artifacts, run manifests and
checkpoints when the umask says so."""

from __future__ import annotations

import contextlib
import os
import stat

import pytest

from turbo_dllm.fsutil import make_temp_dir, write_atomic
from turbo_dllm.jobs.manifest import write_exclusive


@contextlib.contextmanager
def umask(value: int):
    old = os.umask(value)
    try:
        yield
    finally:
        os.umask(old)


def mode(path) -> int:
    return stat.S_IMODE(os.stat(path).st_mode)


@pytest.mark.parametrize(
    ("mask", "file_mode", "dir_mode"), [(0o022, 0o644, 0o755), (0o077, 0o600, 0o700)]
)
def test_atomic_writes_honour_the_umask(tmp_path, mask, file_mode, dir_mode):
    from turbo_dllm.data.writer import staged_artifact

    with umask(mask):
        assert mode(write_atomic(tmp_path / "catalog.toml", "x")) == file_mode
        assert mode(write_atomic(tmp_path / "catalog.toml", "replaced")) == file_mode
        assert mode(write_exclusive(tmp_path / "manifest.json", b"{}")) == file_mode
        assert mode(make_temp_dir(tmp_path, ".staging-")) == dir_mode
        with staged_artifact(tmp_path / "artifact", overwrite=False) as staging:
            (staging / "manifest.json").write_text("{}")
        assert mode(tmp_path / "artifact") == dir_mode
    assert not [p.name for p in tmp_path.iterdir() if p.name.startswith(".catalog")]


def test_a_created_mirror_honours_the_umask(tmp_path):
    from turbo_dllm.envs.select import select_manifest
    from turbo_dllm.mirror.create import MirrorPlan, create_mirror

    with umask(0o022):
        plan = MirrorPlan(tmp_path / "mirror", None, [select_manifest("auto")])
        create_mirror(plan)
    assert mode(tmp_path / "mirror") == 0o755
    assert mode(tmp_path / "mirror" / "MIRROR.json") == 0o644


@pytest.mark.parametrize(("mask", "file_mode"), [(0o022, 0o644), (0o077, 0o600)])
def test_exported_weights_honour_the_umask(tmp_path, mask, file_mode):
    """An export's model.safetensors (safetensors creates its files 0600) is as readable as its
    config.json: a serving account or a colleague loads the folder when the umask allows."""
    import torch

    from turbo_dllm.families.decoder import DecoderConfig
    from turbo_dllm.train.weights import save_hf

    config = DecoderConfig(model_type="qwen3", vocab_size=8, hidden_size=4, intermediate_size=8,
                           num_hidden_layers=1, num_attention_heads=1, num_key_value_heads=1,
                           head_dim=4)  # fmt: skip
    with umask(mask):
        folder = save_hf({"model.norm.weight": torch.ones(4)}, config, tmp_path / "export")
    assert mode(folder / "model.safetensors") == file_mode
    assert mode(folder / "config.json") == file_mode
