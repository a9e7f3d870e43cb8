"""diffusiongemma_sft: the corruption, one loss computed by hand, training, resume and export."""

from __future__ import annotations

import shutil
from functools import partial

import pytest
import torch

from tests.families.dg_util import hf_model, ours, tiny_hf_dict
from tests.helpers import benchmark_module
from tests.train.util import losses, metrics, tiny_spec
from turbo_dllm.errors import DllmError
from turbo_dllm.families.diffusion_gemma.config import PRESETS
from turbo_dllm.train.entry import train
from turbo_dllm.train.objectives import NoiseKey, score
from turbo_dllm.train.objectives.diffusiongemma_sft import DiffusionGemmaSft

KEY = NoiseKey(seed=3, step=1, first_sample=0, samples_per_step=2)


def _batch(L=20, starts=(7, 9)):
    torch.manual_seed(0)
    ids = torch.randint(0, 97, (len(starts), L))
    mask = torch.zeros_like(ids, dtype=torch.bool)
    for row, start in enumerate(starts):
        mask[row, start:] = True
    return {"input_ids": ids, "loss_mask": mask}


def _objective(**kw):
    return DiffusionGemmaSft(block_size=4, vocab_size=97, **kw)


def test_corruption_replaces_only_response_tokens_and_labels_every_one():
    batch = _batch()
    d = _objective().corrupt(batch, KEY)
    layout = d.layout
    assert (layout.canvas_start, layout.canvas_blocks) == (7, 4)  # shared start, 13 -> 16 tokens
    C = layout.canvas_len
    x0, sup = batch["input_ids"], batch["loss_mask"]
    canvas = d.input_ids[:, :C]
    assert torch.equal(d.input_ids[:, C:], x0)  # the clean stream is untouched
    changed = canvas[:, : 20 - 7] != x0[:, 7:]
    assert not changed[~sup[:, 7:]].any() and changed.any()  # row 1's prompt tokens stay
    n_decoder, n_encoder = d.term_sizes
    assert n_decoder == int(sup.sum()) and n_encoder == 2 * 19
    assert torch.equal(d.targets[:n_decoder], x0[sup])  # replaced or not, all are labels


def test_native_sft_loss_equals_a_hand_computation(tmp_path):
    model, attention = ours(tmp_path / "none" if False else None, hf=tiny_hf_dict())
    objective = _objective(self_conditioning_probability=0.0, encoder_loss_weight=0.7)
    batch = _batch()
    d = objective.corrupt(batch, KEY)
    mask = attention.prepare(d.layout, None, torch.device("cpu"))
    positions = d.layout.positions()
    with torch.no_grad():
        sums = model(d.input_ids, positions, mask, output=partial(score, d))
        logits = model(d.input_ids, positions, mask)
    examples, pairs = objective.supervised_count(batch)
    loss = float((sums / torch.tensor([examples, pairs])).sum())

    logp = logits.log_softmax(-1)
    C, x0, sup = d.layout.canvas_len, batch["input_ids"], batch["loss_mask"]
    decoder = 0.0
    for row in range(2):  # per block mean, per example mean over valid blocks, mean over examples
        block_means = []
        for block in range(d.layout.canvas_blocks):
            cols = [c for c in range(block * 4, block * 4 + 4) if 7 + c < 20 and sup[row, 7 + c]]
            if cols:
                block_means.append(
                    sum(-float(logp[row, c, x0[row, 7 + c]]) for c in cols) / len(cols)
                )
        decoder += sum(block_means) / len(block_means)
    decoder /= 2
    encoder = sum(
        -float(logp[row, C + i, x0[row, i + 1]]) for row in range(2) for i in range(19)
    ) / (2 * 19)
    assert loss == pytest.approx(decoder + 0.7 * encoder, rel=1e-5)


def test_self_conditioning_changes_only_the_chosen_rows_canvas():
    model, attention = ours(hf=tiny_hf_dict())
    d = _objective(self_conditioning_probability=1.0).corrupt(_batch(), KEY)
    mask = attention.prepare(d.layout, None, torch.device("cpu"))
    args = (d.input_ids, d.layout.positions(), mask)
    with torch.no_grad():
        plain = model(*args, self_conditioning=torch.tensor([False, False]))
        conditioned = model(*args, self_conditioning=torch.tensor([True, False]))
    C = d.layout.canvas_len
    assert not torch.allclose(plain[0, :C], conditioned[0, :C])
    torch.testing.assert_close(plain[1], conditioned[1])  # unchosen row: zero soft input
    torch.testing.assert_close(plain[:, C:], conditioned[:, C:])  # clean never sees the canvas


def test_a_row_padded_after_its_example_is_one_example_and_a_packed_row_is_refused():
    """The loader numbers a row's trailing padding as a segment of its own: such a row (one
    example, then padding) was refused as packed by the family's attention, so no prepared
    artifact with a response shorter than its row trained past its first padded batch."""
    _, attention = ours(hf=tiny_hf_dict())
    batch = _batch()  # row 0 fills its row; row 1's example ends at 15, then 5 pad tokens
    batch["loss_mask"][1, 15:] = False
    batch["doc_ids"] = torch.zeros(2, 20, dtype=torch.int32)
    batch["doc_ids"][1, 15:] = 1
    d = _objective().corrupt(batch, KEY)
    attention.prepare(d.layout, d.doc_ids, torch.device("cpu"))  # was: "packs several documents"
    C = d.layout.canvas_len
    n_decoder, n_encoder = d.term_sizes
    assert n_encoder == 19 + 14 == _objective().supervised_count(batch)[1]  # no pair into padding
    clean_positions = (d.score_index[n_decoder:] % (C + 20)) - C
    rows = d.score_index[n_decoder:] // (C + 20)
    assert int(clean_positions[rows == 1].max()) == 13  # the last pair: (13, 14)
    assert torch.equal(d.input_ids[1, 15 - 7 : 20 - 7], batch["input_ids"][1, 15:])  # unnoised

    batch["loss_mask"][1, 17] = True  # a supervised token in a second document: packed
    with pytest.raises(DllmError, match="packs several documents") as error:
        _objective().corrupt(batch, KEY)
    assert "packing.block_size equal to packing.seq_len" in error.value.hint


def test_native_sft_trains_on_a_prepared_artifact_of_one_padded_example_per_row(tmp_path):
    """The data path the docs give: prompt/completion records prepared with packing.block_size
    = seq_len, so each row is one example followed by padding."""
    from tests.data.helpers import prepare_config, write_config, write_jsonl

    records = [{"prompt": f"q{i}: ", "completion": "ab" * (3 + i % 7)} for i in range(16)]
    write_jsonl(tmp_path / "data.jsonl", records)
    prepared = prepare_config(
        write_config(
            tmp_path,
            records={"kind": "prompt_completion"},
            supervision="completion_only",
            packing={"seq_len": 32, "block_size": 32, "overflow": "truncate"},
        )
    )
    base = {**SFT, "data": {"artifact": str(prepared.path), "seq_len": 32}}
    base["objective"] = {**SFT["objective"], "block_size": 8}
    train(tiny_spec("training.steps=3", base=base), tmp_path / "run")
    assert [r["step"] for r in metrics(tmp_path / "run")] == [1, 2, 3]


def test_packed_artifacts_are_refused_before_training(tmp_path):
    """A packed artifact trained until its first packed batch, then stopped mid-run; the
    family's input rule now names it (dllm train, dllm launch) before any step."""
    from tests.data.helpers import prepare_config, write_config, write_jsonl
    from turbo_dllm.jobs.launcher import check_inputs

    records = [{"prompt": f"q{i}: ", "completion": "ab" * (3 + i % 7)} for i in range(16)]
    write_jsonl(tmp_path / "data.jsonl", records)

    def artifact(block_size):
        packing = {"seq_len": 32, "block_size": block_size, "overflow": "truncate"}
        out = {"path": f"out{block_size}"}
        return prepare_config(
            write_config(
                tmp_path,
                records={"kind": "prompt_completion"},
                supervision="completion_only",
                packing=packing,
                output=out,
            )
        ).path

    def spec(path, objective="diffusiongemma_sft"):
        base = {**SFT, "data": {"artifact": str(path), "seq_len": 32}}
        base["objective"] = {**SFT["objective"], "name": objective, "block_size": 8}
        return tiny_spec(base=base)

    packed, one_per_row = artifact(8), artifact(32)
    with pytest.raises(DllmError, match="packed data") as error:
        check_inputs(spec(packed), "train.yaml")
    assert "packing.block_size equal to packing.seq_len" in error.value.message
    check_inputs(spec(one_per_row), "train.yaml")  # one example per row, padded after it
    with pytest.raises(DllmError, match="padding after one"):  # block_diffusion: not even that
        check_inputs(spec(one_per_row, "block_diffusion"), "train.yaml")


def test_a_canvas_shorter_than_one_block_is_an_error():
    with pytest.raises(DllmError, match="shorter than one block"):
        _objective().corrupt(_batch(starts=(18, 19)), KEY)


SFT = {
    "launch": {"seed": 0},
    "model": {"family": "diffusion_gemma", "from_config": "tiny"},
    "objective": {"name": "diffusiongemma_sft", "block_size": 16},
    "data": {"synthetic": {"num_sequences": 32, "vocab_size": 512}, "seq_len": 32},
    "training": {"micro_batch_size": 2, "steps": 4},
    "optimizer": {"lr": 0.003},
    "scheduler": {"name": "cosine", "warmup_steps": 1},
    "checkpoint": {"interval": 2, "keep_last": 3},
    "logging": {"console": False},
}


def test_training_freezes_routers_and_resumes_bitwise(tmp_path):
    straight, resumed = tmp_path / "straight", tmp_path / "resumed"
    args = ("training.activation_checkpointing=true",)
    train(tiny_spec(*args, base=SFT), straight)
    # The resumed run is the straight one cut back to step 2 (a second 4-step run would only
    # write the same files again): it trains steps 3-4 from step 2's checkpoint.
    shutil.copytree(straight, resumed)
    shutil.rmtree(resumed / "checkpoints/step_00000004")
    train(tiny_spec(*args, base=SFT), resumed)
    assert (resumed / "checkpoints/step_00000004/checkpoint.json").is_file()  # trained again
    assert [r["step"] for r in metrics(resumed)] == list(range(1, 5))
    assert losses(resumed) == losses(straight)
    first, last = losses(straight)[0], losses(straight)[-1]
    assert last < first

    from turbo_dllm.train.export import export_checkpoint

    out = export_checkpoint(straight / "checkpoints", tmp_path / "hf")
    transformers = pytest.importorskip("transformers")
    hf = transformers.DiffusionGemmaForBlockDiffusion.from_pretrained(str(out)).eval()
    model, _ = ours(out)
    fresh, _ = ours(hf=PRESETS["tiny"])  # the run's initial weights (seed 0)
    hf_params = hf.state_dict()
    for name, param in model.named_parameters():
        if name == "lm_head.weight":
            continue
        assert torch.equal(hf_params[name], param), name
        if "router." in name:  # frozen by the objective
            assert torch.equal(param, dict(fresh.named_parameters())[name]), name
    assert not torch.equal(model.model.decoder.norm.weight, fresh.model.decoder.norm.weight)
    # the encoder copy of the layer scalars and the decoder's agree
    assert torch.equal(
        hf.model.encoder.language_model.layers[0].layer_scalar,
        hf.model.decoder.layers[0].layer_scalar,
    )
    # A few denoising steps run the same loop as the default 48 (most of this test's time).
    generated = hf.generate(torch.randint(0, 500, (1, 8)), max_new_tokens=16, max_denoising_steps=3)
    assert generated.sequences.shape[0] == 1 and generated.sequences.shape[1] > 8


def test_export_of_a_model_folder_keeps_its_vision_tower(tmp_path, capsys):
    """The model neither reads nor trains the vision tower; an export used to drop it, and
    transformers then loaded the folder with a randomly initialised vision tower."""
    import copy

    from safetensors import safe_open

    from turbo_dllm.train.export import export_checkpoint

    transformers = pytest.importorskip("transformers")
    hf_model(tmp_path / "source")
    base = copy.deepcopy(SFT)
    base["model"].update(path=str(tmp_path / "source"), from_config=None)
    base["objective"]["block_size"] = 4
    base["data"]["synthetic"]["vocab_size"] = 97
    train(tiny_spec("training.steps=2", base=base), tmp_path / "run")
    out = export_checkpoint(tmp_path / "run/checkpoints", tmp_path / "hf", dtype="bfloat16")
    with safe_open(str(tmp_path / "source/model.safetensors"), framework="pt") as source:
        with safe_open(str(out / "model.safetensors"), framework="pt") as exported:
            assert set(source.keys()) == set(exported.keys())
            vision = [k for k in source.keys() if ".vision_tower." in k or ".embed_vision." in k]
            assert vision
            for name in vision:  # unchanged, in the export's dtype
                assert exported.get_tensor(name).dtype == torch.bfloat16
                assert torch.equal(
                    exported.get_tensor(name), source.get_tensor(name).to(torch.bfloat16)
                )
    _, info = transformers.DiffusionGemmaForBlockDiffusion.from_pretrained(
        str(out), output_loading_info=True
    )
    assert not info["missing_keys"], info["missing_keys"]
    shutil.rmtree(tmp_path / "source")  # gone since training: said
    capsys.readouterr()
    export_checkpoint(tmp_path / "run/checkpoints", tmp_path / "hf2")
    err = capsys.readouterr().err
    assert "is gone: the export lacks its tokenizer and generation_config.json and its " in err
    assert "model.encoder.vision_tower.*" in err and "tensors" in err


def test_another_familys_folder_is_refused(tmp_path):
    import json

    from turbo_dllm.config.load import load_model
    from turbo_dllm.config.runspec import RunSpec
    from turbo_dllm.config.validate import problems

    (tmp_path / "config.json").write_text(json.dumps({"model_type": "qwen3", "vocab_size": 8}))
    spec = load_model(
        RunSpec,
        {
            "model": {"family": "diffusion_gemma", "path": str(tmp_path), "from_config": None},
            "objective": {"name": "diffusiongemma_sft"},
        },
        "test",
    )
    found = [str(p) for p in problems(spec) if p.path == "model.family"]
    assert found and "'qwen3' model" in found[0]


def test_mask_token_outside_the_vocabulary_is_refused():
    from turbo_dllm.config.load import load_model
    from turbo_dllm.config.runspec import RunSpec
    from turbo_dllm.config.validate import problems

    base = dict(
        SFT, objective={"name": "diffusiongemma_sft", "block_size": 16, "mask_token_id": 600}
    )
    base["data"] = {"synthetic": {"num_sequences": 32, "vocab_size": 700}, "seq_len": 32}
    found = {p.path for p in problems(load_model(RunSpec, base, "test"))}
    assert {"objective.mask_token_id", "data.synthetic.vocab_size"} <= found


def test_a_mask_token_under_the_uniform_noise_sft_is_refused_not_ignored():
    """diffusiongemma_sft never masks (uniform random ids): a mask token set for it was ignored
    without a word; under block_diffusion the same family masks with it."""
    from turbo_dllm.config.load import load_model
    from turbo_dllm.config.runspec import RunSpec
    from turbo_dllm.config.validate import problems

    def found(**objective):
        document = dict(SFT, objective={**SFT["objective"], **objective})
        return {p.path: p.message for p in problems(load_model(RunSpec, document, "test"))}

    assert "never masks" in found(mask_token_id=5)["objective.mask_token_id"]
    assert found() == {}
    assert "objective.mask_token_id" not in found(name="block_diffusion", mask_token_id=5)


def test_hf_folder_round_trip_single_and_sharded(tmp_path):
    hf = hf_model(tmp_path / "one")
    hf.save_pretrained(str(tmp_path / "sharded"), max_shard_size="20KB")
    assert (tmp_path / "sharded/model.safetensors.index.json").exists()
    a, _ = ours(tmp_path / "one")
    b, _ = ours(tmp_path / "sharded")
    for (name, x), (_, y) in zip(a.named_parameters(), b.named_parameters(), strict=True):
        assert torch.equal(x, y), name


def test_experts_not_divisible_by_ep_and_ep_outside_the_data_ranks_are_refused():
    from turbo_dllm.config.load import load_model
    from turbo_dllm.config.runspec import RunSpec
    from turbo_dllm.config.validate import problems

    def found(topology):
        spec = load_model(RunSpec, dict(SFT, topology=topology), "test")
        return [str(p) for p in problems(spec) if p.path == "topology.ep"]

    assert any(
        "num_experts = 4 is not divisible by ep = 3" in m for m in found({"fsdp": 3, "ep": 3})
    )
    assert any("must divide the data-parallel ranks" in m for m in found({"fsdp": 2, "ep": 4}))
    assert found({"fsdp": 2, "ep": 2}) == []


def test_cp_and_bp_are_accepted_with_ep_and_cp_with_bp_and_tp_are_refused_with_reasons():
    from turbo_dllm.config.load import load_model
    from turbo_dllm.config.runspec import RunSpec
    from turbo_dllm.config.validate import problems

    def found(topology, **objective):
        document = dict(SFT, topology=topology, data={**SFT["data"], "seq_len": 192})
        document["objective"] = {**SFT["objective"], **objective}
        return {p.path: p.message for p in problems(load_model(RunSpec, document, "test"))}

    assert found({"cp": 2}) == {}
    assert found({"cp": 2, "ep": 2}) == {}
    assert found({"cp": 2, "fsdp": 2, "ep": 4}) == {}
    assert "2*cp = 6" in found({"cp": 3}, block_size=8)["objective.block_size"]
    assert found({"bp": 2}) == {}
    assert found({"bp": 2, "ep": 2}) == {}
    assert "does not combine cp and bp" in found({"cp": 2, "bp": 2})["topology.bp"]
    assert "tensor parallelism is not implemented" in found({"tp": 2})["topology.tp"]
    # tp with ep: the family's tp refusal alone (it covers the layout's 'tp = 1, or ep = 1')
    with_ep = found({"fsdp": 2, "ep": 2, "tp": 2})
    assert list(with_ep) == ["topology.tp"] and "is not implemented" in with_ep["topology.tp"]


def test_the_benchmark_baseline_computes_our_loss_through_transformers(tmp_path):
    """benchmarks/train_step.py --family diffusion_gemma: HF's model trains the same objective."""
    train_step = benchmark_module("train_step")
    hf = hf_model(tmp_path)
    model, attention = ours(tmp_path)
    objective = _objective(self_conditioning_probability=0.0, encoder_loss_weight=0.5)
    batch = _batch()
    with torch.no_grad():
        theirs, d = train_step.hf_gemma_loss(
            hf, model.config, objective, batch, KEY, torch.device("cpu")
        )
        mask = attention.prepare(d.layout, None, torch.device("cpu"))
        sums = model(d.input_ids, d.layout.positions(), mask, output=partial(score, d))
    counts = torch.tensor(objective.supervised_count(batch), dtype=torch.float32)
    torch.testing.assert_close((sums / counts).sum(), theirs, rtol=1e-5, atol=1e-5)


def test_benchmark_family_smoke_on_cpu(tmp_path):
    import json

    train_step = benchmark_module("train_step")
    out = tmp_path / "bench.json"
    argv = ["--family", "diffusion_gemma", "--tiny", "--seq-len", "32", "--steps", "1"]
    assert train_step.main([*argv, "--warmup", "0", "--out", str(out)]) == 0
    report = json.loads(out.read_text())
    assert [r["name"] for r in report["results"]] == ["turbo-dllm", "hf-diffusiongemma"]
    assert report["results"][0]["grouped_gemm"] == "loop"  # CPU float32: the exact loop
    assert report["results"][1]["gradient_checkpointing"]  # like ours, from the first step
    assert report["family"] == "diffusion_gemma" and report["speedup"] > 0


def test_the_turbo_kernel_is_refused_for_this_family():
    from turbo_dllm.config.load import load_model
    from turbo_dllm.config.runspec import RunSpec
    from turbo_dllm.config.validate import problems

    base = dict(SFT, model={**SFT["model"], "attention": "turbo"})
    assert "model.attention" in {p.path for p in problems(load_model(RunSpec, base, "test"))}
