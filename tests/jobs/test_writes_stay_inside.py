"""Nothing is written outside the dllm home, the run dir and the paths the user names: a tiny
torchrun launch, its plots and a data plot leave an empty HOME and temp folder empty
(matplotlib's config and font cache, inductor's cache folder, torchrun's `torchelastic_*`)."""

from __future__ import annotations

import textwrap

import pytest

pytestmark = pytest.mark.slow

SPEC = """
launch:
  seed: 0
model:
  family: qwen3
  from_config: tiny
  config_overrides: {num_hidden_layers: 1, hidden_size: 32, intermediate_size: 64, head_dim: 8}
objective:
  name: block_diffusion
  block_size: 16
data:
  synthetic: {num_sequences: 16, vocab_size: 512}
  seq_len: 32
training:
  micro_batch_size: 2
  steps: 2
scheduler:
  warmup_steps: 1
"""


@pytest.fixture
def sealed(tmp_path, isolated_home, monkeypatch):
    """A subprocess environment whose HOME and TMPDIR are empty folders; returns (env, them)."""
    home, temp = tmp_path / "user-home", tmp_path / "temp"
    home.mkdir()
    temp.mkdir()
    for name in ("MPLCONFIGDIR", "TORCHINDUCTOR_CACHE_DIR", "TRITON_CACHE_DIR", "XDG_CACHE_HOME",
                 "XDG_CONFIG_HOME", "DLLM_COMPILE_CACHE"):  # fmt: skip
        monkeypatch.delenv(name, raising=False)  # cli_process passes on this process's env
    env = {"HOME": str(home), "TMPDIR": str(temp), "DLLM_HOME": str(isolated_home)}
    return env, (home, temp)


def leftovers(folders) -> list[str]:
    return sorted(str(p) for folder in folders for p in folder.rglob("*"))


def test_a_training_run_leaves_no_inductor_folder_in_temp(cli_process, tmp_path, sealed):
    """Importing torch._dynamo (FSDP2, DCP) creates inductor's cache folder: in the dllm home."""
    env, folders = sealed
    (tmp_path / "train.yaml").write_text(textwrap.dedent(SPEC))
    run = cli_process("train", "--config", "train.yaml", "--run-dir", "run", cwd=tmp_path, env=env)
    assert run.code == 0, run.err
    assert leftovers(folders) == []


def test_a_torchrun_launch_keeps_its_logs_in_the_run_dir(cli_process, tmp_path, sealed):
    env, folders = sealed
    (tmp_path / "train.yaml").write_text(textwrap.dedent(SPEC))
    launch = cli_process(
        "launch", "--config", "train.yaml", "--nproc-per-node", "2", "--set", "topology.dp=2",
        "--run-dir", "run", cwd=tmp_path, env=env,
    )  # fmt: skip
    assert launch.code == 0, launch.err
    assert (tmp_path / "run/torchelastic").is_dir()
    assert leftovers(folders) == []


def test_run_and_data_plots_keep_matplotlib_out_of_home(cli_process, tmp_path, sealed):
    """matplotlib's config and font cache go under the dllm home, not ~/.config or ~/.cache."""
    env, folders = sealed
    (tmp_path / "train.yaml").write_text(textwrap.dedent(SPEC))
    launch = cli_process(
        "launch", "--config", "train.yaml", "--run-dir", "run", cwd=tmp_path, env=env
    )
    assert launch.code == 0, launch.err
    plot = cli_process("run", "plot", "run", cwd=tmp_path, env=env)
    assert plot.code == 0, plot.err
    assert list((tmp_path / "run/plots").glob("*.png"))
    assert cli_process("init", "p", cwd=tmp_path, env=env).code == 0
    project = tmp_path / "p"
    prepare = cli_process("data", "prepare", "--config", "prepare.yaml", cwd=project, env=env)
    assert prepare.code == 0, prepare.err
    stats = cli_process("data", "stats", "data/prepared", "--plot", "s.png", cwd=project, env=env)
    assert stats.code == 0, stats.err
    assert (project / "s.png").is_file()
    assert leftovers(folders) == []
