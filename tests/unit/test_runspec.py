"""RunSpec rules, and a property test: any document yields a spec or a DllmError, nothing else."""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from turbo_dllm.config.load import apply_overrides, load_model, load_runspec
from turbo_dllm.config.runspec import RunSpec
from turbo_dllm.config.validate import check, problems
from turbo_dllm.errors import DllmError


def spec(**sections) -> RunSpec:
    return load_model(RunSpec, sections, "test")


def paths(s: RunSpec, world_size=None) -> set[str]:
    return {p.path for p in problems(s, world_size)}


def test_defaults_are_valid():
    assert problems(RunSpec()) == []


def test_unavailable_capabilities_are_rejected_by_name(monkeypatch):
    from turbo_dllm import registry

    # Every family and objective the product defines has landed: plan two more.
    monkeypatch.setattr(
        registry, "PLANNED", {"family": ("next_family",), "objective": ("next_objective",)}
    )
    with pytest.raises(DllmError) as error:
        spec(model={"family": "next_family"}, objective={"name": "next_objective"})
    lines = str(error.value).splitlines()
    assert any("model.family" in m and "not available in this version" in m for m in lines)
    assert any("objective.name" in m and "not available in this version" in m for m in lines)


def test_objective_must_suit_family(monkeypatch):
    from dataclasses import replace

    from turbo_dllm import registry

    # Every landed objective trains the decoders: narrow one family to see the rule work.
    narrow = replace(registry.FAMILIES["qwen3"], objectives=("block_diffusion",))
    monkeypatch.setitem(registry.FAMILIES, "qwen3", narrow)
    found = problems(spec(model={"family": "qwen3"}, objective={"name": "fast_dllm_v2"}))
    assert [p.path for p in found] == ["objective.name"]
    assert "cannot train model family 'qwen3' (allowed: block_diffusion)" in str(found[0])


def test_a_field_only_another_objective_reads_is_refused_not_ignored():
    """objective.self_conditioning_probability under block_diffusion, a DFlash loss under
    fast_dllm_v2: the run's objective never reads them, so a value there was silently ignored.
    Their defaults stay accepted (a run dir's spec.yaml spells out every default)."""
    found = problems(
        spec(objective={"name": "block_diffusion", "self_conditioning_probability": 0.2,
                        "encoder_loss_weight": 0.5})
    )  # fmt: skip
    assert [p.path for p in found] == [
        "objective.self_conditioning_probability",
        "objective.encoder_loss_weight",
    ]
    assert "only diffusiongemma_sft reads it" in found[0].message
    found = problems(spec(objective={"name": "fast_dllm_v2", "dflash_loss": "greedy_ce"}))
    assert [p.path for p in found] == ["objective.dflash_loss"]
    assert "this run's objective is fast_dllm_v2" in found[0].message
    every_default = RunSpec().objective.model_dump()
    assert problems(spec(objective=every_default)) == []


def test_bp_cp_layout_rule():
    s = spec(topology={"cp": 4, "bp": 2}, data={"seq_len": 1024, "synthetic": {}})
    assert "topology.bp" in paths(s)


def test_world_size_is_product_of_degrees():
    s = spec(topology={"dp": 2, "fsdp": 2, "tp": 2})
    assert s.topology.world_size == 8
    assert "topology" in paths(s, world_size=4)
    assert "topology" not in paths(s, world_size=8)


def test_prod_rules():
    s = spec(launch={"kind": "prod"}, kernels="jit")
    assert {"data.artifact", "model.path", "kernels"} <= paths(s)
    pinned = spec(
        launch={"kind": "prod"},
        model={"path": "/m", "from_config": None, "revision": "main"},
        data={"artifact": "/d"},
    )
    assert "model.revision" in paths(pinned)


def test_exactly_one_model_source_and_data_source():
    both = spec(model={"path": "/m", "from_config": "tiny"}, data={"artifact": "/a", "synthetic": {}})
    assert {"model", "data"} <= paths(both)
    message = next(p.message for p in problems(both) if p.path == "model")
    assert "model.from_config=null" in message
    neither = spec(model={"from_config": None})
    assert "model" in paths(neither)


def test_a_model_folder_alone_starts_from_it_not_from_the_tiny_preset(tmp_path):
    # `path: DIR` is the whole request; the preset is the default of a spec naming no weights.
    folder = spec(model={"path": "/m"})
    assert folder.model.from_config is None and "model" not in paths(folder)
    assert spec().model.from_config == "tiny"
    # Through a YAML file and --set, as a user writes it.
    config = tmp_path / "train.yaml"
    config.write_text("model: {family: qwen3, path: /m}\n")
    assert load_runspec(str(config)).model.from_config is None
    assert load_runspec(str(config), ["model.path=/n"]).model.path == "/n"


def test_check_lists_every_problem():
    s = spec(objective={"block_size": 7}, topology={"sp": True}, scheduler={"warmup_steps": 999})
    with pytest.raises(DllmError) as info:
        check(s)
    text = info.value.message
    assert "3 problems" in text  # sp needs tp > 1
    for path in ("data.seq_len", "topology.sp", "scheduler.warmup_steps"):
        assert path in text


def test_sequence_parallel_rules():
    ok = spec(topology={"tp": 2, "sp": True})
    assert "topology.sp" not in paths(ok)
    uneven = spec(
        data={"seq_len": 200}, objective={"block_size": 8}, topology={"tp": 3, "sp": True}
    )
    assert "topology.sp" in paths(uneven)  # 200 tokens do not split over max(cp, bp) x tp = 3
    chunked = spec(topology={"tp": 2, "sp": True}, training={"mlp_chunks": 2})
    assert "topology.sp" not in paths(chunked)  # pieces are gathered one at a time


def test_turbo_attention_needs_head_dim_64_or_128():
    tiny = spec(model={"attention": "turbo"})  # the tiny preset has head dim 32
    (problem,) = [p for p in problems(tiny) if p.path == "model.attention"]
    assert "head dim 64 or 128" in problem.message and "32" in problem.message
    qwen = spec(model={"attention": "turbo", "from_config": "qwen3-0.6b"})
    assert "model.attention" not in paths(qwen)  # head dim 128 (the bundle is doctor's check)


def test_apply_overrides_creates_sections_and_parses_scalars():
    doc = apply_overrides(
        {"training": {"steps": 1}}, ["training.steps=5", "topology.tp=2", "launch.name=null"]
    )
    assert doc == {"training": {"steps": 5}, "topology": {"tp": 2}, "launch": {"name": None}}


def test_relative_paths_are_the_configs_folders_wherever_dllm_runs(tmp_path, monkeypatch):
    """`checkpoint.resume: ../runs/a/checkpoints` was kept as written while every other path was
    made absolute against the config's folder: it was looked up from the working directory
    (another folder than the config's data.artifact beside it), and the manifest recorded it
    relative, so a replay from elsewhere resumed from another folder, or failed."""
    from turbo_dllm.config.load import load_runspec

    config = tmp_path / "configs" / "train.yaml"
    config.parent.mkdir()
    config.write_text(
        "data: {synthetic: {}, seq_len: 64}\nobjective: {block_size: 16}\n"
        "launch: {run_dir: ../runs/b}\n"
        "checkpoint: {dir: ckpt, resume: ../runs/a/checkpoints}\n"
    )
    monkeypatch.chdir(tmp_path / "configs")
    here = load_runspec("train.yaml")
    monkeypatch.chdir("/")
    elsewhere = load_runspec(config)
    for loaded in (here, elsewhere):
        assert loaded.checkpoint.resume == str(tmp_path / "runs" / "a" / "checkpoints")
        assert loaded.checkpoint.dir == str(tmp_path / "configs" / "ckpt")
        assert loaded.launch.run_dir == str(tmp_path / "runs" / "b")
    for word in ("auto", "never"):
        assert load_runspec(config, [f"checkpoint.resume={word}"]).checkpoint.resume == word


def test_white_space_around_an_override_key_is_no_part_of_it():
    """`--set "training.steps = 3"` was refused as `' training: unknown key; did you mean
    'training'?`, naming the section it wrote."""
    doc = apply_overrides({}, [" training.steps = 3", "optimizer . lr=0.1"])
    assert doc == {"training": {"steps": 3}, "optimizer": {"lr": 0.1}}
    with pytest.raises(DllmError, match="bad override 'training.st eps=3'"):
        apply_overrides({}, ["training.st eps=3"])


def test_override_into_a_value_is_an_error():
    with pytest.raises(DllmError):
        apply_overrides({"kernels": "native"}, ["kernels.x=1"])


_SECTIONS = [
    "launch",
    "model",
    "objective",
    "data",
    "training",
    "topology",
    "optimizer",
    "scheduler",
    "checkpoint",
    "logging",
    "profiler",
    "kernels",
    "bogus",
]
_FIELDS = [
    "seed",
    "kind",
    "family",
    "name",
    "block_size",
    "seq_len",
    "steps",
    "dp",
    "cp",
    "bp",
    "tp",
    "sp",
    "ep",
    "lr",
    "warmup_steps",
    "synthetic",
    "artifact",
    "path",
    "x",
]
_scalars = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(-5, 70000),
    st.floats(allow_nan=True),
    st.text(max_size=8),
    st.sampled_from(["qwen3", "prod", "flex", "cosine"]),
)
_values = st.recursive(
    _scalars,
    lambda inner: st.one_of(
        st.lists(inner, max_size=3), st.dictionaries(st.sampled_from(_FIELDS), inner, max_size=4)
    ),
    max_leaves=12,
)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.one_of(st.dictionaries(st.sampled_from(_SECTIONS), _values, max_size=6), _values))
def test_random_documents_give_spec_or_dllm_error(document):
    try:
        check(load_model(RunSpec, document, "random.yaml"), source="random.yaml")
    except DllmError as error:
        assert error.message.startswith("random.yaml")


@pytest.mark.parametrize(
    "sections,field",
    [
        ({"optimizer": {"lr": float("inf")}}, "optimizer.lr"),
        ({"training": {"max_duration_s": float("nan")}}, "training.max_duration_s"),
        ({"data": {"seq_len": 2**31}}, "data.seq_len"),
        ({"launch": {"seed": 2**64 - 1}}, "launch.seed"),
        ({"model": {"config_overrides": {f"k{i}": i for i in range(300)}}}, "config_overrides"),
    ],
)
def test_values_past_any_sane_bound_are_refused(sections, field):
    with pytest.raises(DllmError, match=field):
        spec(**sections)


def test_a_path_starting_with_a_tilde_is_the_home_folder_as_in_a_shell(tmp_path, monkeypatch):
    """`model.path: ~/models/x` was taken as a folder named `~` beside the config."""
    from turbo_dllm.config.load import load_runspec

    home = tmp_path / "home"
    monkeypatch.setenv("HOME", str(home))
    config = tmp_path / "configs" / "train.yaml"
    config.parent.mkdir()
    config.write_text(
        "data: {artifact: ~/data/prepared, seq_len: 64}\nobjective: {block_size: 16}\n"
        "checkpoint: {dir: ~/ckpt, resume: ~nosuchuser/ckpt}\n"
    )
    spec = load_runspec(config)
    assert spec.data.artifact == str(home / "data" / "prepared")
    assert spec.checkpoint.dir == str(home / "ckpt")
    # a ~name of no user on this machine stays a name, as in a shell
    assert spec.checkpoint.resume == str(tmp_path / "configs" / "~nosuchuser" / "ckpt")


def test_prepare_yaml_paths_expand_the_tilde_the_same_way(tmp_path, monkeypatch):
    """prepare.yaml expanded `~` already, but `~name` of no user here raised a RuntimeError
    traceback (pathlib's expanduser) from `dllm data prepare`."""
    from turbo_dllm.data.spec import load_prepare_spec

    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    config = tmp_path / "prepare.yaml"
    config.write_text(
        "source: {kind: jsonl, paths: [~/a.jsonl, ~nosuchuser/b.jsonl]}\n"
        "tokenizer: {kind: byte_level}\npacking: {seq_len: 64, block_size: 16}\n"
        "output: {path: out}\n"
    )
    spec = load_prepare_spec(config)
    assert spec.source.paths == [
        str(tmp_path / "home" / "a.jsonl"),
        str(tmp_path / "~nosuchuser" / "b.jsonl"),
    ]
