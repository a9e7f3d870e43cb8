"""DFlash2's hard-label losses: slot weights (`dflash`, D-PACE) and the candidate selector's loss.

Per scored slot k of a block (gold token y_k, the drafter's unary logits z_k):
- token loss: w_k * CE(z_k, y_k), through the frozen head in row chunks (no [N, V] logits);
- selector loss: w_k * CE over the k candidates (top-k of z_k) of unary + pair score, the pair
  score's predecessor being the gold token before y_k (the anchor's token before the first
  slot); only slots whose gold token is among the candidates count.

Weights w_k, by `dflash_loss`:
- `dflash`: the objective's slot decay (exp(-(k-1)/gamma), 0 where unsupervised);
- D-PACE, from the drafter's own gold probabilities p_j, detached: a slot is accepted with
  s_j = (1 - alpha) p_j + alpha (s_j = 1 where unsupervised), the block up to slot k with
  prefix_k = prod_{j<=k} s_j, and
  `dpace` w_k = sum_{j>=k} prefix_j mask_j (the expected accepted tokens from slot k on),
  `dpace-cumulative-confidence-only` w_k = prefix_k,
  `dpace-continuation-value-only` w_k = (sum_{j>=k} prefix_j mask_j) / prefix_k;
  all times mask_k. The D-PACE weights replace the decay.
With `greedy_path` the gold token is the target's greedy token instead, and only slots on its
greedy path count (w_k = 0 elsewhere; D-PACE's mask is the path), as `greedy_ce` does for DFlash.
The sum (token + selector_weight x selector) is what the output hook returns; the trainer divides
it by the global count of supervised slots, as for every objective (the original divides by the
global sum of the weights instead).
"""

from __future__ import annotations

import torch

from turbo_dllm.train.losses import _even_chunks, default_chunk_size, linear_cross_entropy

__all__ = ["dpace_weights", "gold_probability_and_topk", "hard_label_loss", "selector_loss"]


def _softcap(logits: torch.Tensor, cap: float | None) -> torch.Tensor:
    return logits if cap is None else cap * torch.tanh(logits / cap)


@torch.no_grad()
def gold_probability_and_topk(
    hidden: torch.Tensor,
    weight: torch.Tensor,
    targets: torch.Tensor,
    top_k: int,
    *,
    softcap: float | None = None,
    chunk_size: int | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """(n,) float32 softmax probability of each row's gold token and (n, top_k) ids of its
    largest logits (softcap(hidden @ weight^T)), walked in row chunks."""
    n = hidden.shape[0]
    if chunk_size is None:
        chunk_size = _even_chunks(n, default_chunk_size(weight.shape[0], element_size=8))
    probability = torch.empty(n, dtype=torch.float32, device=hidden.device)
    ids = torch.empty(n, top_k, dtype=torch.long, device=hidden.device)
    for start in range(0, n, chunk_size):
        end = min(start + chunk_size, n)
        logits = _softcap((hidden[start:end] @ weight.t().to(hidden.dtype)).float(), softcap)
        gold = logits.gather(1, targets[start:end, None])[:, 0]
        probability[start:end] = torch.exp(gold - torch.logsumexp(logits, dim=-1))
        ids[start:end] = logits.topk(top_k, dim=-1).indices
    return probability, ids


def dpace_weights(
    kind: str, probability: torch.Tensor, supervised: torch.Tensor, alpha: float
) -> torch.Tensor:
    """(blocks, B) D-PACE weights from (blocks, B) gold probabilities and supervised slots."""
    mask = supervised.to(probability.dtype)
    accept = torch.where(supervised, (1.0 - alpha) * probability + alpha, 1.0)
    prefix = accept.cumprod(dim=1)
    continuation = (prefix * mask).flip(1).cumsum(1).flip(1)
    if kind == "dpace":
        weights = continuation
    elif kind == "dpace-cumulative-confidence-only":
        weights = prefix
    elif kind == "dpace-continuation-value-only":
        weights = continuation / prefix
    else:
        raise ValueError(f"not a D-PACE kind: {kind!r}")
    return weights * mask


def selector_loss(
    hidden: torch.Tensor,
    scaled: torch.Tensor,
    head: torch.Tensor,
    selector,
    predecessors: torch.Tensor,
    targets: torch.Tensor,
    candidates: torch.Tensor,
    weights: torch.Tensor,
    softcap: float | None,
) -> torch.Tensor:
    """sum_i w_i CE over row i's candidates of (unary + pair score), rows whose gold token is
    a candidate only. `scaled`: the hidden states the unary logits are made from.

    Every row is scored and the others are masked out, rather than selected: selecting them
    (`nonzero`) would stop the host until the GPU had caught up, once per step. The masked
    sum also reaches every selector weight when no row counts, so each rank's backward (and
    FSDP's gradient reduction) sees the same parameters."""
    hit = candidates == targets[:, None]
    present = hit.any(dim=1)
    unary = _softcap(
        torch.einsum("nh,nkh->nk", scaled, head[candidates].to(scaled.dtype)).float(), softcap
    )
    score = unary + selector.pair_scores(hidden, predecessors, candidates)
    gold = hit.float().argmax(dim=1)  # 0 where the gold token is no candidate (masked below)
    ce = torch.logsumexp(score, dim=-1) - score.gather(1, gold[:, None])[:, 0]
    return (torch.where(present, weights.to(ce.dtype), 0.0) * ce).sum()


def hard_label_loss(
    batch,
    hidden: torch.Tensor,
    head: torch.Tensor,
    drafter,
    *,
    labels: torch.Tensor | None = None,
    on_path: torch.Tensor | None = None,
) -> torch.Tensor:
    """The token + weighted selector loss of a DFlash2 drafter's scored slots (the output
    hook's sum; `hidden` (R, Q, H) the drafter's final hidden states). With `greedy_path` the
    caller passes the target's greedy tokens as `labels` and which slots are on its path
    (`on_path`, (n,) bool): the others weigh 0, and D-PACE counts only on-path slots as
    supervised (decoding never asks the rest)."""
    config = drafter.config
    targets = batch.targets if labels is None else labels
    flat = hidden.reshape(-1, hidden.shape[-1]).index_select(0, batch.score_index)
    scaled = drafter.scale_hidden(flat)
    cap = config.final_logit_softcapping
    probability, candidates = gold_probability_and_topk(
        scaled.detach(), head, targets, config.selector_top_k, softcap=cap
    )
    weights = batch.weights
    if batch.loss == "dflash":
        if on_path is not None:
            weights = weights * on_path
    else:
        b = batch.block_size
        blocks = hidden.shape[0] * (hidden.shape[1] // b)
        block, slot = batch.score_index // b, batch.score_index % b
        dense = torch.zeros(blocks, b, dtype=torch.float32, device=flat.device)
        supervised = torch.zeros(blocks, b, dtype=torch.bool, device=flat.device)
        dense[block, slot] = probability
        supervised[block, slot] = True if on_path is None else on_path
        weights = dpace_weights(batch.loss, dense, supervised, batch.dpace_alpha)[block, slot]
    total = linear_cross_entropy(scaled, head, targets, weights, softcap=cap)
    if batch.selector_weight > 0.0:
        predecessors = batch.context_ids.reshape(-1).index_select(0, batch.teacher_index)
        total = total + batch.selector_weight * selector_loss(
            flat,
            scaled,
            head,
            drafter.candidate_selector,
            predecessors,
            targets,
            candidates,
            weights,
            cap,
        )
    return total
