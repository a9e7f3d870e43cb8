"""The CLI skeleton: help, version, error contract, config/recipe/init/doctor commands."""

from __future__ import annotations

import json
import textwrap

import pytest
import yaml

from tests.helpers import assert_user_error
from turbo_dllm import __version__


def write(path, text):
    path.write_text(textwrap.dedent(text))
    return path


def test_help_lists_command_groups(cli):
    result = cli("--help")
    assert result.code == 0
    for name in ("config", "doctor", "init", "recipe"):
        assert name in result.out


def test_version(cli):
    result = cli("--version")
    assert result.code == 0 and result.out.strip() == f"dllm {__version__}"


def test_group_without_subcommand_prints_its_help(cli):
    result = cli("recipe")
    assert result.code == 2 and "list" in result.err


def test_user_error_in_real_process_has_no_traceback(cli_process, tmp_path):
    result = cli_process("config", "validate", "--config", tmp_path / "missing.yaml")
    assert_user_error(result, "config file not found", "hint:")


# --- config validate -----------------------------------------------------------------------


def test_validate_prints_resolved_spec_with_overrides(cli, tmp_path):
    config = write(
        tmp_path / "run.yaml",
        """
        training:
          steps: 7
    """,
    )
    result = cli(
        "config", "validate", "--config", config, "--set", "training.micro_batch_size=3", "--json"
    )
    assert result.code == 0, result.err
    resolved = json.loads(result.out)
    assert resolved["training"]["steps"] == 7
    assert resolved["training"]["micro_batch_size"] == 3
    assert resolved["model"]["family"] == "qwen3"  # defaults are filled in


def test_validate_yaml_output_round_trips(cli, tmp_path):
    config = write(tmp_path / "run.yaml", "launch: {seed: 5}\n")
    result = cli("config", "validate", "--config", config)
    assert result.code == 0
    assert yaml.safe_load(result.out)["launch"]["seed"] == 5


def test_missing_file(cli, tmp_path):
    assert_user_error(cli("config", "validate", "--config", tmp_path / "nope.yaml"), "not found")


def test_a_missing_config_names_a_yaml_file_of_a_close_name(cli, tmp_path):
    """`--config train.yml` beside a train.yaml got "check the path" only."""
    write(tmp_path / "train.yaml", "launch: {seed: 5}\n")
    for typo in ("train.yml", "trian.yaml"):
        result = cli("config", "validate", "--config", tmp_path / typo)
        assert_user_error(
            result, "config file not found", f"did you mean {tmp_path / 'train.yaml'}?"
        )
    result = cli("config", "validate", "--config", tmp_path / "other.yaml")
    assert_user_error(result, "config file not found", "check the path, or create one")


def test_yaml_syntax_error_names_line(cli, tmp_path):
    config = write(tmp_path / "bad.yaml", "training:\n  steps: [1, 2\n")
    assert_user_error(
        cli("config", "validate", "--config", config), "YAML syntax error", "bad.yaml:"
    )


def test_yaml_syntax_error_names_where_an_unclosed_bracket_or_quote_began(cli, tmp_path):
    """PyYAML marks the end of the file (line 3 of a 2-line file): the error named only that
    line, and the hint said to check it; it now names where the `[` or quote was opened."""
    config = write(tmp_path / "bad.yaml", "training:\n  steps: [1, 2\n")
    assert_user_error(
        cli("config", "validate", "--config", config),
        "bad.yaml:3:1: expected ',' or ']', but got '<stream end>' (while parsing a flow "
        "sequence at line 2, column 10)",
        "from line 2, column 10 to that line",
    )
    config = write(tmp_path / "quote.yaml", 'launch:\n  name: "abc\nmodel: {}\n')
    assert_user_error(
        cli("config", "validate", "--config", config),
        "(while scanning a quoted scalar at line 2, column 9)",
    )


def test_top_level_must_be_mapping(cli, tmp_path):
    config = write(tmp_path / "list.yaml", "- 1\n- 2\n")
    assert_user_error(cli("config", "validate", "--config", config), "mapping")


def test_unknown_key_names_path_and_nearest(cli, tmp_path):
    config = write(
        tmp_path / "run.yaml",
        """
        training:
          stpes: 10
    """,
    )
    assert_user_error(
        cli("config", "validate", "--config", config),
        "training.stpes: unknown key",
        "did you mean 'steps'",
    )


def test_wrong_type(cli, tmp_path):
    config = write(tmp_path / "run.yaml", "training:\n  steps: many\n")
    assert_user_error(cli("config", "validate", "--config", config), "training.steps", "'many'")


def test_several_cross_field_errors_reported_at_once(cli, tmp_path):
    config = write(
        tmp_path / "run.yaml",
        """
        objective: {block_size: 24}
        data: {seq_len: 100, synthetic: {vocab_size: 64}}
        topology: {sp: true, ep: 2}
        scheduler: {warmup_steps: 500}
    """,
    )
    result = cli("config", "validate", "--config", config)
    assert_user_error(
        result, "data.seq_len", "topology.sp", "topology.ep", "scheduler.warmup_steps"
    )


def test_override_syntax_error(cli, tmp_path):
    config = write(tmp_path / "run.yaml", "{}\n")
    assert_user_error(
        cli("config", "validate", "--config", config, "--set", "training"), "bad override"
    )


def test_world_size_mismatch(cli, tmp_path):
    config = write(tmp_path / "run.yaml", "topology: {fsdp: 2}\n")
    assert cli("config", "validate", "--config", config, "--world-size", "2").code == 0
    assert_user_error(
        cli("config", "validate", "--config", config, "--world-size", "4"),
        "topology",
        "4 processes",
    )


@pytest.mark.parametrize("size", ["0", "-3"])
def test_validate_refuses_a_world_size_below_one(cli, tmp_path, size):
    """Was: checked as a launch of 0 (or -3) processes, "... but the launch has 0 processes"
    (and not at all where the spec had other problems)."""
    config = write(tmp_path / "run.yaml", "topology: {fsdp: 2}\n")
    result = cli("config", "validate", "--config", config, "--world-size", size)
    assert_user_error(result, f"--world-size must be 1 or more, got {size}")
    assert "the launch has" not in result.err
    broken = write(tmp_path / "broken.yaml", "training: {stpes: 1}\n")
    assert_user_error(
        cli("config", "validate", "--config", broken, "--world-size", size),
        "--world-size must be 1 or more",
    )


@pytest.mark.parametrize("size", ["0", "two"])
def test_train_refuses_a_world_size_variable_that_is_no_process_count(
    cli, tmp_path, monkeypatch, size
):
    """Was: WORLD_SIZE=0 went on as a launch of 0 processes, into a topology-mismatch message."""
    monkeypatch.setenv("WORLD_SIZE", size)
    config = write(tmp_path / "run.yaml", "training: {steps: 1}\n")
    result = cli("train", "--config", config, "--run-dir", tmp_path / "run")
    assert_user_error(result, f"WORLD_SIZE={size!r} is not a process count")
    assert "topology" not in result.err
    assert not (tmp_path / "run").exists()


def test_a_field_given_without_set_is_answered_with_the_set_form(cli, tmp_path):
    """`dllm launch --config F training.steps=10` was refused as "unrecognized arguments" alone;
    the error now shows the --set form (only for commands that take --set)."""
    config = write(tmp_path / "run.yaml", "training: {steps: 1}\n")
    result = cli(
        "launch", "--config", config, "training.steps=10", "optimizer.lr=0.002", "--dry-run"
    )
    assert result.code == 2
    assert "unrecognized arguments: training.steps=10 optimizer.lr=0.002" in result.err
    assert "--set training.steps=10 --set optimizer.lr=0.002" in result.err
    other = cli("run", "list", "a=b")
    assert other.code == 2 and "unrecognized arguments: a=b" in other.err
    assert "--set" not in other.err


def test_schema_is_json_schema(cli):
    result = cli("config", "schema")
    schema = json.loads(result.out)
    assert result.code == 0
    assert set(schema["properties"]) >= {
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
    }


def test_schema_bounds_are_json_schema_keywords(cli):
    """A bound on an optional or nested number (mask_token_id >= 0, an Adam beta in [0, 1)) is
    written as JSON Schema's minimum/exclusiveMaximum, not as pydantic's ge/lt, which no JSON
    Schema validator knows: an editor accepted mask_token_id: -1 that validate refuses."""
    schema = json.loads(cli("config", "schema").out)
    foreign = []

    def walk(node, path):
        if isinstance(node, dict):
            foreign.extend(f"{path}.{k}" for k in ("ge", "gt", "le", "lt") if k in node)
            for key, value in node.items():
                walk(value, f"{path}.{key}")
        elif isinstance(node, list):
            for i, value in enumerate(node):
                walk(value, f"{path}[{i}]")

    walk(schema, "")
    assert foreign == []
    defs = schema["$defs"]
    mask = defs["ObjectiveSpec"]["properties"]["mask_token_id"]["anyOf"]
    assert {"type": "integer", "minimum": 0} in mask
    clip = defs["TrainingSpec"]["properties"]["clip_grad_norm"]["anyOf"]
    assert {"type": "number", "exclusiveMinimum": 0.0} in clip
    beta = defs["OptimizerSpec"]["properties"]["betas"]["prefixItems"][0]
    assert beta == {"type": "number", "minimum": 0.0, "exclusiveMaximum": 1.0}


# --- recipes -------------------------------------------------------------------------------


def test_recipe_list_json(cli):
    result = cli("recipe", "list", "--json")
    names = {r["name"] for r in json.loads(result.out)["recipes"]}
    assert {"smoke/cpu-tiny", "h200/fast-dllm-v2-qwen3-1.7b", "2xh200/csbp-qwen3-1.7b-64k"} <= names


@pytest.mark.parametrize("columns", ["60", "80"])
def test_recipe_list_never_cuts_a_name(cli, monkeypatch, columns):
    """The table's names are what `recipe show` takes: whole in a narrow terminal too (the
    summary wraps instead)."""
    monkeypatch.setenv("COLUMNS", columns)
    names = [r["name"] for r in json.loads(cli("recipe", "list", "--json").out)["recipes"]]
    words = set(cli("recipe", "list").out.split())
    assert all(name in words for name in names), [n for n in names if n not in words]


def test_recipe_show_and_copy_never_overwrites(cli, tmp_path):
    shown = cli("recipe", "show", "smoke/cpu-tiny")
    assert shown.code == 0 and "block_diffusion" in shown.out
    dest = tmp_path / "run.yaml"
    assert cli("recipe", "copy", "smoke/cpu-tiny", dest).code == 0
    assert dest.read_text() == shown.out
    assert cli("config", "validate", "--config", dest).code == 0
    dest.write_text("mine")
    assert_user_error(cli("recipe", "copy", "smoke/cpu-tiny", dest), "already exists")
    assert dest.read_text() == "mine"


def test_recipe_copy_into_a_missing_folder_named_with_a_slash(cli, tmp_path):
    """`DIR/` is a folder: copying there once wrote a file named DIR when DIR did not exist."""
    result = cli("recipe", "copy", "smoke/cpu-tiny", f"{tmp_path}/new/")
    assert_user_error(result, f"folder '{tmp_path}/new' does not exist", f"mkdir -p {tmp_path}/new")
    assert not (tmp_path / "new").exists()
    (tmp_path / "new").mkdir()
    assert cli("recipe", "copy", "smoke/cpu-tiny", f"{tmp_path}/new/").code == 0
    assert (tmp_path / "new" / "cpu-tiny.yaml").is_file()


def test_recipe_copy_under_a_file_names_the_file(cli, tmp_path):
    """A path through a file said "folder 'F' does not exist" with the hint `mkdir -p F`,
    which fails on that file."""
    (tmp_path / "train.yaml").write_text("mine")
    result = cli("recipe", "copy", "smoke/cpu-tiny", tmp_path / "train.yaml" / "x" / "y.yaml")
    assert_user_error(result, f"'{tmp_path}/train.yaml' is a file, not a folder")
    assert "mkdir" not in result.err
    assert (tmp_path / "train.yaml").read_text() == "mine"


def test_recipe_copy_into_folder(cli, tmp_path):
    assert cli("recipe", "copy", "smoke/cpu-tiny", tmp_path).code == 0
    assert (tmp_path / "cpu-tiny.yaml").is_file()


@pytest.mark.parametrize(
    "name", ["../../../etc/passwd", "/etc/passwd", "smoke/../../x", "smoke\\x"]
)
def test_recipe_rejects_path_traversal(cli, tmp_path, name):
    assert_user_error(cli("recipe", "copy", name, tmp_path / "x.yaml"), "recipe name")


def test_recipe_unknown_suggests(cli):
    assert_user_error(cli("recipe", "show", "smoke/cpu-tiy"), "no recipe", "smoke/cpu-tiny")


# --- init -----------------------------------------------------------------------------------


def test_init_creates_a_project_that_validates(cli, tmp_path):
    project = tmp_path / "p"
    result = cli("init", project)
    assert result.code == 0, result.err
    for name in ("prepare.yaml", "train.yaml", "README.md", ".gitignore", "data/train.jsonl"):
        assert (project / name).is_file(), name
    lines = (project / "data/train.jsonl").read_text().splitlines()
    assert len(lines) >= 100 and all(json.loads(line)["text"] for line in lines)
    validated = cli("config", "validate", "--config", project / "train.yaml", "--json")
    assert validated.code == 0
    # Relative paths resolve against the config's folder, not the working directory.
    assert json.loads(validated.out)["data"]["artifact"] == str(project / "data/prepared")


def test_train_and_launch_before_prepare_name_the_prepare_config_that_writes_the_data(
    cli, tmp_path, monkeypatch
):
    """The hint was `dllm data prepare --config prepare.yaml` from any folder and for any
    data.artifact: run from outside the project, that file is not there, and a data.artifact
    no prepare.yaml writes was not made by it. Now it is doctor's line: the config beside the
    spec whose output.path is the artifact, as seen from here, else what one must say."""
    project = tmp_path / "p"
    assert cli("init", project).code == 0
    monkeypatch.chdir(tmp_path)
    for command in ("train", "launch"):
        result = cli(command, "--config", "p/train.yaml")
        assert_user_error(
            result,
            "data artifact not found",
            "create it with `dllm data prepare --config p/prepare.yaml`",
        )
        result = cli(command, "--config", "p/train.yaml", "--set", "data.artifact=other")
        assert_user_error(
            result,
            "create it with `dllm data prepare --config PREPARE.yaml` (a prepare.yaml with "
            f"output.path: {tmp_path / 'other'})",  # a --set path is the current folder's
        )
    assert not (tmp_path / "runs").exists() and not (project / "runs").exists()


def test_init_never_overwrites(cli, tmp_path):
    project = tmp_path / "p"
    project.mkdir()
    (project / "train.yaml").write_text("mine")
    assert_user_error(cli("init", project), "not overwriting")
    assert (project / "train.yaml").read_text() == "mine"
    assert sorted(p.name for p in project.iterdir()) == ["train.yaml"]


def test_init_rolls_back_on_failure(cli, tmp_path, monkeypatch):
    import turbo_dllm.config.load as load

    def broken(*args, **kwargs):
        raise OSError("disk full")

    monkeypatch.setattr(load, "load_runspec", broken)
    project = tmp_path / "new" / "p"
    assert_user_error(cli("init", project), "cannot create the project", "disk full")
    assert not (tmp_path / "new").exists()


def test_init_under_a_file_is_a_clear_error(cli, tmp_path):
    (tmp_path / "file").write_text("x")
    result = cli("init", tmp_path / "file" / "p")
    # It named only the project's path ("Not a directory: '.../file/p'"), not the file in the way.
    assert_user_error(result, "cannot create the project", f"{str(tmp_path / 'file')!r} is a file")


def test_init_next_steps_paste_into_bash(cli, tmp_path, monkeypatch):
    """The `cd` line was printed unquoted: `cd my project` went to `my`."""
    monkeypatch.chdir(tmp_path)
    result = cli("init", "my project")
    assert result.code == 0, result.err
    assert "\n  cd 'my project'\n" in result.out
    # the steps end with the launch the project's README ends with
    assert result.out.rstrip().endswith(
        "dllm doctor --config train.yaml\n  dllm launch --config train.yaml"
    )


def test_init_of_the_current_folder_prints_no_cd(cli, tmp_path, monkeypatch):
    """`dllm init .` printed `cd .` as its first next step."""
    (tmp_path / "here").mkdir()
    monkeypatch.chdir(tmp_path / "here")
    result = cli("init", ".")
    assert result.code == 0, result.err
    assert "\nnext:\n  dllm data prepare --config prepare.yaml\n" in result.out, result.out


def test_init_and_recipe_copy_refuse_an_empty_path(cli, tmp_path, monkeypatch):
    """`dllm init ""` (an unset shell variable) wrote the project into the working folder and
    printed `cd ` as its next step; `dllm recipe copy NAME ""` wrote into it too."""
    monkeypatch.chdir(tmp_path)
    assert_user_error(cli("init", ""), "the project folder is empty")
    assert_user_error(cli("recipe", "copy", "smoke/cpu-tiny", ""), "the destination is empty")
    assert list(tmp_path.iterdir()) == []


def test_init_refuses_a_file(cli, tmp_path):
    target = tmp_path / "file"
    target.write_text("x")
    assert_user_error(cli("init", target), "not a folder")


# --- doctor ---------------------------------------------------------------------------------


def test_doctor_with_starter_config_is_ready(cli, tmp_path):
    cli("init", tmp_path / "p")
    result = cli("doctor", "--config", tmp_path / "p/train.yaml", "--json")
    report = json.loads(result.out)
    assert report["format"] == "turbo_dllm.doctor.v1"
    assert result.code == 0 and report["ready"] is True
    names = {c["name"] for c in report["checks"]}
    assert {"python", "torch", "venv", "cache dir", "run dir", "disk", "config"} <= names
    for check in report["checks"]:
        assert check["status"] in ("pass", "warn", "fail", "skip")
        assert check["status"] in ("pass", "skip") or check["fix"]
    # not prepared yet: a warning with the prepare fix, and nothing for data fit to compare
    statuses = {c["name"]: c["status"] for c in report["checks"]}
    assert (statuses["data artifact"], statuses["data fit"]) == ("warn", "skip")


def test_doctor_bad_config_is_not_ready(cli, tmp_path):
    config = write(tmp_path / "run.yaml", "training: {stpes: 1}\n")
    result = cli("doctor", "--config", config, "--json")
    report = json.loads(result.out)
    assert result.code == 1 and report["ready"] is False
    failed = [c for c in report["checks"] if c["status"] == "fail"]
    assert [c["name"] for c in failed] == ["config"]
    assert failed[0]["fix"] == (
        f"edit the fields named above in {config} (`dllm config schema` describes each), "
        f"then check it again with `dllm config validate --config {config}`"
    )


def test_doctor_says_how_to_launch_fewer_cpu_processes_than_cores(cli, tmp_path):
    """The fix named a flag without its command (`dllm doctor` has no --nproc-per-node)."""
    from turbo_dllm.host.view import _cpu_count

    cores = _cpu_count()  # the usable ones, as doctor counts them
    cli("init", tmp_path / "p")
    result = cli(
        "doctor", "--config", tmp_path / "p/train.yaml", "--world-size", cores + 1, "--json"
    )
    check = next(c for c in json.loads(result.out)["checks"] if c["name"] == "gpus")
    assert check["status"] == "warn"
    assert (
        check["detail"]
        == f"no GPU: {cores + 1} CPU processes on {cores} core(s) will oversubscribe"
    )
    assert f"`dllm launch --nproc-per-node {cores}` with a topology to match" in check["fix"]


def doctor_checks(cli, config):
    result = cli("doctor", "--config", config, "--json")
    return result.code, {c["name"]: c for c in json.loads(result.out)["checks"]}


@pytest.mark.parametrize("mode", [0o644, 0o755])
def test_doctor_says_a_run_dir_under_a_file_goes_through_a_file(cli, tmp_path, mode):
    """Was: "cannot create runs under F/run (F is not writable)", of a file one may write, with
    the fix "set launch.run_dir to a writable folder"; under an executable file, a pass."""
    blocker = tmp_path / "file"
    blocker.write_text("")
    blocker.chmod(mode)
    config = write(tmp_path / "run.yaml", f"launch: {{run_dir: {blocker / 'run'}}}\n")
    code, checks = doctor_checks(cli, config)
    run = checks["run dir"]
    assert code == 1 and run["status"] == "fail", run
    assert run["detail"] == (
        f"cannot create runs under {blocker / 'run'}: "
        f"the path goes through {blocker}, which is a file, not a folder"
    )
    assert "writable" not in run["detail"] + run["fix"]
    assert f"move the file {blocker}" in run["fix"] and "launch.run_dir" in run["fix"]
    write(config, f"launch: {{run_dir: {blocker}}}\n")  # the run dir itself is the file
    code, checks = doctor_checks(cli, config)
    assert code == 1
    assert (
        checks["run dir"]["detail"]
        == f"cannot create runs under {blocker}: it is a file, not a folder"
    )


def test_doctor_fails_a_checkpoint_dir_through_a_file(cli, tmp_path):
    """Was: not checked: training ran its steps, then the first checkpoint failed."""
    blocker = tmp_path / "file"
    blocker.write_text("")
    config = write(tmp_path / "run.yaml", "launch: {seed: 0}\n")
    code, checks = doctor_checks(cli, config)
    assert checks["checkpoint dir"]["status"] == "pass"
    write(config, f"checkpoint: {{dir: {blocker / 'ckpts'}}}\n")
    code, checks = doctor_checks(cli, config)
    ckpt = checks["checkpoint dir"]
    assert code == 1 and ckpt["status"] == "fail", ckpt
    assert ckpt["detail"] == (
        f"cannot write checkpoints to {blocker / 'ckpts'}: "
        f"the path goes through {blocker}, which is a file, not a folder"
    )
    assert f"move the file {blocker}" in ckpt["fix"] and "checkpoint.dir" in ckpt["fix"]
    assert checks["run dir"]["status"] == "pass"


def test_doctor_checks_the_disks_the_run_writes_to(cli, tmp_path, monkeypatch):
    """Was: only DLLM_HOME's disk was looked at, and a full one was a warning: a run dir or
    checkpoint.dir on a full disk was "ready" (the fix even named launch.run_dir)."""
    from turbo_dllm.doctor.checks import portable
    from turbo_dllm.fsutil import file_system

    full, small = tmp_path / "full", tmp_path / "small"
    full.mkdir()
    small.mkdir()

    def disk(path):  # two pretend file systems, mounted at `full` (0 bytes free) and `small`
        for mount, free in ((full, 0), (small, 100 * 1024**2)):
            if str(path).startswith(str(mount)):
                return mount, free
        return file_system(path)

    monkeypatch.setattr(portable, "file_system", disk)
    config = write(tmp_path / "run.yaml", "launch: {seed: 0}\n")
    code, checks = doctor_checks(cli, config)
    assert checks["disk"]["status"] == "pass", checks["disk"]
    write(config, f"launch: {{run_dir: {full / 'runs'}}}\n")
    code, checks = doctor_checks(cli, config)
    disk_check = checks["disk"]
    assert code == 1 and disk_check["status"] == "fail", disk_check
    assert disk_check["detail"].startswith(f"{full} is full: ")
    assert f"0 bytes free on {full} (run dir)" in disk_check["detail"]
    assert disk_check["fix"] == f"free space on {full}, or point launch.run_dir at a larger disk"
    write(config, f"checkpoint: {{dir: {small / 'ckpts'}}}\n")
    code, checks = doctor_checks(cli, config)
    disk_check = checks["disk"]
    assert disk_check["status"] == "warn", disk_check
    assert f"100.0 MiB free on {small} (checkpoint.dir)" in disk_check["detail"]
    assert "point checkpoint.dir at a larger disk" in disk_check["fix"]
    monkeypatch.setenv("DLLM_HOME", str(full / "home"))  # the home's disk, full, with no config
    result = cli("doctor", "--json")
    disk_check = next(c for c in json.loads(result.out)["checks"] if c["name"] == "disk")
    assert result.code == 1 and disk_check["status"] == "fail"
    assert f"0 bytes free on {full} (DLLM_HOME)" in disk_check["detail"]
    assert "point DLLM_HOME at a larger disk" in disk_check["fix"]


def test_train_refuses_a_checkpoint_dir_through_a_file_before_training(cli, tmp_path):
    """Was: the steps ran (minutes on a real model), then saving failed: "Not a directory"."""
    blocker = tmp_path / "file"
    blocker.write_text("")
    config = write(
        tmp_path / "run.yaml",
        f"""
        model: {{family: qwen3, from_config: tiny, attention: reference}}
        objective: {{name: block_diffusion, block_size: 16}}
        data: {{synthetic: {{}}, seq_len: 64}}
        training: {{steps: 2}}
        scheduler: {{warmup_steps: 0}}
        checkpoint: {{dir: {blocker / "ckpts"}}}
        """,
    )
    result = cli("train", "--config", config, "--run-dir", tmp_path / "run")
    assert_user_error(
        result,
        f"cannot write checkpoints to {blocker / 'ckpts'}: ",
        f"goes through {blocker}, which is a file",
        "hint: move the file",
    )
    assert "step 1" not in result.out + result.err
    assert not (tmp_path / "run").exists()  # refused before the run dir was made


def test_a_train_refused_before_it_writes_anything_leaves_no_run_dir(cli, tmp_path):
    """A refusal from inside the trainer (here: a model.path folder without weights) left the
    run dir `dllm train` had made, empty: one more stamped runs/<stamp>-<id> per attempt."""
    from turbo_dllm.families.decoder.config import PRESETS

    folder = tmp_path / "model"
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps(PRESETS["tiny"]))
    config = write(
        tmp_path / "run.yaml",
        f"""
        model: {{family: qwen3, path: {folder}, attention: reference}}
        objective: {{name: block_diffusion, block_size: 16}}
        data: {{synthetic: {{}}, seq_len: 64}}
        training: {{steps: 2}}
        scheduler: {{warmup_steps: 0}}
        """,
    )
    result = cli("train", "--config", config, "--run-dir", tmp_path / "runs" / "a")
    assert_user_error(result, f"no safetensors weights in {str(folder)!r}")
    assert list((tmp_path / "runs").iterdir()) == []
    # a folder that was there before is the user's: left as it was, empty or not
    (tmp_path / "mine").mkdir()
    result = cli("train", "--config", config, "--run-dir", tmp_path / "mine")
    assert_user_error(result, "no safetensors weights")
    assert (tmp_path / "mine").is_dir()


def test_doctor_human_output(cli):
    result = cli("doctor")
    assert result.code in (0, 1)
    assert "python" in result.out and ("ready" in result.out)


def test_doctor_unwritable_cache_fails(cli, tmp_path, monkeypatch):
    blocker = tmp_path / "file"
    blocker.write_text("")
    monkeypatch.setenv("DLLM_HOME", str(blocker / "home"))
    result = cli("doctor", "--json")
    report = json.loads(result.out)
    cache = next(c for c in report["checks"] if c["name"] == "cache dir")
    assert result.code == 1 and cache["status"] == "fail" and "DLLM_HOME" in cache["fix"]
    # said as what it is (was: "... is not writable: [Errno 17] File exists: ...")
    assert cache["detail"] == (
        f"{blocker / 'home'}: the path goes through {blocker}, which is a file, not a folder"
    )


def test_a_home_of_a_user_this_machine_does_not_know_is_an_error(cli, monkeypatch):
    """DLLM_HOME=~name/... where no user `name` exists: was a RuntimeError traceback ("Could
    not determine home directory") out of every command."""
    monkeypatch.setenv("DLLM_HOME", "~no-such-user-dllm/home")
    for command in (("doctor",), ("doctor", "--json"), ("bundle", "status")):
        assert_user_error(
            cli(*command), "DLLM_HOME='~no-such-user-dllm/home'", "~no-such-user-dllm is not a"
        )


def test_each_cli_module_registers_the_command_named_like_it():
    """The lazy parser imports only `turbo_dllm.cli.<argv[0]>`: module and command names agree."""
    from turbo_dllm.cli import build_parser, command_names

    for name in command_names():
        parser = build_parser(only=name)
        choices = parser._subparsers._group_actions[0].choices
        assert list(choices) == [name]


def test_closed_stdout_pipe_is_not_a_traceback():
    """`dllm ... | head`: the reader is gone before we write; exit quietly with 141."""
    import subprocess
    import sys

    proc = subprocess.Popen(
        [sys.executable, "-m", "turbo_dllm", "config", "schema"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    proc.stdout.close()  # close our end before the child (still importing) writes
    stderr = proc.stderr.read().decode()
    assert proc.wait(timeout=60) == 141, stderr
    assert "Traceback" not in stderr


FREEZE_PROGRAM = """
import gc, sys
from turbo_dllm.cli import main
sys.argv = ["dllm", "bundle", "list"]
code = main()
print("frozen", code, gc.get_freeze_count())
"""


def test_the_dllm_process_freezes_its_start_up_objects_and_callers_are_left_alone(
    cli, tmp_path, monkeypatch
):
    """The `dllm` process moves what start-up made out of the cyclic GC's way (a short command
    such as `bundle install` would otherwise scan it again and again, and at exit); a caller
    passing argv (a test, a library user) keeps its own GC untouched."""
    import gc
    import subprocess
    import sys

    monkeypatch.setenv("DLLM_HOME", str(tmp_path))
    frozen = gc.get_freeze_count()
    assert cli("bundle", "list").code == 0
    assert gc.get_freeze_count() == frozen
    proc = subprocess.run(
        [sys.executable, "-c", FREEZE_PROGRAM], capture_output=True, text=True, check=True
    )
    code, count = proc.stdout.split("frozen")[-1].split()
    assert code == "0" and int(count) > 10_000, proc.stdout


QUICK_EXIT_PROGRAM = """
import gc, sys
import turbo_dllm.cli.{module} as commands
from turbo_dllm.cli import main

handler, kept = commands.{handler}, []

def counting(args):
    code = handler(args)
    kept.append(gc.get_freeze_count())
    kept.extend([i] for i in range(5000))  # tracked objects the command leaves alive
    return code

commands.{handler} = counting
sys.argv = ["dllm", *{argv!r}]
code = main()
print("frozen", code, kept[0], gc.get_freeze_count())
"""


@pytest.mark.parametrize(
    ("module", "handler", "argv", "frozen_at_exit"),
    [("bundle", "_list", ["bundle", "list"], True), ("recipe", "_list", ["recipe", "list"], False)],
)
def test_quick_exit_groups_also_freeze_what_the_command_left_alive(
    tmp_path, monkeypatch, module, handler, argv, frozen_at_exit
):
    """`bundle` commands (short, everything closed) freeze what they leave alive too, so the
    interpreter's exit does not scan it again; other groups leave the GC as start-up left it."""
    import subprocess
    import sys

    monkeypatch.setenv("DLLM_HOME", str(tmp_path))
    program = QUICK_EXIT_PROGRAM.format(module=module, handler=handler, argv=argv)
    proc = subprocess.run([sys.executable, "-c", program], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    code, during, after = proc.stdout.split("frozen")[-1].split()
    assert code == "0"
    left_alive_frozen = int(after) - int(during) >= 5000  # (frozen objects may die meanwhile)
    assert left_alive_frozen == frozen_at_exit


@pytest.mark.parametrize(
    ("name", "line"), [("-x", "cd ./-x"), ("-", "cd ./-"), ("-a b", "cd './-a b'")]
)
def test_init_next_steps_for_a_folder_named_like_an_option(cli, tmp_path, monkeypatch, name, line):
    """Was: `cd -x`, which bash reads as an option (and `cd -` goes to the previous folder)."""
    monkeypatch.chdir(tmp_path)
    result = cli("init", "--", name)
    assert result.code == 0, result.err
    assert f"\n  {line}\n" in result.out
    assert (tmp_path / name / "train.yaml").is_file()


def test_the_qwen3_8_recipe_says_what_data_to_prepare(cli):
    """The recipe named only `data/prepared`: its packed data stopped at the fit check."""
    shown = cli("recipe", "show", "h200/fast-dllm-v2-qwen3.8")
    assert shown.code == 0, shown.err
    for needle in ("one document per row", "packing.overflow: truncate", "8192 tokens"):
        assert needle in shown.out, needle


def test_recipe_copy_s_next_step_runs_as_printed_for_a_name_like_an_option(
    cli, tmp_path, monkeypatch
):
    """`dllm recipe copy NAME -- -x.yaml` printed `dllm config validate --config -x.yaml`, which
    argparse refuses (--config expects one argument): the file is named ./-x.yaml."""
    import shlex

    monkeypatch.chdir(tmp_path)
    result = cli("recipe", "copy", "smoke/cpu-tiny", "--", "-x.yaml")
    assert result.code == 0, result.err
    line = next(x for x in result.out.splitlines() if x.startswith("next: "))
    assert line == "next: dllm config validate --config ./-x.yaml"
    command = shlex.split(line.removeprefix("next: "))
    assert command[0] == "dllm" and cli(*command[1:]).code == 0
