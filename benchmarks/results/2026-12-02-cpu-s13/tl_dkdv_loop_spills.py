"""The `tl` dK/dV kernel's spill instructions per loop (session 13): its default config at D = 128
compiled for sm90 (Triton 3.6.0 unpacked at /tmp/triton36), each loop with wgmma instructions
listed with the spill stores and loads between its head and its back-edge."""

import re
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, "/tmp/triton36")
sys.path.insert(0, str(Path(__file__).resolve().parents[3] / "ci"))

import triton_sm90_compile as c  # noqa: E402

module = c._module()
kernel = c.compile_variant(module, "dkdv", module.default_config(128), 128)
tool = "/tmp/triton36/triton/backends/nvidia/bin/cuobjdump"
with tempfile.NamedTemporaryFile(suffix=".cubin") as handle:
    handle.write(kernel.asm["cubin"])
    handle.flush()
    sass = subprocess.run([tool, "-sass", handle.name], capture_output=True, text=True).stdout
code = [line for line in sass.splitlines() if re.search(r"/\*[0-9a-f]{4}\*/", line)]
address = [int(re.search(r"/\*([0-9a-f]{4})\*/", line)[1], 16) for line in code]
mma = [i for i, line in enumerate(code) if "HGMMA" in line]
spills = [i for i, line in enumerate(code) if re.search(r"\b(STL|LDL)", line)]
for i, line in enumerate(code):
    branch = re.search(r"BRA 0x([0-9a-f]+)", line)
    if branch and int(branch[1], 16) < address[i] and int(branch[1], 16) in address:
        top = address.index(int(branch[1], 16))
        inside = sum(top <= j <= i for j in mma)
        if inside and i - top < 2000:  # a tile loop, not the whole kernel
            spilled = sum(top <= j <= i for j in spills)
            print(f"loop {top}-{i}: {inside} HGMMA, spill instructions inside {spilled}")
print("spill instructions in all", len(spills))
