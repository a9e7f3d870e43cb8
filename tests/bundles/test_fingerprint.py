"""The host fingerprint: probes without torch import or CUDA init, and DLLM_OVERRIDE_* values."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from turbo_dllm.errors import DllmError
from turbo_dllm.host import (
    FINGERPRINT_FORMAT,
    GpuArch,
    HostFingerprint,
    collect_fingerprint,
    probes,
)


def test_fingerprint_of_this_host_round_trips_through_json():
    fingerprint = collect_fingerprint(environ={})
    data = fingerprint.model_dump(mode="json")
    assert data["format"] == FINGERPRINT_FORMAT
    assert data["python_tag"] == f"cp{sys.version_info.major}{sys.version_info.minor}"
    assert fingerprint.overrides == ()
    assert HostFingerprint.model_validate_json(json.dumps(data)) == fingerprint


def test_fingerprint_reports_what_torch_reports():
    import torch

    fingerprint = collect_fingerprint(environ={})
    assert fingerprint.torch == torch.__version__
    assert (fingerprint.torch_cuda is None) == (torch.version.cuda is None)
    assert fingerprint.cxx11_abi == bool(torch._C._GLIBCXX_USE_CXX11_ABI)


def test_collecting_does_not_import_torch():
    code = (
        "import sys; from turbo_dllm.host import collect_fingerprint; f = collect_fingerprint(); "
        "print(f.torch, f.cxx11_abi, 'torch' in sys.modules)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    import torch

    version, abi, imported = out.stdout.split()
    assert version == torch.__version__
    assert abi == str(bool(torch._C._GLIBCXX_USE_CXX11_ABI))  # read from libc10's symbols
    assert imported == "False"


def test_overrides_let_a_cpu_node_pose_as_a_gpu_host():
    fingerprint = collect_fingerprint(
        environ={
            "DLLM_OVERRIDE_PYTHON": "3.12",
            "DLLM_OVERRIDE_TORCH": "2.11.0+cu130",
            "DLLM_OVERRIDE_CUDA": "13.0",
            "DLLM_OVERRIDE_GPUS": "sm90,9.0",
            "DLLM_OVERRIDE_DRIVER": "580.95.05",
        }
    )
    assert str(fingerprint.python_tag) == "cp312"
    assert str(fingerprint.torch_release) == "torch2.11"
    assert str(fingerprint.torch_cuda) == "cu130"
    assert [str(g.arch) for g in fingerprint.gpus] == ["sm90", "sm90"]
    assert fingerprint.gpu_archs == (GpuArch(9, 0),)
    assert fingerprint.driver == "580.95.05"
    assert set(fingerprint.overrides) == {
        "python",
        "python_tag",
        "torch",
        "torch_cuda",
        "gpus",
        "driver",
    }
    assert "2x sm90" in fingerprint.summary()


@pytest.mark.parametrize("value", ["", "none"])
def test_empty_gpu_override_means_no_gpu(value):
    fingerprint = collect_fingerprint(
        environ={"DLLM_OVERRIDE_GPUS": value, "DLLM_OVERRIDE_CUDA": "none"}
    )
    assert fingerprint.gpus == () and fingerprint.torch_cuda is None


def test_bad_override_is_a_user_error_naming_the_variable():
    with pytest.raises(DllmError, match="DLLM_OVERRIDE_GPUS='volta'"):
        collect_fingerprint(environ={"DLLM_OVERRIDE_GPUS": "volta"})


def test_overrides_can_be_ignored():
    fingerprint = collect_fingerprint(
        apply_overrides=False, environ={"DLLM_OVERRIDE_PYTHON": "3.99"}
    )
    assert fingerprint.overrides == ()


def test_driver_probe_reads_sys_then_proc(tmp_path):
    sys_file, proc_file = tmp_path / "sys", tmp_path / "proc"
    proc_file.write_text(
        "NVRM version: NVIDIA UNIX Open Kernel Module for x86_64  580.65.06  Release Build\n"
    )
    assert probes.probe_driver(sys_file, proc_file) == "580.65.06"
    sys_file.write_text("575.51.03\n")
    assert probes.probe_driver(sys_file, proc_file) == "575.51.03"


def test_visible_devices_follow_cuda_rules():
    rows = [
        (0, "H200", "9.0", "GPU-aaa"),
        (1, "H200", "9.0", "GPU-bbb"),
        (2, "A100", "8.0", "GPU-ccc"),
    ]
    pick = probes._apply_visible_devices
    assert pick(rows, None) == rows
    assert pick(rows, "") == []
    assert [r[0] for r in pick(rows, "2,0")] == [2, 0]
    assert [r[0] for r in pick(rows, "GPU-bbb")] == [1]
    assert [r[0] for r in pick(rows, "1,7,0")] == [1]  # CUDA stops at the first unknown entry


def test_torch_version_file_is_parsed_not_imported(tmp_path):
    (tmp_path / "version.py").write_text(
        "from typing import Optional\n__version__ = '2.11.0+cu130'\ncuda: Optional[str] = '13.0'\n"
        "raise SystemExit('imported!')\n"
    )
    assert probes._read_torch_version_file(tmp_path / "version.py") == ("2.11.0+cu130", "13.0")


def test_package_versions_come_from_dist_info_folders(tmp_path, monkeypatch):
    first, second = tmp_path / "a", tmp_path / "b"
    for folder, names in (
        (first, ["nvidia_nccl_cu12-2.21.5.dist-info", "Triton-3.1.0.dist-info"]),
        (second, ["nvidia_nccl_cu13-2.27.3.dist-info", "triton-9.9.dist-info", "README"]),
    ):
        folder.mkdir()
        for name in names:
            (folder / name).mkdir()
    monkeypatch.setattr(sys, "path", [str(first), str(second), str(tmp_path / "missing")])
    # The first name that is installed anywhere wins; among copies, the first on sys.path.
    assert probes.probe_package_version("nvidia-nccl-cu13", "nvidia-nccl-cu12") == "2.27.3"
    assert probes.probe_package_version("triton", "pytorch-triton") == "3.1.0"
    assert probes.probe_package_version("NVIDIA.NCCL_cu12") == "2.21.5"
    assert probes.probe_package_version("absent") is None


def test_package_version_probe_agrees_with_importlib_metadata():
    from importlib.metadata import version

    for name in ("pytest", "zstandard", "typing-extensions", "turbo-dllm"):
        assert probes.probe_package_version(name) == version(name)


def _fake_nvidia_smi(tmp_path, monkeypatch):
    """An nvidia-smi on PATH that logs each run and names its GPU after the run's number."""
    log = tmp_path / "runs.log"
    script = tmp_path / "bin" / "nvidia-smi"
    script.parent.mkdir()
    script.write_text(
        "#!/bin/sh\n"
        f'echo run >> "{log}"\n'
        f'n=$(wc -l < "{log}")\n'
        'echo "0, NVIDIA H200 run $n, 9.0, GPU-11ea1456-904e-1960-ce50-281c5f246553"\n'
    )
    script.chmod(0o755)
    monkeypatch.setenv("PATH", f"{script.parent}:/usr/bin:/bin")
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    return log


def test_gpu_probe_started_early_is_the_one_probe_gpus_reads(tmp_path, monkeypatch):
    log = _fake_nvidia_smi(tmp_path, monkeypatch)
    probes.start_gpu_probe()
    probes.start_gpu_probe()  # already running: not a second query
    assert probes.probe_gpus().gpus == ((0, "NVIDIA H200 run 1", "9.0"),)
    assert log.read_text().count("run") == 1
    # Read once: the next probe asks nvidia-smi again (GPUs may have changed since).
    assert probes.probe_gpus().gpus == ((0, "NVIDIA H200 run 2", "9.0"),)


def test_gpu_probe_started_early_that_fails_reports_it(tmp_path, monkeypatch):
    script = tmp_path / "bin" / "nvidia-smi"
    script.parent.mkdir()
    script.write_text("#!/bin/sh\nexit 9\n")
    script.chmod(0o755)
    monkeypatch.setenv("PATH", f"{script.parent}:/usr/bin:/bin")
    probes.start_gpu_probe()
    assert probes.probe_gpus() == probes.GpuProbe(
        (), ("nvidia-smi is installed but exited with status 9: no message; GPU list unknown",)
    )


def test_gpu_probe_start_without_nvidia_smi_does_nothing(tmp_path, monkeypatch):
    monkeypatch.setenv("PATH", str(tmp_path))
    probes.start_gpu_probe()
    assert probes.probe_gpus() == probes.GpuProbe(())


def _smi_script(tmp_path, monkeypatch, body: str):
    script = tmp_path / "bin" / "nvidia-smi"
    script.parent.mkdir(exist_ok=True)
    script.write_text("#!/bin/sh\n" + body)
    script.chmod(0o755)
    monkeypatch.setenv("PATH", f"{script.parent}:/usr/bin:/bin")
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    monkeypatch.setattr(probes, "_HUNG", set())
    return script


def _gone(pid: int, within_s: float = 5.0) -> bool:
    """No such process, or only its zombie (nothing here reaps an orphan's), within `within_s`:
    a SIGKILLed process ends a moment after the signal is sent (longer on a loaded host)."""
    import time

    deadline = time.monotonic() + within_s
    while True:
        try:
            with open(f"/proc/{pid}/stat") as stat:
                if stat.read().rsplit(")", 1)[1].split()[0] in ("Z", "X"):
                    return True
        except FileNotFoundError:
            return True
        if time.monotonic() > deadline:
            return False
        time.sleep(0.02)


@pytest.mark.parametrize("started_early", [False, True], ids=["probed", "started-early"])
def test_a_hung_nvidia_smi_times_out_once_and_leaves_nothing_running(
    tmp_path, monkeypatch, started_early
):
    """A wrapper whose child holds the output pipes and never ends (a hung driver): the probe
    gives up after the timeout, says so, ends the child too, and asks that nvidia-smi no more
    in this process (a command fingerprints the host several times)."""
    import time

    log = tmp_path / "runs.log"
    _smi_script(tmp_path, monkeypatch, f'sleep 30 &\necho $! >> "{log}"\nwait\n')
    monkeypatch.setattr(probes, "NVIDIA_SMI_TIMEOUT_S", 0.5)
    if started_early:
        probes.start_gpu_probe()
    began = time.monotonic()
    assert probes.probe_gpus() == probes.GpuProbe(
        (), ("nvidia-smi is installed but did not answer within 0.5 s; GPU list unknown",)
    )
    assert probes.probe_driver(tmp_path / "no-sys", tmp_path / "no-proc") is None
    fingerprint = collect_fingerprint(environ={})
    assert time.monotonic() - began < 10  # it waited for the sleep (30 s) before
    assert fingerprint.gpus == () and "did not answer within 0.5 s" in fingerprint.notes[-1]
    (child,) = map(int, log.read_text().split())  # nvidia-smi was run once
    assert _gone(child)
    probes.start_gpu_probe()  # not started again either
    assert probes._started_gpu_query is None


def test_a_failing_nvidia_smi_is_reported_with_its_exit_status_and_message(tmp_path, monkeypatch):
    _smi_script(
        tmp_path,
        monkeypatch,
        'echo "NVIDIA-SMI has failed because it couldn\'t communicate with the NVIDIA driver."\n'
        "exit 9\n",
    )
    (note,) = probes.probe_gpus().notes
    assert note == (
        "nvidia-smi is installed but exited with status 9: NVIDIA-SMI has failed because it "
        "couldn't communicate with the NVIDIA driver.; GPU list unknown"
    )


def test_nvidia_smi_output_that_is_not_text_is_a_note_not_a_crash(tmp_path, monkeypatch):
    _smi_script(tmp_path, monkeypatch, "printf '\\365\\377\\000garbage\\n[N/A]'\n")
    assert probes.probe_driver(tmp_path / "no-sys", tmp_path / "no-proc") is None
    (note,) = probes.probe_gpus().notes
    assert note.startswith("unexpected nvidia-smi output: ")
    fingerprint = collect_fingerprint(environ={})
    assert fingerprint.driver is None and fingerprint.gpus == ()
    sys_file = tmp_path / "sys"
    sys_file.write_bytes(b"\xf5\xff580\n")  # an odd /sys/module/nvidia/version: next source
    proc_file = tmp_path / "proc"
    proc_file.write_text("NVRM version: NVIDIA UNIX Kernel Module  580.65.06  Release Build\n")
    assert probes.probe_driver(sys_file, proc_file) == "580.65.06"


def test_ctrl_c_while_nvidia_smi_hangs_leaves_nothing_running(tmp_path, monkeypatch):
    """nvidia-smi runs in its own session (so a timeout can end all it started), where the
    terminal's SIGINT does not reach it: the probe ends it when Ctrl-C interrupts the wait."""
    import signal
    import time

    log = tmp_path / "runs.log"
    _smi_script(tmp_path, monkeypatch, f'sleep 30 &\necho $! >> "{log}"\nwait\n')
    probe = subprocess.Popen(
        [sys.executable, "-c", "from turbo_dllm.host import probes; probes.probe_gpus()"],
        stderr=subprocess.PIPE,
        # as from a terminal: a suite run as a shell's background job starts ignoring SIGINT
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
    )
    deadline = time.monotonic() + 20
    while not (log.exists() and log.read_text().strip()) and time.monotonic() < deadline:
        time.sleep(0.05)
    probe.send_signal(signal.SIGINT)
    _, err = probe.communicate(timeout=20)
    assert b"KeyboardInterrupt" in err
    (child,) = map(int, log.read_text().split())
    assert _gone(child)
