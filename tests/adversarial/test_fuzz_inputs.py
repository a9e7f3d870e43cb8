"""Fuzz every input a user hands `dllm`: RunSpecs, prepare configs, records, artifact manifests.

Over a thousand generated inputs, mostly broken and some hostile (aliases, deep nesting, huge
integers, NUL, lone surrogates, random bytes), go through the CLI entry in-process. Each must end
with exit 0 (the input was valid) or exit 2 with a `dllm: error:` line, never an exception; the
examples are derandomized (the same on every run) and small, and the process's peak memory may
grow only a little over the whole run.
"""

from __future__ import annotations

import contextlib
import io
import json
import resource
import shutil
import tempfile
from datetime import timedelta
from pathlib import Path

import numpy as np
import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.data.helpers import prepare_config, write_config, write_jsonl


def fuzz(examples: int) -> settings:
    """The same generated examples on every run, at most `examples` of them, none slow."""
    return settings(
        max_examples=examples,
        derandomize=True,
        database=None,
        deadline=timedelta(seconds=5),
        suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
    )


MAX_RSS_GROWTH_MIB = 400


def run_cli(*argv) -> tuple[int, str]:
    """`dllm ARGV` in-process: (exit code, stderr). Any exception is a failed example."""
    from turbo_dllm.cli import main

    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            code = main([str(a) for a in argv])
        except SystemExit as exit_:  # argparse
            code = exit_.code if isinstance(exit_.code, int) else 1
    return code, err.getvalue()


def assert_clean_outcome(code: int, err: str, failed_check: bool = False) -> None:
    """Exit 0, or 2 with `dllm: error:`; with `failed_check` (a command that checks, such as
    `dllm data validate`) also 1 with its `fix:` on stderr. Never a traceback."""
    assert code in ((0, 1, 2) if failed_check else (0, 2)), (code, err)
    assert "Traceback" not in err
    if code == 2:
        assert err.startswith(("dllm: error:", "usage:")), err
    if code == 1:
        assert err.startswith("fix: "), err


@pytest.fixture(autouse=True)
def bounded_peak_memory():
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    yield
    grown_mib = (resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before) / 1024
    assert grown_mib < MAX_RSS_GROWTH_MIB, f"peak memory grew by {grown_mib:.0f} MiB"


@pytest.fixture(autouse=True)
def offline(monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")


@contextlib.contextmanager
def scratch():
    folder = Path(tempfile.mkdtemp(prefix="dllm-fuzz-"))
    try:
        yield folder
    finally:
        shutil.rmtree(folder, ignore_errors=True)


def write_text(path: Path, text: str) -> Path:
    # surrogatepass: a lone surrogate becomes bytes that are not UTF-8, which readers must refuse
    path.write_bytes(text.encode("utf-8", errors="surrogatepass"))
    return path


# --- strategies ---------------------------------------------------------------------------------

_any_char = st.characters(codec=None, categories=None)  # NUL and lone surrogates included
_hostile_ints = st.one_of(
    st.integers(-5, 70000),
    st.integers(),
    st.sampled_from([2**31, 2**63, 2**64, -(2**63) - 1, 10**30]),
)
_scalars = st.one_of(
    st.none(),
    st.booleans(),
    _hostile_ints,
    st.floats(allow_nan=True),
    st.text(alphabet=_any_char, max_size=12),
    st.sampled_from(["qwen3", "prod", "flex", "cosine", "jsonl", "text", "byte_level", "auto"]),
)


def _values(keys: list[str]):
    return st.recursive(
        _scalars,
        lambda inner: st.one_of(
            st.lists(inner, max_size=3), st.dictionaries(st.sampled_from(keys), inner, max_size=4)
        ),
        max_leaves=12,
    )


def _nested(depth: int) -> str:
    return "[" * depth + "1" + "]" * depth


def _alias_chain(levels: int, width: int) -> str:
    parts = ["&a0 [x]"] + [
        f"&a{i} [" + ", ".join([f"*a{i - 1}"] * width) + "]" for i in range(1, levels)
    ]
    return "[" + ", ".join(parts) + "]"


# A value written as raw YAML text: what a generated structure cannot express.
_raw_yaml_values = st.one_of(
    st.integers(1, 300).map(_nested),
    st.builds(_alias_chain, st.integers(1, 12), st.integers(1, 9)),
    st.sampled_from(
        [
            "&r [*r]",
            "*undefined",
            "!!python/object:os.system {}",
            "!!binary '%%%'",
            "2026-13-45",
            '"\\0"',
            '"\\ud800"',
            "9" * 5000,
            "0x" + "f" * 100,
            "1e99999",
            "{a: 1, a: 2}",
            "[1, 2",
            "\t- tab",
            "? [a]\n: b",
        ]
    ),
    st.text(alphabet=st.characters(categories=["L", "N", "P", "S", "Zs"]), max_size=30),
)


def _yaml_document(sections: list[str], fields: list[str]):
    """A YAML text: a dumped structure, plus raw hostile values under random keys."""
    structure = st.dictionaries(st.sampled_from(sections), _values(fields), max_size=6)
    raw = st.lists(st.tuples(st.sampled_from(sections + fields), _raw_yaml_values), max_size=3)

    def render(document, extra) -> str:
        text = yaml.safe_dump(document, allow_unicode=True) if document else ""
        return text + "".join(f"{key}: {value}\n" for key, value in extra)

    structured = st.builds(render, structure, raw)
    unstructured = st.one_of(
        st.text(alphabet=_any_char, max_size=200),
        st.binary(max_size=200).map(lambda b: b.decode("latin-1")),
    )
    return st.integers(0, 5).flatmap(lambda i: unstructured if i == 0 else structured)


# --- RunSpecs -----------------------------------------------------------------------------------

_RUNSPEC_SECTIONS = [
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
    "<<",
    "bogus",
]
_RUNSPEC_FIELDS = [
    "seed",
    "kind",
    "family",
    "name",
    "path",
    "from_config",
    "block_size",
    "seq_len",
    "steps",
    "micro_batch_size",
    "dp",
    "fsdp",
    "cp",
    "bp",
    "tp",
    "sp",
    "lr",
    "betas",
    "synthetic",
    "num_sequences",
    "vocab_size",
    "artifact",
    "dir",
    "run_dir",
    "resume",
    "config_overrides",
    "x",
]
_override_keys = st.lists(
    st.sampled_from(_RUNSPEC_SECTIONS + _RUNSPEC_FIELDS), min_size=1, max_size=4
).map(".".join)
_PLAUSIBLE_OVERRIDES = [
    "training.steps=5",
    "launch.seed=3",
    "launch.kind=prod",
    "model.from_config=tiny",
    "model.attention=flex",
    "objective.block_size=8",
    "objective.name=fast_dllm_v2",
    "data.seq_len=64",
    "data.synthetic.vocab_size=300",
    "topology.dp=2",
    "topology.cp=2",
    "topology.tp=2",
    "topology.sp=true",
    "optimizer.betas=[0.9, 0.99]",
    "checkpoint.resume=never",
    "kernels=native",
]
_overrides = st.lists(
    st.one_of(
        st.sampled_from(_PLAUSIBLE_OVERRIDES),
        st.builds(
            lambda k, v: f"{k.split('=')[0]}={v}",
            st.sampled_from(_PLAUSIBLE_OVERRIDES),
            _raw_yaml_values,
        ),
        st.builds(lambda k, v: f"{k}={v}", _override_keys, _raw_yaml_values),
        st.text(alphabet=st.characters(codec="utf-8", exclude_characters="\x00"), max_size=20),
    ),
    max_size=3,
)


@fuzz(350)
@given(
    text=_yaml_document(_RUNSPEC_SECTIONS, _RUNSPEC_FIELDS),
    overrides=_overrides,
    world_size=st.one_of(st.none(), st.integers(-2, 2**40)),
)
def test_fuzz_runspecs(text, overrides, world_size):
    with scratch() as folder:
        config = write_text(folder / "train.yaml", text)
        argv = ["config", "validate", "--config", config]
        for item in overrides:
            argv += ["--set", item]
        if world_size is not None:
            argv += ["--world-size", world_size]
        assert_clean_outcome(*run_cli(*argv))


# --- prepare configs ----------------------------------------------------------------------------

_PREPARE_SECTIONS = [
    "source",
    "records",
    "tokenizer",
    "supervision",
    "packing",
    "output",
    "on_error",
    "workers",
    "bogus",
]
_PREPARE_FIELDS = [
    "kind",
    "paths",
    "path",
    "unit",
    "dtype",
    "document_separator_id",
    "field",
    "prompt_field",
    "completion_field",
    "loss_mask_field",
    "mask_token",
    "mask_token_id",
    "special_tokens_in_text",
    "seq_len",
    "block_size",
    "align",
    "overflow",
    "separator",
    "prepend_bos",
    "overwrite",
    "x",
]
_kinds = {
    "source": st.sampled_from(["jsonl", "text", "token_ids", "parquet", "huggingface", "jsnl"]),
    "records": st.sampled_from(["text", "chat", "prompt_completion", "tokens", "txt"]),
    "tokenizer": st.sampled_from(["byte_level", "huggingface", "bytes"]),
}


@st.composite
def _prepare_documents(draw):
    """A prepare document near the valid ones: real kinds, sometimes good values, often not."""
    document = {
        "source": {"kind": "jsonl", "paths": ["data.jsonl"]},
        "tokenizer": {"kind": "byte_level"},
        "packing": {"seq_len": 64, "block_size": 8},
        "output": {"path": "out", "overwrite": True},
        "workers": 1,
    }
    for section, kinds in _kinds.items():
        if draw(st.integers(0, 2)) == 0:
            fields = draw(st.dictionaries(st.sampled_from(_PREPARE_FIELDS), _scalars, max_size=2))
            document[section] = {"kind": draw(kinds), **fields}
    if draw(st.integers(0, 2)) == 0:  # else only the kinds and their fields vary
        for section in draw(st.lists(st.sampled_from(_PREPARE_SECTIONS), max_size=2)):
            document[section] = draw(_values(_PREPARE_FIELDS))
    if document.get("workers") == "auto" or (
        isinstance(document.get("workers"), int) and document["workers"] > 1
    ):
        document["workers"] = 1  # a process pool per example would be slow, not more thorough
    source = document.get("source")
    if isinstance(source, dict) and source.get("kind") == "huggingface":
        source.pop("name", None)  # only local folders: no Hub lookups
        source.pop("data_files", None)
        source["path"] = "no-such-dataset"
    return document


@fuzz(250)
@given(document=_prepare_documents(), overrides=st.lists(_override_keys.map(lambda k: f"{k}=1")))
def test_fuzz_prepare_configs(document, overrides):
    with scratch() as folder:
        write_jsonl(folder / "data.jsonl", [{"text": "hello", "input_ids": [1, 2]}])
        (folder / "data.txt").write_text("plain text\n")
        config = write_text(folder / "prepare.yaml", yaml.safe_dump(document, allow_unicode=True))
        argv = ["data", "prepare", "--config", config]
        for item in overrides[:2]:
            argv += ["--set", item]
        assert_clean_outcome(*run_cli(*argv))


# --- records ------------------------------------------------------------------------------------

_json_values = st.recursive(
    st.one_of(
        st.none(),
        st.booleans(),
        _hostile_ints,
        st.floats(allow_nan=False),
        st.text(alphabet=_any_char, max_size=10),
    ),
    lambda inner: st.one_of(
        st.lists(inner, max_size=4),
        st.dictionaries(
            st.sampled_from(["text", "messages", "role", "content", "prompt", "completion"]),
            inner,
            max_size=4,
        ),
    ),
    max_leaves=10,
)
_records = st.fixed_dictionaries(
    {},
    optional={
        "text": _json_values,
        "prompt": _json_values,
        "completion": _json_values,
        "input_ids": st.lists(_hostile_ints, max_size=6),
        "loss_mask": st.lists(st.integers(-1, 2), max_size=6),
        "messages": st.lists(
            st.fixed_dictionaries(
                {
                    "role": st.sampled_from(["user", "assistant", "system", 3]),
                    "content": _json_values,
                }
            ),
            max_size=3,
        ),
    },
)


def _dump(record) -> bytes:
    return json.dumps(record).encode()  # ensure_ascii: surrogates become \udXXX escapes


_lines = st.one_of(
    _records.map(_dump),
    _json_values.map(_dump),
    st.binary(max_size=40),
    st.integers(1, 3000).map(lambda n: b"[" * n),
    st.sampled_from(
        [
            b'{"text": "\\ud800"}',
            b'\xef\xbb\xbf{"text": "bom"}',
            b'{"text": "a\x00b"}',
            b'{"text": "<|endoftext|>"}',
            b'{"input_ids": [' + b"9" * 5000 + b"]}",
            b"",
            b"\r",
        ]
    ),
)


@fuzz(300)
@given(
    lines=st.lists(_lines, min_size=1, max_size=6),
    records=st.sampled_from(
        [
            ({"kind": "text"}, "full"),
            ({"kind": "chat"}, "full"),
            ({"kind": "chat"}, "assistant_only"),
            ({"kind": "prompt_completion"}, "completion_only"),
            ({"kind": "tokens"}, "full"),
            ({"kind": "tokens", "loss_mask_field": "loss_mask"}, "provided"),
        ]
    ),
    on_error=st.sampled_from(["stop", "skip"]),
    packing=st.sampled_from(
        [
            {"seq_len": 16, "block_size": 8},
            {"seq_len": 8, "block_size": 8, "overflow": "truncate", "prepend_bos": True},
            {"seq_len": 8, "block_size": 4, "overflow": "reject", "align": "none"},
        ]
    ),
    gz=st.booleans(),
)
def test_fuzz_records(lines, records, on_error, packing, gz):
    import gzip

    chat = [{"role": "user", "content": "q"}, {"role": "assistant", "content": "a"}]
    good = {"text": "t", "prompt": "p", "completion": "c", "messages": chat, "input_ids": [1]}
    good["loss_mask"] = [1]
    with scratch() as folder:
        data = b"\n".join([_dump(good), *lines]) + b"\n"
        name = "data.jsonl.gz" if gz else "data.jsonl"
        (folder / name).write_bytes(gzip.compress(data) if gz else data)
        config = write_config(
            folder,
            source={"kind": "jsonl", "paths": [name]},
            records=records[0],
            supervision=records[1],
            on_error=on_error,
            packing=packing,
        )
        assert_clean_outcome(*run_cli("data", "prepare", "--config", config))


def _npy(ids: list[int], dtype: str, rows: int) -> bytes:
    array = np.array(ids, dtype=np.int64).astype(dtype)
    if rows > 1 and len(ids) % rows == 0:
        array = array.reshape(rows, -1)
    buffer = io.BytesIO()
    np.save(buffer, array, allow_pickle=False)
    return buffer.getvalue()


_id_files = st.one_of(
    st.binary(max_size=64),
    st.lists(st.integers(-(2**63), 2**63 - 1), max_size=8).map(
        lambda ids: np.array(ids, dtype="<i8").tobytes()
    ),
    st.builds(
        _npy,
        st.lists(st.integers(0, 2**16), max_size=8),
        st.sampled_from(["int8", "uint16", "uint64", "int64", "float32"]),
        st.integers(1, 3),
    ),
)


@fuzz(150)
@given(
    content=_id_files,
    suffix=st.sampled_from([".npy", ".bin", ".jsonl", ".jsonl.gz", ".txt"]),
    dtype=st.sampled_from([None, "uint16", "uint32", "int32", "int64"]),
    separator=st.one_of(st.none(), st.integers(0, 300)),
)
def test_fuzz_token_id_files(content, suffix, dtype, separator):
    with scratch() as folder:
        (folder / f"ids{suffix}").write_bytes(content)
        source = {
            "kind": "token_ids",
            "paths": [f"ids{suffix}"],
            "document_separator_id": separator,
        }
        if dtype is not None:
            source["dtype"] = dtype
        config = write_config(folder, source=source)
        assert_clean_outcome(*run_cli("data", "prepare", "--config", config))


# --- artifact manifests -------------------------------------------------------------------------


@pytest.fixture(scope="module")
def artifact(tmp_path_factory):
    folder = tmp_path_factory.mktemp("fuzz-artifact")
    write_jsonl(folder / "data.jsonl", [{"text": "hello world"}, {"text": "more"}] * 3)
    return prepare_config(write_config(folder, packing={"seq_len": 16, "block_size": 8})).path


def _paths(node, prefix=()):
    """Every path into a JSON document (dict keys and list positions)."""
    yield prefix
    if isinstance(node, dict):
        for key, value in node.items():
            yield from _paths(value, (*prefix, key))
    elif isinstance(node, list):
        for index, value in enumerate(node):
            yield from _paths(value, (*prefix, index))


def _set(document, path, value):
    if not path:
        return value
    node = document
    for part in path[:-1]:
        node = node[part]
    if value is _DELETE:
        del node[path[-1]]
    else:
        node[path[-1]] = value
    return document


_DELETE = object()
_manifest_values = st.one_of(
    st.just(_DELETE),
    _hostile_ints,
    st.sampled_from([0, -1, 1, 2, 16, 2**40, 2**63, "tokens.bin", "../x", "uint8", "int64"]),
    st.lists(_hostile_ints, max_size=3),
    _json_values,
)


@fuzz(300)
@given(
    data=st.data(),
    command=st.sampled_from(
        [("inspect",), ("inspect", "--n", "2", "--start", "1"), ("stats",), ("validate",)]
    ),
    scramble_index=st.booleans(),
)
def test_fuzz_artifact_manifests(artifact, data, command, scramble_index):
    with scratch() as folder:
        copy = folder / "artifact"
        shutil.copytree(artifact, copy)
        manifest = json.loads((copy / "manifest.json").read_text())
        paths = [p for p in _paths(manifest) if p]
        for _ in range(data.draw(st.integers(0, 3))):
            path = data.draw(st.sampled_from(paths))
            try:
                manifest = _set(manifest, path, data.draw(_manifest_values))
            except (KeyError, IndexError, TypeError):
                pass  # an earlier change removed or replaced what the path ran through
        if data.draw(st.integers(0, 9)) == 0:
            (copy / "manifest.json").write_bytes(data.draw(st.binary(max_size=80)))
        else:
            (copy / "manifest.json").write_text(json.dumps(manifest))
        if scramble_index:
            size = (copy / "documents.bin").stat().st_size
            raw = data.draw(st.binary(min_size=size, max_size=size))
            (copy / "documents.bin").write_bytes(raw)
        # validate's damaged artifact is a failed check (exit 1), the others' a refusal (2)
        assert_clean_outcome(
            *run_cli("data", *command, copy), failed_check=command[0] == "validate"
        )
