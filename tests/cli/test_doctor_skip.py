"""`skip`: a doctor check that could not run because the RunSpec did not load says so with its
own status (human and --json), where it printed `pass` with "not checked: ..."; it changes
no exit code on its own (the failed config check makes the exit 1)."""

from __future__ import annotations

import json

import pytest

# The checks that need the RunSpec: with one that does not load, nothing of them ran.
NEED_THE_SPEC = {
    "checkpoint dir",
    "data artifact",
    "data fit",
    "held-out data",
    "world size",
    "attention backend",
    "linear attention",
    "attention merge",
    "model",
    "compile cache",
    "wandb",
}

GOOD = """\
model: {family: qwen3, from_config: tiny}
objective: {name: block_diffusion, block_size: 16}
data: {synthetic: {}, seq_len: 64}
training: {steps: 10}
"""


def _human_statuses(text: str) -> dict[str, str]:
    """{check name: its status word} of the human report (`STATUS  NAME  DETAIL` lines)."""
    rows = [line.split(None, 1) for line in text.splitlines() if line[:6].strip() and "  " in line]
    return {rest.split("  ")[0]: status for status, rest in rows}


def _doctor(cli, config):
    human = cli("doctor", "--config", config)
    machine = cli("doctor", "--config", config, "--json")
    report = json.loads(machine.out)
    return human, machine.code, {c["name"]: c for c in report["checks"]}, report


@pytest.mark.parametrize(
    "text",
    [
        "launch: [\n",  # YAML syntax
        # a schema error, in a RunSpec that asks for W&B logging ("W&B logging is off" was said)
        GOOD + "logging: {wandb: {project: p}}\nmodel_typo: 1\n",
    ],
    ids=["yaml", "schema"],
)
def test_checks_a_bad_runspec_keeps_from_running_are_skipped(cli, tmp_path, text):
    config = tmp_path / "train.yaml"
    config.write_text(text)
    human, code, checks, report = _doctor(cli, config)
    assert code == human.code == 1 and report["ready"] is False
    assert checks["config"]["status"] == "fail"
    for name in NEED_THE_SPEC:
        assert checks[name]["status"] == "skip", checks[name]
        assert checks[name]["detail"].startswith("not checked: the RunSpec did not load")
        assert _human_statuses(human.out)[name] == "skip", human.out
    assert not [
        c for c in checks.values() if c["status"] == "pass" and "not checked" in c["detail"]
    ]


def test_a_runspec_that_loads_has_no_skipped_check_and_a_skip_alone_is_ready(cli, tmp_path):
    config = tmp_path / "train.yaml"
    config.write_text(GOOD)
    human, code, checks, _ = _doctor(cli, config)
    assert [c for c in checks.values() if c["status"] == "skip"] == []
    assert "skip" not in _human_statuses(human.out).values()
    assert {checks[name]["status"] for name in NEED_THE_SPEC} == {"pass"}
    # An artifact not prepared yet: a warning (a dev run), and the data fit check, with nothing
    # to compare, a skip; neither makes the host "not ready".
    config.write_text(GOOD.replace("synthetic: {}", "artifact: data/art"))
    human, code, checks, report = _doctor(cli, config)
    assert checks["data artifact"]["status"] == "warn"
    assert checks["data fit"]["status"] == "skip" and checks["data fit"]["fix"] is None
    assert code == human.code == 0 and report["ready"] is True
    assert "\nready\n" in "\n" + human.out


def test_a_dllm_home_through_a_file_fails_the_cache_dir_check_alone(cli, tmp_path, monkeypatch):
    """The compile packs check failed too, with "move that file aside; the packs installed
    before have to be installed again": none was installed, none is lost; the cache dir
    check's failure says what is wrong and its fix."""
    (tmp_path / "afile").write_text("x")
    monkeypatch.setenv("DLLM_HOME", str(tmp_path / "afile" / "home"))
    result = cli("doctor", "--json")
    checks = {c["name"]: c for c in json.loads(result.out)["checks"]}
    assert result.code == 1 and checks["cache dir"]["status"] == "fail"
    assert f"move the file {tmp_path / 'afile'} out of the way" in checks["cache dir"]["fix"]
    packs = checks["compile packs"]
    assert packs["status"] == "skip" and "see the cache dir check" in packs["detail"], packs
