"""A path that starts with "-" (a folder named -r1, given as --run-dir=-r1) in the commands
`dllm launch` prints to paste. The dry run's start line and the manifest's argv (a multi-node
run's resume command) wrote `--run-dir -r1`, which argparse reads back as a missing value
("argument --run-dir: expected one argument"); a refused replay's hint wrote
`dllm launch --config -r1/spec.yaml`, which fails the same way."""

from __future__ import annotations

import json
import shlex
import textwrap

from tests.jobs.conftest import SMALL_SPEC


def _launch_words(command: str) -> list[str]:
    """The `launch ...` words of a printed `cd DIR && python -m turbo_dllm launch ...`."""
    words = shlex.split(command)
    return words[words.index("launch") :]


def test_the_start_line_and_the_recorded_argv_parse_back_with_dash_paths(cli, workdir):
    (workdir / "-c.yaml").write_text(textwrap.dedent(SMALL_SPEC))
    result = cli("launch", "--config=-c.yaml", "--run-dir=-r1", "--dry-run", "--json")
    assert result.code == 0, result.err
    shown = json.loads(result.out)
    start = _launch_words(shown["start_command"])
    again = cli(*start, "--dry-run", "--json")
    assert again.code == 0, again.err
    assert json.loads(again.out)["plan"]["run_dir"] == str(workdir / "-r1")
    recorded = shown["manifest"]["argv"]
    assert recorded[:2] == ["dllm", "launch"]
    assert cli(*recorded[1:], "--dry-run", "--json").code == 0
    assert not (workdir / "-r1").exists()


def test_a_refused_replay_names_a_dash_spec_path_that_parses(cli, workdir):
    (workdir / "train.yaml").write_text(textwrap.dedent(SMALL_SPEC))
    shown = json.loads(cli("launch", "--config", "train.yaml", "--dry-run", "--json").out)
    run = workdir / "-r1"
    run.mkdir()
    (run / "spec.yaml").write_text(textwrap.dedent(SMALL_SPEC))
    (run / "manifest.json").write_text(json.dumps(shown["manifest"]))
    refused = cli("launch", "--manifest=-r1/manifest.json", "--set", "training.steps=3")
    assert refused.code == 2, refused.err
    hint = refused.err.split("as a new run: ", 1)[1].strip()
    command = hint.replace("NEW_DIR", "new")
    assert " --set training.steps=3 " in command
    assert command.startswith("dllm launch --config ./-r1/spec.yaml ")
    assert cli(*shlex.split(command)[1:], "--dry-run").code == 0


def test_a_runspec_given_as_manifest_is_named_as_a_config_that_parses(cli, workdir):
    (workdir / "-t.yaml").write_text(textwrap.dedent(SMALL_SPEC))
    refused = cli("launch", "--manifest=-t.yaml")
    assert refused.code == 2
    assert "pass it as --config ./-t.yaml;" in refused.err, refused.err
    assert cli("launch", "--config", "./-t.yaml", "--dry-run").code == 0


def test_the_launcher_quotes_a_dash_path_as_a_word_that_parses():
    from turbo_dllm.jobs.launcher import _q

    assert _q("-r1/spec.yaml") == "./-r1/spec.yaml"
    assert _q("/abs/-r1 x/spec.yaml") == "'/abs/-r1 x/spec.yaml'"
