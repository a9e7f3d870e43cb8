"""docs/parallelism.md read as a new user: what `dllm doctor` and `dllm config validate` say
about a topology that cannot run, and the fix each gives."""

from __future__ import annotations

import json

import pytest

from tests.jobs import conftest as jobs

# The job tests' small qwen3 RunSpec (tests/jobs/conftest.py), written into a fresh working
# folder; its sequences are made 128 tokens long here, the length the refusals below count from.
workdir = jobs.workdir
spec_file = jobs.spec_file
SEQ = ("--set", "data.seq_len=128")


def _checks(result) -> dict[str, dict]:
    return {check["name"]: check for check in json.loads(result.out)["checks"]}


def test_doctor_judges_a_process_count_in_its_world_size_check(cli, spec_file):
    """`dllm doctor --world-size 3` for cp = 2: the RunSpec is valid (config passes) and the
    world size check fails with the launch flags that fit. It was the config check that failed,
    with the fix `dllm config validate --config ...` (which says the file is valid), and the
    world size check said it had not run."""
    result = cli(
        "doctor",
        "--config",
        "train.yaml",
        *SEQ,
        "--set",
        "topology.cp=2",
        "--world-size",
        "3",
        "--json",
    )
    assert result.code == 1
    checks = _checks(result)
    assert checks["config"]["status"] == "pass", checks["config"]
    world = checks["world size"]
    assert world["status"] == "fail"
    assert "launch starts 3 processes" in world["detail"]
    assert "--nproc-per-node 2" in world["fix"]
    assert "--nproc-per-node 4 --set topology.dp=2" in world["fix"]


def test_a_huge_process_count_is_refused_at_once(cli_process, spec_file):
    """`--nproc-per-node 1099511627777` for cp = 2: refused (exit 2) with the nearest counts
    that fit. The fixes were found by scanning every count from 1099511627776 down to 1: the
    launch never returned."""
    result = cli_process(
        "launch",
        "--config",
        "train.yaml",
        *SEQ,
        "--set",
        "topology.cp=2",
        "--nproc-per-node",
        str(2**40 + 1),
        "--dry-run",
        cwd=spec_file.parent,
        timeout=60,
    )
    assert result.code == 2, result.err
    assert f"--nproc-per-node {2**40} --set topology.dp={2**39}" in result.err
    assert f"--nproc-per-node {2**40 + 2} --set topology.dp={2**39 + 1}" in result.err


GEMMA = ("model.family=diffusion_gemma",)
SP_UNEVEN = (
    *("data.seq_len=36", "objective.block_size=3"),
    *("topology.bp=2", "topology.tp=2", "topology.sp=true"),
)
REFUSALS = [
    # (the --set values refused, what the refusal names as the change, a change it names)
    (("data.seq_len=120",), "block_size (16; nearest: 112 or 128)", "data.seq_len=128"),
    (
        ("topology.tp=2", "topology.sp=true", "topology.bp=3"),
        "must be a multiple of max(cp, bp) x tp = 6 (nearest that are whole blocks too: 96 or 144",
        "data.seq_len=144",
    ),
    (
        # bp 2 over 12 blocks of 3: the ranks hold 54 and 45 stream tokens; tp 2 cannot halve
        # 45 (the run aborted in gloo: 'Received data size doesn't match expected size')
        SP_UNEVEN,
        "hold 54, 45 tokens (block size 3), and 45 does not split: data.seq_len 24 or 48",
        "data.seq_len=48",
    ),
    (("topology.tp=3",), "the tp degrees up to 8 that split this model: 1, 2", "topology.tp=2"),
    (("topology.cp=3",), "a multiple of 96 (nearest: 96 or 192)", "data.seq_len=192"),
    (("topology.bp=8",), "(topology.bp <= 4, or data.seq_len >= 256)", "topology.bp=4"),
    (("topology.bp=8",), "(topology.bp <= 4, or data.seq_len >= 256)", "data.seq_len=256"),
    (
        ("topology.cp=2", "topology.bp=3"),
        "(with cp = 2: bp = 2 or 4; or a cp that divides bp)",
        "topology.bp=4",
    ),
    (
        ("topology.ep=2",),
        "set topology.ep: 1 (model families with ep: diffusion_gemma)",
        "topology.ep=1",
    ),
    (
        (*GEMMA, "topology.ep=2"),
        "ep = 1, or more ranks (e.g. topology.fsdp = 2)",
        "topology.fsdp=2",
    ),
    ((*GEMMA, "topology.tp=2"), "set topology.tp: 1 (model families with tp: ", "topology.tp=1"),
]


@pytest.mark.parametrize(("refused", "names", "change"), REFUSALS)
def test_a_refused_topology_names_a_change_that_validates(cli, spec_file, refused, names, change):
    """Each layout rule's refusal (exit 2) says what to change, and that change validates. They
    said what was wrong only: 'num_key_value_heads = 2 is not divisible by topology.tp = 3',
    'needs at least 16 blocks, got 8', 'ep is not supported here: expert parallelism needs a
    mixture-of-experts family'."""
    sets = [arg for value in refused for arg in ("--set", value)]
    result = cli("config", "validate", "--config", "train.yaml", *SEQ, *sets)
    assert result.code == 2
    assert names in result.err, result.err
    fixed = cli("config", "validate", "--config", "train.yaml", *SEQ, *sets, "--set", change)
    assert fixed.code == 0, fixed.err


def test_sp_on_a_family_without_it_is_one_problem(cli, spec_file):
    """diffusion_gemma refuses sp: one problem, not that one and 'sequence parallelism needs
    topology.tp > 1' besides (tp is refused there too)."""
    result = cli(
        "config",
        "validate",
        "--config",
        "train.yaml",
        *SEQ,
        "--set",
        *GEMMA,
        "--set",
        "topology.sp=true",
    )
    assert result.code == 2
    assert "has 1 problem:" in result.err and "set topology.sp: false" in result.err


def test_tp_with_ep_on_a_family_without_tp_is_one_problem(cli, spec_file):
    """diffusion_gemma has ep, not tp: tp 2 with ep 2 is the tp refusal alone. It was that and
    'ep combines with dp, fsdp, cp and bp (tp = 1)' at topology.ep besides."""
    sets = ("--set", *GEMMA, "--set", "topology.tp=2", "--set", "topology.ep=2")
    result = cli(
        "config", "validate", "--config", "train.yaml", *SEQ, *sets, "--set", "topology.dp=2"
    )
    assert result.code == 2
    assert "has 1 problem:" in result.err and "topology.tp: tp is not supported" in result.err


@pytest.mark.parametrize(
    ("seq_len", "block", "cp", "bp"),
    [
        (36, 3, 1, 2),
        (256, 16, 2, 2),
        (240, 16, 1, 2),
        (36, 1, 1, 2),
        (80, 16, 1, 2),
        (112, 16, 1, 3),
        (35, 5, 1, 3),
        (192, 16, 2, 4),
        (240, 16, 1, 3),
    ],
)
def test_the_validated_stream_shares_are_the_layouts(seq_len, block, cp, bp):
    """The torch-free share sizes that the sp rule checks are the ranks' real ones."""
    from turbo_dllm.config.topology import context_stream_lengths
    from turbo_dllm.train.parallel.layout import CsbpLayout

    held = [CsbpLayout.build(seq_len, block, bp, cp, rank) for rank in range(bp)]
    assert context_stream_lengths(seq_len, block, cp, bp) == [
        layout.num_noisy + layout.num_clean for layout in held
    ]


def test_a_huge_tp_is_refused_at_once(cli_process, spec_file):
    """The tp degrees a refusal names are looked for up to 8 only: they were looked for up to
    the tp given, one family check each, so `topology.tp=1099511627777` never returned."""
    result = cli_process(
        "config",
        "validate",
        "--config",
        "train.yaml",
        *SEQ,
        "--set",
        f"topology.tp={2**40 + 1}",
        cwd=spec_file.parent,
        timeout=60,
    )
    assert result.code == 2, result.err
    assert "the tp degrees up to 8 that split this model: 1, 2" in result.err


def test_the_sp_share_rule_is_quick_at_the_longest_sequence(cli_process, spec_file):
    """The autoregressive stream's blocks are single tokens: at seq_len 4194294 the shares were
    found by dealing its 4M blocks, 1.5 s a length, for the length itself and each of the 128
    lengths tried for the fix (minutes); they are in closed form now."""
    sets = (
        *("data.seq_len=4194294", "objective.name=autoregressive"),
        *("topology.bp=3", "topology.tp=2", "topology.sp=true"),
    )
    args = [arg for value in sets for arg in ("--set", value)]
    result = cli_process(
        "config",
        "validate",
        "--config",
        "train.yaml",
        *SEQ,
        *args,
        cwd=spec_file.parent,
        timeout=60,
    )
    assert result.code == 2, result.err
    assert "hold 5592392, 4893343, 4194294 tokens (block size 1)" in result.err
    assert "data.seq_len 4194288 or 4194300 splits evenly" in result.err
