"""`dllm dflash eval` with an autoregressive drafter whose embedding table is padded to another
size than the target's, over one tokenizer (Qwen2.5-0.5B: 151,936 rows, Qwen2.5-7B: 152,064,
one tokenizer of 151,665 ids). The decode must stay the target's own greedy decode token for
token (the oracle), drafts must never be ids the target has no row for, and the target's
tokens must reach the drafter even where they are ids its smaller table lacks. A drafter of
another tokenizer, or one whose folder cannot show its tokenizer, is refused."""

from __future__ import annotations

import pytest
import torch
import yaml

from tests.dflash.helpers import tiny_qwen3_config
from tests.helpers import assert_user_error
from turbo_dllm.families.dflash.speculative import evaluate

WORDS = "def return import class if else for in while with as pass".split()
SPECIALS = ["<|endoftext|>", "<|pad|>", "<|mask|>"]


def _save_tokenizer(folder, words=WORDS):
    """A small word-level Hugging Face tokenizer (15 ids) saved in `folder`."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {token: i for i, token in enumerate(SPECIALS + list(words))}
    tok = Tokenizer(models.WordLevel(vocab, unk_token="<|pad|>"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    PreTrainedTokenizerFast(
        tokenizer_object=tok, eos_token="<|endoftext|>", pad_token="<|pad|>", mask_token="<|mask|>"
    ).save_pretrained(str(folder))


def _pair(root, target_rows: int, drafter_rows: int):
    """A random target and a near copy of it as the drafter (so it agrees with the target
    often, not always), with embedding tables of `target_rows` and `drafter_rows`, sharing the
    tokenizer; the drafter's rows past the target's table score high (a drafter left free to
    draft them would)."""
    from transformers import Qwen3ForCausalLM

    torch.manual_seed(0)
    target = Qwen3ForCausalLM(tiny_qwen3_config(target_rows)).eval()
    drafter = Qwen3ForCausalLM(tiny_qwen3_config(drafter_rows)).eval()
    common = min(target_rows, drafter_rows)
    state = drafter.state_dict()
    with torch.no_grad():
        for name, tensor in target.state_dict().items():
            mine = state[name]
            if mine.shape == tensor.shape:
                mine.copy_(tensor)
            else:  # the embedding and the head: the shared rows
                mine[:common].copy_(tensor[:common])
            mine.add_(torch.randn_like(mine) * 0.003)
        if drafter_rows > target_rows:
            drafter.lm_head.weight[target_rows:] *= 20.0
    folders = []
    for name, model in (("target", target), ("drafter", drafter)):
        model.save_pretrained(root / name)
        _save_tokenizer(root / name)
        folders.append(root / name)
    return folders


def _artifact(root):
    """Held-out text prepared with the shared tokenizer."""
    from turbo_dllm.data.prepare import prepare
    from turbo_dllm.data.spec import load_prepare_spec

    tokenizer = root / "tokenizer"
    _save_tokenizer(tokenizer)
    folder = root / "data"
    folder.mkdir()
    text = " ".join(WORDS[(i * 7) % len(WORDS)] for i in range(400))
    for i in range(3):
        (folder / f"doc{i}.txt").write_text(text[i * 3 :] + "\n")
    config = {
        "source": {"kind": "text", "paths": [str(folder / f"doc{i}.txt") for i in range(3)]},
        "tokenizer": {"kind": "huggingface", "path": str(tokenizer)},
        "packing": {"seq_len": 64, "block_size": 4},
        "output": {"path": str(folder / "artifact")},
        "workers": 1,
    }
    (folder / "prepare.yaml").write_text(yaml.safe_dump(config))
    prepare(load_prepare_spec(folder / "prepare.yaml", []), progress=False)
    return folder / "artifact"


@pytest.mark.parametrize(
    ("target_rows", "drafter_rows"),
    [(48, 32), (32, 48)],
    ids=["drafter-table-smaller", "drafter-table-larger"],
)
def test_a_drafter_of_the_same_tokenizer_padded_to_another_size_is_lossless(
    tmp_path, target_rows, drafter_rows
):
    """Tables of 48 and 32 rows over 15 tokenizer ids, each way round. A smaller drafter reads
    the target's tokens past its table (a random target chooses its padding ids often); a
    larger one drafts only ids the target has (its own extra rows score highest); the decode is
    the target's greedy decode, and drafts are accepted (tau above one)."""
    target, drafter = _pair(tmp_path, target_rows, drafter_rows)
    data = _artifact(tmp_path)
    report = evaluate(
        str(target),
        str(drafter),
        str(data),
        block_size=4,
        max_new_tokens=24,
        num_prompts=3,
        prompt_len=8,
    )
    assert report.lossless and report.drafter_kind == "autoregressive"
    assert report.tau > 1.0  # drafts accepted


def test_drafts_stay_in_the_rows_both_tables_have(tmp_path):
    """The proposer drafts ids below the smaller table only, and feeds the drafter the target's
    tokens it has no row for as its own last (padding) row."""
    from transformers import AutoModelForCausalLM

    from turbo_dllm.families.dflash import speculative

    target, drafter = _pair(tmp_path, 32, 48)
    model = AutoModelForCausalLM.from_pretrained(drafter).eval()
    prompt = torch.tensor([3, 4, 5, 6, 7, 8, 9, 10])
    with torch.inference_mode():
        proposer = speculative._AutoregressiveProposer(model, 5, target_vocab=32)
        proposer.reset(prompt, [])
        drafts = proposer.propose(torch.tensor([11]), len(prompt) + 1)
        free = speculative._AutoregressiveProposer(model, 5)
        free.reset(prompt, [])
        unmasked = free.propose(torch.tensor([11]), len(prompt) + 1)
    assert int(drafts.max()) < 32
    assert int(unmasked.max()) >= 32  # the extra rows do win where nothing masks them

    _, small = _pair(tmp_path / "small", 48, 32)
    model = AutoModelForCausalLM.from_pretrained(small).eval()
    with torch.inference_mode():
        proposer = speculative._AutoregressiveProposer(model, 3, target_vocab=48)
        proposer.reset(torch.tensor([3, 4, 40]), [])  # 40: a padding id of the target's
        assert proposer.propose(torch.tensor([45]), 4).shape == (2,)


def _eval(cli, target, drafter, data):
    return cli(
        "dflash", "eval", "--target", target, "--drafter", drafter, "--data", data,
        "--block-size", "4", "--max-new-tokens", "4", "--num-prompts", "1", "--prompt-len", "8",
    )  # fmt: skip


def test_a_drafter_of_another_tokenizer_is_refused(cli, tmp_path):
    """Another tokenizer (the same words in another order: the same ids are other text) is
    refused whether or not the tables have the same size."""
    target, drafter = _pair(tmp_path, 48, 32)
    data = _artifact(tmp_path)
    _save_tokenizer(drafter, words=list(reversed(WORDS)))
    result = _eval(cli, target, drafter, data)
    assert_user_error(result, "tokenizer", str(drafter), str(target))
    same_size = tmp_path / "same"
    _, other = _pair(same_size, 48, 48)
    _save_tokenizer(other, words=list(reversed(WORDS)))
    assert_user_error(_eval(cli, target, other, data), "tokenizer", str(other))


def test_tables_of_other_sizes_without_a_tokenizer_to_compare_are_refused(cli, tmp_path):
    """Other sizes with no tokenizer in the drafter's folder: nothing shows the ids mean the
    same text; the message says what to save."""
    target, drafter = _pair(tmp_path, 48, 32)
    data = _artifact(tmp_path)
    for name in ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json"):
        (drafter / name).unlink(missing_ok=True)
    result = _eval(cli, target, drafter, data)
    assert_user_error(result, "(32)", "(48)", "no tokenizer", str(drafter))


def test_a_tokenizer_with_ids_past_the_smaller_table_is_refused(cli, tmp_path):
    """Tables that differ by more than padding: the shared tokenizer defines ids the smaller
    table has no row for."""
    target, drafter = _pair(tmp_path, 48, 12)  # 15 tokenizer ids, a drafter of 12 rows
    data = _artifact(tmp_path)
    result = _eval(cli, target, drafter, data)
    assert_user_error(result, "(12)", "14")
