"""`dllm export --out` naming a folder the export cannot replace."""

from __future__ import annotations

from tests.helpers import assert_user_error
from tests.train.util import tiny_spec
from turbo_dllm.train.entry import train


def test_an_empty_current_folder_as_out_is_refused_by_name(cli, tmp_path, monkeypatch):
    """An empty --out is replaced by the written folder; `--out .` was "cannot write the export
    to '.': Invalid argument" (and would have left the shell in a deleted folder)."""
    train(tiny_spec("training.steps=2"), tmp_path / "run")
    here = tmp_path / "here"
    (here / "sub").mkdir(parents=True)
    for cwd, out in ((here / "sub", "."), (here / "sub", str(here / "sub")), (here / "sub", "..")):
        monkeypatch.chdir(cwd)
        result = cli("export", "--checkpoint", tmp_path / "run", "--out", out)
        if out == "..":  # not empty: it holds sub/
            assert_user_error(result, "already exists and is not empty")
        else:
            assert_user_error(result, "is the current folder", "hint: pass --out a new folder")
    assert sorted(p.name for p in here.rglob("*")) == ["sub"]
    result = cli("export", "--checkpoint", tmp_path / "run", "--out", "hf")  # inside it: fine
    assert result.code == 0, result.err
    assert (here / "sub" / "hf" / "model.safetensors").is_file()
    # A legal 240-byte name: its hidden working folder beside it (`.NAME.partial-<host>-...`)
    # went past 255 bytes and the export failed "File name too long" (the odd-paths audit).
    long = tmp_path / ("数" * 80)
    result = cli("export", "--checkpoint", tmp_path / "run", "--out", long)
    assert result.code == 0, result.err
    assert (long / "model.safetensors").is_file()
    assert sorted(p.name for p in tmp_path.iterdir() if p.name.startswith(".")) == []


def test_an_out_under_a_file_is_named_as_the_user_gave_it(cli, tmp_path):
    """`--out notes.txt/hf` read "cannot write the export to 'notes.txt/hf': Not a directory",
    once the checkpoint was read; now before it, naming the file in the way."""
    train(tiny_spec("training.steps=2"), tmp_path / "run")
    (tmp_path / "notes.txt").write_text("mine")
    out = tmp_path / "notes.txt" / "deeper" / "hf"
    result = cli("export", "--checkpoint", tmp_path / "run", "--out", out)
    assert_user_error(
        result,
        f"cannot write --out {str(out)!r}: {str(tmp_path / 'notes.txt')!r} is a file, not a folder",
    )
    assert (tmp_path / "notes.txt").read_text() == "mine"


def test_an_exported_folder_given_as_a_checkpoint_is_named_as_a_model_folder(tmp_path, cli):
    """`--checkpoint` (or checkpoint.resume) naming a Hugging Face folder, an export say, said
    'no checkpoint.json' and to pass a step folder, which the user had not got to hand."""
    (tmp_path / "hf").mkdir()
    (tmp_path / "hf/config.json").write_text("{}")
    result = cli("export", "--checkpoint", tmp_path / "hf", "--out", tmp_path / "out")
    assert_user_error(
        result,
        f"not a checkpoint: {str(tmp_path / 'hf')!r} (no checkpoint.json)",
        "is a Hugging Face model folder, not a training checkpoint: train from it with "
        "model.path (a new run), or pass a checkpoints/step_<N> folder written by `dllm train`, "
        "its checkpoints/ folder or its run dir",
    )


def test_working_names_fit_a_file_name_and_keep_long_names_apart():
    import os

    from turbo_dllm.fsutil import owned_prefix, working_name

    assert working_name("hf", ".partial-") == ".hf.partial-"
    a, b = (working_name(c * 250, ".partial-") for c in "ab")
    assert a != b and a.endswith(".partial-") and "~" in a
    for name in (a, b, working_name("数" * 85, ".staging-")):
        assert len(os.fsencode(owned_prefix(name) + "0" * 12)) <= 255, name
