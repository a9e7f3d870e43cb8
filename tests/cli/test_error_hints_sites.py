"""The raise sites that printed only the generic hint (`dllm ... --help describes what it
takes`, tests/cli/test_error_hints.py) where a user is likely to meet them: bad RunSpec and
`--set` values, missing or unreadable files, data and tokenizer files, bundle targets and
environment locks. Each now says what to do.

`SITES` holds every one of them as (module, a fragment of its message, a fragment of its
hint), read from the source: removing or emptying such a hint fails this test. The tests below
it then meet a sample of them as a user would, to show the hint reaches the screen.
"""

from __future__ import annotations

import ast
import json
import os
from functools import cache
from pathlib import Path

import numpy as np
import pytest

from tests.helpers import assert_user_error

ROOT = Path(__file__).resolve().parents[2]

SITES = [
    # RunSpec and prepare.yaml files, --set overrides
    ("config/load.py", "not a config file", "pass the YAML config itself"),
    ("config/load.py", "cannot read config", "check that path and its permissions"),
    ("config/load.py", "the top level must be a mapping", "write each section as `name:`"),
    ("config/load.py", "nested deeper than", "a --set key is a field's path"),
    ("config/load.py", "is a value, not a section", "set it whole (--set"),
    ("config/load.py", "invalid document", "`dllm config schema` lists every field"),
    # model config.json files and model families
    ("families/base.py", "cannot read {}: {}", "download the model's config.json again"),
    ("families/base.py", "cannot read {}: {}", "check that file and its permissions"),
    ("families/base.py", "has a bad value", "set it with model.config_overrides"),
    ("families/nemotron_diffusion/config.py", "model, not", "set model.family to the family"),
    ("families/nemotron_diffusion/config.py", "rope_scaling is not an object", '"rope_type"'),
    ("families/qwen3_8/config.py", "model, not one of", "set model.family to the family"),
    ("families/qwen3_8/config.py", "needs a text_config object", "qwen3_5_text config.json"),
    ("families/diffusion_gemma/config.py", "text_config is not an object", "as Hugging Face"),
    ("families/qwen3_8/mask_token.py", "cannot load the tokenizer", "tokenizer files"),
    ("families/dflash/runtime.py", "topology.tp must be 1", "set topology.tp: 1"),
    ("families/diffusion_gemma/runtime.py", "does not combine cp and bp", "topology.bp: 1"),
    ("families/diffusion_gemma/runtime.py", "tensor parallelism", "set topology.tp: 1"),
    ("families/dflash/plan.py", "is not a multiple of cp", "set data.seq_len to a multiple"),
    ("families/dflash/plan.py", "offline features need data.artifact", "set data.artifact"),
    ("families/dflash/features.py", "not JSON", "dllm dflash prepare-features"),
    ("train/synthetic.py", "vocab_size must be at least 3", "data.synthetic.vocab_size"),
    ("train/export.py", "the checkpoint lacks", "export another checkpoint"),
    # data sources, artifacts and outputs
    ("data/loader.py", "holds no sequences", "prepare it again"),
    ("data/sources.py", "cannot read {}: {}", "check that path in source.paths"),
    ("data/sources.py", "not a readable parquet file", "own source.kind"),
    ("data/sources.py", "not a readable .npy array", "numpy.save(path, ids)"),
    ("data/sources.py", "not a .npy array (an .npz archive?)", "as its own .npy"),
    ("data/sources.py", "empty file (no token ids)", "leave that file out of source.paths"),
    ("data/sources.py", "expected a 1-D or 2-D integer array", "document_separator_id"),
    ("data/summary.py", "cannot load its tokenizer/", "dllm data validate"),
    ("data/writer.py", "output path {}: {}", "choose another output.path"),
    ("project_init.py", "exists and is not a folder", "dllm init DIR"),
    ("jobs/launcher.py", "cannot create run dir", "pass another --run-dir"),
    ("jobs/manifest.py", "a run dir holds one job", "launch into a new run dir"),
    # bundles, environments, kernels, mirrors, compile packs: the host's side
    ("bundles/target.py", "a CPU target has no GPU architectures", "drop the -smXX field"),
    ("bundles/target.py", "invalid bundle target: {}", "cp312-torch2.11-cpu-cxx11"),
    ("bundles/target.py", "second field", "cp312-torch2.11-cu130-cxx11"),
    ("bundles/target.py", "fourth field", "cp312-torch2.11-cu130-cxx11"),
    ("bundles/native.py", "unknown native op", "leave --op out"),
    ("bundles/publish.py", "belongs to release", "publish into a fresh --mirror"),
    ("bundles/install.py", "is the catalog of release", "dllm mirror verify"),
    ("envs/lock.py", "Python {} is not one of target", "pass --python-version with one"),
    ("envs/lock.py", "releases ({})", "pass --torch with one of"),
    ("envs/lock.py", "CUDA {} is not one of target", "pass --cuda with one of"),
    ("kernels/jit.py", "is not a number of seconds", "or unset it for the default"),
    ("kernels/jit.py", "no GPU is visible to nvidia-smi", "set kernels: native"),
    ("mirror/release.py", "two --manifest files", "one environment manifest per target"),
    ("mirror/create.py", "different project versions", "one turbo-dllm version"),
    ("cache/key.py", "torch is not installed", "dllm env sync"),
]


@cache
def _module(relative: str) -> ast.Module:
    return ast.parse((ROOT / "turbo_dllm" / relative).read_text(encoding="utf-8"))


def _text(node: ast.AST | None, module: ast.Module) -> str:
    """The text a message or hint expression shows, as far as the source says: its string
    parts (an f-string's fields as `{}`), module constants looked up by name."""
    if node is None:
        return ""
    if isinstance(node, ast.Constant):
        return node.value if isinstance(node.value, str) else ""
    if isinstance(node, ast.JoinedStr):
        return "".join(
            "{}" if isinstance(v, ast.FormattedValue) else _text(v, module) for v in node.values
        )
    if isinstance(node, ast.BinOp):
        return _text(node.left, module) + _text(node.right, module)
    if isinstance(node, ast.BoolOp):  # `os_error_hint(...) or "..."`: every alternative
        return " | ".join(_text(v, module) for v in node.values)
    if isinstance(node, ast.Name):
        for statement in module.body:
            targets = statement.targets if isinstance(statement, ast.Assign) else []
            if any(isinstance(t, ast.Name) and t.id == node.id for t in targets):
                return _text(statement.value, module)
    return ""


def _raised(relative: str) -> list[tuple[str, str]]:
    """(message, hint) of every `raise SomeError(message, hint)` in the module."""
    module = _module(relative)
    found = []
    for node in ast.walk(module):
        if not (isinstance(node, ast.Raise) and isinstance(node.exc, ast.Call)):
            continue
        call = node.exc
        message = call.args[0] if call.args else None
        hint = call.args[1] if len(call.args) > 1 else None
        for keyword in call.keywords:
            if keyword.arg == "message":
                message = keyword.value
            if keyword.arg == "hint":
                hint = keyword.value
        found.append((_text(message, module), _text(hint, module)))
    return found


@pytest.mark.parametrize(("relative", "message", "hint"), SITES)
def test_each_raise_site_keeps_its_specific_hint(relative, message, hint):
    sites = [(m, h) for m, h in _raised(relative) if message in m]
    assert sites, f"no raise in turbo_dllm/{relative} says {message!r}"
    assert all(h for _, h in sites), f"a raise of {message!r} in {relative} lost its hint"
    assert any(hint in h for _, h in sites), (relative, message, [h for _, h in sites])


# --- as a user meets them --------------------------------------------------------------------


def _hint_line(result) -> str:
    lines = [line for line in result.err.splitlines() if line.startswith("hint: ")]
    assert len(lines) == 1, result.err
    assert "describes what it takes" not in lines[0], result.err  # not the generic one
    return lines[0]


def test_runspec_file_and_set_errors_say_how_to_fix_them(cli, tmp_path):
    spec = tmp_path / "train.yaml"
    spec.write_text("- model\n- training\n")
    result = cli("config", "validate", "--config", spec)
    assert_user_error(result, "the top level must be a mapping of sections, not list")
    assert "write each section as `name:`" in _hint_line(result)

    spec.write_text("training: {steps: 2}\n")
    result = cli("config", "validate", "--config", spec, "--set", "training.steps.max=3")
    assert_user_error(result, "'steps' is a value, not a section")
    assert "set it whole (--set training.steps=VALUE)" in _hint_line(result)

    big = tmp_path / "big.yaml"
    big.write_bytes(b"#" * (4 << 20) + b"\n#\n")
    result = cli("config", "validate", "--config", big)
    assert_user_error(result, "larger than 4 MiB; not a config file")
    assert "pass the YAML config itself" in _hint_line(result)


@pytest.mark.parametrize(
    ("text", "message", "hint"),
    [
        (
            "training: {steps: 2}\ntraining: {lr: 1}\n",
            "duplicate key 'training'",
            "write training:",
        ),
        ("launch: {seed: 99999999999999999999999}\n", "out of range", "fits in 64 bits"),
        ("launch: {name: 2026-13-45}\n", "invalid date", "quote it to keep it as text"),
        ("a: &x [*x]\n", "lies inside its own anchor", "write that value out"),
        ('launch: {name: "a\\0b"}\n', "a NUL character", "remove it"),
        ("a: " + "[" * 70 + "]" * 70 + "\n", "nested deeper than 64", "check the indentation"),
    ],
    ids=["duplicate", "big-int", "date", "recursive", "nul", "deep"],
)
def test_yaml_a_config_may_not_hold_says_what_to_write(cli, tmp_path, text, message, hint):
    """The bounded loader's refusals (config/bounded_yaml.py) named the line and the problem,
    with the generic hint."""
    spec = tmp_path / "train.yaml"
    spec.write_text(text)
    result = cli("config", "validate", "--config", spec)
    assert_user_error(result, message)
    assert hint in _hint_line(result)


def test_token_id_files_prepare_cannot_read_say_what_to_do(cli, tmp_path):
    np.savez(tmp_path / "ids.npy", a=np.arange(5))  # an .npz written under an .npy name
    os.replace(tmp_path / "ids.npy.npz", tmp_path / "ids.npy")
    (tmp_path / "empty.bin").write_bytes(b"")
    np.save(tmp_path / "floats.npy", np.zeros(4, np.float32))
    cases = {
        "ids.npy": ("not a .npy array (an .npz archive?)", "as its own .npy"),
        "empty.bin": ("empty file (no token ids)", "leave that file out of source.paths"),
        "floats.npy": ("expected a 1-D or 2-D integer array", "document_separator_id"),
    }
    for name, (message, hint) in cases.items():
        config = tmp_path / f"{name}.yaml"
        source = {"kind": "token_ids", "paths": [name], "dtype": "uint16"}
        config.write_text(
            json.dumps(
                {
                    "source": source if name.endswith(".bin") else {**source, "dtype": None},
                    "tokenizer": {"kind": "byte_level"},
                    "packing": {"seq_len": 16, "block_size": 8},
                    "output": {"path": f"out-{name}"},
                }
            )
        )
        result = cli("data", "prepare", "--config", config)
        assert_user_error(result, message)
        assert hint in _hint_line(result), name


def test_a_bad_bundle_target_shows_how_one_is_written(cli, tmp_path):
    for target, said in [
        ("cp311-t2.13-cpu-cxx11-linux_x86_64", "second field 't2.13'"),
        ("cp311-torch2.13-cpu-gnu-linux_x86_64", "fourth field 'gnu'"),
        ("cp311-torch2.13-cpu-cxx11-linux_x86_64-sm90", "a CPU target has no GPU"),
    ]:
        result = cli("bundle", "install", "--target", target, "--mirror", tmp_path, "--dry-run")
        assert_user_error(result, said)
        hint = _hint_line(result)
        assert "cp312-torch2.11-cpu-cxx11-linux_x86_64" in hint, hint


def test_a_project_folder_that_is_a_file(cli, tmp_path):
    (tmp_path / "project").write_text("")
    result = cli("init", tmp_path / "project")
    assert_user_error(result, "exists and is not a folder")
    assert "dllm init DIR" in _hint_line(result)


def test_model_and_family_errors_name_the_field_to_change(tmp_path):
    from turbo_dllm.errors import DllmError
    from turbo_dllm.families.base import read_hf_config
    from turbo_dllm.families.dflash import runtime as dflash
    from turbo_dllm.families.diffusion_gemma import runtime as gemma
    from turbo_dllm.train.synthetic import SyntheticLoader

    (tmp_path / "config.json").write_text('{"model_type": "qwen3", ')  # cut short
    with pytest.raises(DllmError) as error:
        read_hf_config(tmp_path / "config.json", what="model folder")
    assert "download the model's config.json again" in error.value.hint
    with pytest.raises(DllmError) as error:
        dflash.check_tensor_parallel(None, 2)
    assert "set topology.tp: 1" in error.value.hint
    with pytest.raises(DllmError) as error:
        gemma.check_tensor_parallel(None, 2)
    assert "set topology.tp: 1" in error.value.hint
    with pytest.raises(DllmError) as error:
        SyntheticLoader(vocab_size=2, num_sequences=4, seq_len=8, micro_batch_size=1)
    assert "data.synthetic.vocab_size to 3 or more" in error.value.hint


# --- bundle archives, catalogs and mirrors (tests/bundles/test_archive_hints.py meets them) ----

BUNDLE_SITES = [
    ("bundles/archive.py", "is an absolute path", "rebuild it with `dllm bundle build`"),
    ("bundles/archive.py", "climbs out of the bundle", "rebuild it with `dllm bundle build`"),
    ("bundles/archive.py", "member {}; refusing to extract", "rebuild it with `dllm bundle build`"),
    ("bundles/archive.py", "{}: {}; refusing to extract", "ask its publisher for one built so"),
    ("bundles/archive.py", "unpacks to {} bytes", "a decompression bomb?"),
    ("bundles/archive.py", "-file cap on a bundle", "a bundle holds a few dozen files"),
    ("bundles/archive.py", "cap on expansion", "do not use it"),
    ("bundles/archive.py", "the first member must be", "rebuild it with `dllm bundle build`"),
    ("bundles/archive.py", "is larger than 1 MiB", "rebuild it with `dllm bundle build`"),
    ("bundles/archive.py", "bundles hold only regular files", "ask its publisher"),
    ("bundles/archive.py", "appears twice", "rebuild it with `dllm bundle build`"),
    ("bundles/archive.py", "is not listed in", "rebuild it with `dllm bundle build`"),
    ("bundles/archive.py", "bytes, {} says {}", "copy it again whole"),
    ("bundles/archive.py", "has sha256 {}", "copy it again whole"),
    ("bundles/archive.py", "empty archive", "copy it again whole"),
    ("bundles/archive.py", "archive lacks listed files", "copy it again whole"),
    ("bundles/archive.py", "cannot extract member", "point DLLM_HOME at another file system"),
    ("bundles/targuard.py", "tar headers (the cap)", "a bundle holds a few dozen files"),
    ("bundles/targuard.py", "bundles hold only regular files", "another tar program"),
    ("bundles/targuard.py", "two pax headers in a row", "writes only short pax headers"),
    ("bundles/targuard.py", "-byte pax header, over", "writes only short pax headers"),
    ("bundles/targuard.py", "a malformed pax record", "writes only short pax headers"),
    ("bundles/targuard.py", "is not allowed in a bundle", "writes only short pax headers"),
    ("bundles/targuard.py", "is not valid", "writes only short pax headers"),
    ("bundles/fetch.py", "sha256 mismatch", "re-publish it or use another mirror"),
    ("bundles/build.py", "no native ops found to build", "reinstall turbo-dllm"),
    ("bundles/build.py", "at least one compiled (C++) op", "add a C++ op with --op"),
    ("bundles/catalog.py", "not a valid catalog.toml", "ask its publisher for it"),
    ("bundles/manifest.py", "cannot read {}: {}", "check that file and its permissions"),
    ("bundles/sources.py", "cannot read {}: {}", "check that file and its permissions"),
    ("bundles/sources.py", "-byte cap", "a release catalog is a few KB"),
    ("bundles/store.py", "holds bundle version", "re-publish the release"),
    ("bundles/store.py", "is not installed", "`dllm bundle list` shows the installed bundles"),
    ("bundles/targets.py", "invalid targets file", "reinstall the package"),
    ("mirror/source.py", "-byte cap", "the mirror serves something else under that name"),
    ("mirror/source.py", "broke off", "`dllm mirror serve DIR`"),
    ("mirror/source.py", "not JSON", "copy the mirror again whole"),
    ("mirror/release.py", "is the catalog of {}", "mirror from the official index"),
]


@pytest.mark.parametrize(("relative", "message", "hint"), BUNDLE_SITES)
def test_each_bundle_raise_site_keeps_its_specific_hint(relative, message, hint):
    test_each_raise_site_keeps_its_specific_hint(relative, message, hint)
