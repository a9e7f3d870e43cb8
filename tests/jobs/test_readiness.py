"""Launch readiness checks (doctor orders 400-499) judged against the real launch."""

from __future__ import annotations

import socket
import stat

from tests.helpers import assert_user_error
from turbo_dllm.doctor.checks.launch import GpuProcess, busy_gpus, query_gpu_processes

FAKE_SMI = """#!/bin/sh
case "$1" in
  --query-gpu=*) printf '0, GPU-aaa, 1\\n1, GPU-bbb, 40961\\n2, GPU-ccc, 30721\\n3, GPU-ddd, %s\\n' "$DLLM_TEST_SMI_GPU3_MIB" ;;
  --query-compute-apps=*) printf '%s' "$DLLM_TEST_SMI_APPS" ;;
  *) exit 9 ;;
esac
"""


def install_fake_smi(folder, monkeypatch, apps: str, gpu3_mib: str = "0") -> None:
    folder.mkdir(exist_ok=True)
    smi = folder / "nvidia-smi"
    smi.write_text(FAKE_SMI)
    smi.chmod(smi.stat().st_mode | stat.S_IEXEC)
    monkeypatch.setenv("PATH", f"{folder}:/usr/bin:/bin")
    monkeypatch.setenv("DLLM_TEST_SMI_APPS", apps)
    monkeypatch.setenv("DLLM_TEST_SMI_GPU3_MIB", gpu3_mib)


def test_query_reads_processes_per_gpu_index(tmp_path, monkeypatch):
    install_fake_smi(tmp_path / "bin", monkeypatch, "GPU-ccc, 4321, 30720\nGPU-zzz, 1, 5\n")
    # GPU 1 has 40 GiB in use but no process nvidia-smi can name (another container).
    assert query_gpu_processes() == [
        GpuProcess(gpu_index=2, pid=4321, used_mib=30720.0),
        GpuProcess(gpu_index=1, pid=None, used_mib=40961.0),
    ]


def test_query_that_cannot_be_read_is_none_not_a_crash(tmp_path, monkeypatch):
    """A pid nvidia-smi cannot give ("[N/A]" in some containers): the check says it cannot
    tell (was a ValueError traceback out of dllm doctor and dllm launch)."""
    install_fake_smi(tmp_path / "bin", monkeypatch, "GPU-bbb, [N/A], 40960\n")
    assert query_gpu_processes() is None
    install_fake_smi(tmp_path / "bin", monkeypatch, "")
    assert query_gpu_processes() == [  # GPUs 1 and 2 have memory in use, no process named
        GpuProcess(gpu_index=1, pid=None, used_mib=40961.0),
        GpuProcess(gpu_index=2, pid=None, used_mib=30721.0),
    ]


def test_busy_gpus_only_counts_the_gpus_the_launch_uses():
    procs = [GpuProcess(gpu_index=3, pid=99999999, used_mib=1.0)]
    assert busy_gpus(procs, None, 2) == []
    assert busy_gpus(procs, None, 4) == procs
    assert busy_gpus(procs, [3, 0], 1) == procs  # CUDA_VISIBLE_DEVICES=3,0: first is GPU 3


def test_launch_refuses_busy_gpus(cli, spec_file, gpus, workdir, monkeypatch):
    gpus(4)
    install_fake_smi(
        workdir / "bin", monkeypatch, "GPU-bbb, 4321, 40960\nGPU-ccc, 77, 30720\n", "9000"
    )
    result = cli("launch", "--config", spec_file, "--set", "topology.fsdp=4")
    assert_user_error(
        result,
        "busy gpus",
        "GPU 1: pid 4321 use 40.0 GiB",
        "GPU 3: processes nvidia-smi cannot name use 8.8 GiB",
        "CUDA_VISIBLE_DEVICES",
    )
    assert not (workdir / "runs").exists()
    install_fake_smi(workdir / "bin", monkeypatch, "GPU-bbb, 4321, 40960\n")
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0,2,3")
    report = cli("doctor", "--config", spec_file, "--world-size", "1", "--json")
    assert '"busy gpus"' in report.out and "are free" in report.out


def test_doctor_checks_gpus_against_the_world_size(cli, spec_file, gpus):
    gpus(2)
    result = cli("doctor", "--config", spec_file, "--json")
    assert "1 process(es) on 2 visible GPU(s)" in result.out
    result = cli("doctor", "--config", spec_file, "--world-size", "4")
    assert result.code == 1
    assert "4 processes per node but 2 visible GPU(s)" in result.out


def test_taken_rendezvous_port_is_not_ready(cli, spec_file, workdir):
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        result = cli(
            "launch",
            "--config",
            spec_file,
            "--set",
            "topology.dp=2",
            "--nproc-per-node",
            "2",
            "--master-addr",
            "127.0.0.1",
            "--master-port",
            str(port),
        )
    assert_user_error(result, "rendezvous", f"port {port} is taken", "--master-port")
    assert not (workdir / "runs").exists()


def test_launch_refuses_a_checkpoint_dir_through_a_file(cli, spec_file, workdir):
    """Was: the workers trained, then the first checkpoint failed ("Not a directory")."""
    (workdir / "file").write_text("")
    result = cli("launch", "--config", spec_file, "--set", f"checkpoint.dir={workdir}/file/c")
    assert_user_error(
        result,
        "not ready to launch",
        "checkpoint dir:",
        f"goes through {workdir / 'file'}",
        # the doctor line as typed, to paste (it read "`dllm doctor --config F`")
        f"hint: fix the checks above, then launch again (dllm doctor --config {spec_file} "
        f"--set checkpoint.dir={workdir}/file/c runs this host's checks without launching)",
    )
    assert not (workdir / "runs").exists()


def test_a_slurm_job_is_judged_on_its_nodes_gpus_not_the_login_nodes(cli, spec_file, workdir):
    """Was: submitting a flex (or turbo with kernels: jit) run from a login node without GPUs
    was refused "flex needs a CUDA GPU", the login node's torch having none."""
    slurm = ("launch", "--config", spec_file, "--backend", "slurm", "--nproc-per-node", "1")
    for attention in (("model.attention=flex",), ("model.attention=turbo", "kernels=jit")):
        settings = [word for setting in attention for word in ("--set", setting)]
        if "kernels=jit" in attention:
            settings += ["--set", "model.config_overrides.head_dim=64"]
        run_dir = workdir / "runs" / attention[0].split("=")[1]
        result = cli(*slurm, *settings, "--gpus-per-node", "1", "--run-dir", run_dir)
        assert result.code == 0, result.err
        assert (run_dir / "job.sbatch").is_file()
        cpu_job = cli(*slurm, *settings, "--gpus-per-node", "0", "--run-dir", f"{run_dir}-cpu")
        assert_user_error(cpu_job, "attention backend", "CUDA GPU")
