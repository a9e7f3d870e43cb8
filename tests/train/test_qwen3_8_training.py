"""qwen3_8 through the trainer on CPU: it learns, resumes bitwise, exports, refuses what it can't."""

from __future__ import annotations

import shutil

import pytest
import torch

from tests.train.util import losses, metrics, tiny_spec, write_config
from turbo_dllm.errors import DllmError
from turbo_dllm.train.entry import train

HYBRID = {
    "launch": {"seed": 0},
    "model": {
        "family": "qwen3_8",
        "from_config": "tiny",
        "config_overrides": {"num_hidden_layers": 2, "hidden_size": 64, "intermediate_size": 96},
    },
    "objective": {"name": "fast_dllm_v2", "block_size": 8},
    "data": {"synthetic": {"num_sequences": 64, "vocab_size": 512}, "seq_len": 32},
    "training": {"micro_batch_size": 2, "steps": 10},
    "optimizer": {"lr": 0.003},
    "scheduler": {"name": "cosine", "warmup_steps": 2},
    "checkpoint": {"interval": 5, "keep_last": 2},
    "logging": {"console": False},
}


def spec(*overrides: str):
    return tiny_spec(*overrides, base=HYBRID)


@pytest.mark.parametrize("objective", ["fast_dllm_v2", "block_diffusion"])
def test_loss_falls(tmp_path, objective):
    train(
        spec(
            "training.steps=12",
            "optimizer.lr=0.01",
            f"objective.name={objective}",
            "objective.loss_weighting=unit",
            "checkpoint.interval=null",
        ),
        tmp_path,
    )
    trace = losses(tmp_path)
    first, last = sum(trace[:3]) / 3, sum(trace[-3:]) / 3
    assert last < 0.85 * first, (first, last)


def test_resume_reproduces_the_loss_trace_bitwise(tmp_path):
    straight, resumed = tmp_path / "straight", tmp_path / "resumed"
    args = ("training.steps=3", "checkpoint.interval=1", "checkpoint.keep_last=3")
    train(spec(*args), straight)
    train(spec(*args), resumed)
    shutil.rmtree(resumed / "checkpoints/step_00000003")  # as if it crashed after step 2
    train(spec(*args), resumed)
    assert [r["step"] for r in metrics(resumed)] == list(range(1, 4))
    assert losses(resumed) == losses(straight)
    assert [r["grad_norm"] for r in metrics(resumed)] == [r["grad_norm"] for r in metrics(straight)]


def test_cli_train_and_export_reload_in_transformers(cli, tmp_path):
    transformers = pytest.importorskip("transformers")
    config = write_config(tmp_path / "train.yaml", "training.steps=2", base=HYBRID)
    result = cli("train", "--config", config, "--run-dir", tmp_path / "run")
    assert result.code == 0, result.err
    assert "linear_attention torch" in result.err  # the kernel choice is reported
    result = cli("export", "--checkpoint", tmp_path / "run/checkpoints", "--out", tmp_path / "hf")
    assert result.code == 0, result.err
    hf = transformers.AutoModelForCausalLM.from_pretrained(tmp_path / "hf").eval()
    assert type(hf).__name__ == "Qwen3_5ForCausalLM"

    import torch.distributed.checkpoint as dcp

    from turbo_dllm.families.qwen3_8.runtime import build_model
    from turbo_dllm.registry import get_family
    from turbo_dllm.train.weights import allocate, full_state_dict

    family = get_family("qwen3_8")
    config = family.resolve_config(path=str(tmp_path / "hf"), from_config=None)
    model = allocate(build_model(config, None), torch.device("cpu"))
    state = {"model": model.state_dict()}
    dcp.load(state, checkpoint_id=str(tmp_path / "run/checkpoints/step_00000002"))
    model.load_state_dict(state["model"])
    trained = full_state_dict(model)
    reloaded = hf.state_dict()
    for name, tensor in trained.items():
        assert torch.equal(reloaded[name], tensor), name


def test_fla_on_cpu_is_a_user_error(tmp_path):
    with pytest.raises(DllmError, match="CUDA"):
        train(
            spec(
                "training.steps=1",
                "scheduler.warmup_steps=0",
                "model.linear_attention=fla",
                "objective.block_size=64",
                "data.seq_len=64",
            ),
            tmp_path,
        )


@pytest.mark.parametrize(
    "override,field,words",
    [
        ("topology.cp=2 topology.bp=4", "topology.bp", "sharded clean stream"),
        ("topology.cp=2 training.activation_checkpointing=true", "training.act", "hand-off"),
        ("topology.ep=2", "topology.ep", "dense"),
        ("model.linear_attention=fla", "objective.block_size", "multiple of fla's chunk"),
        ("model.config_overrides.linear_num_key_heads=3", "topology.tp", "linear_num_key_heads"),
        ("model.config_overrides.num_hidden_layers=1", "model.config_overrides", "both"),
    ],
)
def test_unsupported_combinations_are_refused_with_the_reason(override, field, words):
    extra = (
        ("topology.tp=2", "model.config_overrides.linear_num_value_heads=6")
        if field == "topology.tp"
        else ()
    )
    with pytest.raises(DllmError) as error:
        spec(*override.split(), *extra)
    assert field in str(error.value) and words in str(error.value)


def test_an_unset_mask_token_with_synthetic_data_must_be_the_checkpoint_s():
    """A migrated checkpoint's mask token was silently replaced by the synthetic data's last id
    when objective.mask_token_id was unset; now that is refused unless the two agree."""
    spec("model.config_overrides.mask_token_id=511")
    with pytest.raises(DllmError, match=r"objective\.mask_token_id: unset.*last id \(511\)"):
        spec("model.config_overrides.mask_token_id=480")


def _artifact(folder, texts, **packing):
    from tests.data.helpers import prepare_config, write_config, write_jsonl

    write_jsonl(folder / "data.jsonl", [{"text": text} for text in texts])
    config = write_config(folder, packing={"seq_len": 32, "block_size": 8, **packing})
    return prepare_config(config).path  # byte level: mask token 259


def _inputs(artifact, *overrides):
    from turbo_dllm.jobs.launcher import check_inputs

    check_inputs(spec(f"data.artifact={artifact}", "data.synthetic=null", *overrides), "t.yaml")


def test_an_artifact_whose_mask_token_is_not_the_checkpoint_s_is_refused_at_the_start(tmp_path):
    """With objective.mask_token_id unset the trainer masks with the artifact's mask token; one
    other than the migrated checkpoint's trained silently before."""
    artifact = _artifact(tmp_path, ["abc " * 40] * 6, overflow="truncate")
    _inputs(artifact, "model.config_overrides.mask_token_id=259")
    with pytest.raises(DllmError, match=r"artifact's mask token \(259\), not the checkpoint's"):
        _inputs(artifact, "model.config_overrides.mask_token_id=300")


def test_an_artifact_with_rows_of_several_documents_is_refused_before_the_run(tmp_path):
    """Such rows stopped the run at whichever step first drew one (step 55 of the audit's run);
    now the artifact is refused when the run starts, counting its rows as the loader would."""
    import numpy as np

    from turbo_dllm.data.artifact import DataArtifact
    from turbo_dllm.families.qwen3_8.inputs import rows_with_boundaries

    texts = [("xy" * (7 * i % 23)) + "z" * (i % 5) for i in range(1, 40)]
    packed = _artifact(tmp_path / "packed", texts)
    data = DataArtifact(packed)
    rows = data.manifest.num_sequences
    mixed = [r for r in range(rows) if len(np.unique(data.doc_ids(r))) > 1]
    assert mixed and len(mixed) < rows
    assert rows_with_boundaries(data.documents, 32, rows) == (len(mixed), mixed[0])
    with pytest.raises(DllmError, match=rf"data\.artifact: {len(mixed)} of its {rows} rows"):
        _inputs(packed, "model.config_overrides.mask_token_id=259")
    whole = _artifact(tmp_path / "whole", ["abc " * 40] * 6, overflow="truncate")
    _inputs(whole, "model.config_overrides.mask_token_id=259")  # one document a row


def test_linear_attention_kernel_is_refused_for_families_without_linear_layers():
    with pytest.raises(DllmError, match="no linear-attention layers"):
        tiny_spec("model.linear_attention=fla")


def test_sequence_and_context_parallelism_validate(cli, tmp_path):
    # sp: the token mixers gather the sequence whole; cp: the clean state is handed from rank to
    # rank (both equal to one process: tests/distributed/test_family_tp.py).
    for overrides in (("topology.tp=2", "topology.sp=true"), ("topology.cp=2",)):
        config = write_config(tmp_path / "t.yaml", *overrides, base=HYBRID)
        result = cli("config", "validate", "--config", config)
        assert result.code == 0, result.err


@pytest.mark.slow
@pytest.mark.parametrize("axis", ["topology.bp=2", "topology.cp=2"])
def test_dllm_train_split_over_two_ranks_trains_the_single_process_trace(tmp_path, axis):
    """bp: the clean prefix whole on each rank; cp: the clean state handed from rank to rank."""
    from tests.train.util import torchrun

    two = write_config(tmp_path / "two.yaml", "training.steps=3", axis, base=HYBRID)
    train(spec("training.steps=3"), tmp_path / "one")
    torchrun(2, "train", "--config", str(two), "--run-dir", str(tmp_path / "two"), cwd=tmp_path)
    torch.testing.assert_close(
        losses(tmp_path / "two"), losses(tmp_path / "one"), rtol=1e-5, atol=1e-5
    )


def test_compiled_checkpointed_layers_trace_whole_and_train_like_eager(tmp_path, monkeypatch):
    """The chunked gated-delta scan is a custom op, not a `torch.compiler.disable`d function:
    under compile and activation checkpointing the layers trace with no graph break (a break
    there runs the whole layer eagerly; the trainer would warn) and the losses are eager's.
    aot_eager_decomp_partition: dynamo, AOTAutograd, inductor's decompositions and partitioner
    as in a real compile, without its code generation (plain aot_eager trips over a stride
    mismatch of torch's own softplus_backward meta on CPU)."""
    import torch._dynamo
    from torch._dynamo.utils import counters

    import turbo_dllm.train.trainer as trainer_module

    graphs: list[str] = []

    def record(gm, example_inputs):
        graphs.append(gm.print_readable(print_output=False))
        return torch._dynamo.backends.debugging.aot_eager_decomp_partition(gm, example_inputs)

    def compile_layers(layers):
        for layer in layers:
            layer.compile(backend=record, dynamic=False)

    common = (
        "training.steps=2",
        "training.activation_checkpointing=true",
        "checkpoint.interval=null",
    )
    train(spec(*common), tmp_path / "eager")
    monkeypatch.setattr(trainer_module, "apply_compile", compile_layers)
    torch._dynamo.reset()
    counters.clear()
    train(spec(*common, "training.compile=true"), tmp_path / "compiled")
    assert sum(counters["graph_break"].values()) == 0, dict(counters["graph_break"])
    assert any("gated_delta_scan" in g for g in graphs)
    assert losses(tmp_path / "compiled") == pytest.approx(losses(tmp_path / "eager"), rel=1e-5)


def test_a_folder_whose_mask_token_is_its_zero_pad_row_trains_with_a_sane_grad_norm(tmp_path):
    """A random HF folder (transformers zeroes its pad row) with the mask token on the pad row:
    the masked positions' zero row got its gradient through the first zero-centred RMSNorm at
    x = 0 (~1/sqrt(eps) = 1000x), a grad norm of thousands at the first steps that the clip
    divided every other gradient by. transformers' padding_idx gives the row none, as ours now."""
    transformers = pytest.importorskip("transformers")
    from turbo_dllm.families.qwen3_8.config import PRESETS

    shape = {k: v for k, v in PRESETS["tiny"].items() if k != "model_type"}
    shape.update(num_hidden_layers=2, hidden_size=64, intermediate_size=96)
    shape["layer_types"] = shape["layer_types"][:2]
    torch.manual_seed(0)
    config = transformers.Qwen3_5TextConfig(**shape, pad_token_id=480, mask_token_id=480)
    transformers.Qwen3_5ForCausalLM(config).save_pretrained(tmp_path / "hf")
    overrides = ("model.from_config=null", "model.config_overrides={}", "training.steps=2")
    train(
        spec(f"model.path={tmp_path / 'hf'}", "objective.mask_token_id=480", *overrides), tmp_path
    )
    train(spec("training.steps=2"), tmp_path / "preset")
    preset = metrics(tmp_path / "preset")[0]["grad_norm"]
    assert metrics(tmp_path)[0]["grad_norm"] < 5 * preset, (metrics(tmp_path), preset)
