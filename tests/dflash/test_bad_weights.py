"""A damaged `model.safetensors` in a drafter or target folder is a user error naming the folder,
in every `dllm dflash` command that loads it and in training: safetensors' own error
("Error while deserializing header: header too large") was a traceback that named no file."""

from __future__ import annotations

import shutil

import pytest
import yaml

from tests.dflash.helpers import drafter_document, drafter_spec
from tests.helpers import assert_user_error
from turbo_dllm.errors import DllmError

QUICK = ("--max-new-tokens", "4", "--num-prompts", "1")


def _damaged(folder, to):
    copy = shutil.copytree(folder, to)
    (copy / "model.safetensors").write_bytes(b"not safetensors" * 8)
    return copy


def _eval(cli, target, drafter, data, *flags):
    return cli("dflash", "eval", "--target", target, "--drafter", drafter, "--data", data, *flags)


def test_eval_names_a_damaged_drafter_or_target(cli, world, drafter, tmp_path):
    bad_drafter = _damaged(drafter["folder"], tmp_path / "drafter")
    result = _eval(cli, world["target"], bad_drafter, world["artifact"], *QUICK)
    assert_user_error(result, f"the drafter {str(bad_drafter)!r}", "unreadable")
    bad_target = _damaged(world["target"], tmp_path / "target")
    result = _eval(cli, bad_target, drafter["folder"], world["artifact"], *QUICK)
    assert_user_error(result, f"the target {str(bad_target)!r}", "unreadable")
    # an autoregressive drafter (the baseline) loads through transformers
    result = _eval(cli, world["target"], bad_target, world["artifact"], *QUICK, "--block-size", "4")
    assert_user_error(result, f"--drafter {str(bad_target)!r}", "unreadable")


def test_prepare_features_and_training_name_a_damaged_target(cli, world, tmp_path):
    bad_target = _damaged(world["target"], tmp_path / "target")
    config = tmp_path / "drafter.yaml"
    config.write_text(yaml.safe_dump(drafter_document(bad_target, world["artifact"])))
    result = cli("dflash", "prepare-features", "--config", config, "--out", tmp_path / "features")
    assert_user_error(result, f"the target {str(bad_target)!r}", "unreadable")
    from turbo_dllm.train.entry import train

    spec = drafter_spec(
        bad_target, world["artifact"], "training.steps=1", "scheduler.warmup_steps=0"
    )
    with pytest.raises(DllmError, match="unreadable"):
        train(spec, tmp_path / "run")
