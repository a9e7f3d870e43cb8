"""The trainer's warning about graph breaks in the step that compiles the layers."""

from __future__ import annotations

from collections import Counter

import torch

from turbo_dllm.train.graph_breaks import graph_break_counts, graph_break_warning


def _broken(x: torch.Tensor) -> torch.Tensor:
    x = x + 1
    torch._dynamo.graph_break()
    return x * 2


def test_a_graph_break_in_compiled_code_is_reported_with_its_reason():
    torch._dynamo.reset()
    before = graph_break_counts()
    assert graph_break_warning(before, graph_break_counts(), checkpointing=True) is None
    torch.compile(_broken, backend="eager")(torch.ones(3))
    warning = graph_break_warning(before, graph_break_counts(), checkpointing=True)
    assert warning is not None
    assert "1 graph break " in warning and "graph_break" in warning.lower()
    assert "runs that whole layer eagerly" in warning


def test_the_warning_counts_only_new_breaks_and_names_the_most_frequent():
    before = Counter({"old reason": 5})
    after = Counter({"old reason": 5, "Unsupported thing\n  Explanation: long": 3, "other": 1})
    warning = graph_break_warning(before, after, checkpointing=False)
    assert "4 graph breaks" in warning and "2 reasons" in warning
    assert "most frequent: Unsupported thing)" in warning
    assert "splits a compiled graph" in warning
    assert graph_break_warning(after, after, checkpointing=False) is None


def test_the_trainer_warns_when_a_checkpointed_layer_breaks_the_graph(
    tmp_path, monkeypatch, capsys
):
    """A layer that cannot be traced in one piece (here: an MLP with a forced break) under
    compile and activation checkpointing: the first step's warning says so, once."""
    from tests.train.util import tiny_spec
    from turbo_dllm.families.decoder import model as decoder_model
    from turbo_dllm.train.entry import train

    forward = decoder_model.MLP.forward

    def broken_forward(self, x):
        torch._dynamo.graph_break()
        return forward(self, x)

    monkeypatch.setattr(decoder_model.MLP, "forward", broken_forward)
    torch._dynamo.reset()
    spec = tiny_spec(
        "training.steps=2",
        "training.compile=true",
        "training.activation_checkpointing=true",
        "checkpoint.interval=null",
    )
    train(spec, tmp_path / "run")
    warnings = [line for line in capsys.readouterr().err.splitlines() if "graph break" in line]
    assert len(warnings) == 1, warnings
    assert "runs that whole layer eagerly" in warnings[0]
