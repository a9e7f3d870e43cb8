"""Serve a published bundle on loopback and run `dllm bundle install --auto` a few ways."""
import os, subprocess, sys, tempfile, time, shutil, glob, pstats
from pathlib import Path
sys.path.insert(0, os.getcwd())
from benchmarks.bundle_install import serve
from turbo_dllm.bundles.publish import publish

archive = Path(sys.argv[1]) if len(sys.argv) > 1 else Path(glob.glob("/tmp/ib/dist/*.tar.zst")[0])
work = Path(tempfile.mkdtemp())
res = publish([archive], release="probe", mirror=work / "mirror")
server, url = serve(work / "mirror")
env = dict(os.environ); env.pop("PYTHONDONTWRITEBYTECODE", None)
env["PYTHONPYCACHEPREFIX"] = str(work / "pyc")
base = [sys.executable]
cmd = ["-m", "turbo_dllm", "bundle", "install", "--release", "probe", "--auto", "--index", url,
       "--catalog-sha256", res.catalog_sha256]
def run(extra, tag, i, extra_env=None):
    home = work / f"h-{tag}-{i}"
    t = time.perf_counter()
    p = subprocess.run(base + extra + cmd, env={**env, **(extra_env or {}), "DLLM_HOME": str(home)}, capture_output=True, text=True)
    dt = time.perf_counter() - t
    if p.returncode: print(p.stderr[-2000:])
    shutil.rmtree(home, ignore_errors=True)
    return dt, p
for i in range(6):
    dt, _ = run([], "plain", i); print(f"plain {dt*1e3:.0f} ms")
dt, p = run(["-X", "importtime"], "imp", 0)
lines = [l for l in p.stderr.splitlines() if "import time" in l]
rows = []
for l in lines[1:]:
    parts = l.split("|")
    try: rows.append((int(parts[1]), parts[2]))
    except Exception: pass
rows.sort(reverse=True)
print("importtime cumulative top:"); [print(f"  {us/1e3:7.1f} ms {n}") for us, n in rows[:25]]
dt, p = run(["-m", "cProfile", "-o", str(work / "prof.out")], "prof", 0)
st = pstats.Stats(str(work / "prof.out")); st.sort_stats("cumulative").print_stats(45)
st.sort_stats("tottime").print_stats(25)
