"""Rows of the [x_t ; x_0] stream whose outputs nothing reads are not computed.

A model's output matters only at the positions its loss scores, and the block-diffusion mask
says who reads whom (`layout`: clean never sees noise). So two kinds of work are dead and a
family may skip them:

- `CLEAN_HALF`: every scored position is clean (the autoregressive objective): no clean query
  ever reads a noisy key, so the noisy half is dead in every layer. The model takes the clean
  half alone, L rows with their positions and a clean-by-clean mask; nothing in the model
  changes. Half the work of that objective. With whole sequences on a rank
  (`train.parallel.plan.WholeSequence`), and under CSBP / the CP baseline the clean stream
  alone, sharded over the context group (`ContextParallel.clean_half`).
- `LAST_LAYER_QUERIES`: every scored position is noisy (block diffusion, Fast-dLLM v2): the
  clean half is read as keys and values by every layer's noisy queries, except the last
  layer's, whose clean outputs go only to the loss, which reads none. The model's mask is then a
  `LastLayerQueries`: the last layer computes queries, attention, output projection and MLP for
  the first `queries` rows only (keys and values still for all). About half a layer. Whole
  sequences, and under CSBP / the CP baseline each rank's noisy rows (`ContextParallel`).

A family declares the trims its model takes in its runtime's `STREAM_TRIMS`; the trainer drops
them under sequence parallelism (each tp rank holds a slice of the rows, not the first ones).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

__all__ = ["CLEAN_HALF", "LAST_LAYER_QUERIES", "LastLayerQueries"]

CLEAN_HALF = "clean_half"
LAST_LAYER_QUERIES = "last_layer_queries"


@dataclass(frozen=True)
class LastLayerQueries:
    """A model's mask when its last layer computes only the first `queries` stream rows."""

    every: Any  # every other layer's mask (queries and keys: the whole stream)
    last: Any  # the last layer's: queries the first `queries` rows, keys the whole stream
    queries: int
