"""A small real-text world for the drafter tests: Python standard library sources as a data
artifact, a tiny target trained on them with `objective: autoregressive`, drafter specs."""

from __future__ import annotations

import shutil
import sysconfig
from pathlib import Path
from typing import Any

import yaml

from tests.train.util import TINY
from turbo_dllm.config.load import apply_overrides
from turbo_dllm.config.runspec import RunSpec
from turbo_dllm.config.validate import check

# Small, stable modules of every CPython install (sources are text every machine has).
STDLIB_FILES = ("colorsys.py", "bisect.py", "keyword.py", "glob.py", "fnmatch.py")
MASK = 259  # the byte-level tokenizer's <|mask|>


def stdlib_artifact(folder: Path, files=STDLIB_FILES, seq_len: int = 64) -> Path:
    """A byte-level artifact of a few standard-library sources (one document per file)."""
    sources = folder / "sources"
    sources.mkdir(parents=True)
    stdlib = Path(sysconfig.get_paths()["stdlib"])
    for name in files:
        shutil.copy(stdlib / name, sources / name)
    config = {
        "source": {"kind": "text", "paths": [str(sources / n) for n in files]},
        "tokenizer": {"kind": "byte_level"},
        "packing": {"seq_len": seq_len, "block_size": 4},
        "output": {"path": str(folder / "artifact")},
        "workers": 1,
    }
    path = folder / "prepare.yaml"
    path.write_text(yaml.safe_dump(config))
    from turbo_dllm.data.prepare import prepare
    from turbo_dllm.data.spec import load_prepare_spec

    prepare(load_prepare_spec(path, []), progress=False)
    return folder / "artifact"


def target_document(artifact: Path, run_dir: Path, steps: int = 60) -> dict[str, Any]:
    return apply_overrides(
        TINY,
        [
            "objective.name=autoregressive",
            f"data.artifact={artifact}",
            "data.synthetic=null",
            "data.seq_len=64",
            f"training.steps={steps}",
            "training.micro_batch_size=8",
            "optimizer.lr=0.01",
            "checkpoint.interval=null",
            f"launch.run_dir={run_dir}",
        ],
    )


def train_target(artifact: Path, folder: Path, steps: int = 60) -> Path:
    """A tiny Qwen3 (2 layers, hidden 64) trained autoregressively, exported as an HF folder."""
    from turbo_dllm.train.entry import train
    from turbo_dllm.train.export import export_checkpoint

    run = folder / "target-run"
    train(check(RunSpec.model_validate(target_document(artifact, run, steps))), run)
    return export_checkpoint(run / "checkpoints", folder / "target")


def drafter_document(target: Path, artifact: Path, *overrides: str) -> dict[str, Any]:
    base = apply_overrides(
        TINY,
        [
            "model.family=dflash",
            "model.from_config=target",
            "model.config_overrides={}",
            f"model.dflash={{target: {target}, num_layers: 1, block_size: 4, mask_token_id: {MASK}}}",
            "objective.name=dflash_distillation",
            "objective.block_size=4",
            "objective.max_anchors=8",
            "objective.decay_gamma=4.0",
            f"data.artifact={artifact}",
            "data.synthetic=null",
            "data.seq_len=64",
            "training.steps=6",
            "training.micro_batch_size=4",
            "optimizer.lr=0.003",
            "checkpoint.interval=3",
        ],
    )
    return apply_overrides(base, list(overrides))


def drafter_spec(target: Path, artifact: Path, *overrides: str) -> RunSpec:
    return check(RunSpec.model_validate(drafter_document(target, artifact, *overrides)))


def assert_two_processes_train_the_one_process_trace(
    world, tmp_path: Path, topology: tuple[str, ...], common: tuple[str, ...] = ()
):
    """`train` in this process and `dllm train` under torchrun on 2 processes with `topology`
    (both runs with the `common` overrides) give the same loss and gradient-norm trace."""
    import torch

    from tests.train.util import metrics, torchrun
    from turbo_dllm.train.entry import train

    args = (*common, "training.steps=3", "checkpoint.interval=null")
    single, double = tmp_path / "single", tmp_path / "double"
    train(drafter_spec(world["target"], world["artifact"], *args), single)
    config = tmp_path / "train.yaml"
    document = drafter_document(world["target"], world["artifact"], *args, *topology)
    config.write_text(yaml.safe_dump(document))
    torchrun(2, "train", "--config", str(config), "--run-dir", str(double), cwd=tmp_path)
    for key in ("loss", "grad_norm"):
        torch.testing.assert_close(
            [r[key] for r in metrics(double)],
            [r[key] for r in metrics(single)],
            rtol=2e-5,
            atol=2e-5,
        )


def tiny_qwen3_config(vocab_size: int = 64):
    """A transformers Qwen3Config of 2 small layers (4 query / 2 key-value heads of 8): a target
    or drafter that builds in milliseconds."""
    from transformers import Qwen3Config

    return Qwen3Config(
        vocab_size=vocab_size,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=8,
    )


def tiny_drafter_config(**overrides: Any):
    """A DFlashConfig of 2 tiny layers (vocab 11, hidden 8, 2 query / 1 key-value heads of 4)
    reading layers 0 and 2 of a 3-layer target, block 4, mask id 10; `overrides` replace
    fields (`architecture="DFlash2DraftModel"` and its fields for a DFlash2 drafter)."""
    from turbo_dllm.families.dflash.config import DFlashConfig

    fields: dict[str, Any] = dict(
        vocab_size=11,
        hidden_size=8,
        intermediate_size=16,
        num_hidden_layers=2,
        num_attention_heads=2,
        num_key_value_heads=1,
        head_dim=4,
        target_hidden_size=8,
        num_target_layers=3,
        target_layer_ids=(0, 2),
        block_size=4,
        mask_token_id=10,
    )
    return DFlashConfig(**{**fields, **overrides})
