"""Speculative decoding with a drafter, against the target decoding alone: `dllm dflash eval`.

Greedy (T = 0) on held-out prompts. The target is transformers' causal LM with a KV cache
(the folder our decoder exports). Per prompt:

- target alone: prefill, then one forward per new token;
- speculative: the drafter proposes d tokens after the last accepted one; the target checks
  all of them in one forward [last, d_1 .. d_d]; the longest prefix agreeing with the target's
  own greedy choices is kept, plus the target's token after it (so every forward yields
  1 .. d + 1 tokens); the KV cache is cropped back to the accepted length.

Drafters: a DFlash drafter (one block [last, mask x (B-1)] per forward, reading the outputs of
target layers `target_layer_ids` for every accepted position, the features it was trained on:
`_step`; the last layer's after the final norm), or an autoregressive drafter
(a small causal LM with its own KV cache, proposing B - 1 tokens one at a time: the standard
speculative-decoding baseline). Outputs must be token-for-token those of the target alone.

tau = accepted tokens per target forward in the speculative loop (mean of 1 + accepted drafts),
with its standard error over the prompts (`tau_stderr`: tau is a ratio of per-prompt sums, so
the prompts, not the forwards, are the independent samples; `tau_ratio_stderr` does the same
for two drafters decoding the same prompts).
"""

from __future__ import annotations

import json
import sys
import time
from collections import Counter
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Any

import torch

from turbo_dllm.errors import DllmError
from turbo_dllm.families.base import hf_cache_argument

__all__ = ["SpeculativeReport", "compare", "evaluate", "held_out_prompts", "tau_ratio_stderr"]


@dataclass
class SpeculativeReport:
    drafter_kind: str
    block_size: int
    prompts: int
    new_tokens: int
    target_forwards: int
    tau: float
    target_tokens_per_s: float
    speculative_tokens_per_s: float
    speedup: float
    lossless: bool
    first_mismatch: int | None = None  # the first prompt whose outputs differ
    accepted_histogram: dict[int, int] = field(default_factory=dict)
    tau_stderr: float | None = None  # over the prompts; None with fewer than two
    prompt_tokens: list[int] = field(default_factory=list)  # accepted tokens, per prompt
    prompt_forwards: list[int] = field(default_factory=list)  # target forwards, per prompt
    draft_steps: int = 1  # a DFlash drafter's forwards per block (1 in an AR drafter's report)
    # --num-prompts as asked; `prompts` is how many the data held and were decoded (fewer were
    # warned about on stderr)
    prompts_requested: int | None = None
    # the drafter's export records another target than the one it was evaluated against
    # (allowed by allow_other_target / --allow-other-target): tau then measures a transfer
    other_target: bool = False

    def to_dict(self) -> dict[str, Any]:
        out = dict(self.__dict__)
        out["accepted_histogram"] = {str(k): v for k, v in sorted(self.accepted_histogram.items())}
        return out


def held_out_prompts(artifact: str | Path, *, count: int, length: int) -> list[torch.Tensor]:
    """Up to `count` prompts of `length` tokens, each inside one document of the artifact,
    spread over its documents (windows at evenly spaced offsets)."""
    import numpy as np

    from turbo_dllm.data.artifact import DataArtifact

    data = DataArtifact(artifact)
    flat = np.asarray(data.tokens).reshape(-1)
    windows = [
        (start + offset)
        for start, size in np.asarray(data.documents).tolist()
        for offset in range(0, max(size - 2 * length, 0), length)
    ]
    if not windows:
        raise DllmError(
            f"no document of {str(artifact)!r} is longer than 2 x {length} tokens",
            hint="use a shorter --prompt-len or an artifact of longer documents",
        )
    picks = np.linspace(0, len(windows) - 1, num=min(count, len(windows))).round().astype(int)
    return [
        torch.from_numpy(flat[windows[i] : windows[i] + length].astype(np.int64)) for i in picks
    ]


def _load_target(folder: str, device: torch.device, dtype: torch.dtype, flag: str = "--target"):
    from transformers import AutoModelForCausalLM
    from transformers.utils import logging as hf_logging

    # transformers' "Loading weights" bar would land in the middle of the command's report
    shown = hf_logging.is_progress_bar_enabled()
    hf_logging.disable_progress_bar()
    from turbo_dllm.families.dflash.runtime import readable_weights

    try:
        with readable_weights(flag, folder):
            model, info = AutoModelForCausalLM.from_pretrained(
                folder, dtype=dtype, local_files_only=True, output_loading_info=True
            )
    except ValueError as error:  # a model type or config class it has no causal LM for
        raise DllmError(
            f"{flag} {folder!r} is not a causal LM transformers can load: "
            f"{str(error).splitlines()[0]}",
            hint="--target takes a Llama / Qwen2 / Qwen3 folder; --drafter that or a DFlash "
            "drafter folder",
        ) from None
    finally:
        if shown:
            hf_logging.enable_progress_bar()
    missing = sorted(info.get("missing_keys") or [])
    if missing:  # transformers initialises them at random and goes on: a model of noise
        shown_keys = ", ".join(missing[:4]) + (
            f" and {len(missing) - 4} more" if len(missing) > 4 else ""
        )
        raise DllmError(
            f"{flag} {folder!r} lacks weights its config.json needs ({shown_keys})",
            hint=f"point {flag} at a complete model folder (`dllm export` writes one)",
        )
    return model.to(device).eval()


def _architecture(folder: str) -> str:
    from turbo_dllm.families.base import read_hf_config

    hf = read_hf_config(Path(folder) / "config.json", what="drafter")
    return (hf.get("architectures") or ["?"])[0]


def _crop(cache, length: int) -> None:
    """Keep the first `length` positions of a transformers KV cache (crop takes the count of
    positions to drop, negative)."""
    extra = cache.get_seq_length() - length
    if extra > 0:
        cache.crop(-extra)


def _step(model, ids: torch.Tensor, cache=None, layers: tuple[int, ...] = ()):
    """One cached forward of the 1-D `ids`: (logits (S, V), cache, the features (1, S, H) of the
    decoder layers `layers` (0-based), in that order).

    Training's target features (`target.TargetFeatures`): entry `layer + 1` of transformers'
    hidden-state tuple, caught as each layer's output leaves it (the whole tuple would keep
    every layer's), and for the last layer after the final norm, as the tuple holds it."""
    if cache is None:
        from transformers import DynamicCache

        cache = DynamicCache()
    name = hf_cache_argument(type(model).forward)
    outputs: dict[int, torch.Tensor] = {}

    def catch(index, module, args, output):
        outputs[index] = output[0] if isinstance(output, tuple) else output

    decoder = model.model.layers
    hooks = [decoder[i].register_forward_hook(partial(catch, i)) for i in layers]
    try:
        out = model(input_ids=ids[None], use_cache=True, **{name: cache})
    finally:
        for hook in hooks:
            hook.remove()
    last = len(decoder) - 1
    if last in outputs:
        outputs[last] = model.model.norm(outputs[last])
    return out.logits[0], cache, [outputs[i] for i in layers]


def _greedy_target(target, prompt: torch.Tensor, new_tokens: int) -> list[int]:
    """The target alone: prefill, then one forward per token. The tokens stay on the device
    (each forward's argmax feeds the next) and come back to the host once, at the end."""
    logits, cache, _ = _step(target, prompt)
    token = logits[-1:].argmax(-1)
    tokens = [token]
    while len(tokens) < new_tokens:
        logits, cache, _ = _step(target, token, cache)
        token = logits[-1:].argmax(-1)
        tokens.append(token)
    return torch.cat(tokens).tolist()


class _DFlashProposer:
    """Drafts one block from the target's features of every accepted position. With
    `draft_steps` S > 1 the drafter refines its draft: each forward but the last shows its most
    confident guesses among the slots still hidden (an even share of them) to the next, in place
    of the mask (a drafter trained with `objective.reveal_blocks` has seen such blocks)."""

    def __init__(
        self, drafter, block_size: int, draft_steps: int = 1, block_source: str | None = None
    ) -> None:
        self.drafter = drafter
        self.block_size = block_size
        self.target_layers = tuple(drafter.config.target_layer_ids)  # 0-based, as trained
        self.mask = drafter.config.mask_token_id
        self.from_anchor = drafter.config.sample_from_anchor
        # `compare` checked this before loading anything (`_check_draft_steps`); kept here for
        # the callers that build a proposer themselves
        self.drafts = _check_draft_steps(
            draft_steps,
            block_size,
            from_anchor=self.from_anchor,
            dflash2=drafter.config.is_dflash2,
            block_source=block_source or "the drafter's block size",
        )
        hidden, self.reveals = self.drafts, []
        for step in range(draft_steps - 1):  # guesses shown after each forward but the last
            self.reveals.append(hidden // (draft_steps - step))
            hidden -= self.reveals[-1]

    def reset(self, prompt: torch.Tensor, layer_outputs) -> None:
        self.context = self.drafter.project_context(self._features(layer_outputs))
        self.masks = torch.full((self.block_size - 1,), self.mask, device=prompt.device)
        self.offsets = torch.arange(self.block_size, device=prompt.device)[None]

    def _features(self, layer_outputs) -> torch.Tensor:
        return torch.cat(layer_outputs, dim=-1).to(self.drafter.fc.weight.dtype)

    def propose(self, last: torch.Tensor, length: int) -> torch.Tensor:
        """The drafts (d,) after the last accepted token `last` (1,), at position length - 1,
        on the device (no host sync)."""
        from turbo_dllm.families.dflash.model import DraftContext

        device = self.context.device
        position = length - 1  # the last accepted token: the block's anchor
        block = torch.cat([last, self.masks])[None]
        context = DraftContext(None, torch.arange(position, device=device), None)

        def forward(block):
            hidden = self.drafter.hidden_states(
                block, position + self.offsets, context, projected=self.context
            )
            return hidden[0, : self.drafts] if self.from_anchor else hidden[0, 1:]

        shown = torch.zeros(self.drafts, dtype=torch.bool, device=device)
        for count in self.reveals:
            confidence, guess = self.drafter.lm_head(forward(block)).float().softmax(-1).max(-1)
            picked = confidence.masked_fill(shown, -1.0).topk(count).indices
            shown[picked] = True
            block = block.clone()
            block[0, 1 + picked] = guess[picked]
        drafted = self.drafter.greedy_draft(forward(block), last)  # DFlash2: its selector
        if not self.reveals:  # one forward (a sample_from_anchor drafter's B drafts: always)
            return drafted
        return torch.where(shown, block[0, 1:], drafted)

    def accept(self, length: int, layer_outputs, verify: torch.Tensor, kept: int) -> None:
        """`kept` rows of the verify forward (the anchor and the accepted drafts) are final."""
        rows = self._features(layer_outputs)[:, :kept]
        self.context = torch.cat([self.context, self.drafter.project_context(rows)], dim=1)


def _check_draft_steps(
    draft_steps: int, block_size: int, *, from_anchor: bool, dflash2: bool, block_source: str
) -> int:
    """The DFlash drafter's draft slots per block, where it can refine a draft over
    `draft_steps` forwards (`_DFlashProposer`); else the DllmError saying why not.
    `block_source`: where `block_size` came from (--block-size, or the drafter's config.json)."""
    drafts = block_size if from_anchor else block_size - 1
    if draft_steps < 1:
        raise DllmError(
            f"--draft-steps must be at least 1 (got {draft_steps})",
            hint="leave --draft-steps out for one denoising step per block",
        )
    if draft_steps > 1 and (from_anchor or dflash2):
        raise DllmError(
            "--draft-steps > 1 refines DFlashDraftModel drafters with sample_from_anchor "
            "false (slot k holds the token at anchor + k)",
            hint="evaluate this drafter with --draft-steps 1",
        )
    if draft_steps > drafts:  # the forwards past one a slot would show nothing
        raise DllmError(
            f"--draft-steps {draft_steps}: a block of {block_size} ({block_source}) drafts "
            f"{drafts} slots, so at most that many forwards refine it",
            hint=f"use --draft-steps {drafts} or fewer",
        )
    return drafts


def _check_autoregressive_draft_steps(draft_steps: int) -> None:
    if draft_steps != 1:
        raise DllmError(
            f"--draft-steps {draft_steps}: an autoregressive drafter drafts one token a forward",
            hint="--draft-steps refines DFlash drafters; leave it at 1 here",
        )


def _block_source(folder: str, block_size: int | None) -> str:
    """Where a drafter's block size comes from, as the user can check it."""
    if block_size is not None:
        return "--block-size"
    return f"block_size in {str(Path(folder) / 'config.json')!r}"


def _check_drafter_steps(folder: str, block_size: int | None, draft_steps: int) -> None:
    """`--draft-steps` against the drafter folder's config.json alone (a few bytes), before
    anything heavy loads or is hashed: the check `_DFlashProposer` makes once the drafter's
    weights are in memory (minutes for a real one), with the same message."""
    if draft_steps == 1:  # every drafter takes one forward a block
        return
    from turbo_dllm.families.base import read_hf_config
    from turbo_dllm.families.dflash.config import DFlashConfig

    hf = read_hf_config(Path(folder) / "config.json", what="drafter")
    if not str((hf.get("architectures") or ["?"])[0]).startswith("DFlash"):
        _check_autoregressive_draft_steps(draft_steps)
        return
    config = DFlashConfig.from_hf_dict(hf)
    _check_draft_steps(
        draft_steps,
        config.block_size if block_size is None else block_size,
        from_anchor=config.sample_from_anchor,
        dflash2=config.is_dflash2,
        block_source=_block_source(folder, block_size),
    )


class _AutoregressiveProposer:
    """A small causal LM drafting B - 1 tokens greedily, with its own KV cache; each draft's
    argmax feeds the next forward on the device (no host sync inside a block).

    With `target_vocab` (the target's embedding rows) the two tables may differ in size by
    padding over one tokenizer (`_check_autoregressive`): the drafter drafts only ids below
    both sizes (its logits past them are never chosen), and a token of the target's that the
    drafter has no row for (a padding id of the target's: the tokenizer defines none there)
    reaches it as its own last row, a padding id too."""

    target_layers = ()  # reads no target features

    def __init__(
        self, drafter, block_size: int, draft_steps: int = 1, target_vocab: int | None = None
    ) -> None:
        _check_autoregressive_draft_steps(draft_steps)
        self.drafter = drafter
        self.drafts = block_size - 1
        rows = drafter.get_input_embeddings().num_embeddings
        self.vocab = rows if target_vocab is None else min(rows, target_vocab)
        # the last id the drafter can read, where the target's tokens may lie past its table
        self.top = rows - 1 if target_vocab is not None and target_vocab > rows else None

    def _readable(self, ids: torch.Tensor) -> torch.Tensor:
        return ids if self.top is None else ids.clamp_max(self.top)

    def reset(self, prompt: torch.Tensor, layer_outputs) -> None:
        self.cache = None
        self.cached = 0
        self.pending = prompt  # tokens the drafter has not read yet

    def propose(self, last: torch.Tensor, length: int) -> torch.Tensor:
        pending = torch.cat([self.pending, last]) if self.pending.numel() else last
        proposal = []
        for _ in range(self.drafts):
            logits, self.cache, _ = _step(self.drafter, self._readable(pending), self.cache)
            self.cached += pending.numel()
            pending = logits[-1:, : self.vocab].argmax(-1)
            proposal.append(pending)
        return torch.cat(proposal)

    def accept(self, length: int, layer_outputs, verify: torch.Tensor, kept: int) -> None:
        # The cache may hold rejected drafts: keep the agreed prefix. The sequence's last
        # `kept + 1` tokens are verify[:kept] and the target's own next token; queue those up
        # to the last one that the drafter has not read (at most the last accepted draft).
        valid = min(self.cached, length - 1)
        _crop(self.cache, valid)
        self.cached = valid
        self.pending = verify[valid - (length - kept - 1) : kept]


def _speculative(
    target, proposer, prompt: torch.Tensor, new_tokens: int
) -> tuple[list[int], list[int]]:
    """(generated tokens, tokens gained per target forward). One host sync per target forward:
    the drafts and the target's choices come back together to count the agreed prefix."""
    logits, cache, hidden = _step(target, prompt, layers=proposer.target_layers)
    proposer.reset(prompt, hidden)
    last = logits[-1:].argmax(-1)
    sequence = prompt.tolist() + last.tolist()
    start = len(prompt)
    gains: list[int] = []
    while len(sequence) - start < new_tokens:
        drafts = proposer.propose(last, len(sequence))
        verify = torch.cat([last, drafts])
        logits, cache, hidden = _step(target, verify, cache, layers=proposer.target_layers)
        choices = logits.argmax(-1)  # choices[j]: the target's token after row j
        both = torch.cat([drafts, choices]).tolist()
        d = len(both) // 2
        drafted, chosen = both[:d], both[d:]
        accepted = 0
        while accepted < d and drafted[accepted] == chosen[accepted]:
            accepted += 1
        sequence += drafted[:accepted] + [chosen[accepted]]
        last = choices[accepted : accepted + 1]
        _crop(cache, len(sequence) - 1)  # rows up to the new last token's predecessor are final
        proposer.accept(len(sequence), hidden, verify, accepted + 1)
        gains.append(accepted + 1)
    return sequence[start : start + new_tokens], gains


def _check_dflash_drafter(
    folder: str, target_folder: str, target_config, allow_other_target: bool
) -> bool:
    """A DFlash drafter must fit the target's shape and, where its export records the target
    it was trained against (training_export.json's `target_fingerprint`), be evaluated against
    those weights: another target's tau says nothing of this drafter with its own (the decode
    stays lossless either way). True when the record names another target and
    `allow_other_target` lets it pass."""
    from turbo_dllm.families.base import read_hf_config
    from turbo_dllm.families.dflash.config import DFlashConfig, drafter_problems
    from turbo_dllm.families.dflash.runtime import require_target_weights

    config = DFlashConfig.from_hf_dict(read_hf_config(Path(folder) / "config.json", what="drafter"))
    problems = drafter_problems(config, target_config)
    if problems:
        raise DllmError(
            f"the drafter {folder!r} does not fit the target {target_folder!r}:\n"
            + "\n".join(f"  - {p}" for p in problems),
            hint="evaluate the drafter with the target it was distilled from",
        )
    require_target_weights("--target", target_folder)  # its fingerprint, its embeddings and head
    recorded = _recorded_target(folder)
    if (Path(folder) / "training_export.json").is_file():
        from turbo_dllm.families.dflash.export import verify_export

        # the files are those the record was written for (not a torn copy, an edited config)
        verify_export(folder)
    if recorded is None:
        return False  # a `dllm export` folder, or an export made before the record: shape only
    from turbo_dllm.families.dflash.target_identity import target_fingerprint

    # hashed once per process (memoized by the files' stamps): every drafter shares it
    actual = target_fingerprint(target_folder)
    if actual == recorded:
        return False
    if allow_other_target:
        return True
    raise DllmError(
        f"the drafter {folder!r} was trained against a target of fingerprint {recorded[:12]} "
        f"(its training_export.json), and --target {target_folder!r} holds other weights "
        f"(fingerprint {actual[:12]}): its tau against them is not the drafter's",
        hint="pass the target the drafter was trained against (a copy of it anywhere passes), "
        "or --allow-other-target to measure how it drafts for this one (still lossless)",
    )


def _recorded_target(folder: str) -> str | None:
    """The target fingerprint a `dllm dflash export` folder records, if any."""
    record = Path(folder) / "training_export.json"
    if not record.is_file():
        return None
    try:
        document = json.loads(record.read_text())
    except (OSError, ValueError) as error:
        raise DllmError(
            f"{str(record)!r} is unreadable ({error})",
            hint="re-export the drafter with `dllm dflash export`, or remove the file to "
            "evaluate it unchecked against the target",
        ) from None
    fingerprint = document.get("target_fingerprint") if isinstance(document, dict) else None
    return fingerprint if isinstance(fingerprint, str) and fingerprint else None


def _drafter(folder: str, target_folder: str, device, dtype, block_size: int | None = None):
    """(kind, model) for a drafter folder (checked by `_check_dflash_drafter` /
    `_check_autoregressive` first): a DFlash drafter or an autoregressive causal LM. A DFlash
    drafter given `block_size` (--block-size) is built for blocks of that size: a DFlash2
    drafter's block-local convolutions then span the block it drafts, as the serving engines'
    span the block they serve (not blocks of the size in its config.json)."""
    architecture = _architecture(folder)
    if architecture.startswith("DFlash"):
        import dataclasses

        from turbo_dllm.families.base import read_hf_config
        from turbo_dllm.families.dflash.config import DFlashConfig
        from turbo_dllm.families.dflash.runtime import build_model, materialize

        config = DFlashConfig.from_hf_dict(
            read_hf_config(Path(folder) / "config.json", what="drafter")
        )
        config = dataclasses.replace(
            config,
            target_path=target_folder,
            block_size=config.block_size if block_size is None else block_size,
        )
        model = materialize(build_model(config, None, dtype), device, seed=0, weights_from=folder)
        return "dflash", model.eval()
    return "autoregressive", _load_target(folder, device, dtype, "--drafter")


def evaluate(target: str, drafter: str, data: str, **options) -> SpeculativeReport:
    """Decode held-out prompts of `data` with the target alone and with `drafter`, and compare
    (`compare` with one drafter; the options are its)."""
    return compare(target, [drafter], data, **options)[0]


def compare(
    target: str,
    drafters: list[str],
    data: str,
    *,
    block_size: int | None = None,
    max_new_tokens: int = 64,
    num_prompts: int = 8,
    prompt_len: int = 32,
    device: str | None = None,
    dtype: str = "float32",
    strict: bool = True,
    draft_steps: int | list[int] = 1,
    progress=None,
    allow_other_target: bool = False,
) -> list[SpeculativeReport]:
    """Decode `num_prompts` held-out prompts of `data` with the target alone (once) and with
    each drafter, through the same forward and cache machinery, and compare; one report per
    drafter, each against the same target-alone run. With `strict` (the CLI), outputs that
    differ are an error, else the report says `lossless: false` and `first_mismatch` (a
    benchmark records it rather than losing the run). `draft_steps`: a DFlash drafter's
    forwards per block (`_DFlashProposer`), one for all or one per drafter. `progress(line)`:
    called as each decode starts and ends. A DFlash drafter whose export records another
    target than `target` is refused unless `allow_other_target` (its report then says
    `other_target`)."""
    from turbo_dllm.families.dflash import read_target_config
    from turbo_dllm.families.dflash.runtime import require_model_folder, resolve_device

    say = progress or (lambda line: None)
    if isinstance(draft_steps, int):
        draft_steps = [draft_steps] * len(drafters)
    if len(draft_steps) != len(drafters):
        raise ValueError(f"{len(draft_steps)} draft_steps for {len(drafters)} drafters")
    # before any work (the target's fingerprint reads every byte of it, the drafters load its
    # embeddings): fewer would fail deep in the decode loop (no prompt, no forward). The
    # prompt's own forward gives the first new token, so one new token leaves no verify forward
    # to measure tau over. `is None`, not `or`: --block-size 0 is refused, not read as the
    # drafter's own.
    for flag, value, least in [
        ("--max-new-tokens", max_new_tokens, 2),
        ("--num-prompts", num_prompts, 1),
        ("--prompt-len", prompt_len, 1),
        ("--block-size", 2 if block_size is None else block_size, 2),
        ("--draft-steps", min(draft_steps, default=1), 1),
    ]:
        if value < least:
            raise DllmError(
                f"{flag} must be at least {least} (got {value})",
                hint=f"pass {flag} {least} or more, or leave it out for the default",
            )
    for flag, folder in [("--target", target), *(("--drafter", d) for d in drafters)]:
        require_model_folder(flag, folder)
    for drafter, steps in zip(drafters, draft_steps, strict=True):
        _check_drafter_steps(drafter, block_size, steps)  # its config.json: before any weights
    torch_device = resolve_device(device)
    torch_dtype = getattr(torch, dtype)
    target_config = read_target_config(target)  # a readable target before any work
    # the data first (cheap), then each drafter (a recorded target fingerprint hashes the
    # target: seconds per GB), all before loading anything
    prompts = _prompts(data, target, target_config, num_prompts, prompt_len)
    if len(prompts) < num_prompts:  # the data holds fewer windows: said, and in the report
        print(
            f"warning: --num-prompts {num_prompts}, but --data {data!r} holds only "
            f"{len(prompts)} held-out prompts of {prompt_len} tokens (--prompt-len; each "
            f"followed by {prompt_len} tokens of its document): evaluating {len(prompts)}",
            file=sys.stderr,
        )
    others = []
    for drafter in drafters:
        _check_autoregressive(drafter, block_size, target, target_config, data)
        dflash = _architecture(drafter).startswith("DFlash")
        others.append(
            dflash and _check_dflash_drafter(drafter, target, target_config, allow_other_target)
        )
    _warn_past_context(target, target_config, drafters, block_size, prompt_len, max_new_tokens)
    models = [
        _drafter(drafter, target, torch_device, torch_dtype, block_size) for drafter in drafters
    ]
    blocks = [model.config.block_size if block_size is None else block_size for _, model in models]
    proposers = [
        _DFlashProposer(model, block, steps, _block_source(drafter, block_size))
        if kind == "dflash"
        else _AutoregressiveProposer(model, block, steps, target_config.vocab_size)
        for drafter, (kind, model), block, steps in zip(
            drafters, models, blocks, draft_steps, strict=True
        )
    ]
    prompts = [p.to(torch_device) for p in prompts]
    target_model = _load_target(target, torch_device, torch_dtype)

    def timed(fn):
        if torch_device.type == "cuda":
            torch.cuda.synchronize()
        start = time.perf_counter()
        result = fn()
        if torch_device.type == "cuda":
            torch.cuda.synchronize()
        return result, time.perf_counter() - start

    total = max_new_tokens * len(prompts)
    reports = []
    with torch.inference_mode():
        # one warm-up decode each (allocator, kernels), not timed
        _greedy_target(target_model, prompts[0], 2)
        for proposer in proposers:
            _speculative(target_model, proposer, prompts[0], 2)
        say(
            f"eval: {len(prompts)} prompts x {max_new_tokens} tokens, the target alone and "
            f"{len(proposers)} drafter(s) in turn on each"
        )
        # Interleaved prompt by prompt, so a host or GPU that speeds up or slows down during
        # the evaluation moves every decoder's time alike (one after the other, the last
        # drafter would see only the end of any drift).
        plain, plain_s = [], 0.0
        spec = [[] for _ in proposers]
        spec_s = [0.0 for _ in proposers]
        for prompt in prompts:
            tokens, seconds = timed(
                lambda prompt=prompt: _greedy_target(target_model, prompt, max_new_tokens)
            )
            plain.append(tokens)
            plain_s += seconds
            for i, proposer in enumerate(proposers):
                result, seconds = timed(
                    lambda proposer=proposer, prompt=prompt: _speculative(
                        target_model, proposer, prompt, max_new_tokens
                    )
                )
                spec[i].append(result)
                spec_s[i] += seconds
        say(f"eval: target alone {total / plain_s:.1f} tokens/s")
        for i, ((kind, _), block) in enumerate(zip(models, blocks, strict=True)):
            report = _report(kind, block, plain, plain_s, spec[i], spec_s[i], max_new_tokens)
            report.prompts_requested = num_prompts
            if kind == "dflash":
                report.draft_steps = draft_steps[i]
                report.other_target = others[i]
            say(
                f"eval: {kind} drafter tau {report.tau:.2f}, "
                f"{report.speculative_tokens_per_s:.1f} tokens/s ({report.speedup:.2f}x)"
            )
            if not report.lossless and strict:
                first = report.first_mismatch
                raise DllmError(
                    f"speculative decoding changed the output of prompt {first}: "
                    f"{json.dumps(plain[first][:16])} vs {json.dumps(spec[i][first][0][:16])}",
                    hint="the target's greedy choices must not depend on how many tokens a "
                    "forward checks; evaluate in float32 (--dtype float32)",
                )
            reports.append(report)
    return reports


def _prompts(data: str, target: str, target_config, count: int, length: int):
    """The held-out prompts of the `--data` artifact, which must be the target's text: data
    tokenized with another tokenizer than the one saved in the target folder (the dflash
    family's input rule) is refused, and so is a prompt id outside the target's vocabulary
    (an index error inside its embedding)."""
    from turbo_dllm.data.artifact import read_manifest
    from turbo_dllm.families.dflash.features import tokenizer_mismatch

    problem = tokenizer_mismatch(data, read_manifest(data), target)
    if problem is not None:
        raise DllmError(
            f"--data {problem}",
            hint="evaluate on held-out text prepared with the target's tokenizer",
        )
    prompts = held_out_prompts(data, count=count, length=length)
    top = max(int(p.max()) for p in prompts)
    if top >= target_config.vocab_size:
        raise DllmError(
            f"--data {data!r} holds token id {top}, outside the vocabulary of the target {target!r} "
            f"({target_config.vocab_size} ids): it was tokenized for another model",
            hint="evaluate on held-out text prepared with the target's tokenizer",
        )
    return prompts


def _warn_past_context(
    target: str, target_config, drafters: list[str], block_size, prompt_len: int, new_tokens: int
) -> None:
    """A decode whose positions run past the target's max_position_embeddings measures a target
    outside the context it was trained for (transformers goes on without a word; a rope-scaled
    target may mean to): said on stderr, before anything loads."""
    from turbo_dllm.families.base import read_hf_config
    from turbo_dllm.families.dflash.config import DFlashConfig

    limit = getattr(target_config, "max_position_embeddings", None)
    drafts = 0
    for drafter in drafters:  # the last verify forward reaches past the last new token
        hf = read_hf_config(Path(drafter) / "config.json", what="drafter")
        if str((hf.get("architectures") or ["?"])[0]).startswith("DFlash"):
            config = DFlashConfig.from_hf_dict(hf)
            block = config.block_size if block_size is None else block_size
            drafts = max(drafts, block if config.sample_from_anchor else block - 1)
        elif block_size is not None:
            drafts = max(drafts, block_size - 1)
    positions = prompt_len + new_tokens + drafts - 1
    if limit is None or positions <= limit:
        return
    print(
        f"warning: --prompt-len {prompt_len} + --max-new-tokens {new_tokens} (+ {drafts} drafted "
        f"tokens in the last verify forward) may reach {positions} positions, past the target's "
        f"max_position_embeddings {limit} ({str(Path(target) / 'config.json')!r}): tau there "
        "measures the target outside its trained context",
        file=sys.stderr,
    )


def _check_autoregressive(
    drafter: str, block_size: int | None, target: str, target_config, data: str
) -> None:
    """An autoregressive drafter needs a block size and the target's tokenizer: the same ids for
    the same text. Where both folders hold a tokenizer (loaded as `tokenizer.path` is, compared by
    vocabulary as `--data` is against the target), they must be one vocabulary or one extending
    the other (added tokens). Embedding tables of other sizes pass only where that shows: one
    tokenizer padded to two sizes (Qwen2.5-0.5B: 151,936 rows, Qwen2.5-7B: 152,064, over one
    tokenizer of 151,665 ids), every id it defines a row of both tables; the drafter then
    drafts below the smaller size only (`_AutoregressiveProposer`). A target folder without a
    tokenizer leaves `--data`'s (the target's text, `_prompts`) to compare the drafter's with:
    a drafter of another tokenizer only ever had its drafts rejected (tau 1, lossless)."""
    if _architecture(drafter).startswith("DFlash"):
        return
    from turbo_dllm.data.tokenizers import _vocab_sha256, folder_vocabulary, vocabulary_fits
    from turbo_dllm.families.base import read_hf_config

    if block_size is None:
        raise DllmError("an autoregressive drafter has no block size", hint="pass --block-size B")
    vocab = read_hf_config(Path(drafter) / "config.json", what="drafter").get("vocab_size")
    rows = target_config.vocab_size
    theirs, ours = folder_vocabulary(target), folder_vocabulary(drafter)
    if theirs is not None and ours is not None:
        t, d = set(theirs), set(ours)
        if not (t <= d or d <= t):
            raise DllmError(
                f"the drafter {drafter!r} has another tokenizer than the target {target!r} "
                f"(vocabulary sha256 {_vocab_sha256(ours)[:12]}, the target's "
                f"{_vocab_sha256(theirs)[:12]}): its token ids would be other text to the target",
                hint="a drafter must share the target's tokenizer",
            )
    if theirs is None and ours is not None:
        from turbo_dllm.data.artifact import read_manifest

        prepared = read_manifest(data).tokenizer
        if not vocabulary_fits(data, prepared.vocab_sha256, ours):
            raise DllmError(
                f"the drafter {drafter!r} has another tokenizer (vocabulary sha256 "
                f"{_vocab_sha256(ours)[:12]}) than --data {data!r} was prepared with "
                f"({prepared.kind}, {prepared.vocab_sha256[:12]}; the target {target!r} holds "
                "no tokenizer, so --data stands for its text): its token ids would be other text "
                "to the target",
                hint="a drafter must share the target's tokenizer",
            )
    if vocab == rows:
        return
    if theirs is None or ours is None:
        missing = drafter if ours is None else target
        raise DllmError(
            f"the drafter's vocabulary ({vocab}) is not the target's ({rows}), and "
            f"{missing!r} holds no tokenizer to show that they share one (tables of one "
            "tokenizer padded to other sizes are accepted)",
            hint="save the tokenizer in both folders (tokenizer.save_pretrained), or evaluate "
            "a drafter of the target's vocabulary",
        )
    top = max(i for _, i in [*theirs, *ours])
    if not isinstance(vocab, int) or top >= min(vocab, rows):
        raise DllmError(
            f"the drafter's vocabulary ({vocab}) and the target's ({rows}) differ by more than "
            f"padding: their tokenizer defines ids up to {top}, past the smaller table",
            hint="a drafter must hold a row for every token of the target's tokenizer",
        )


def _influence(tokens: list[int], forwards: list[int]) -> list[float]:
    """Each prompt's first-order share of the error of log(tau), tau = sum(tokens) /
    sum(forwards) (the delta method for a ratio of sums): mean(influence) = 0, and
    stderr(log tau) = sqrt(sum(influence^2) / (k (k - 1))) over k prompts."""
    tau = sum(tokens) / sum(forwards)
    mean_tokens = sum(tokens) / len(tokens)
    return [(x - tau * n) / mean_tokens for x, n in zip(tokens, forwards, strict=True)]


def _stderr(influence: list[float]) -> float | None:
    k = len(influence)
    return (sum(z * z for z in influence) / (k * (k - 1))) ** 0.5 if k > 1 else None


def tau_ratio_stderr(a: SpeculativeReport, b: SpeculativeReport) -> float | None:
    """The standard error of a.tau / b.tau for two drafters evaluated on the same prompts
    (paired: a prompt that is easy for both moves both taus, and cancels in the ratio)."""
    if len(a.prompt_forwards) != len(b.prompt_forwards):
        raise ValueError("the two reports did not decode the same prompts")
    paired = [
        za - zb
        for za, zb in zip(
            _influence(a.prompt_tokens, a.prompt_forwards),
            _influence(b.prompt_tokens, b.prompt_forwards),
            strict=True,
        )
    ]
    error = _stderr(paired)
    return None if error is None else a.tau / b.tau * error


def _report(kind, block, plain, plain_s, spec, spec_s, max_new_tokens) -> SpeculativeReport:
    lossless = all(a == b for a, (b, _) in zip(plain, spec, strict=True))
    gains = [g for _, per_prompt in spec for g in per_prompt]
    prompt_tokens = [sum(per_prompt) for _, per_prompt in spec]
    prompt_forwards = [len(per_prompt) for _, per_prompt in spec]
    error = _stderr(_influence(prompt_tokens, prompt_forwards))
    tau = sum(gains) / len(gains)
    total = max_new_tokens * len(plain)
    report = SpeculativeReport(
        drafter_kind=kind,
        block_size=block,
        prompts=len(plain),
        new_tokens=total,
        target_forwards=len(gains),
        tau=tau,
        target_tokens_per_s=total / plain_s,
        speculative_tokens_per_s=total / spec_s,
        speedup=plain_s / spec_s,
        lossless=lossless,
        accepted_histogram=dict(Counter(gains)),
        tau_stderr=None if error is None else tau * error,
        prompt_tokens=prompt_tokens,
        prompt_forwards=prompt_forwards,
    )
    if not lossless:
        first = next(i for i, (a, (b, _)) in enumerate(zip(plain, spec, strict=True)) if a != b)
        report.first_mismatch = first
    return report
