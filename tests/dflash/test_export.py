"""`dllm dflash export`: the serving folder's config keys and tensors, held to the contract SGLang
and vLLM load (REFERENCE-FAMILIES §1(5)), reloading into our drafter bit-exactly."""

from __future__ import annotations

import hashlib
import json
import re
import shutil

import pytest
import torch
from safetensors import safe_open

from tests.helpers import assert_user_error
from turbo_dllm.families.dflash.config import DFlashConfig
from turbo_dllm.families.dflash.runtime import build_model, materialize
from turbo_dllm.train.weights import full_state_dict


def _export(cli, checkpoint, out, *flags):
    """`dllm dflash export` of a checkpoint folder into `out`, with extra flags."""
    return cli("dflash", "export", "--checkpoint", checkpoint, "--out", out, *flags)


def _layer_shapes(config: DFlashConfig) -> dict[str, tuple[int, ...]]:
    h, d, i = config.hidden_size, config.head_dim, config.intermediate_size
    q, kv = config.num_attention_heads * d, config.num_key_value_heads * d
    shapes = {
        "fc.weight": (h, len(config.target_layer_ids) * config.target_hidden_size),
        "hidden_norm.weight": (h,),
        "norm.weight": (h,),
    }
    for n in range(config.num_hidden_layers):
        p = f"layers.{n}."
        shapes.update(
            {
                p + "self_attn.q_proj.weight": (q, h),
                p + "self_attn.k_proj.weight": (kv, h),
                p + "self_attn.v_proj.weight": (kv, h),
                p + "self_attn.o_proj.weight": (h, q),
                p + "self_attn.q_norm.weight": (d,),
                p + "self_attn.k_norm.weight": (d,),
                p + "mlp.gate_proj.weight": (i, h),
                p + "mlp.up_proj.weight": (i, h),
                p + "mlp.down_proj.weight": (h, i),
                p + "input_layernorm.weight": (h,),
                p + "post_attention_layernorm.weight": (h,),
            }
        )
    return shapes


def test_export_holds_the_serving_contract_and_reloads_bit_exactly(cli, world, drafter, tmp_path):
    out = tmp_path / "serve"
    result = _export(cli, drafter["run"] / "checkpoints", out, "--target", world["target"])
    assert result.code == 0, result.err
    # a checkpoints/ folder exports its newest complete step, which the command names
    newest = sorted((drafter["run"] / "checkpoints").glob("step_*"))[-1]
    assert result.out.strip() == f"wrote {out} from {newest}"
    names = {p.name for p in out.iterdir()}
    assert {"config.json", "model.safetensors", "training_export.json"} <= names
    assert [n for n in names if n.endswith(".safetensors")] == ["model.safetensors"]
    hf = json.loads((out / "config.json").read_text())
    assert hf["architectures"] == ["DFlashDraftModel"] and hf["model_type"] == "qwen3"
    target = json.loads((world["target"] / "config.json").read_text())
    assert hf["dflash_config"] == {
        "block_size": 4,
        "mask_token_id": 259,
        "target_layer_ids": [target["num_hidden_layers"] // 2],
    }
    assert hf["block_size"] == 4 and hf["target_hidden_size"] == target["hidden_size"]
    assert hf["rope_theta"] == target["rope_theta"]
    for key in (
        "hidden_size",
        "intermediate_size",
        "num_hidden_layers",
        "num_attention_heads",
        "num_key_value_heads",
        "head_dim",
        "vocab_size",
        "rms_norm_eps",
    ):
        assert isinstance(hf[key], (int, float)), key
    config = DFlashConfig.from_hf_dict(hf)
    with safe_open(str(out / "model.safetensors"), framework="pt") as handle:
        shapes = {name: tuple(handle.get_slice(name).get_shape()) for name in handle.keys()}  # noqa: SIM118
    assert shapes == _layer_shapes(config)  # no embed_tokens / lm_head: the target's
    record = json.loads((out / "training_export.json").read_text())
    assert record["format"] == "turbo_dllm.dflash_export.v1"
    for name in ("config.json", "model.safetensors"):
        digest = hashlib.sha256((out / name).read_bytes()).hexdigest()
        assert record["files"][name]["sha256"] == digest
    # bit-exact: the exported folder loads back into our drafter as the trained weights
    import dataclasses

    config = dataclasses.replace(config, target_path=str(world["target"]))
    reloaded = materialize(build_model(config), torch.device("cpu"), seed=5, weights_from=str(out))
    first = materialize(
        build_model(config), torch.device("cpu"), seed=5, weights_from=str(drafter["folder"])
    )
    for name, tensor in full_state_dict(reloaded).items():
        assert torch.equal(tensor, full_state_dict(first)[name]), name


def test_the_serve_record_counts_the_drafted_tokens_of_the_slot_contract(cli, world, tmp_path):
    """vLLM's num_speculative_tokens is B - 1 for the default slot contract and B for a drafter
    trained with sample_from_anchor (REFERENCE-FAMILIES §1(1)); the record said B - 1 for both."""
    from tests.dflash.helpers import drafter_spec
    from turbo_dllm.train.entry import train

    for from_anchor, drafts in ((False, 3), (True, 4)):
        run = tmp_path / f"run-{from_anchor}"
        flag = str(from_anchor).lower()
        spec = drafter_spec(
            world["target"],
            world["artifact"],
            f"model.dflash.sample_from_anchor={flag}",
            f"objective.sample_from_anchor={flag}",
            "training.steps=2",
            "checkpoint.interval=null",
        )
        train(spec, run)
        out = tmp_path / f"serve-{from_anchor}"
        assert _export(cli, run / "checkpoints", out).code == 0
        assert json.loads((out / "config.json").read_text())["sample_from_anchor"] is from_anchor
        serve = json.loads((out / "training_export.json").read_text())["serve"]
        assert json.loads(serve["vllm"])["num_speculative_tokens"] == drafts


def test_export_refuses_a_checkpoint_of_another_family(cli, world, tmp_path):
    result = _export(cli, world["root"] / "target-run/checkpoints", tmp_path / "x")
    assert_user_error(result, "not a dflash drafter")
    assert not (tmp_path / "x").exists()


def test_export_names_a_target_flag_that_is_not_a_model_folder(cli, drafter, tmp_path):
    flags = ("--target", tmp_path / "nowhere")
    result = _export(cli, drafter["run"] / "checkpoints", tmp_path / "x", *flags)
    assert_user_error(result, "--target", "is not a model folder")
    assert "model.path" not in result.err  # a RunSpec key: not what the user typed
    assert not (tmp_path / "x").exists()


def test_an_unwritable_out_is_named_as_typed_and_leaves_nothing(cli, drafter, tmp_path):
    """The error used to name an inner staging folder (`x/..serve.dflash-partial.partial`)."""
    (tmp_path / "file").write_text("x")
    out = tmp_path / "file" / "serve"
    result = _export(cli, drafter["run"] / "checkpoints", out)
    assert_user_error(result, f"cannot write --out {str(out)!r}", "is a file, not a folder")
    assert "partial" not in result.err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["file"]


def test_export_refuses_a_target_with_other_weights_than_the_drafters(
    cli, world, drafter, tmp_path
):
    """`--target` checks the drafter against it: a same-shape target with other weights than
    the one the checkpoint was trained against is refused (shape alone passed it, and the
    record then named that target's config.json); without --target, or with the same target,
    the record carries the checkpoint's target fingerprint."""
    import shutil

    from safetensors.torch import load_file, save_file

    other = shutil.copytree(world["target"], tmp_path / "other")
    tensors = load_file(str(other / "model.safetensors"))
    tensors["model.norm.weight"] = tensors["model.norm.weight"] * 2
    save_file(tensors, str(other / "model.safetensors"), metadata={"format": "pt"})
    checkpoints = drafter["run"] / "checkpoints"
    result = _export(cli, checkpoints, tmp_path / "x", "--target", other)
    assert_user_error(result, "other weights", str(other), str(world["target"]))
    assert not (tmp_path / "x").exists()
    meta = json.loads((sorted(checkpoints.glob("step_*"))[-1] / "checkpoint.json").read_text())
    for out, flags in (
        (tmp_path / "plain", ()),
        (tmp_path / "same", ("--target", world["target"])),
    ):
        assert _export(cli, checkpoints, out, *flags).code == 0
        record = json.loads((out / "training_export.json").read_text())
        assert record["target_fingerprint"] == meta["target"]["fingerprint"]


def test_a_sharded_export_records_and_verifies_every_weight_file(cli, world, drafter, tmp_path):
    """`dllm dflash export --max-shard-size`: the weights split as `dllm export` splits them, and
    training_export.json hashes every file written (each shard and the index; the record named
    model.safetensors only). `verify_export` checks either layout, and the sharded folder loads
    back to the unsharded one's tensors."""
    import dataclasses

    from turbo_dllm.errors import DllmError
    from turbo_dllm.families.dflash.export import verify_export

    checkpoints = drafter["run"] / "checkpoints"
    plain, sharded = tmp_path / "plain", tmp_path / "sharded"
    assert _export(cli, checkpoints, plain, "--target", world["target"]).code == 0
    size = (plain / "model.safetensors").stat().st_size
    result = _export(cli, checkpoints, sharded, "--max-shard-size", str(size // 4), "--json")
    assert result.code == 0, result.err
    names = sorted(p.name for p in sharded.iterdir())
    assert json.loads(result.out)["files"] == names
    shards = [n for n in names if n.endswith(".safetensors")]
    assert len(shards) >= 3 and "model.safetensors" not in shards
    assert shards == [
        f"model-{i:05d}-of-{len(shards):05d}.safetensors" for i in range(1, 1 + len(shards))
    ]
    index = json.loads((sharded / "model.safetensors.index.json").read_text())
    assert sorted(set(index["weight_map"].values())) == shards
    for folder, weights in (
        (plain, ["model.safetensors"]),
        (sharded, [*shards, "model.safetensors.index.json"]),
    ):
        record = json.loads((folder / "training_export.json").read_text())
        written = sorted(["config.json", "generation_config.json", *weights])
        assert sorted(record["files"]) == written, folder
        for name, entry in record["files"].items():
            data = (folder / name).read_bytes()
            assert entry == {"sha256": hashlib.sha256(data).hexdigest(), "bytes": len(data)}
        assert sorted(verify_export(folder)) == written
    # the same tensors, whichever layout they were written in
    config = DFlashConfig.from_hf_dict(json.loads((plain / "config.json").read_text()))
    config = dataclasses.replace(config, target_path=str(world["target"]))
    loaded = [
        full_state_dict(
            materialize(build_model(config), torch.device("cpu"), seed=3, weights_from=str(f))
        )
        for f in (plain, sharded)
    ]
    assert loaded[0].keys() == loaded[1].keys()
    for name, tensor in loaded[0].items():
        assert torch.equal(tensor, loaded[1][name]), name
    # the record is checked: a changed shard, a shard gone, a weight file it does not list
    middle = sharded / shards[1]
    original = middle.read_bytes()
    middle.write_bytes(original[:-1] + bytes([original[-1] ^ 1]))
    with pytest.raises(DllmError, match=f"{shards[1]}: sha256"):
        verify_export(sharded)
    middle.unlink()
    with pytest.raises(DllmError, match=f"{shards[1]}: missing"):
        verify_export(sharded)
    middle.write_bytes(original)
    (sharded / "model.safetensors").write_bytes(b"")
    with pytest.raises(DllmError, match="model.safetensors: not in the record"):
        verify_export(sharded)
    # a bad size is refused before anything is read or written, as `dllm export` refuses it
    assert_user_error(
        _export(cli, checkpoints, tmp_path / "bad", "--max-shard-size", "5GiB"), "5GiB"
    )
    assert not (tmp_path / "bad").exists()


def test_a_taken_out_is_refused_before_the_target_is_checked_and_a_file_named_as_one(
    cli, world, drafter, tmp_path, monkeypatch
):
    """An --out that cannot be written is refused before --target's weights are compared
    (hashing the target reads every byte of it: seconds per GB), and a file is called a file,
    as `dllm export` calls it (an empty file read 'already exists and is not empty')."""
    from turbo_dllm.families.dflash import target_identity

    def compared(*args):
        raise AssertionError("--target was checked before --out was refused")

    monkeypatch.setattr(target_identity, "current_target_record", compared)
    checkpoints, flags = drafter["run"] / "checkpoints", ("--target", world["target"])
    (tmp_path / "file").touch()
    result = _export(cli, checkpoints, tmp_path / "file", *flags)
    assert_user_error(result, "is a file, not a folder")
    (tmp_path / "full").mkdir()
    (tmp_path / "full" / "notes.txt").write_text("mine")
    result = _export(cli, checkpoints, tmp_path / "full", *flags)
    assert_user_error(result, "already exists and is not empty")
    assert (tmp_path / "full" / "notes.txt").read_text() == "mine"
    # under a file: the user's path named (it was refused only when writing, after the hashing)
    result = _export(cli, checkpoints, tmp_path / "file" / "drafter", *flags)
    assert_user_error(
        result, f"cannot write --out {str(tmp_path / 'file' / 'drafter')!r}: ", "is a file"
    )
    assert ".partial" not in result.err


def test_a_target_without_weights_is_named_as_such(cli, world, drafter, tmp_path):
    """--target holding config.json alone read 'holds other weights' (the fingerprint of
    config.json alone differs from the recorded one)."""
    bare = tmp_path / "bare"
    bare.mkdir()
    (bare / "config.json").write_text((world["target"] / "config.json").read_text())
    result = _export(cli, drafter["run"] / "checkpoints", tmp_path / "x", "--target", bare)
    assert_user_error(result, f"--target {str(bare)!r} holds no safetensors weights")
    assert "other weights" not in result.err
    assert not (tmp_path / "x").exists()


def test_the_record_covers_every_file_the_export_writes(cli, world, tmp_path):
    """training_export.json hashed config.json and the weights only: a generation_config.json
    or a tokenizer file the export wrote (which transformers, SGLang and vLLM read) could change
    unnoticed. Every file written is recorded and verified, an unlisted one a loader reads is
    refused, a README is not; a record written before this (no `files_complete`) still
    verifies as it did."""
    from tests.dflash.helpers import drafter_spec
    from tests.dflash.test_target_tokenizer import _artifact, _with_tokenizer
    from turbo_dllm.errors import DllmError
    from turbo_dllm.families.dflash.export import verify_export
    from turbo_dllm.train.entry import train

    target = _with_tokenizer(world["target"], tmp_path / "target")
    data = _artifact(target, tmp_path / "data")
    run = tmp_path / "run"
    spec = drafter_spec(
        target,
        data,
        "model.dflash.mask_token_id=2",
        "training.steps=2",
        "scheduler.warmup_steps=1",
        "checkpoint.interval=null",
    )
    train(spec, run)
    out = tmp_path / "serve"
    result = _export(cli, run / "checkpoints", out, "--json")
    assert result.code == 0, result.err
    names = sorted(p.name for p in out.iterdir())
    assert {"generation_config.json", "tokenizer.json", "tokenizer_config.json"} <= set(names)
    record = json.loads((out / "training_export.json").read_text())
    assert record["files_complete"] is True
    assert sorted(record["files"]) == [n for n in names if n != "training_export.json"]
    assert verify_export(out) == sorted(record["files"])
    # a changed file the export wrote is named, in `dllm dflash eval` as in verify_export
    for name in ("generation_config.json", "tokenizer.json"):
        changed = shutil.copytree(out, tmp_path / f"changed-{name}")
        document = json.loads((changed / name).read_text())
        (changed / name).write_text(json.dumps(document, indent=1))  # same values, other bytes
        with pytest.raises(DllmError, match=f"  - {re.escape(name)}: "):
            verify_export(changed)
        result = cli(
            "dflash", "eval", "--target", target, "--drafter", changed, "--data", data,
            "--max-new-tokens", "4", "--num-prompts", "1",
        )  # fmt: skip
        assert_user_error(result, "does not match its training_export.json", f"  - {name}: ")
    # a file a loader reads that the record does not list is refused; a README passes
    extra = shutil.copytree(out, tmp_path / "extra")
    (extra / "README.md").write_text("# my drafter\n")
    assert verify_export(extra) == sorted(record["files"])
    (extra / "special_tokens_map.json").write_text("{}")
    with pytest.raises(DllmError, match="special_tokens_map.json: not in the record"):
        verify_export(extra)
    # a record that names a file outside the folder is refused, not read
    edited = shutil.copytree(out, tmp_path / "edited")
    document = json.loads((edited / "training_export.json").read_text())
    document["files"]["../secret"] = {"sha256": "0" * 64, "bytes": 1}
    (edited / "training_export.json").write_text(json.dumps(document))
    with pytest.raises(DllmError, match=re.escape("'../secret': not a file of the folder")):
        verify_export(edited)
    # a folder exported before: config.json and the weights recorded, nothing else checked
    old = shutil.copytree(out, tmp_path / "old")
    document = json.loads((old / "training_export.json").read_text())
    del document["files_complete"]
    document["files"] = {
        n: e for n, e in document["files"].items() if n == "config.json" or ".safetensors" in n
    }
    (old / "training_export.json").write_text(json.dumps(document, indent=2))
    (old / "generation_config.json").write_text("{}")
    assert verify_export(old) == ["config.json", "model.safetensors"]


def test_export_names_a_target_of_another_model_type_as_the_target(cli, drafter, tmp_path):
    other = tmp_path / "qwen3_5"
    other.mkdir()
    (other / "config.json").write_text(json.dumps({"model_type": "qwen3_5"}))
    result = _export(cli, drafter["run"] / "checkpoints", tmp_path / "x", "--target", other)
    assert_user_error(result, f"DFlash target: {str(other)!r} is a 'qwen3_5' model", "--target")
    assert "model.path" not in result.err and "model.family" not in result.err
    assert not (tmp_path / "x").exists()


@pytest.mark.parametrize(
    "found", ["turbo_dllm.dflash_export.v9", "turbo_dllm.run_manifest.v1", None]
)
def test_a_record_of_another_format_is_refused(tmp_path, found):
    """The record's `format` was never read: a training_export.json of another version (or
    another kind, or none) whose listed files matched passed as checked."""
    from turbo_dllm.errors import DllmError
    from turbo_dllm.families.dflash.export import EXPORT_FORMAT, verify_export

    config = tmp_path / "config.json"
    config.write_text("{}")
    entry = {"sha256": hashlib.sha256(b"{}").hexdigest(), "bytes": 2}
    record = {"format": EXPORT_FORMAT, "files": {"config.json": entry}}
    (tmp_path / "training_export.json").write_text(json.dumps(record))
    assert verify_export(tmp_path) == ["config.json"]
    if found is None:
        del record["format"]
    else:
        record["format"] = found
    (tmp_path / "training_export.json").write_text(json.dumps(record))
    with pytest.raises(DllmError, match=f"format {found!r}, expected '{EXPORT_FORMAT}'"):
        verify_export(tmp_path)
