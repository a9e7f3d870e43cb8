#!/usr/bin/env bash
# where the GPU host's bundle install time goes (session 25 probe)
set -u
cd "$(dirname "$0")/../.."
export PYTHONPATH=$PWD
echo "--- nvidia-smi query x3"
for i in 1 2 3; do /usr/bin/time -f "%e s wall %U user %S sys" nvidia-smi --query-gpu=index,name,compute_cap,uuid --format=csv,noheader; done
nvidia-smi -q | grep -i -m2 persistence
echo "--- /proc/driver/nvidia/gpus"; ls /proc/driver/nvidia/gpus/ 2>&1; cat /proc/driver/nvidia/gpus/*/information 2>&1 | head -20
cat /sys/module/nvidia/version 2>&1
for d in /sys/bus/pci/devices/*; do [ "$(cat $d/vendor)" = 0x10de ] && echo "$d $(cat $d/device) $(cat $d/class)"; done
echo "--- NVML via ctypes x3 (fresh processes)"
for i in 1 2 3; do python3 - <<'PY'
import ctypes, time
t = time.perf_counter()
lib = ctypes.CDLL("libnvidia-ml.so.1")
t1 = time.perf_counter()
rc = lib.nvmlInit_v2()
t2 = time.perf_counter()
n = ctypes.c_uint(); lib.nvmlDeviceGetCount_v2(ctypes.byref(n))
h = ctypes.c_void_p(); lib.nvmlDeviceGetHandleByIndex_v2(0, ctypes.byref(h))
maj, mi = ctypes.c_int(), ctypes.c_int(); lib.nvmlDeviceGetCudaComputeCapability(h, ctypes.byref(maj), ctypes.byref(mi))
name = ctypes.create_string_buffer(96); lib.nvmlDeviceGetName(h, name, 96)
drv = ctypes.create_string_buffer(96); lib.nvmlSystemGetDriverVersion(drv, 96)
t3 = time.perf_counter()
lib.nvmlShutdown()
t4 = time.perf_counter()
print(f"load {1e3*(t1-t):.1f} ms init {1e3*(t2-t1):.1f} ms query {1e3*(t3-t2):.1f} ms shutdown {1e3*(t4-t3):.1f} ms rc {rc} n {n.value} {name.value} {maj.value}.{mi.value} {drv.value}")
PY
done
echo "--- startup"
for i in 1 2 3; do /usr/bin/time -f "python -c pass %e s" python3 -c pass; done
for i in 1 2 3; do /usr/bin/time -f "python -S -c pass %e s" python3 -S -c pass; done
python3 -c "import sys; print(len(sys.path), sys.path)"
echo "--- fingerprint in-process"
python3 - <<'PY'
import time
t = time.perf_counter()
from turbo_dllm.host import probes
t1 = time.perf_counter()
for name, fn in [("torch", probes.probe_torch), ("glibc", probes.probe_glibc), ("driver", probes.probe_driver), ("gpus", probes.probe_gpus), ("pkg", lambda: probes.probe_package_version("torch"))]:
    s = time.perf_counter(); r = fn(); print(f"{name}: {1e3*(time.perf_counter()-s):.1f} ms {r}")
from turbo_dllm.host import fingerprint
s = time.perf_counter()
fp = fingerprint.__dict__
print("import probes", 1e3*(t1-t))
PY
echo "--- the install, profiled"
python3 benchmarks/scratch/install_probe.py "$@"
