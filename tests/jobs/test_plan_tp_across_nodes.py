"""A tensor-parallel group that spans nodes is warned of in the plan (not refused), with the
fix. Before, `--set topology.tp=2 --nnodes 2 --nproc-per-node 1` planned each tp pair across two
nodes without a word: tp all-reduces in every layer, so such a job crawls."""

from __future__ import annotations

import json

import pytest

MULTI_NODE = ("--master-addr", "10.0.0.1", "--node-rank", "0", "--run-dir", "r", "--dry-run")


def _launch(cli, spec_file, *args):
    result = cli("launch", "--config", spec_file, *args, *MULTI_NODE)
    assert result.code == 0, result.err
    as_json = cli("launch", "--config", spec_file, *args, *MULTI_NODE, "--json")
    assert as_json.code == 0, as_json.err
    return result.out, json.loads(as_json.out)["plan"]["notes"]


def test_a_tp_group_across_nodes_is_warned_of_with_the_fix(cli, spec_file):
    out, notes = _launch(
        cli, spec_file, "--set", "topology.tp=2", "--nnodes", "2", "--nproc-per-node", "1"
    )
    [note] = [n for n in notes if n.startswith("tp:")]
    assert "tp=2 spans nodes (1 process(es) per node)" in note
    assert "all-reduces" in note and "very slow" in note
    assert "tp <= --nproc-per-node" in note
    assert "e.g. --nnodes 1 --nproc-per-node 2" in note  # the same 2 processes, tp on one node
    assert f"note         {note}" in out.splitlines()


@pytest.mark.parametrize(
    "args",
    [
        (
            "--set",
            "topology.tp=2",
            "--set",
            "topology.dp=2",
            "--nnodes",
            "2",
            "--nproc-per-node",
            "2",
        ),
        ("--set", "topology.dp=2", "--nnodes", "2", "--nproc-per-node", "1"),
    ],
    ids=["tp-inside-each-node", "no-tp"],
)
def test_tp_inside_a_node_gets_no_such_note(cli, spec_file, args):
    _, notes = _launch(cli, spec_file, *args)
    assert not [n for n in notes if n.startswith("tp:")], notes
