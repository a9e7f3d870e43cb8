"""`dllm dflash eval` evaluates a drafter against the target it was trained against: a
`dllm dflash export` folder records that target's content fingerprint, and a same-shape target
with other weights is refused (decoding stays lossless with any target, so nothing else would
say that the tau is another target's), unless --allow-other-target asks for exactly that."""

from __future__ import annotations

import json
import re
import shutil

import pytest

from tests.dflash.helpers import tiny_qwen3_config
from tests.helpers import assert_user_error
from turbo_dllm import digests
from turbo_dllm.families.dflash import target_identity
from turbo_dllm.families.dflash.export import export_drafter
from turbo_dllm.families.dflash.speculative import compare

QUICK = ("--max-new-tokens", "8", "--num-prompts", "1")


def _eval(cli, target, drafter, data, *flags):
    return cli("dflash", "eval", "--target", target, "--drafter", drafter, "--data", data, *flags)


@pytest.fixture(scope="module")
def exported(drafter, tmp_path_factory):
    """The world's drafter as `dllm dflash export` writes it (with training_export.json)."""
    out = tmp_path_factory.mktemp("eval-target") / "export"
    return export_drafter(drafter["run"] / "checkpoints", out)


@pytest.fixture(scope="module")
def other_target(world, tmp_path_factory):
    """The world's target with other weights of the same shape."""
    from safetensors.torch import load_file, save_file

    other = shutil.copytree(world["target"], tmp_path_factory.mktemp("other") / "target")
    tensors = load_file(str(other / "model.safetensors"))
    tensors["model.norm.weight"] = tensors["model.norm.weight"] * 2
    save_file(tensors, str(other / "model.safetensors"), metadata={"format": "pt"})
    return other


def test_a_target_with_other_weights_than_the_export_records_is_refused(
    cli, world, exported, other_target
):
    recorded = json.loads((exported / "training_export.json").read_text())["target_fingerprint"]
    actual = target_identity.target_fingerprint(other_target)
    result = _eval(cli, other_target, exported, world["artifact"], *QUICK)
    assert_user_error(
        result, str(exported), str(other_target), recorded[:12], actual[:12], "--allow-other-target"
    )
    # asked for: evaluated, and the report says against what
    flags = (*QUICK, "--allow-other-target", "--json")
    result = _eval(cli, other_target, exported, world["artifact"], *flags)
    assert result.code == 0, result.err
    report = json.loads(result.out)
    assert report["lossless"] is True and report["other_target"] is True
    result = _eval(cli, other_target, exported, world["artifact"], *QUICK, "--allow-other-target")
    assert result.code == 0 and "another target" in result.out, result.err


def test_the_recorded_target_or_a_copy_passes_and_is_hashed_once(
    world, exported, tmp_path, monkeypatch
):
    """Two drafters of the same record against one target: its files are read for the
    fingerprint once in the process (memoized by their stamps)."""
    copy = shutil.copytree(world["target"], tmp_path / "copy")
    calls = []
    real = digests.sha256_file
    monkeypatch.setattr(target_identity, "_FINGERPRINTS", {})
    monkeypatch.setattr(digests, "sha256_file", lambda f: calls.append(f) or real(f))
    reports = compare(
        str(copy),
        [str(exported), str(exported)],
        str(world["artifact"]),
        max_new_tokens=4,
        num_prompts=1,
    )
    assert [r.other_target for r in reports] == [False, False]
    assert sorted(p.name for p in calls) == ["config.json", "model.safetensors"]


def test_a_drafter_without_the_record_is_evaluated_unchecked(cli, world, drafter, other_target):
    """`dllm export` folders (and exports made before the record) carry no target fingerprint:
    shape-checked only, as before."""
    assert not (drafter["folder"] / "training_export.json").exists()
    result = _eval(cli, other_target, drafter["folder"], world["artifact"], *QUICK, "--json")
    assert result.code == 0, result.err
    assert json.loads(result.out)["other_target"] is False


def test_an_unreadable_export_record_is_named(cli, world, exported, tmp_path):
    broken = shutil.copytree(exported, tmp_path / "broken")
    (broken / "training_export.json").write_text("{not json")
    result = _eval(cli, world["target"], broken, world["artifact"], *QUICK)
    assert_user_error(result, "training_export.json", "unreadable")


def test_data_of_another_tokenizer_than_the_targets_is_refused(cli, world, drafter, tmp_path):
    """The family's input rule (tests/dflash/test_target_tokenizer.py) holds for --data too:
    the target would read another tokenizer's ids as other text, and decode losslessly."""
    from tests.dflash.test_target_tokenizer import _artifact, _with_tokenizer

    target = _with_tokenizer(world["target"], tmp_path / "target")
    result = _eval(cli, target, drafter["folder"], world["artifact"], *QUICK)  # byte-level data
    assert_user_error(result, "--data", str(world["artifact"]), "another tokenizer", str(target))
    artifact = _artifact(target, tmp_path / "data")  # the target's own tokenizer passes
    result = _eval(cli, target, drafter["folder"], artifact, *QUICK, "--json")
    assert result.code == 0, result.err
    assert json.loads(result.out)["lossless"] is True


def test_data_ids_outside_the_targets_vocabulary_are_refused(cli, world, tmp_path):
    """A target folder without a tokenizer is not compared by vocabulary, but a prompt id past
    its embedding was an IndexError traceback from inside the target's forward."""
    import torch
    from transformers import Qwen3ForCausalLM

    config = tiny_qwen3_config()
    torch.manual_seed(0)
    Qwen3ForCausalLM(config).save_pretrained(tmp_path / "small")
    small = tmp_path / "small"  # byte-level text: ASCII letters are ids 65 and up
    flags = (*QUICK, "--block-size", "4")
    result = _eval(cli, small, small, world["artifact"], *flags)
    assert_user_error(result, "--data", "outside the vocabulary of the target", "(64 ids)")


def test_data_that_is_not_an_artifact_is_named(cli, world, drafter, tmp_path):
    result = _eval(cli, world["target"], drafter["folder"], tmp_path, *QUICK)
    assert_user_error(result, "no data artifact at", str(tmp_path))


def _with_config(folder, tmp_path, name, **changes):
    """A copy of the drafter folder `folder` with config.json keys changed (None: removed)."""
    copy = shutil.copytree(folder, tmp_path / name)
    hf = json.loads((copy / "config.json").read_text())
    for key, value in changes.items():
        if value is None:
            hf.pop(key, None)
        else:
            hf[key] = value
    (copy / "config.json").write_text(json.dumps(hf))
    return copy


def test_a_drafter_recording_another_target_depth_is_refused(cli, world, drafter, tmp_path):
    """The folder's num_target_layers is the depth of the target it was trained against: its
    layer ids can all exist in a deeper target (read as other layers' features), which only the
    shape check let through. Compared by eval, training (model.path) and export --target."""
    from tests.dflash.helpers import drafter_spec
    from turbo_dllm.errors import DllmError

    depth = json.loads((world["target"] / "config.json").read_text())["num_hidden_layers"]
    deeper = _with_config(drafter["folder"], tmp_path, "deeper", num_target_layers=depth + 2)
    result = _eval(cli, world["target"], deeper, world["artifact"], *QUICK)
    assert_user_error(result, f"{depth + 2}-layer target", f"has {depth} layers")
    with pytest.raises(DllmError, match=f"{depth + 2}-layer target"):
        drafter_spec(
            world["target"], world["artifact"], "model.from_config=null", f"model.path={deeper}"
        )
    # a folder that does not record it (older or other writers) keeps working
    unrecorded = _with_config(drafter["folder"], tmp_path, "unrecorded", num_target_layers=None)
    result = _eval(cli, world["target"], unrecorded, world["artifact"], *QUICK)
    assert result.code == 0, result.err
    drafter_spec(
        world["target"], world["artifact"], "model.from_config=null", f"model.path={unrecorded}"
    )


def test_a_drafter_folder_given_as_the_target_is_refused(cli, world, drafter, tmp_path):
    """A DFlash drafter's config.json is a qwen3 one (its own layers): read as the target it
    passed, and transformers loaded it with a random embedding and head (exit 0, a tau against
    noise); as model.dflash.target it shaped a drafter after the drafter."""
    from tests.dflash.helpers import drafter_spec
    from turbo_dllm.errors import DllmError

    flags = (*QUICK, "--block-size", "4")  # the target folder as an autoregressive drafter
    result = _eval(cli, drafter["folder"], world["target"], world["artifact"], *flags)
    assert_user_error(result, "--target", str(drafter["folder"]), "is a DFlash drafter folder")
    with pytest.raises(DllmError, match="model.dflash.target.*is a DFlash drafter folder"):
        drafter_spec(drafter["folder"], world["artifact"])


def test_a_target_folder_missing_weights_is_refused(cli, world, drafter, tmp_path):
    """transformers initialises the tensors a folder lacks at random and goes on (a warning on
    stderr, then a tau measured against that model)."""
    from safetensors.torch import load_file, save_file

    partial = shutil.copytree(world["target"], tmp_path / "partial")
    tensors = load_file(str(partial / "model.safetensors"))
    del tensors["model.norm.weight"]
    save_file(tensors, str(partial / "model.safetensors"), metadata={"format": "pt"})
    result = _eval(cli, partial, drafter["folder"], world["artifact"], *QUICK)
    assert_user_error(result, "--target", str(partial), "lacks weights", "model.norm.weight")


def test_a_drafter_of_a_model_type_transformers_does_not_know_is_named(cli, world, tmp_path):
    """transformers' ValueError ("does not recognize this architecture") was a traceback."""
    folder = shutil.copytree(world["target"], tmp_path / "unknown")
    hf = json.loads((folder / "config.json").read_text())
    hf.update(model_type="no_such_model", architectures=["NoSuchModel"])
    (folder / "config.json").write_text(json.dumps(hf))
    flags = (*QUICK, "--block-size", "4")
    result = _eval(cli, world["target"], folder, world["artifact"], *flags)
    assert_user_error(result, f"--drafter {str(folder)!r} is not a causal LM", "no_such_model")


def test_data_of_another_tokenizer_is_refused_before_the_target_is_hashed(
    world, exported, tmp_path, monkeypatch
):
    """The data check is cheap; the fingerprint reads every byte of the target."""
    from tests.dflash.test_target_tokenizer import _with_tokenizer
    from turbo_dllm.errors import DllmError

    target = _with_tokenizer(world["target"], tmp_path / "target")
    calls = []
    monkeypatch.setattr(target_identity, "_FINGERPRINTS", {})
    monkeypatch.setattr(digests, "sha256_file", lambda f: calls.append(f))
    with pytest.raises(DllmError, match="another tokenizer"):
        compare(str(target), [str(exported)], str(world["artifact"]), max_new_tokens=4)
    assert calls == []


def test_an_export_whose_files_differ_from_its_record_is_refused(cli, world, exported, tmp_path):
    """A `dllm dflash export` folder is evaluated only as the files its training_export.json
    hashed: a torn copy or a file changed since is named, with how to use it anyway."""
    torn = shutil.copytree(exported, tmp_path / "torn")
    weights = torn / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[:-8])
    result = _eval(cli, world["target"], torn, world["artifact"], *QUICK)
    assert_user_error(result, str(torn), "does not match its training_export.json",
                      "model.safetensors", "remove its training_export.json")  # fmt: skip
    (torn / "training_export.json").unlink()  # asked for: used as it is, shape-checked only
    result = _eval(cli, world["target"], torn, world["artifact"], *QUICK)
    assert_user_error(result, "safetensors weights are unreadable")  # the torn file itself
    edited = shutil.copytree(exported, tmp_path / "edited")
    config = json.loads((edited / "config.json").read_text())
    (edited / "config.json").write_text(json.dumps(config, indent=4))  # same values, other bytes
    result = _eval(cli, world["target"], edited, world["artifact"], *QUICK)
    assert_user_error(result, "  - config.json: ", "recorded")
    # the intact export still evaluates
    result = _eval(cli, world["target"], exported, world["artifact"], *QUICK, "--json")
    assert result.code == 0, result.err


@pytest.mark.parametrize(
    ("option", "needle"),
    [
        ({"block_size": 1}, "--block-size must be at least 2 (got 1)"),
        ({"draft_steps": 0}, "--draft-steps must be at least 1 (got 0)"),
    ],
)
def test_bad_block_options_are_refused_before_the_target_is_hashed(
    world, exported, monkeypatch, option, needle
):
    """A number the command refuses on sight must not wait for the target's fingerprint (every
    byte of the target: seconds per GB) or the drafter's weights to load first."""
    from turbo_dllm.errors import DllmError

    def hashed(folder):
        raise AssertionError(f"the target {folder} was hashed before {option} was refused")

    monkeypatch.setattr(target_identity, "target_fingerprint", hashed)
    with pytest.raises(DllmError, match=re.escape(needle)):
        compare(
            str(world["target"]), [str(exported)], str(world["artifact"]), max_new_tokens=4,
            **option,
        )  # fmt: skip


def test_a_target_folder_without_weights_is_named_as_such(cli, world, exported, tmp_path):
    """A --target holding config.json alone read as a target of 'other weights' (its
    fingerprint is config.json's alone), and with --allow-other-target as 'no safetensors
    weights' in a message naming no flag."""
    bare = tmp_path / "bare"
    bare.mkdir()
    (bare / "config.json").write_text((world["target"] / "config.json").read_text())
    for flags in ((), ("--allow-other-target",)):
        result = _eval(cli, bare, exported, world["artifact"], *QUICK, *flags)
        assert_user_error(result, f"--target {str(bare)!r} holds no safetensors weights")
        assert "other weights" not in result.err


def test_too_many_draft_steps_are_refused_before_anything_heavy_loads(
    cli, world, exported, monkeypatch
):
    """--draft-steps above the drafter's slots per block was refused only once the target was
    hashed and the drafter's weights loaded (minutes on a real model): it is refused from the
    drafter's config.json, naming the limit and where the block size came from, in the words
    the late check (`_DFlashProposer`) uses."""
    from turbo_dllm.families.dflash import runtime, speculative

    def heavy(*args, **kwargs):
        raise AssertionError("weights were loaded or hashed before --draft-steps was refused")

    monkeypatch.setattr(target_identity, "target_fingerprint", heavy)
    monkeypatch.setattr(runtime, "materialize", heavy)
    monkeypatch.setattr(speculative, "_load_target", heavy)
    config = exported / "config.json"
    result = _eval(cli, world["target"], exported, world["artifact"], "--draft-steps", "4")
    assert_user_error(
        result,
        f"--draft-steps 4: a block of 4 (block_size in {str(config)!r}) drafts 3 slots, so at "
        "most that many forwards refine it",
        "use --draft-steps 3 or fewer",
    )
    flags = ("--block-size", "3", "--draft-steps", "3")
    result = _eval(cli, world["target"], exported, world["artifact"], *flags)
    assert_user_error(result, "a block of 3 (--block-size) drafts 2 slots", "--draft-steps 2 or")
    # an autoregressive drafter (any causal LM: the target itself) takes one forward a draft
    flags = ("--block-size", "4", "--draft-steps", "2")
    result = _eval(cli, world["target"], world["target"], world["artifact"], *flags)
    assert_user_error(result, "--draft-steps 2: an autoregressive drafter drafts one token")


def test_a_target_of_another_model_type_is_named_as_the_target(cli, world, exported, tmp_path):
    """A Qwen3.5 (or any non-decoder) --target read 'model.path ... is a qwen3_5 model, which
    model.family causal_lm does not read', hint 'set model.family': neither is what the user
    typed or can change."""
    other = tmp_path / "qwen3_5"
    other.mkdir()
    (other / "config.json").write_text(json.dumps({"model_type": "qwen3_5"}))
    result = _eval(cli, other, exported, world["artifact"], *QUICK)
    assert_user_error(result, f"DFlash target: {str(other)!r} is a 'qwen3_5' model", "--target")
    assert "model.path" not in result.err and "model.family" not in result.err
