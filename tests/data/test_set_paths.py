"""`dllm data prepare --set` paths are the shell's, as a RunSpec's are (f7d0c21): a relative path
given with `--set` is taken against the current folder, one written in prepare.yaml against the
file's folder. `dllm data prepare --config project/prepare.yaml --set output.path=data/v2`, run
from the folder above the project, wrote project/data/v2, not the data/v2 the shell names."""

from __future__ import annotations

from tests.data.helpers import write_config, write_jsonl
from turbo_dllm.data.spec import load_prepare_spec


def test_set_paths_are_the_shell_s_and_file_paths_the_file_s(tmp_path, monkeypatch):
    config = write_config(tmp_path / "project")  # paths: [data.jsonl], output: out
    monkeypatch.chdir(tmp_path)
    spec = load_prepare_spec(config.relative_to(tmp_path))
    assert spec.source.paths == [str(tmp_path / "project/data.jsonl")]  # the file's
    assert spec.output.path == str(tmp_path / "project/out")
    spec = load_prepare_spec(
        config, ["output.path=data/v2", "source.paths=[corpus/a.jsonl, /abs/b.jsonl]"]
    )
    assert spec.output.path == str(tmp_path / "data/v2")
    assert spec.source.paths == [str(tmp_path / "corpus/a.jsonl"), "/abs/b.jsonl"]
    # a whole section set from the command line is the shell's too
    spec = load_prepare_spec(config, ["output={path: here}"])
    assert spec.output.path == str(tmp_path / "here")


def test_prepare_writes_where_the_set_path_points(cli, tmp_path, monkeypatch):
    write_jsonl(tmp_path / "project/data.jsonl", [{"text": "a small document " * 4}] * 3)
    config = write_config(tmp_path / "project")
    monkeypatch.chdir(tmp_path)
    result = cli("data", "prepare", "--config", "project/prepare.yaml", "--set", "output.path=v2")
    assert result.code == 0, result.err
    assert (tmp_path / "v2" / "manifest.json").is_file()
    assert not (tmp_path / "project" / "v2").exists()
    assert config.is_file()
