"""`dllm dflash eval`: speculative decoding with a DFlash drafter, and with an autoregressive
drafter (the baseline), reproduces the target's greedy output token for token."""

from __future__ import annotations

import json
from types import SimpleNamespace

import pytest
import torch

from tests.dflash.helpers import target_document, tiny_qwen3_config
from tests.helpers import assert_user_error
from turbo_dllm.config.load import apply_overrides
from turbo_dllm.config.runspec import RunSpec
from turbo_dllm.config.validate import check
from turbo_dllm.families.dflash.speculative import evaluate
from turbo_dllm.train.entry import train
from turbo_dllm.train.export import export_checkpoint


def _eval(cli, target, drafter, data, *flags):
    """`dllm dflash eval` of one drafter on the data artifact, with extra flags."""
    return cli("dflash", "eval", "--target", target, "--drafter", drafter, "--data", data, *flags)


def test_dflash_drafter_is_lossless_with_tau_above_one(cli, world, drafter):
    flags = ("--max-new-tokens", "24", "--num-prompts", "3", "--json")
    result = _eval(cli, world["target"], drafter["folder"], world["artifact"], *flags)
    assert result.code == 0, result.err
    report = json.loads(result.out)
    assert report["lossless"] is True and report["drafter_kind"] == "dflash"
    assert report["tau"] > 1.0
    assert sum(int(k) * v for k, v in report["accepted_histogram"].items()) >= 3 * 24
    assert set(map(int, report["accepted_histogram"])) <= set(range(1, 5))
    assert len(report["prompt_forwards"]) == 3 and report["tau_stderr"] >= 0


@pytest.fixture(scope="module")
def ar_drafter(world):
    """A one-layer causal LM trained with `objective: autoregressive` on the same text."""
    run = world["root"] / "ar-run"
    document = apply_overrides(
        target_document(world["artifact"], run, steps=20),
        ["model.config_overrides.num_hidden_layers=1"],
    )
    train(check(RunSpec.model_validate(document)), run)
    return export_checkpoint(run / "checkpoints", world["root"] / "ar-drafter")


def test_autoregressive_drafter_is_the_lossless_baseline(world, ar_drafter):
    report = evaluate(
        str(world["target"]),
        str(ar_drafter),
        str(world["artifact"]),
        block_size=4,
        max_new_tokens=16,
        num_prompts=2,
    )
    assert report.lossless and report.drafter_kind == "autoregressive"
    assert 1.0 <= report.tau <= 4.0


def test_an_autoregressive_drafter_needs_a_block_size(cli, world, ar_drafter):
    result = _eval(cli, world["target"], ar_drafter, world["artifact"])
    assert_user_error(result, "has no block size")
    # --draft-steps refines DFlash drafters; an AR drafter ignored it without a word
    flags = ("--block-size", "4", "--draft-steps", "2")
    result = _eval(cli, world["target"], ar_drafter, world["artifact"], *flags)
    assert_user_error(result, "one token a forward")


def test_an_autoregressive_drafter_of_another_tokenizer_than_the_data_is_refused(
    cli, world, ar_drafter, tmp_path
):
    """A target folder without a tokenizer (a byte-level export) left an autoregressive
    drafter of another tokenizer unchecked: every draft was rejected and eval reported tau 1.0,
    lossless. The drafter's tokenizer is compared with the one --data was prepared with."""
    from tests.dflash.test_target_tokenizer import _with_tokenizer

    other = _with_tokenizer(ar_drafter, tmp_path / "word-level-drafter")
    flags = ("--block-size", "4", "--max-new-tokens", "8", "--num-prompts", "1")
    result = _eval(cli, world["target"], other, world["artifact"], *flags)
    assert_user_error(
        result, f"the drafter {str(other)!r} has another tokenizer", "--data", "holds no tokenizer"
    )
    result = _eval(cli, world["target"], ar_drafter, world["artifact"], *flags, "--json")
    assert result.code == 0, result.err  # no tokenizer in either folder: not compared, as before


def test_a_drafter_of_another_target_is_refused_before_decoding(cli, world, drafter, tmp_path):
    other = dict(json.loads((world["target"] / "config.json").read_text()))
    other["hidden_size"] = 96
    (tmp_path / "config.json").write_text(json.dumps(other))
    result = _eval(cli, tmp_path, drafter["folder"], world["artifact"])
    assert_user_error(result, "does not fit the target", "hidden size")


def test_autoregressive_drafts_match_a_cache_free_drafter_under_partial_acceptance():
    """The drafter's KV cache and unread tokens stay in step with the sequence through
    rejected drafts: every block equals the one drafted from scratch over the whole sequence."""
    from transformers import Qwen3ForCausalLM

    from turbo_dllm.families.dflash import speculative

    config = tiny_qwen3_config()
    torch.manual_seed(0)
    target, drafter = Qwen3ForCausalLM(config).eval(), Qwen3ForCausalLM(config).eval()
    drafter.load_state_dict(target.state_dict())
    with torch.no_grad():  # a near copy: it agrees with the target often, not always
        for param in drafter.parameters():
            param.add_(torch.randn_like(param) * 0.003)

    class CacheFree:
        target_layers = ()
        drafts = 4

        def reset(self, prompt, hidden_states):
            self.sequence = prompt.tolist()

        def propose(self, last, length):
            ids = (self.sequence + last.tolist())[:length]
            for _ in range(self.drafts):
                ids.append(int(drafter(input_ids=torch.tensor([ids])).logits[0, -1].argmax()))
            return torch.tensor(ids[length:])

        def accept(self, length, hidden_states, verify, kept):
            self.sequence = (self.sequence + verify.tolist())[: length - 1]

    prompt = torch.randint(64, (12,), generator=torch.Generator().manual_seed(1))
    with torch.inference_mode():
        plain = speculative._greedy_target(target, prompt, 40)
        cached = speculative._AutoregressiveProposer(drafter, block_size=5)
        out, gains = speculative._speculative(target, cached, prompt, 40)
        reference, reference_gains = speculative._speculative(target, CacheFree(), prompt, 40)
    assert out == plain == reference
    assert gains == reference_gains
    assert 1 in gains and 5 in gains and len(set(gains)) > 2  # rejections and full blocks


def test_compare_interleaves_decoders_and_names_the_prompt_a_drafter_changed(
    world, drafter, ar_drafter, monkeypatch
):
    """Prompt by prompt: the target alone, then each drafter (so drift on the host moves all of
    them alike). A drafter whose output differs is recorded (strict=False) or refused, naming
    the prompt (strict=True)."""
    import turbo_dllm.families.dflash.speculative as speculative
    from turbo_dllm.errors import DllmError

    order, real = [], speculative._speculative

    def record(target, proposer, prompt, new_tokens):
        order.append(type(proposer).__name__)
        tokens, gains = real(target, proposer, prompt, new_tokens)
        if len(order) == 2 + 2 * 2 and isinstance(proposer, speculative._AutoregressiveProposer):
            tokens = [tokens[0] + 1, *tokens[1:]]  # the AR drafter "changes" prompt 1's output
        return tokens, gains

    monkeypatch.setattr(speculative, "_speculative", record)
    args = (str(world["target"]), [str(drafter["folder"]), str(ar_drafter)], str(world["artifact"]))
    options = dict(block_size=4, max_new_tokens=8, num_prompts=2)
    dflash, ar = speculative.compare(*args, strict=False, **options)
    # two warm-up decodes, then per prompt: the DFlash drafter, the AR drafter
    assert order == ["_DFlashProposer", "_AutoregressiveProposer"] * 3
    assert dflash.lossless and dflash.first_mismatch is None
    assert not ar.lossless and ar.first_mismatch == 1
    order.clear()
    with pytest.raises(DllmError, match="changed the output of prompt 1"):
        speculative.compare(*args, strict=True, **options)


def _report(tokens, forwards):
    from turbo_dllm.families.dflash.speculative import _report as make

    spec = [([0] * sum(per), per) for per in _gains(tokens, forwards)]
    plain = [tokens_ for tokens_, _ in spec]
    return make("dflash", 8, plain, 1.0, spec, 1.0, max(tokens))


def _gains(tokens, forwards):
    """Per prompt, `forwards` gains (each 1..8) summing to `tokens`."""
    out = []
    for total, n in zip(tokens, forwards, strict=True):
        base, extra = divmod(total, n)
        out.append([base + (i < extra) for i in range(n)])
    return out


def test_tau_stderr_is_the_spread_over_prompts_and_matches_the_jackknife():
    from turbo_dllm.families.dflash.speculative import tau_ratio_stderr

    # Every prompt at the same tau: no spread, however the forwards are distributed.
    same = _report([40, 80, 120], [10, 20, 30])
    assert same.tau == 4.0 and same.tau_stderr == 0.0
    assert same.prompt_tokens == [40, 80, 120] and same.prompt_forwards == [10, 20, 30]
    assert _report([40], [10]).tau_stderr is None  # one prompt: no estimate

    # Against an oracle of another kind: the jackknife standard error of a ratio of sums, which
    # the delta method matches as the prompt count grows.
    generator = torch.Generator().manual_seed(0)
    k = 400
    forwards = (20 + torch.randint(0, 30, (k,), generator=generator)).tolist()
    tokens = [min(8 * n, int(n * (3 + 2 * torch.rand((), generator=generator)))) for n in forwards]
    report = _report(tokens, forwards)
    leave_one_out = [
        (sum(tokens) - x) / (sum(forwards) - n) for x, n in zip(tokens, forwards, strict=True)
    ]
    mean = sum(leave_one_out) / k
    jackknife = ((k - 1) / k * sum((t - mean) ** 2 for t in leave_one_out)) ** 0.5
    assert report.tau_stderr == pytest.approx(jackknife, rel=0.02)

    # Paired ratio: a drafter whose forwards are the other's, halved, on every prompt has
    # exactly twice its tau on every prompt; the prompts' differences cancel.
    half = _report(tokens, [n // 2 for n in forwards])
    assert half.tau_stderr > 0 and report.tau_stderr > 0
    even = [2 * (n // 2) for n in forwards]
    doubled = _report(tokens, even)
    halved = _report(tokens, [n // 2 for n in even])
    assert halved.tau / doubled.tau == pytest.approx(2.0)
    assert tau_ratio_stderr(halved, doubled) == pytest.approx(0.0, abs=1e-12)
    # ... and two unrelated drafters' ratio carries both spreads.
    other = _report(list(reversed(tokens)), forwards)
    ratio_error = tau_ratio_stderr(other, report)
    unpaired = (
        other.tau
        / report.tau
        * ((other.tau_stderr / other.tau) ** 2 + (report.tau_stderr / report.tau) ** 2) ** 0.5
    )
    assert ratio_error == pytest.approx(unpaired, rel=0.25)
    with pytest.raises(ValueError, match="same prompts"):
        tau_ratio_stderr(report, _report(tokens[:5], forwards[:5]))


@pytest.mark.parametrize(
    ("flag", "value", "needle"),
    [
        ("--max-new-tokens", "0", "--max-new-tokens must be at least 2"),
        # the first new token is the prompt forward's: no verify forward, tau divided by zero
        ("--max-new-tokens", "1", "--max-new-tokens must be at least 2 (got 1)"),
        ("--num-prompts", "0", "--num-prompts must be at least 1"),
        ("--num-prompts", "-1", "--num-prompts must be at least 1"),
        ("--prompt-len", "0", "--prompt-len must be at least 1"),
        ("--block-size", "0", "--block-size must be at least 2 (got 0)"),
        ("--device", "foo", "not a torch device"),
        ("--draft-steps", "99", "at most that many forwards"),  # extra forwards showed nothing
    ],
)
def test_bad_eval_options_are_refused_before_decoding(cli, world, drafter, flag, value, needle):
    # each was a traceback deep in the decode loop (division by zero, an empty prompt list),
    # and --block-size 0 silently meant the drafter's own block size
    result = _eval(cli, world["target"], drafter["folder"], world["artifact"], flag, value)
    assert_user_error(result, needle)


@pytest.mark.skipif(torch.cuda.is_available(), reason="needs a host without a CUDA GPU")
def test_a_cuda_device_without_a_gpu_is_a_user_error(cli, world, drafter):
    result = _eval(cli, world["target"], drafter["folder"], world["artifact"], "--device", "cuda")
    assert_user_error(result, "no CUDA GPU")


def _tiny_target(folder, vocab_size=64):
    """A tiny random transformers Qwen3 (2 layers) whose final norm is far from the identity
    (as a trained one is), saved as a target folder; (its model, the folder)."""
    from transformers import Qwen3ForCausalLM

    torch.manual_seed(0)
    hf = tiny_qwen3_config(vocab_size)
    model = Qwen3ForCausalLM(hf).eval()
    with torch.no_grad():
        model.model.norm.weight.uniform_(0.2, 3.0)
    model.save_pretrained(folder)
    return model, folder


def _fresh_drafter(target, architecture="DFlashDraftModel", block_size=4, from_anchor=False):
    """A randomly initialised one-layer drafter shaped after the `target` folder."""
    from turbo_dllm.families.dflash import read_target_config
    from turbo_dllm.families.dflash.config import DFlashConfig
    from turbo_dllm.families.dflash.runtime import build_model, materialize

    shape = SimpleNamespace(
        target_layer_ids=None,  # the default: layer 1, the last of two
        num_layers=1,
        intermediate_size=None,
        block_size=block_size,
        mask_token_id=3,
        sample_from_anchor=from_anchor,
        architecture=architecture,
        conv_kernel_size=4,
        conv_group_size=16,
        selector_rank=8,
        selector_top_k=8,
        final_logit_softcapping=None,
        output_multiplier=1.0,
    )
    config = DFlashConfig.from_target(
        read_target_config(str(target)), shape, target_path=str(target)
    )
    return materialize(build_model(config), torch.device("cpu"), seed=0).eval()


def test_eval_feeds_the_drafter_the_features_training_does_at_the_last_layer(tmp_path):
    """The drafter reads the features of target layers `target_layer_ids` as training's
    `TargetFeatures` computes them, the last layer included (the default layer of a one-layer
    drafter on a two-layer target, the smoke recipes' shape; both follow transformers'
    hidden-state tuple: tests/dflash/test_target_layers.py): the context a decode built must be
    the features of its sequence as training computes them."""
    from turbo_dllm.families.dflash import speculative
    from turbo_dllm.families.dflash.target import TargetFeatures

    model, target = _tiny_target(tmp_path / "target")
    drafter = _fresh_drafter(target)
    assert drafter.config.target_layer_ids == (1,)
    features = TargetFeatures(
        str(target), drafter.config, teacher=False, device=torch.device("cpu")
    )
    prompt = torch.randint(64, (12,), generator=torch.Generator().manual_seed(1))
    with torch.inference_mode():
        proposer = speculative._DFlashProposer(drafter, block_size=4)
        out, _ = speculative._speculative(model, proposer, prompt, 16)
        sequence = torch.cat([prompt, torch.tensor(out)])
        rows = min(proposer.context.shape[1], len(sequence))
        trained = drafter.project_context(features(sequence[None], None)[0])[:, :rows]
    assert rows > len(prompt)  # the prompt's features and the accepted tokens'
    torch.testing.assert_close(proposer.context[:, :rows], trained, rtol=1e-4, atol=1e-4)


def test_a_dflash2_drafter_evaluated_at_another_block_size_convolves_over_that_block(tmp_path):
    """--block-size B with a DFlash2 drafter: its block-local convolutions span the B tokens it
    drafts (the serving engines' convolutions span the block they serve), as the same weights
    configured for B do; not blocks of the size it was trained at (a block that size did not
    divide was a ValueError traceback)."""
    import shutil

    from tests.dflash.helpers import stdlib_artifact
    from turbo_dllm.families.dflash import speculative
    from turbo_dllm.train.weights import full_state_dict, save_hf

    _, target = _tiny_target(tmp_path / "target", vocab_size=512)
    drafter = _fresh_drafter(target, "DFlash2DraftModel")
    with torch.no_grad():  # trained convolutions: each token reads the ones before it
        for name, param in drafter.named_parameters():
            if "conv" in name:
                param.normal_(0.0, 0.5)
    state = {
        name: tensor
        for name, tensor in full_state_dict(drafter).items()
        if name not in drafter.external_weights
    }
    four = save_hf(state, drafter.config, tmp_path / "block4")
    eight = shutil.copytree(four, tmp_path / "block8")
    hf = json.loads((eight / "config.json").read_text())
    hf["block_size"] = hf["dflash_config"]["block_size"] = 8
    (eight / "config.json").write_text(json.dumps(hf))
    prompt = torch.randint(256, (12,), generator=torch.Generator().manual_seed(1))
    cpu = torch.device("cpu")
    drafts = []
    with torch.inference_mode():
        target_model = speculative._load_target(str(target), cpu, torch.float32)
        for folder, block_size in ((four, 8), (eight, None)):
            _, model = speculative._drafter(
                str(folder), str(target), cpu, torch.float32, block_size
            )
            proposer = speculative._DFlashProposer(model, 8)
            logits, _, outputs = speculative._step(
                target_model, prompt, layers=proposer.target_layers
            )
            proposer.reset(prompt, outputs)
            drafts.append(proposer.propose(logits[-1:].argmax(-1), len(prompt) + 1))
    assert torch.equal(drafts[0], drafts[1])
    data = stdlib_artifact(tmp_path / "data")
    (report,) = speculative.compare(
        str(target), [str(four)], str(data), block_size=6, max_new_tokens=8, num_prompts=1
    )
    assert report.lossless and report.block_size == 6


def test_a_sample_from_anchor_drafter_drafts_a_whole_block_losslessly(tmp_path):
    """A drafter trained with sample_from_anchor drafts B tokens after the anchor (slot 0 the
    next token); eval was a RuntimeError (its B drafts against the B - 1 slots after the
    anchor)."""
    from turbo_dllm.families.dflash import speculative

    model, target = _tiny_target(tmp_path / "target")
    drafter = _fresh_drafter(target, from_anchor=True)
    prompt = torch.randint(64, (12,), generator=torch.Generator().manual_seed(1))
    with torch.inference_mode():
        proposer = speculative._DFlashProposer(drafter, block_size=4)
        out, gains = speculative._speculative(model, proposer, prompt, 16)
        plain = speculative._greedy_target(model, prompt, 16)
        proposer = speculative._DFlashProposer(drafter, block_size=4)
        logits, _, outputs = speculative._step(model, prompt, layers=proposer.target_layers)
        proposer.reset(prompt, outputs)
        assert proposer.propose(logits[-1:].argmax(-1), len(prompt) + 1).shape == (4,)
    assert out == plain
    assert set(gains) <= set(range(1, 6))


def test_fewer_prompts_than_asked_are_said_and_recorded(cli, world, drafter):
    """--num-prompts above the prompts the data holds silently decoded fewer (tau's standard
    error then spans fewer samples than the user asked for): a warning on stderr names both
    counts, the report records both, and the text report says so."""
    from turbo_dllm.families.dflash.speculative import held_out_prompts

    length = 2500  # long prompts: a handful in the world's five source files
    available = len(held_out_prompts(world["artifact"], count=10**6, length=length))
    assert 1 <= available < 8
    asked = str(available + 2)
    flags = ("--prompt-len", str(length), "--max-new-tokens", "4", "--num-prompts", asked)
    result = _eval(cli, world["target"], drafter["folder"], world["artifact"], *flags, "--json")
    assert result.code == 0, result.err
    report = json.loads(result.out)
    assert report["prompts"] == available and report["prompts_requested"] == available + 2
    assert len(report["prompt_forwards"]) == available
    assert (
        f"warning: --num-prompts {asked}, but --data {str(world['artifact'])!r} holds only "
        f"{available} held-out prompts of {length} tokens"
    ) in result.err
    result = _eval(cli, world["target"], drafter["folder"], world["artifact"], *flags)
    assert result.code == 0, result.err
    assert f"over {available} prompts (of --num-prompts {asked}: the data holds no more)" in (
        result.out
    )
    # as many as asked: no warning
    flags = ("--max-new-tokens", "4", "--num-prompts", "2", "--json")
    result = _eval(cli, world["target"], drafter["folder"], world["artifact"], *flags)
    assert result.code == 0 and "warning" not in result.err, result.err
    assert json.loads(result.out)["prompts_requested"] == 2


def test_a_decode_past_the_targets_context_is_warned_about(cli, world, drafter, tmp_path):
    """--prompt-len + --max-new-tokens past the target's max_position_embeddings decoded on
    without a word (transformers' rope goes on): the tau of a target outside its trained
    context. Said on stderr, counting the last verify forward's drafts; the decode runs."""
    import shutil

    target = shutil.copytree(world["target"], tmp_path / "target")
    config = json.loads((target / "config.json").read_text())
    config["max_position_embeddings"] = 64
    (target / "config.json").write_text(json.dumps(config))
    common = ("--prompt-len", "32", "--num-prompts", "1", "--json")
    # 32 + 30 new tokens + 3 drafts - 1 = 64 positions: inside
    result = _eval(
        cli, target, drafter["folder"], world["artifact"], *common, "--max-new-tokens", "30"
    )
    assert result.code == 0 and "warning" not in result.err, result.err
    result = _eval(
        cli, target, drafter["folder"], world["artifact"], *common, "--max-new-tokens", "31"
    )
    assert result.code == 0, result.err
    assert (
        "warning: --prompt-len 32 + --max-new-tokens 31 (+ 3 drafted tokens in the last verify "
        "forward) may reach 65 positions, past the target's max_position_embeddings 64"
    ) in result.err
    assert json.loads(result.out)["lossless"] is True
