"""The `dllm data` commands end to end, starting from a `dllm init` project (offline)."""

from __future__ import annotations

import json

import pytest

from tests.data.helpers import write_config, write_jsonl
from tests.helpers import assert_failed_check, assert_user_error


@pytest.fixture
def project(cli, tmp_path):
    folder = tmp_path / "p"
    assert cli("init", folder).code == 0
    return folder


def test_starter_project_prepares_validates_and_is_ready(cli, project, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # relative paths resolve against prepare.yaml, not the cwd
    result = cli("data", "prepare", "--config", project / "prepare.yaml", "--json")
    assert result.code == 0, result.err
    summary = json.loads(result.out)  # exactly one JSON object on stdout
    assert summary["path"] == str(project / "data/prepared")
    assert summary["num_sequences"] > 0 and summary["stats"]["documents"] == 150
    assert summary["special_tokens"] == {"bos": 256, "eos": 257, "mask": 259, "pad": 258}

    validated = cli(
        "data", "validate", project / "data/prepared", "--config", project / "train.yaml", "--json"
    )
    assert validated.code == 0, validated.err
    report = json.loads(validated.out)
    assert report["valid"] and report["fingerprint"] == summary["fingerprint"]
    assert report["checked_against_config"] == [
        "seq_len",
        "block_size",
        "vocab",
        "mask_token",
        "family_inputs",
    ]

    doctor = json.loads(cli("doctor", "--config", project / "train.yaml", "--json").out)
    checks = {c["name"]: c for c in doctor["checks"]}
    assert checks["data artifact"]["status"] == "pass"
    assert checks["data fit"]["status"] == "pass"


def test_doctor_warns_before_prepare_and_fails_on_a_mismatch(cli, project):
    doctor = json.loads(cli("doctor", "--config", project / "train.yaml", "--json").out)
    check = {c["name"]: c for c in doctor["checks"]}["data artifact"]
    assert check["status"] == "warn" and "dllm data prepare" in check["fix"]
    assert cli("data", "prepare", "--config", project / "prepare.yaml").code == 0
    train = project / "train.yaml"
    train.write_text(train.read_text().replace("seq_len: 256", "seq_len: 128"))
    doctor = cli("doctor", "--config", train, "--json")
    assert doctor.code == 1
    check = {c["name"]: c for c in json.loads(doctor.out)["checks"]}["data fit"]
    assert check["status"] == "fail" and "data.seq_len: 128" in check["detail"]


def test_validate_against_a_runspec_lists_every_misfit(cli, project):
    assert cli("data", "prepare", "--config", project / "prepare.yaml").code == 0
    train = project / "train.yaml"
    text = train.read_text().replace("seq_len: 256", "seq_len: 128")
    text = text.replace("block_size: 16", "block_size: 32")
    text = text.replace(
        "from_config: tiny", "from_config: tiny\n  config_overrides: {vocab_size: 200}"
    )
    text = text.replace("block_size: 32", "block_size: 32\n  mask_token_id: 5")
    train.write_text(text)
    result = cli("data", "validate", project / "data/prepared", "--config", train)
    assert_failed_check(
        result,
        "data.seq_len: 128",
        "objective.block_size: 32",
        "vocabulary of 200",
        "objective.mask_token_id: 5",
    )


def test_fit_checks_what_the_objective_needs(cli, project):
    """The autoregressive objective streams blocks of 1 and never masks: an artifact aligned to
    blocks of 4 fits it (the smoke/cpu-ar-target recipe on the smoke/cpu-dflash data), while a
    block-diffusion spec with blocks of 16 is still refused."""
    prepare = ("--set", "packing.seq_len=128", "--set", "packing.block_size=4")
    assert cli("data", "prepare", "--config", project / "prepare.yaml", *prepare).code == 0
    target = project / "ar.yaml"
    assert cli("recipe", "copy", "smoke/cpu-ar-target", target).code == 0
    artifact = project / "data/prepared"
    result = cli("data", "validate", artifact, "--config", target)
    assert result.code == 0, result.err
    doctor = json.loads(cli("doctor", "--config", target, "--json").out)
    assert {c["name"]: c for c in doctor["checks"]}["data fit"]["status"] == "pass"
    # a mask token the objective never uses is no misfit either
    target.write_text(
        target.read_text().replace(
            "name: autoregressive", "name: autoregressive\n  mask_token_id: 5"
        )
    )
    assert cli("data", "validate", artifact, "--config", target).code == 0

    diffusion = project / "bd.yaml"
    diffusion.write_text(
        target.read_text().replace(
            "name: autoregressive", "name: block_diffusion\n  block_size: 16"
        )
    )
    result = cli("data", "validate", artifact, "--config", diffusion)
    assert_failed_check(
        result, "objective.block_size: 16, but the artifact aligned documents to blocks of 4"
    )
    assert "objective.mask_token_id: 5" in result.out


def test_dllm_train_resumes_a_recorded_run_only_on_its_recorded_data(
    cli, project, tmp_path, monkeypatch
):
    """The same artifact path prepared again holds another stream than the manifest records."""
    monkeypatch.chdir(tmp_path)
    assert cli("data", "prepare", "--config", project / "prepare.yaml").code == 0
    steps = ("--set", "training.steps=2", "--set", "scheduler.warmup_steps=1")
    launch = ("launch", "--config", project / "train.yaml", "--backend", "slurm")
    assert cli(*launch, "--nproc-per-node", "1", "--run-dir", "runs/r", *steps).code == 0
    run_dir = tmp_path / "runs" / "r"
    prepare = ("data", "prepare", "--config", project / "prepare.yaml")
    assert (
        cli(*prepare, "--set", "output.overwrite=true", "--set", "packing.prepend_bos=true").code
        == 0
    )
    result = cli("train", "--config", run_dir / "spec.yaml", "--run-dir", run_dir)
    assert_user_error(result, "recorded with data artifact fingerprint", "now holds")
    assert not (run_dir / "metrics.jsonl").exists()


def test_prepare_with_overrides_and_human_output(cli, project, monkeypatch):
    monkeypatch.chdir(project)  # a --set path is taken against the current folder
    result = cli(
        "data",
        "prepare",
        "--config",
        project / "prepare.yaml",
        "--set",
        "packing.seq_len=128",
        "--set",
        "output.path=other",
    )
    assert result.code == 0, result.err
    assert f"wrote {project / 'other'}" in result.out
    assert "128 tokens" in result.out and "fingerprint" in result.out
    assert_user_error(
        cli("data", "prepare", "--config", project / "prepare.yaml", "--set", "packing.sq_len=1"),
        "packing.sq_len: unknown key; did you mean 'seq_len'?",
    )


def test_inspect_marks_supervised_spans(cli, tmp_path):
    write_jsonl(tmp_path / "data.jsonl", [{"prompt": "Q?", "completion": " A!"}])
    config = write_config(
        tmp_path, records={"kind": "prompt_completion"}, supervision="completion_only"
    )
    assert cli("data", "prepare", "--config", config).code == 0
    result = cli("data", "inspect", tmp_path / "out", "--n", "1", "--json")
    sample = json.loads(result.out)["samples"][0]
    spans = [(s["text"], s["supervised"], s["padding"]) for s in sample["spans"]]
    assert spans[:2] == [("Q?", False, False), (" A!<|eos|>", True, False)]
    assert spans[2][1:] == (False, True)  # then padding to the end of the row
    human = cli("data", "inspect", tmp_path / "out")
    assert human.code == 0 and "Q?⟦ A!<|eos|>⟧" in human.out and "pad x" in human.out


def test_inspect_decodes_with_the_copied_hf_tokenizer(cli, tmp_path, hf_tokenizer):
    write_jsonl(tmp_path / "data.jsonl", [{"text": "hello world"}])
    config = write_config(tmp_path, tokenizer={"kind": "huggingface", "path": str(hf_tokenizer)})
    assert cli("data", "prepare", "--config", config).code == 0
    result = cli("data", "inspect", tmp_path / "out", "--json")
    assert json.loads(result.out)["samples"][0]["spans"][0]["text"] == "hello world<|endoftext|>"


def test_inspect_errors_say_what_to_do(cli, tmp_path, hf_tokenizer):
    # An artifact copied without its tokenizer/ folder, and a negative --start ('sequence -1
    # is out of range (the artifact has 1)'), were errors without a hint.
    import shutil

    write_jsonl(tmp_path / "data.jsonl", [{"text": "hello world"}])
    config = write_config(tmp_path, tokenizer={"kind": "huggingface", "path": str(hf_tokenizer)})
    assert cli("data", "prepare", "--config", config).code == 0
    result = cli("data", "inspect", tmp_path / "out", "--start", "-1")
    assert_user_error(result, "--start must be 0 or more, got -1", "hint:")
    shutil.rmtree(tmp_path / "out" / "tokenizer")
    result = cli("data", "inspect", tmp_path / "out")
    assert_user_error(result, "no tokenizer/ folder", "hint:", "dllm data validate")


def test_stats_and_plot(cli, project, tmp_path):
    assert cli("data", "prepare", "--config", project / "prepare.yaml").code == 0
    result = cli("data", "stats", project / "data/prepared", "--json", "--plot", tmp_path / "s.png")
    stats = json.loads(result.out)
    assert stats["documents"] == 150 and stats["supervised_fraction"] == 1.0
    assert sum(stats["document_length"]["histogram"]["counts"]) == 150
    assert stats["tokens"] + stats["padding_tokens"] == stats["sequences"] * stats["seq_len"]
    assert (tmp_path / "s.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    human = cli("data", "stats", project / "data/prepared")
    assert "documents        150" in human.out and "#" in human.out


def test_dropped_documents_are_reported(cli, tmp_path):
    # A prompt longer than the row leaves its truncated document nothing to learn: it is
    # dropped, and both summaries must say so, as they do for skipped records.
    rows = [{"prompt": "p" * 100, "completion": "a"}] * 2 + [{"prompt": "q", "completion": "a"}]
    write_jsonl(tmp_path / "data.jsonl", rows)
    config = write_config(
        tmp_path,
        records={"kind": "prompt_completion"},
        supervision="completion_only",
        packing={"seq_len": 32, "block_size": 8, "overflow": "truncate"},
    )
    result = cli("data", "prepare", "--config", config)
    assert result.code == 0, result.err
    assert "dropped: 2 with no supervised token left after truncation" in result.out
    stats = cli("data", "stats", tmp_path / "out")
    assert "dropped          2 with no supervised token left after truncation" in stats.out

    write_jsonl(tmp_path / "data.jsonl", [{"text": "kept"}, {"text": ""}])
    result = cli("data", "prepare", "--config", write_config(tmp_path, output={"path": "o2"}))
    assert "dropped: 1 empty" in result.out
    write_jsonl(tmp_path / "data.jsonl", [{"text": ""}])
    result = cli("data", "prepare", "--config", write_config(tmp_path, output={"path": "o3"}))
    assert_user_error(result, "no documents: 1 record read", "1 empty")


def test_plot_names_the_file_it_writes_and_refuses_bad_paths(cli, project, tmp_path):
    assert cli("data", "prepare", "--config", project / "prepare.yaml").code == 0
    artifact = project / "data/prepared"
    result = cli("data", "stats", artifact, "--json", "--plot", tmp_path / "plain")
    assert json.loads(result.out)["plot"] == str(tmp_path / "plain.png")  # what was written
    assert (tmp_path / "plain.png").read_bytes()[:4] == b"\x89PNG"
    bad = cli("data", "stats", artifact, "--plot", tmp_path / "s.xyz")
    assert_user_error(bad, "cannot write '.xyz' images", ".svg")
    assert bad.out == ""
    assert_user_error(cli("data", "stats", artifact, "--plot", tmp_path), "is a folder")
    (tmp_path / "file").write_text("x")
    assert_user_error(
        cli("data", "stats", artifact, "--plot", tmp_path / "file/s.png"), "cannot write the plot"
    )


def test_validate_and_inspect_errors(cli, tmp_path):
    assert_user_error(cli("data", "validate", tmp_path / "none"), "not found", "dllm data prepare")
    assert_user_error(cli("data", "inspect", tmp_path / "none"), "not found")
    assert_user_error(cli("data", "stats", tmp_path / "none"), "not found")


def test_the_starter_configs_swapped_are_named_for_what_they_are(cli, project):
    """Each was refused with one 'unknown key' per section and wrong guesses (training: did you
    mean 'packing'?), never saying the file was the other config."""
    result = cli("data", "prepare", "--config", project / "train.yaml")
    assert_user_error(result, "train.yaml is a training config", "not a prepare.yaml")
    assert "did you mean" not in result.err
    assert cli("data", "prepare", "--config", project / "prepare.yaml").code == 0
    artifact = project / "data/prepared"
    result = cli("data", "validate", artifact, "--config", project / "prepare.yaml")
    assert_user_error(result, "prepare.yaml is a data preparation config", "RunSpec (train.yaml)")
    assert "did you mean" not in result.err


def test_schema_lists_the_sections(cli):
    schema = json.loads(cli("data", "schema").out)
    assert {"source", "records", "tokenizer", "supervision", "packing", "output"} <= set(
        schema["properties"]
    )


def test_schema_takes_one_path_as_prepare_does(cli, tmp_path):
    """`paths: data.jsonl` (one string) is read as `[data.jsonl]`; the schema an editor checks
    prepare.yaml against said 'not of type array'."""
    defs = json.loads(cli("data", "schema").out)["$defs"]
    for model in ("JsonlSource", "ParquetSource", "TextSource", "TokenIdsSource"):
        paths = defs[model]["properties"]["paths"]
        assert paths["anyOf"] == [
            {"type": "string"},
            {"type": "array", "items": {"type": "string"}, "minItems": 1},
        ]
    data_files = defs["HuggingFaceSource"]["properties"]["data_files"]["anyOf"]
    assert {"type": "string"} in data_files and {"type": "null"} in data_files
    (tmp_path / "data.jsonl").write_text('{"text": "hello"}\n', encoding="utf-8")
    config = write_config(tmp_path, source={"kind": "jsonl", "paths": "data.jsonl"})
    assert cli("data", "prepare", "--config", config).code == 0


def test_prepare_in_a_real_subprocess(cli_process, cli, project):
    result = cli_process("data", "prepare", "--config", "prepare.yaml", cwd=project)
    assert result.code == 0, result.err
    assert "wrote" in result.out and "Traceback" not in result.err
    result = cli_process("data", "validate", "data/prepared", "--config", "train.yaml", cwd=project)
    assert result.code == 0, result.err


def test_validate_and_doctor_apply_the_family_s_input_rules(cli, tmp_path):
    """A qwen3_8 run cannot train rows of several documents (the default packing makes them):
    `dllm train` and `dllm launch` refuse such an artifact, and `data validate --config` and
    doctor said it was ready until now."""
    from tests.data.helpers import prepare_config
    from tests.data.helpers import write_config as write_prepare
    from tests.train.test_qwen3_8_training import HYBRID
    from tests.train.util import write_config as write_train

    texts = [("xy" * (7 * i % 23)) + "z" * (i % 5) for i in range(1, 40)]
    write_jsonl(tmp_path / "data.jsonl", [{"text": text} for text in texts])
    packed = prepare_config(write_prepare(tmp_path, packing={"seq_len": 32, "block_size": 8}))
    train = write_train(
        tmp_path / "train.yaml",
        f"data.artifact={packed.path}",
        "data.synthetic=null",
        "model.config_overrides.mask_token_id=259",  # the byte-level artifact's
        base=HYBRID,
    )
    result = cli("data", "validate", packed.path, "--config", train)
    assert_failed_check(result, "data.artifact:", "rows", "one document")
    doctor = cli("doctor", "--config", train, "--json")
    check = {c["name"]: c for c in json.loads(doctor.out)["checks"]}["data fit"]
    assert check["status"] == "fail" and "data.artifact:" in check["detail"], check


def _doctor_data_check(cli, train) -> dict:
    doctor = json.loads(cli("doctor", "--config", train, "--json").out)
    return {c["name"]: c for c in doctor["checks"]}["data artifact"]


def _run_fix(cli, fix: str):
    """Run the `dllm data prepare ...` command a doctor fix line starts with, as printed."""
    import shlex

    command = shlex.split(fix.split(" (then ")[0])
    assert command[:3] == ["dllm", "data", "prepare"], fix
    return cli(*command[1:])


def test_doctors_data_fix_prepares_the_artifact_from_anywhere(cli, project, tmp_path, monkeypatch):
    """The fix names the project's own prepare.yaml as seen from the working folder (not a bare
    `prepare.yaml`, which is not there), and adds output.overwrite where an artifact is in the
    way (a damaged one: a plain prepare refuses to replace it)."""
    monkeypatch.chdir(tmp_path)
    train = project.relative_to(tmp_path) / "train.yaml"
    check = _doctor_data_check(cli, train)
    assert check["status"] == "warn"
    result = _run_fix(cli, check["fix"])
    assert result.code == 0, (check["fix"], result.err)
    assert _doctor_data_check(cli, train)["status"] == "pass"

    tokens = project / "data/prepared/tokens.bin"
    tokens.write_bytes(tokens.read_bytes()[:100])  # cut short
    check = _doctor_data_check(cli, train)
    assert check["status"] == "fail" and "fewer than" in check["detail"]
    result = _run_fix(cli, check["fix"])
    assert result.code == 0, (check["fix"], result.err)
    assert _doctor_data_check(cli, train)["status"] == "pass"


def test_doctors_data_fix_without_a_prepare_yaml_says_what_to_write(cli, project):
    """No prepare config writes the artifact (renamed, or prepared from elsewhere): the fix says
    which output.path the user's own prepare.yaml must have, not a file that does not exist."""
    (project / "prepare.yaml").rename(project / "prep.txt")
    check = _doctor_data_check(cli, project / "train.yaml")
    assert check["status"] == "warn"
    assert "--config prepare.yaml" not in check["fix"]
    assert f"output.path: {project / 'data/prepared'}" in check["fix"]


def test_doctor_names_a_data_folder_that_holds_no_artifact(cli, project):
    """data.artifact naming a folder of other files: preparing into it is refused, so the fix
    is to point data.artifact (or output.path) elsewhere, not to prepare."""
    raw = project / "data/prepared"
    raw.mkdir(parents=True)
    (raw / "notes.txt").write_text("mine")
    check = _doctor_data_check(cli, project / "train.yaml")
    assert check["status"] == "fail"
    assert "not a data artifact" in check["detail"] and "data.artifact" in check["fix"]


def test_doctor_given_a_prepare_yaml_says_so(cli, project):
    """`dllm doctor --config prepare.yaml` (the starter project has both files): the config check
    says it is a prepare config and how to check it, not five unknown keys with wrong guesses
    ('tokenizer: did you mean optimizer?') and an 'edit the fields' fix; the checks that need
    a RunSpec say it did not load, not that none was given."""
    result = cli("doctor", "--config", project / "prepare.yaml", "--json")
    assert result.code == 1
    checks = {c["name"]: c for c in json.loads(result.out)["checks"]}
    config = checks["config"]
    assert config["status"] == "fail"
    assert "is a data preparation config" in config["detail"], config
    assert "did you mean" not in config["detail"] and "edit the fields" not in config["fix"]
    assert "train.yaml" in config["fix"] and "dllm data prepare" in config["fix"]
    for name in ("data artifact", "world size", "model", "checkpoint dir"):
        assert "no RunSpec given" not in checks[name]["detail"], checks[name]
        assert "did not load" in checks[name]["detail"], checks[name]


@pytest.mark.parametrize("command", [("config", "validate"), ("train",), ("launch",)])
def test_a_prepare_yaml_given_for_a_runspec_says_so(cli, project, command):
    """The starter project's prepare.yaml where a RunSpec belongs: one message saying what it
    is and how to run it, not its seven sections as unknown keys with wrong guesses."""
    result = cli(*command, "--config", project / "prepare.yaml")
    assert result.code != 0
    assert "is a data preparation config" in result.err, result.err
    assert "unknown key" not in result.err and "did you mean" not in result.err
    assert f"dllm data prepare --config {project / 'prepare.yaml'}" in result.err


def test_doctor_checks_the_run_its_set_values_make(cli, project, tmp_path):
    """`dllm doctor --config F --set K=V` checks the run `dllm launch --config F --set K=V`
    would start: the overridden data.artifact is the one checked, and a bad value fails the
    config check with a fix that checks the same command line again."""
    moved = tmp_path / "elsewhere"
    result = cli(
        "doctor", "--config", project / "train.yaml", "--set", f"data.artifact={moved}", "--json"
    )
    checks = {c["name"]: c for c in json.loads(result.out)["checks"]}
    assert checks["config"]["status"] == "pass", checks["config"]
    assert str(moved) in checks["data artifact"]["detail"], checks["data artifact"]
    bad = cli(
        "doctor", "--config", project / "train.yaml", "--set", "training.steps=many", "--json"
    )
    assert bad.code == 1
    config = {c["name"]: c for c in json.loads(bad.out)["checks"]}["config"]
    assert config["status"] == "fail" and "training.steps" in config["detail"], config
    assert "--set training.steps=many" in config["fix"], config


def test_doctor_warns_of_a_file_its_artifact_s_manifest_does_not_list(cli, project):
    """The same check as validate's (without the hashing), as a warning: a tokenizer.json added
    to the starter's byte-level artifact changes neither training nor an export (which copies
    the listed tokenizer files only), but validate fails it."""
    assert cli("data", "prepare", "--config", project / "prepare.yaml").code == 0
    extra = project / "data/prepared/tokenizer/tokenizer.json"
    extra.parent.mkdir()
    extra.write_text("{}")
    check = _doctor_data_check(cli, project / "train.yaml")
    assert check["status"] == "warn"
    assert "tokenizer/tokenizer.json: not listed in the manifest" in check["detail"]
    assert f"rm {extra}" in check["fix"] and "dllm data prepare" in check["fix"]
    extra.unlink()
    assert _doctor_data_check(cli, project / "train.yaml")["status"] == "pass"


def test_a_project_whose_folder_name_is_not_utf8_prepares(tmp_path):
    """`dllm init $'lat\\xe9n'` and a prepare in it ended with a UnicodeEncodeError traceback:
    the output's lock key encoded its path as UTF-8 (found by the odd-paths audit). Real
    processes: their stdout writes such a name back as its bytes."""
    import os
    import subprocess
    import sys
    from pathlib import Path

    folder = os.fsencode(tmp_path) + b"/lat\xe9n"
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[2])}
    for argv, cwd in (
        ([b"init", folder], tmp_path),
        ([b"data", b"prepare", b"--config", b"prepare.yaml"], folder),
    ):
        proc = subprocess.run(
            [sys.executable, "-m", "turbo_dllm", *argv],
            cwd=cwd,
            env=env,
            capture_output=True,
            timeout=300,
        )
        assert proc.returncode == 0, proc.stderr.decode(errors="replace")
    assert os.path.isdir(folder + b"/data")


def test_a_missing_source_path_from_set_is_told_against_the_current_folder(
    cli, project, tmp_path, monkeypatch
):
    """The hint said only that prepare.yaml's paths are relative to its folder: a `--set` path,
    taken against the current folder, sent the user to look beside prepare.yaml."""
    monkeypatch.chdir(tmp_path)
    result = cli(
        "data", "prepare", "--config", project / "prepare.yaml",
        "--set", "source.paths=[data/train.jsonl]", "--set", "output.path=out",
    )  # fmt: skip
    assert_user_error(
        result,
        f"file not found: '{tmp_path / 'data' / 'train.jsonl'}'",
        "one given with --set against the current folder",
    )


def test_a_seq_len_misfit_names_the_seq_len_that_fits(cli, project):
    """The hint said "change the spec, or prepare the data again": it now gives the change, as
    a flag that fits the artifact (a recipe at 128 beside the starter's 256-token artifact)."""
    assert cli("data", "prepare", "--config", project / "prepare.yaml").code == 0
    spec = ("--config", project / "train.yaml")
    for command in (("launch", *spec, "--dry-run"), ("train", *spec)):
        result = cli(*command, "--set", "data.seq_len=128")
        assert_user_error(
            result,
            "data.seq_len: 128, but the artifact holds sequences of 256 tokens",
            "change the spec (--set data.seq_len=256 fits the artifact)",
        )
    assert cli("launch", *spec, "--dry-run", "--set", "data.seq_len=256").code == 0
