"""Compile-cache packs on CPU: a pack made from a real torch.compile run installs into a fresh
home and the next run compiles nothing; a pack for another torch/Triton/GPU is refused with the
fields that differ; a tampered pack is refused and nothing is installed."""

from __future__ import annotations

import io
import json
import os
import shlex
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest

from tests.cache.conftest import clean_env
from tests.helpers import assert_user_error

PROBE = Path(__file__).with_name("compile_probe.py")
ROOT = Path(__file__).resolve().parents[2]


def _compile_run(home: Path, device: str = "cpu") -> dict:
    env = clean_env(DLLM_HOME=str(home), PYTHONPATH=str(ROOT))
    proc = subprocess.run(
        [sys.executable, str(PROBE), device], env=env, capture_output=True, text=True, timeout=300
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


@pytest.fixture(scope="module")
def pack(tmp_path_factory):
    """(pack path, counters of the cold run): compiled once in its own home, then packed."""
    home = tmp_path_factory.mktemp("pack-home")
    cold = _compile_run(home)
    out = tmp_path_factory.mktemp("packs")
    env = clean_env(DLLM_HOME=str(home), PYTHONPATH=str(ROOT))
    proc = subprocess.run(
        [sys.executable, "-m", "turbo_dllm", "cache", "pack", "--out", str(out), "--json"],
        env=env, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    made = json.loads(proc.stdout)
    assert made["files"] > 0 and Path(made["pack"]).parent == out
    return Path(made["pack"]), cold


def test_a_pack_makes_the_next_run_compile_nothing(pack, cli, isolated_home):
    path, cold = pack
    assert cold["inductor"].get("fxgraph_cache_miss", 0) > 0  # the cold run compiled
    installed = cli("cache", "install", path, "--json")
    assert installed.code == 0, installed.err
    record = json.loads(installed.out)
    assert record["added"] == record["files"] > 0
    assert cli("cache", "verify").code == 0
    assert record["sha256"][:12] in cli("cache", "list").out

    warm = _compile_run(isolated_home)  # a fresh home that only has the pack
    assert warm["inductor"].get("fxgraph_cache_miss", 0) == 0, warm
    assert warm["inductor"]["fxgraph_cache_hit"] == cold["inductor"]["fxgraph_cache_miss"]

    again = json.loads(cli("cache", "install", path, "--json").out)
    assert again["added"] == 0  # everything already there: idempotent
    removed = cli("cache", "remove", record["sha256"][:12])
    assert removed.code == 0 and f"{record['files']} files deleted" in removed.out
    assert cli("cache", "list").out.startswith("no compile-cache packs installed")


@pytest.mark.parametrize(
    ("variable", "value", "field"),
    [
        ("DLLM_OVERRIDE_TORCH", "2.11.0+cpu", "torch: host 2.11.0+cpu, pack "),
        ("DLLM_OVERRIDE_TRITON", "3.0.0", "triton: host 3.0.0, pack "),
        ("DLLM_OVERRIDE_GPUS", "sm90", "gpus: host sm90, pack none"),
    ],
)
def test_a_pack_for_another_host_is_refused(pack, cli, monkeypatch, variable, value, field):
    monkeypatch.setenv(variable, value)
    result = cli("cache", "install", pack[0])
    assert_user_error(result, "does not fit this host", field)
    assert cli("cache", "list").out.startswith("no compile-cache packs installed")


def _rewrite(source: Path, dest: Path, change, extra: tuple[str, bytes] | None = None) -> None:
    """Copy the pack, passing every member's (info, bytes) through `change`, then `extra`."""
    import zstandard

    with source.open("rb") as raw, zstandard.ZstdDecompressor().stream_reader(raw) as stream:
        with tarfile.open(fileobj=stream, mode="r|") as tar:
            members = [(m, tar.extractfile(m).read()) for m in tar]
    if extra is not None:
        members.append((tarfile.TarInfo(extra[0]), extra[1]))
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w") as tar:
        for info, data in members:
            info, data = change(info, data)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    dest.write_bytes(zstandard.ZstdCompressor().compress(buffer.getvalue()))


@pytest.mark.parametrize("how", ["flipped-byte", "extra-member", "pack-json-lies"])
def test_a_tampered_pack_is_refused_and_nothing_installed(pack, cli, tmp_path, how):
    from turbo_dllm.train.compile_cache import compile_cache_dir

    source = pack[0]
    tampered = tmp_path / source.name

    def change(info, data):
        if how == "flipped-byte" and info.name.startswith("inductor/") and data:
            return info, bytes([data[0] ^ 1]) + data[1:]
        if how == "pack-json-lies" and info.name == "pack.json":
            document = json.loads(data)
            document["files"][-1]["sha256"] = "0" * 64
            return info, json.dumps(document).encode()
        return info, data

    extra = ("inductor/zz/evil.py", b"boom\n") if how == "extra-member" else None
    _rewrite(source, tampered, change, extra)
    result = cli("cache", "install", tampered)
    expected = {"flipped-byte": "sha256", "extra-member": "not listed", "pack-json-lies": "0" * 64}
    assert_user_error(result, expected[how])
    assert cli("cache", "list").out.startswith("no compile-cache packs installed")
    cache = compile_cache_dir()
    assert not [p for p in cache.rglob("*") if p.is_file()], "a refused pack left files"


def test_a_mirror_carries_packs_and_offers_them(pack, cli, tmp_path, monkeypatch):
    from tests.envs.test_manifest import manifest
    from turbo_dllm.mirror.create import MirrorPlan, create_mirror

    root = tmp_path / "mirror"
    index = create_mirror(
        MirrorPlan(dest=root, release=None, manifests=[manifest()], packs=[pack[0]])
    )
    (carried,) = [f for f in index.files if f.kind == "pack"]
    assert carried.path == f"packs/{pack[0].name}"
    verified = cli("mirror", "verify", root)
    assert verified.code == 0, verified.out + verified.err
    monkeypatch.setenv("DLLM_BUNDLE_INDEX", str(root))
    offered = json.loads(cli("cache", "list", "--available", "--json").out)["available"]
    assert offered == [{"path": str(root / carried.path), "fits": True, "differences": []}]


def test_doctor_and_launch_name_a_fitting_pack_that_is_not_installed(cli, tmp_path, monkeypatch):
    """`dllm doctor --config` (whose warnings `dllm launch` prints) offers a pack made for this
    spec on this kind of host, and stops once it is installed."""
    from tests.train.util import write_config
    from turbo_dllm.cache.key import compile_relevant, host_pack_key, spec_digest
    from turbo_dllm.cache.packs import make_pack
    from turbo_dllm.config.load import load_runspec
    from turbo_dllm.host import collect_fingerprint

    config = write_config(tmp_path / "train.yaml", "training.compile=true")
    other = write_config(
        tmp_path / "other.yaml", "training.compile=true", "objective.block_size=16"
    )
    made = tmp_path / "made" / "inductor" / "ab"
    made.mkdir(parents=True)
    (made / "cabc.py").write_text("# a compiled graph\n")
    spec = load_runspec(config)
    key = host_pack_key(collect_fingerprint(apply_overrides=False), spec_digest(spec))
    path, made_manifest = make_pack(
        {"inductor": made.parent}, tmp_path / "offered packs", key, spec=compile_relevant(spec)
    )
    assert json.loads(made_manifest.spec)["data"] == {"seq_len": 64}
    monkeypatch.setenv("DLLM_PACK_PATH", str(tmp_path / "offered packs"))

    def compile_check(config_file):
        result = cli("doctor", "--config", config_file, "--json")
        return {c["name"]: c for c in json.loads(result.out)["checks"]}["compile cache"]

    offered = compile_check(config)
    # Quoted: the folder's space split the path in two when the fix was pasted.
    assert offered["status"] == "warn" and f"dllm cache install '{path}' (" in offered["fix"]
    assert compile_check(other)["status"] == "pass"  # made for another spec: not offered
    assert cli("cache", "install", path, "--config", config).code == 0
    assert compile_check(config)["status"] == "pass"
    refused = cli("cache", "install", path, "--config", other)
    # Was: "does not fit this host: spec: host <digest>, pack <digest>" and the hint to make a
    # pack on a host like this one (the host was fine): now the fields that differ.
    assert_user_error(
        refused,
        "does not fit this run: made for another spec (objective.block_size: run 16, pack 8)",
        "install it with the --config (and --set) it was packed for",
    )
    assert "on a host like this one" not in refused.err


def test_warm_needs_a_config(cli, tmp_path):
    assert_user_error(cli("cache", "pack", "--warm", "--out", tmp_path), "--config")


def _warm_error(result, *needles: str) -> None:
    """`assert_user_error` for `pack --warm`, whose stderr starts with the step's own output."""
    assert result.code == 2, (result.code, result.err)
    assert "Traceback" not in result.err
    error = result.err[result.err.rindex("dllm: error:") :]  # ours, after the step's
    for needle in needles:
        assert needle in error, (needle, error)


def test_a_warm_up_that_compiles_nothing_says_so(cli_process, tmp_path):
    """Was: "the compile caches are empty (<a temp folder, deleted>): nothing to pack", hinting
    to pass the --warm just given: importing torch makes the (empty) cache folders anyway."""
    from tests.train.util import write_config

    config = write_config(tmp_path / "train.yaml")  # training.compile: false, on CPU
    result = cli_process("cache", "pack", "--config", config, "--warm", "--out", tmp_path / "p")
    _warm_error(
        result,
        f"the warm-up step of {config} compiled nothing: no pack to make",
        "add --set training.compile=true",
    )
    assert "pass --warm" not in result.err and not (tmp_path / "p").exists()


def test_a_failed_warm_up_hints_the_step_it_ran(cli_process, tmp_path):
    """Was: "run `dllm train --config F --set training.steps=1` to see why": the user's --set
    overrides were dropped, and a spec with a warm-up failed on that instead (scheduler.
    warmup_steps: 2 exceeds training.steps (1)). Now the step's own command, quoted."""
    from tests.train.util import write_config

    (tmp_path / "my configs").mkdir()
    config = write_config(tmp_path / "my configs" / "train.yaml", "training.compile=true")
    result = cli_process(
        "cache", "pack", "--config", config, "--set", "data.synthetic=null", "--set", "data.artifact=missing", "--warm",
        "--out", tmp_path / "p",
    )  # fmt: skip
    _warm_error(
        result,
        "failed (exit 2)",
        f"run `dllm train --config '{config}' --set data.synthetic=null --set "
        "data.artifact=missing --set training.steps=1 --set scheduler.warmup_steps=0` to see why",
    )


def test_list_refuses_config_without_available(cli, tmp_path):
    """--config judges offered packs only: without --available it was ignored without a word."""
    result = cli("cache", "list", "--config", tmp_path / "train.yaml")
    assert_user_error(result, "--config", "--available")
    # The hint pastes into a shell: a path with a space quoted, the --set values kept.
    config = tmp_path / "my run.yaml"
    result = cli("cache", "list", "--config", config, "--set", "data.seq_len=64 ")
    assert_user_error(result, "--available", f"hint: dllm cache list --available --config "
                      f"'{config}' --set 'data.seq_len=64 '\n")  # fmt: skip


def test_a_truncated_pack_is_called_truncated(cli, tmp_path):
    from turbo_dllm.cache.key import host_pack_key
    from turbo_dllm.cache.packs import make_pack
    from turbo_dllm.host import collect_fingerprint

    source = tmp_path / "inductor" / "ab"
    source.mkdir(parents=True)
    (source / "c1.py").write_text("# a compiled graph\n" * 2000)
    key = host_pack_key(collect_fingerprint(apply_overrides=False), None)
    path, _ = make_pack({"inductor": source.parent}, tmp_path / "packs", key)
    cut = tmp_path / path.name
    cut.write_bytes(path.read_bytes()[: path.stat().st_size // 2])
    result = cli("cache", "install", cut)
    assert_user_error(result, f"{cut.name}: truncated or incomplete compile-cache pack")
    assert "empty file" not in result.err


def test_the_cache_modules_import_no_torch():
    program = (
        "import sys, turbo_dllm.cache.key, turbo_dllm.cache.packs, turbo_dllm.cache.warm, "
        "turbo_dllm.cli.cache; print('torch' in sys.modules)"
    )
    proc = subprocess.run([sys.executable, "-c", program], capture_output=True, text=True)
    assert proc.stdout.strip() == "False", proc.stderr


@pytest.mark.gpu
def test_a_gpu_pack_carries_the_triton_kernels(cli, tmp_path, isolated_home):
    """On CUDA the pack holds Triton's compiled kernels too; the next run in a fresh home only
    hits the caches."""
    home = tmp_path / "gpu-home"
    cold = _compile_run(home, "cuda")
    assert cold["inductor"].get("fxgraph_cache_miss", 0) > 0
    env = clean_env(DLLM_HOME=str(home), PYTHONPATH=str(ROOT))
    made = subprocess.run(
        [sys.executable, "-m", "turbo_dllm", "cache", "pack", "--out", str(tmp_path), "--json"],
        env=env, capture_output=True, text=True, check=True,
    )  # fmt: skip
    path = Path(json.loads(made.stdout)["pack"])
    from turbo_dllm.cache.packs import read_pack_manifest

    manifest = read_pack_manifest(path)
    assert manifest.key.gpus and manifest.key.cuda
    assert any(f.path.startswith("triton/") for f in manifest.files)
    assert cli("cache", "install", path).code == 0
    warm = _compile_run(isolated_home, "cuda")
    assert warm["inductor"].get("fxgraph_cache_miss", 0) == 0, warm
    assert warm["inductor"]["fxgraph_cache_hit"] == cold["inductor"]["fxgraph_cache_miss"]


def test_remove_takes_away_only_what_the_install_added(cli, tmp_path):
    from turbo_dllm.cache.key import host_pack_key
    from turbo_dllm.cache.packs import make_pack
    from turbo_dllm.host import collect_fingerprint
    from turbo_dllm.train.compile_cache import compile_cache_dir

    source = tmp_path / "inductor" / "ab"
    source.mkdir(parents=True)
    for name in ("c1.py", "c2.py"):
        (source / name).write_text(f"# {name}\n")
    key = host_pack_key(collect_fingerprint(apply_overrides=False), None)
    path, _ = make_pack({"inductor": source.parent}, tmp_path / "packs", key)
    mine = compile_cache_dir() / "inductor" / "ab" / "c1.py"  # already in this host's cache
    mine.parent.mkdir(parents=True)
    mine.write_text("# c1.py\n")
    assert json.loads(cli("cache", "install", path, "--json").out)["added"] == 1
    assert json.loads(cli("cache", "install", path, "--json").out)["added"] == 0
    assert "1 files deleted" in cli("cache", "remove", path.name).out
    assert mine.is_file() and not (mine.parent / "c2.py").exists()


def test_pack_without_config_says_any_spec_and_short_prefixes_are_explained(cli, tmp_path):
    from turbo_dllm.train.compile_cache import compile_cache_dir

    entry = compile_cache_dir() / "inductor" / "ab" / "c1.py"
    entry.parent.mkdir(parents=True)
    entry.write_text("# c1.py\n")
    made = cli("cache", "pack", "--out", tmp_path / "packs")
    assert made.code == 0, made.err
    assert "spec any (no --config)" in made.out  # was cut to "any (no --co"
    sha = json.loads(cli("cache", "pack", "--out", tmp_path / "p2", "--json").out)["sha256"]
    assert cli("cache", "install", next((tmp_path / "packs").iterdir())).code == 0
    # A 4-character prefix of the listed hash is not enough: the error says why.
    assert_user_error(cli("cache", "remove", sha[:4]), sha[:12], "at least 6 characters")
    assert cli("cache", "remove", sha[:6]).code == 0


def test_the_next_command_pack_prints_runs_as_printed_from_a_folder_with_spaces(cli, tmp_path):
    """`next: dllm cache install PATH` left a path with spaces unquoted: pasted into a shell,
    it named a pack that does not exist."""
    import shlex

    from turbo_dllm.train.compile_cache import compile_cache_dir

    entry = compile_cache_dir() / "inductor" / "ab" / "c1.py"
    entry.parent.mkdir(parents=True)
    entry.write_text("# c1.py\n")
    made = cli("cache", "pack", "--out", tmp_path / "my packs")
    assert made.code == 0, made.err
    [line] = [x for x in made.out.splitlines() if x.startswith("next: ")]
    # The whole line as printed: its remark "(on a host like this one)" was a bash syntax error
    # once pasted (this test cut it off before splitting); now it is a shell comment.
    command = line.removeprefix("next: ")
    bash = subprocess.run(["bash", "-n", "-c", command], capture_output=True, text=True)
    assert bash.returncode == 0, bash.stderr
    argv = shlex.split(command, comments=True)
    assert argv[:3] == ["dllm", "cache", "install"], argv
    installed = cli(*argv[1:])
    assert installed.code == 0, installed.err


def test_a_relative_compile_cache_is_recorded_where_it_is(cli, tmp_path, monkeypatch):
    """With a relative DLLM_COMPILE_CACHE an install recorded its folders (and the pack's path)
    relative: `verify` from another folder called every file missing, and `remove` deleted
    none of them (and dropped the record that named them)."""
    pack = _small_pack(tmp_path, count=2)
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    monkeypatch.setenv("DLLM_COMPILE_CACHE", "cc")
    monkeypatch.chdir(tmp_path / "a")
    installed = cli("cache", "install", os.path.relpath(pack), "--json")
    assert installed.code == 0, installed.err
    assert json.loads(installed.out)["source"] == str(pack)
    files = sorted((tmp_path / "a" / "cc").rglob("*.py"))
    assert len(files) == 2
    monkeypatch.chdir(tmp_path / "b")
    verified = cli("cache", "verify")
    assert verified.code == 0, verified.out
    assert "2 files deleted" in cli("cache", "remove", pack.name).out
    assert not any(f.exists() for f in files)


def _small_pack(tmp_path: Path, count: int = 6) -> Path:
    from turbo_dllm.cache.key import host_pack_key
    from turbo_dllm.cache.packs import make_pack
    from turbo_dllm.host import collect_fingerprint

    source = tmp_path / "made" / "inductor" / "ab"
    source.mkdir(parents=True)
    for i in range(count):
        (source / f"c{i}.py").write_text(f"# graph {i}\n")
    key = host_pack_key(collect_fingerprint(apply_overrides=False), None)
    return make_pack({"inductor": source.parent}, tmp_path / "packs", key)[0]


def _cache_files() -> list[Path]:
    """Every file in this home's compile cache folder (the caches and any staging beside)."""
    from turbo_dllm.train.compile_cache import compile_cache_dir

    return sorted(p for p in compile_cache_dir().rglob("*") if p.is_file())


def _interrupt_after(monkeypatch, renames: int) -> None:
    """Ctrl-C (a KeyboardInterrupt) right after the `renames`-th rename: in the middle of
    moving a pack's files into the cache."""
    real, done = os.rename, []

    def rename(*args, **kwargs):
        real(*args, **kwargs)
        done.append(args)
        if len(done) == renames:
            raise KeyboardInterrupt

    monkeypatch.setattr(os, "rename", rename)


def test_an_interrupted_install_leaves_nothing_behind(cli, tmp_path, monkeypatch):
    """Ctrl-C while a pack's files move into the cache left the moved ones there with no record
    (so `remove` never deleted them); now the install takes back all it did."""
    path = _small_pack(tmp_path)
    with monkeypatch.context() as patch:
        _interrupt_after(patch, 3)
        result = cli("cache", "install", path)
    assert result.code == 130 and "interrupted" in result.err
    assert _cache_files() == []
    assert cli("cache", "list").out.startswith("no compile-cache packs installed")

    assert json.loads(cli("cache", "install", path, "--json").out)["added"] == 6
    files = _cache_files()
    victim = files[0]
    victim.unlink()  # installing again has one file to add: interrupt that install too
    before = (files, cli("cache", "list", "--json").out)
    with monkeypatch.context() as patch:
        _interrupt_after(patch, 1)
        assert cli("cache", "install", path).code == 130
    assert cli("cache", "list", "--json").out == before[1]  # the earlier record is back
    assert _cache_files() == [p for p in before[0] if p != victim]
    assert "5 files deleted" in cli("cache", "remove", path.name).out
    assert _cache_files() == []


# `dllm cache install PACK` killed (SIGKILL) right after it moved its second file into the cache.
KILLED_AFTER_TWO_FILES = (
    "import os, signal, sys\n"
    "real, done = os.rename, []\n"
    "def rename(*args):\n"
    "    real(*args)\n"
    "    done.append(args)\n"
    "    if len(done) == 2:\n"
    "        os.kill(os.getpid(), signal.SIGKILL)\n"
    "os.rename = rename\n"
    "from turbo_dllm.cli import main\n"
    "main(['cache', 'install', sys.argv[1]])\n"
)


def test_a_killed_install_is_accounted_for_and_the_next_one_completes_it(cli, tmp_path):
    """A process killed while moving files leaves them under a record (not loose in the cache):
    `verify` names what is missing, installing again adds the rest and sweeps the dead
    install's staging folder, and `remove` deletes every file."""
    import signal

    path = _small_pack(tmp_path)
    env = clean_env(DLLM_HOME=os.environ["DLLM_HOME"], PYTHONPATH=str(ROOT))
    proc = subprocess.run(
        [sys.executable, "-c", KILLED_AFTER_TWO_FILES, str(path)], env=env, timeout=300
    )
    assert proc.returncode == -signal.SIGKILL
    # listed, and not as if installed whole (it read "6 files" like a complete one)
    listed = cli("cache", "list")
    assert path.name in listed.out and "INCOMPLETE: 4 of 6 files missing" in listed.out
    assert f"dllm cache install {path}" in listed.err
    (entry,) = json.loads(cli("cache", "list", "--json").out)["installed"]
    assert entry["missing"] == 4
    verified = cli("cache", "verify")
    assert verified.code == 1 and verified.out.count(": missing") == 4

    again = json.loads(cli("cache", "install", path, "--json").out)
    assert again["added"] == 4 and cli("cache", "verify").code == 0
    assert "INCOMPLETE" not in cli("cache", "list").out
    assert [p.name for p in _cache_files()] == [f"c{i}.py" for i in range(6)]  # staging swept
    assert "6 files deleted" in cli("cache", "remove", path.name).out
    assert _cache_files() == []


def test_pack_refuses_an_out_that_is_a_file(cli, tmp_path):
    """`dllm cache pack --out FILE` was a FileExistsError traceback, after hashing the caches."""
    from turbo_dllm.train.compile_cache import compile_cache_dir

    entry = compile_cache_dir() / "inductor" / "ab" / "c1.py"
    entry.parent.mkdir(parents=True)
    entry.write_text("# c1.py\n")
    afile = tmp_path / "afile"
    afile.write_text("not a folder")
    assert_user_error(cli("cache", "pack", "--out", afile), f"cannot write into {afile}")
    assert afile.read_text() == "not a folder"


@pytest.mark.parametrize("damage", ["[]", "{", '{"manifest": 1}'])
def test_a_damaged_record_is_named_and_removed(cli, tmp_path, damage):
    """A record that was not a JSON object was a traceback; a damaged one could only be deleted
    by hand (the hint named the file). `dllm cache remove` takes it now, and a damaged record
    of another pack no longer stops an install."""
    path = _small_pack(tmp_path)
    sha = json.loads(cli("cache", "install", path, "--json").out)["sha256"]
    record = next(Path(os.environ["DLLM_HOME"]).glob(f"compile-packs/installed/{sha}.json"))
    record.write_text(damage)
    assert_user_error(cli("cache", "list"), "is damaged", f"dllm cache remove {sha[:12]}")
    other = _small_pack(tmp_path / "other", count=2)
    assert cli("cache", "install", other).code == 0
    removed = cli("cache", "remove", sha[:8])
    assert removed.code == 0 and f"removed the damaged record {record}" in removed.out
    assert not record.exists() and cli("cache", "verify").code == 0


def _hold_lock(path: Path, flag: Path):
    """A child process that takes the packs' lock (flock on install.lock), touches `flag` and
    then holds the lock until killed."""
    program = (
        "import fcntl, os, sys, time\n"
        "fd = os.open(sys.argv[1], os.O_RDWR | os.O_CREAT)\n"
        "fcntl.flock(fd, fcntl.LOCK_EX)\n"
        "open(sys.argv[2], 'w').close()\n"
        "time.sleep(300)\n"
    )
    path.parent.mkdir(parents=True, exist_ok=True)
    child = subprocess.Popen([sys.executable, "-c", program, str(path), str(flag)])
    _wait_for(flag, child)
    return child


def _wait_for(flag: Path, child: subprocess.Popen) -> None:
    import time

    deadline = time.monotonic() + 60
    while not flag.exists():
        assert child.poll() is None and time.monotonic() < deadline, "the child did not start"
        time.sleep(0.02)


def test_installs_and_removes_wait_for_the_lock(cli, tmp_path):
    """Installs and removes took no lock: while one ran, another changed the same records and
    files. Now they serialize on compile-packs/install.lock, with --lock-timeout like bundles."""
    path = _small_pack(tmp_path)
    lock = Path(os.environ["DLLM_HOME"]) / "compile-packs" / "install.lock"
    child = _hold_lock(lock, tmp_path / "held")
    try:
        refused = cli("cache", "install", path, "--lock-timeout", "0.2")
        assert_user_error(refused, "another compile-cache pack install or remove is running",
                          "waited 0.2 s", "--lock-timeout")  # fmt: skip
        assert _cache_files() == []
        assert cli("cache", "list").out.startswith("no compile-cache packs installed")
    finally:
        child.kill()
        child.wait()
    sha = json.loads(cli("cache", "install", path, "--json").out)["sha256"]
    child = _hold_lock(lock, tmp_path / "held-again")
    try:
        assert_user_error(cli("cache", "remove", sha[:12], "--lock-timeout", "0"), "waited 0 s")
        assert len(_cache_files()) == 6
    finally:
        child.kill()
        child.wait()
    assert "6 files deleted" in cli("cache", "remove", sha[:12]).out


@pytest.mark.parametrize("value", ["-5", "nan"])
@pytest.mark.parametrize("command", [("install", "some.tar.zst"), ("remove", "abcdef")])
def test_a_negative_pack_lock_timeout_is_refused(cli, command, value):
    result = cli("cache", *command, "--lock-timeout", value)
    assert_user_error(result, f"--lock-timeout must be 0 or more seconds, got {value}")


def test_an_install_waits_for_one_that_is_taking_its_files_back(cli, tmp_path):
    """Two installs of one pack at once: the second recorded the files the first had moved, and
    the first, interrupted, then took them (and the record) back, so the second's success left
    nothing installed. Now the second waits and installs everything."""
    path = _small_pack(tmp_path)
    flag = tmp_path / "moving"
    program = (
        "import os, sys, time\n"
        "real = os.rename\n"
        "def rename(*args):\n"
        "    real(*args)\n"
        "    open(sys.argv[2], 'w').close()\n"  # mid-install: 1 of 6 files moved
        "    time.sleep(2)\n"
        "    raise KeyboardInterrupt\n"
        "os.rename = rename\n"
        "from turbo_dllm.cli import main\n"
        "sys.exit(main(['cache', 'install', sys.argv[1]]))\n"
    )
    env = clean_env(DLLM_HOME=os.environ["DLLM_HOME"], PYTHONPATH=str(ROOT))
    child = subprocess.Popen([sys.executable, "-c", program, str(path), str(flag)], env=env)
    try:
        _wait_for(flag, child)
        second = cli("cache", "install", path, "--json")
    finally:
        child.wait(timeout=120)
    assert child.returncode == 130
    assert second.code == 0, second.err
    assert json.loads(second.out)["added"] == 6
    assert cli("cache", "verify").code == 0
    assert len(_cache_files()) == 6
    assert "6 files deleted" in cli("cache", "remove", path.name).out


def test_pack_leaves_out_a_file_that_vanishes_while_it_is_packed(cli, tmp_path, monkeypatch):
    """Inductor and Triton delete cache files while a pack is made: a file gone between the
    listing and its read was a FileNotFoundError traceback. It is left out now, and the pack
    lists exactly what it holds."""
    import builtins

    from turbo_dllm.train.compile_cache import compile_cache_dir

    folder = compile_cache_dir() / "inductor" / "ab"
    folder.mkdir(parents=True)
    for i in range(3):
        (folder / f"c{i}.py").write_text(f"# graph {i}\n")
    victim, real_open = folder / "c1.py", builtins.open

    def open_(file, *args, **kwargs):
        if isinstance(file, (str, os.PathLike)) and Path(file) == victim:
            victim.unlink(missing_ok=True)  # deleted by the cache just before it is read
        return real_open(file, *args, **kwargs)

    with monkeypatch.context() as patch:  # not monkeypatch.undo(): that would undo DLLM_HOME too
        patch.setattr(builtins, "open", open_)
        made = cli("cache", "pack", "--out", tmp_path / "packs", "--json")
    assert made.code == 0, made.err
    assert "Traceback" not in made.err
    pack = Path(json.loads(made.out)["pack"])
    assert json.loads(made.out)["files"] == 2
    assert cli("cache", "install", pack).code == 0  # every listed member is there
    from turbo_dllm.cache.packs import read_pack_manifest

    assert [f.path for f in read_pack_manifest(pack).files] == ["inductor/ab/c0.py",
                                                              "inductor/ab/c2.py"]  # fmt: skip


def test_pack_skips_a_folder_that_vanishes_while_it_is_listed(cli, tmp_path, monkeypatch):
    """A cache folder deleted while the caches were walked was a FileNotFoundError traceback."""
    from turbo_dllm.train.compile_cache import compile_cache_dir

    for sub in ("ab", "cd"):
        folder = compile_cache_dir() / "inductor" / sub
        folder.mkdir(parents=True)
        (folder / "entry.py").write_text(f"# {sub}\n")
    victim, real_scandir = compile_cache_dir() / "inductor" / "cd", os.scandir

    def scandir(path="."):
        if isinstance(path, (str, os.PathLike)) and Path(path) == victim:
            import shutil

            shutil.rmtree(victim, ignore_errors=True)
        return real_scandir(path)

    with monkeypatch.context() as patch:  # not monkeypatch.undo(): that would undo DLLM_HOME too
        patch.setattr(os, "scandir", scandir)
        made = cli("cache", "pack", "--out", tmp_path / "packs", "--json")
    assert made.code == 0, made.err
    assert json.loads(made.out)["files"] == 1


def test_pack_says_the_caches_are_empty_when_every_file_vanished(cli, tmp_path, monkeypatch):
    import builtins

    from turbo_dllm.train.compile_cache import compile_cache_dir

    entry = compile_cache_dir() / "inductor" / "ab" / "c1.py"
    entry.parent.mkdir(parents=True)
    entry.write_text("# c1.py\n")
    real_open = builtins.open

    def open_(file, *args, **kwargs):
        if isinstance(file, (str, os.PathLike)) and Path(file) == entry:
            entry.unlink(missing_ok=True)
        return real_open(file, *args, **kwargs)

    with monkeypatch.context() as patch:  # not monkeypatch.undo(): that would undo DLLM_HOME too
        patch.setattr(builtins, "open", open_)
        made = cli("cache", "pack", "--out", tmp_path / "packs")
    assert_user_error(made, "the compile caches are empty")
    assert not list((tmp_path / "packs").glob("*.tar.zst"))


def test_installing_again_after_a_damaged_record_was_removed_takes_its_files(cli, tmp_path):
    """After `remove` took a damaged record, installing the pack again found its files there and
    recorded none as added, so no `remove` ever deleted them. The files with the pack's bytes
    are the new record's now; a file that differs from the pack stays the user's."""
    from turbo_dllm.train.compile_cache import compile_cache_dir

    path = _small_pack(tmp_path)
    sha = json.loads(cli("cache", "install", path, "--json").out)["sha256"]
    record = Path(os.environ["DLLM_HOME"]) / "compile-packs" / "installed" / f"{sha}.json"
    record.write_text("{")
    assert cli("cache", "remove", sha[:12]).code == 0
    changed = compile_cache_dir() / "inductor" / "ab" / "c0.py"
    changed.write_text("# the user's own\n")
    again = cli("cache", "install", path, "--json")
    assert again.code == 0, again.err
    listed = json.loads(cli("cache", "list", "--json").out)["installed"]
    assert [p["added"] for p in listed] == [5]
    assert "5 files deleted" in cli("cache", "remove", sha[:12]).out
    assert _cache_files() == [changed]
    # A pack installed later over the user's own identical files still leaves them be.
    assert json.loads(cli("cache", "install", path, "--json").out)["added"] == 5
    assert "5 files deleted" in cli("cache", "remove", sha[:12]).out


def test_installing_into_another_cache_is_refused_while_installed_elsewhere(
    cli, tmp_path, monkeypatch
):
    """Installing an installed pack again with another compile cache in effect (a changed
    DLLM_COMPILE_CACHE) moved its record there: the files added to the first cache were lost to
    `remove`, and `remove` deleted the second cache's own copies of them."""
    path = _small_pack(tmp_path, count=2)
    monkeypatch.setenv("DLLM_COMPILE_CACHE", str(tmp_path / "first"))
    assert cli("cache", "install", path).code == 0
    monkeypatch.setenv("DLLM_COMPILE_CACHE", str(tmp_path / "second"))
    from turbo_dllm.train.compile_cache import compile_cache_dir

    own = compile_cache_dir() / "inductor" / "ab" / "c0.py"  # the second cache's own copy
    own.parent.mkdir(parents=True)
    own.write_text("# graph 0\n")
    refused = cli("cache", "install", path)
    assert_user_error(refused, "is installed into another compile cache", str(tmp_path / "first"),
                      "dllm cache remove")  # fmt: skip
    assert [p.name for p in own.parent.iterdir()] == ["c0.py"]
    assert "2 files deleted" in cli("cache", "remove", path.name).out
    assert not list((tmp_path / "first").rglob("*.py")) and own.is_file()
    assert json.loads(cli("cache", "install", path, "--json").out)["added"] == 1


def test_a_record_without_a_cache_folder_is_damaged_not_a_traceback(cli, tmp_path):
    """A record whose `caches` lacked a folder its files need was a KeyError traceback in
    `verify` and `remove`; it is a damaged record now, named with its fix."""
    path = _small_pack(tmp_path)
    sha = json.loads(cli("cache", "install", path, "--json").out)["sha256"]
    record = Path(os.environ["DLLM_HOME"]) / "compile-packs" / "installed" / f"{sha}.json"
    data = json.loads(record.read_text())
    del data["caches"]["inductor"]
    record.write_text(json.dumps(data))
    assert_user_error(cli("cache", "verify"), "is damaged", "no cache folder for inductor",
                      f"dllm cache remove {sha[:12]}")  # fmt: skip
    assert cli("cache", "remove", sha[:12]).code == 0


def test_installing_again_repairs_a_damaged_file_the_pack_added(cli, tmp_path):
    """`verify` said "remove, then install again", but `remove` keeps a file that is not intact
    and the next install keeps any file already there: the damaged file stayed and `verify`
    failed for good. Installing again now puts back the files the pack added."""
    path = _small_pack(tmp_path, count=2)
    assert cli("cache", "install", path).code == 0
    damaged = next(p for p in _cache_files() if p.name == "c0.py")
    damaged.write_text("garbage\n")
    failed = cli("cache", "verify")
    assert failed.code == 1 and "inductor/ab/c0.py: differs from pack.json" in failed.out
    assert "dllm cache install" in failed.err
    again = cli("cache", "install", path, "--json")
    assert again.code == 0 and json.loads(again.out)["added"] == 1
    assert cli("cache", "verify").code == 0 and damaged.read_text() == "# graph 0\n"
    assert "2 files deleted" in cli("cache", "remove", path.name).out


def _nested_pack(tmp_path: Path) -> Path:
    """A pack whose files sit in nested folders of both caches."""
    from turbo_dllm.cache.key import host_pack_key
    from turbo_dllm.cache.packs import make_pack
    from turbo_dllm.host import collect_fingerprint

    made = tmp_path / "made"
    for relative in ("inductor/ab/cd/c0.py", "inductor/ab/cd/c1.py", "inductor/ef/c2.py",
                     "inductor/ln/sub/c3.py", "triton/k1/kern.so"):  # fmt: skip
        (made / relative).parent.mkdir(parents=True, exist_ok=True)
        (made / relative).write_text(f"# {relative}\n")
    key = host_pack_key(collect_fingerprint(apply_overrides=False), None)
    caches = {"inductor": made / "inductor", "triton": made / "triton"}
    return make_pack(caches, tmp_path / "packs", key)[0]


def test_remove_deletes_the_folders_it_emptied_and_no_other(cli, tmp_path):
    """`remove` left the pack's now-empty folders in the cache. It removes the folders it
    emptied now, up to the cache folders themselves; a folder that still holds something, an
    empty folder it did not empty, and anything outside the cache (through a link) stay."""
    from turbo_dllm.train.compile_cache import compile_cache_dir

    path = _nested_pack(tmp_path)
    cache = compile_cache_dir()
    mine = cache / "inductor" / "ab" / "mine.py"  # the user's own, beside the pack's folder
    mine.parent.mkdir(parents=True)
    mine.write_text("# mine\n")
    (cache / "inductor" / "empty").mkdir()  # empty before the install: not this remove's
    outside = tmp_path / "outside"
    outside.mkdir()
    (cache / "inductor" / "ln").symlink_to(outside)  # a link out of the cache
    assert json.loads(cli("cache", "install", path, "--json").out)["added"] == 5
    assert (outside / "sub" / "c3.py").is_file()

    removed = cli("cache", "remove", path.name)
    assert removed.code == 0 and "5 files deleted" in removed.out
    left = sorted(p.relative_to(cache).as_posix() for p in cache.rglob("*"))
    assert left == ["inductor", "inductor/ab", "inductor/ab/mine.py", "inductor/empty",
                    "inductor/ln", "triton"]  # fmt: skip
    assert (outside / "sub").is_dir()  # emptied, but outside the cache: left alone
    assert cli("cache", "install", path).code == 0  # and it installs again
    assert cli("cache", "verify").code == 0


def test_remove_keeps_a_folder_another_pack_still_uses(cli, tmp_path):
    path = _small_pack(tmp_path, count=2)
    other = _small_pack(tmp_path / "other", count=3)  # c0..c2 in the same folder ab/
    assert json.loads(cli("cache", "install", path, "--json").out)["added"] == 2
    assert json.loads(cli("cache", "install", other, "--json").out)["added"] == 1
    assert "1 files deleted" in cli("cache", "remove", other.name).out  # ab/ still holds 2
    assert cli("cache", "verify").code == 0
    assert "2 files deleted" in cli("cache", "remove", path.name).out
    from turbo_dllm.train.compile_cache import compile_cache_dir

    assert sorted(p.name for p in compile_cache_dir().iterdir()) == ["inductor", "triton"]
    assert not list((compile_cache_dir() / "inductor").iterdir())


def test_files_two_packs_share_go_with_the_last_remove(cli, tmp_path):
    """The first pack's remove keeps the files a second installed pack lists; they were never
    the second's (kept as the cache's at its install), so its remove kept them too and they
    stayed in the cache with no record naming them. They are handed to the pack still using
    them, whose remove deletes them."""
    path = _small_pack(tmp_path, count=2)
    other = _small_pack(tmp_path / "other", count=3)  # c0, c1 as in `path`, and c2
    assert json.loads(cli("cache", "install", path, "--json").out)["added"] == 2
    assert json.loads(cli("cache", "install", other, "--json").out)["added"] == 1
    assert "0 files deleted" in cli("cache", "remove", path.name).out  # `other` still uses them
    assert cli("cache", "verify").code == 0
    assert "3 files deleted" in cli("cache", "remove", other.name).out
    assert _cache_files() == []


def test_verify_counts_every_problem_and_all_shows_them(cli, tmp_path):
    """`verify` printed the first 20 problems and said nothing of the rest. It prints how many
    there are, the first 20 and how many more; --all and --json give every one."""
    path = _small_pack(tmp_path, count=25)
    sha = json.loads(cli("cache", "install", path, "--json").out)["sha256"]
    for entry in _cache_files():
        entry.unlink()
    failed = cli("cache", "verify")
    assert failed.code == 1
    assert f"FAIL  {sha[:12]}  25 problems" in failed.out
    assert failed.out.count(": missing") == 20
    assert "... and 5 more (--all shows them)" in failed.out
    every = cli("cache", "verify", "--all")
    assert every.code == 1 and every.out.count(": missing") == 25 and "more" not in every.out
    one = cli("cache", "verify", sha[:12], "--all")
    assert one.code == 1 and one.out.count(": missing") == 25
    report = cli("cache", "verify", "--json")
    assert report.code == 1
    assert len(json.loads(report.out)["packs"][sha[:12]]) == 25


def test_list_and_verify_say_when_the_records_folder_is_a_file(cli, tmp_path):
    """A file where the installed-pack records belong made `list` and `verify` say that no pack
    was installed (and `remove` that there was none to remove); they name it now."""
    records = Path(os.environ["DLLM_HOME"]) / "compile-packs" / "installed"
    records.parent.mkdir(parents=True)
    records.write_text("not a folder")
    for command in (("list",), ("verify",), ("remove", "abcdef")):
        assert_user_error(cli("cache", *command), f"{records} is not a folder")
    assert records.read_text() == "not a folder"


def test_an_install_blocked_by_the_cache_takes_everything_back(cli, tmp_path):
    """A file in the cache where the pack has a folder (or a folder where it has a file) stopped
    the install, but taking back its work stopped at that path too: the record stayed, so the
    failed install listed as installed. It takes everything back now and names what is in the
    way; once that is moved aside the install succeeds."""
    from turbo_dllm.train.compile_cache import compile_cache_dir

    path = _nested_pack(tmp_path)
    blocker = compile_cache_dir() / "inductor" / "ef"  # the pack has inductor/ef/c2.py
    blocker.parent.mkdir(parents=True)
    blocker.write_text("the user's own\n")
    refused = cli("cache", "install", path)
    assert_user_error(refused, "cannot add inductor/ef/c2.py to the compile cache: "
                      f"{blocker} is a file, where the pack has a folder", "move it aside")  # fmt: skip
    assert cli("cache", "list").out.startswith("no compile-cache packs installed")
    assert _cache_files() == [blocker] and blocker.read_text() == "the user's own\n"
    left = sorted(
        p.relative_to(compile_cache_dir()).as_posix() for p in compile_cache_dir().rglob("*")
    )
    assert left == ["inductor", "inductor/ef", "triton"]  # no folder of the pack's stays behind
    blocker.unlink()
    assert json.loads(cli("cache", "install", path, "--json").out)["added"] == 5

    # Installing again, with a folder where the pack put a file.
    record = next(Path(os.environ["DLLM_HOME"]).glob("compile-packs/installed/*.json"))
    before = record.read_bytes()
    (compile_cache_dir() / "inductor" / "ab" / "cd" / "c0.py").unlink()
    folder = compile_cache_dir() / "inductor" / "ef" / "c2.py"
    folder.unlink()
    folder.mkdir()
    (folder / "keep").write_text("kept\n")
    assert_user_error(cli("cache", "install", path),
                      f"{folder} is a folder, where the pack has a file")  # fmt: skip
    assert record.read_bytes() == before  # the record as it was
    assert (folder / "keep").read_text() == "kept\n"
    assert not (compile_cache_dir() / "inductor" / "ab" / "cd" / "c0.py").exists()  # taken back


def test_list_available_names_a_pack_it_cannot_read(cli, tmp_path, monkeypatch):
    """`dllm cache list --available` skipped an unreadable pack without a word: it is listed
    now with why it cannot be read, and fits nothing (doctor offers only readable packs)."""
    good = _small_pack(tmp_path)
    cut = good.with_name(good.name.replace(".tar.zst", "0.tar.zst"))
    cut.write_bytes(good.read_bytes()[:100])
    monkeypatch.setenv("DLLM_PACK_PATH", str(good.parent))
    offered = json.loads(cli("cache", "list", "--available", "--json").out)["available"]
    by_path = {Path(o["path"]).name: o for o in offered}
    assert by_path[good.name]["fits"] and "error" not in by_path[good.name]
    assert not by_path[cut.name]["fits"] and "truncated" in by_path[cut.name]["error"]
    human = cli("cache", "list", "--available")
    assert human.code == 0
    assert f"offered  {cut}: DAMAGED: " in human.out


def test_list_available_marks_a_damaged_pack_with_its_fix(cli, tmp_path, monkeypatch):
    """A pack on offer that could not be read (cut short, a dangling link) was one line among
    the good ones, with no fix; it is marked DAMAGED now, with its fix on stderr as in `dllm
    bundle list`. And `--available` with nothing on offer printed nothing at all (a
    $DLLM_PACK_PATH folder that does not exist was dropped without a word)."""
    monkeypatch.setenv("DLLM_PACK_PATH", str(tmp_path / "nowhere"))
    empty = cli("cache", "list", "--available")
    assert empty.code == 0 and "no compile-cache packs on offer" in empty.out
    good = _small_pack(tmp_path)
    cut = good.with_name(good.name.replace(".tar.zst", "0.tar.zst"))
    cut.write_bytes(good.read_bytes()[:100])
    dangling = good.with_name(good.name.replace(".tar.zst", "1.tar.zst"))
    dangling.symlink_to(tmp_path / "gone.tar.zst")
    monkeypatch.setenv("DLLM_PACK_PATH", str(good.parent))
    human = cli("cache", "list", "--available")
    assert human.code == 0 and f"offered  {good}: fits" in human.out
    assert f"offered  {cut}: DAMAGED: " in human.out and "truncated" in human.out
    assert f"offered  {dangling}: DAMAGED: cannot read " in human.out
    for bad in (cut, dangling):
        assert f"fix {bad.name}: replace {bad} with a complete copy" in human.err
    offered = json.loads(cli("cache", "list", "--available", "--json").out)["available"]
    fixes = {Path(o["path"]).name: o.get("fix") for o in offered}
    assert fixes[good.name] is None and f"replace {cut}" in fixes[cut.name]


def test_doctor_fails_on_a_damaged_pack_record_and_warns_of_missing_files(cli, tmp_path):
    """A damaged installed-pack record broke `dllm cache list` but passed `dllm doctor`; a pack
    whose files left the cache did too."""
    from tests.train.util import write_config

    def check(*args):
        result = cli("doctor", *args, "--json")
        return {c["name"]: c for c in json.loads(result.out)["checks"]}["compile packs"]

    assert check()["status"] == "pass" and check()["detail"] == "none installed"
    pack_file = _small_pack(tmp_path)
    installed = json.loads(cli("cache", "install", pack_file, "--json").out)
    assert check()["detail"] == "1 installed, their files in place"
    home = Path(os.environ["DLLM_HOME"])
    record = next(home.glob(f"compile-packs/installed/{installed['sha256']}.json"))
    cached = json.loads(record.read_text())
    gone = (
        Path(cached["caches"]["inductor"]) / cached["manifest"]["files"][0]["path"].split("/", 1)[1]
    )
    gone.unlink()
    missing = check()
    assert missing["status"] == "warn" and "(1 files)" in missing["detail"]
    assert "dllm cache verify" in missing["detail"]
    # The fix names this pack's own commands (it said "dllm cache install PACK"), and they run.
    install = f"dllm cache install {shlex.quote(str(pack_file))}"
    assert f"install it again: {install} puts back" in missing["fix"]
    assert f"dllm cache remove {installed['sha256'][:12]}" in missing["fix"]
    assert cli(*shlex.split(install)[1:]).code == 0
    assert check()["detail"] == "1 installed, their files in place"
    gone.unlink()
    record.write_text("{")
    damaged = check()
    assert damaged["status"] == "fail" and "is damaged" in damaged["detail"]
    assert f"dllm cache remove {installed['sha256'][:12]}" in damaged["fix"]
    config = write_config(tmp_path / "train.yaml", "training.compile=true")
    both = {
        c["name"]: c for c in json.loads(cli("doctor", "--config", config, "--json").out)["checks"]
    }
    assert both["compile cache"]["status"] == "pass"  # the damage is the other check's to name
    assert both["compile packs"]["status"] == "fail"


def test_a_stray_file_among_the_records_is_named_with_a_fix_that_works(cli, tmp_path):
    """A .json no install wrote (not named by a sha256) was answered with `dllm cache remove
    <its name>`, which refuses a name under 6 characters and matches no pack's sha256 anyway."""
    path = _small_pack(tmp_path)
    assert cli("cache", "install", path).code == 0
    stray = next(Path(os.environ["DLLM_HOME"]).glob("compile-packs/installed")) / "x.json"
    stray.write_text("{}")
    result = cli("cache", "list")
    assert_user_error(result, f"the installed-pack record {stray} is damaged", f"delete {stray}")
    assert "dllm cache remove" not in result.err
    stray.unlink()
    assert cli("cache", "list").code == 0


def _crafted_pack(tmp_path: Path, members, listed=None, extra=()) -> Path:
    """A pack written by hand, not by `make_pack`: `members` ((path, bytes)) after pack.json,
    which lists `listed` (default: the members) with their true hashes; then the `extra`
    TarInfo entries (links, folders) as they are."""
    import hashlib

    import zstandard

    from turbo_dllm.cache.key import host_pack_key
    from turbo_dllm.host import collect_fingerprint

    key = host_pack_key(collect_fingerprint(apply_overrides=False), None)
    document = {
        "format": "turbo_dllm.compile_pack.v1",
        "key": key.model_dump(mode="json"),
        "created_by": "a test",
        "files": [
            {"path": p, "sha256": hashlib.sha256(d).hexdigest(), "size": len(d)}
            for p, d in (members if listed is None else listed)
        ],
    }
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w") as tar:
        for name, data in [("pack.json", json.dumps(document).encode()), *members]:
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
        for info in extra:
            tar.addfile(info)
    path = tmp_path / "turbo-dllm-compile-crafted.tar.zst"
    path.write_bytes(zstandard.ZstdCompressor().compress(buffer.getvalue()))
    return path


def _link(name: str, target: str, kind: bytes = tarfile.SYMTYPE) -> tarfile.TarInfo:
    info = tarfile.TarInfo(name)
    info.type, info.linkname = kind, target
    return info


@pytest.mark.parametrize(
    ("members", "listed", "extra", "expected"),
    [
        ([("inductor/../../../slip.py", b"x")], None, (),
         "'inductor/../../../slip.py' is not a plain relative path"),
        ([("/tmp/slip.py", b"x")], None, (), "'/tmp/slip.py' is not a plain relative path"),
        ([("inductor/a.py", b"x"), ("../../slip.py", b"y")], [("inductor/a.py", b"x")], (),
         "member '../../slip.py' is not listed"),
        ([("inductor/a.py", b"x")], None, [_link("inductor/ab", "/etc")],
         "member 'inductor/ab' is not a regular file"),
        ([("inductor/a.py", b"x")], None, [_link("inductor/h", "pack.json", tarfile.LNKTYPE)],
         "member 'inductor/h' is not a regular file"),
        ([("extra/a.py", b"x")], None, (), "'extra/a.py' is in neither inductor/ nor triton/"),
        # These two were installed: a record of a "file" that was the cache folder itself, and a
        # traceback-free but wrong error naming the staging folder ("choose another path").
        ([("inductor", b"x")], None, (), "'inductor' is a cache folder, not a file in one"),
        ([("inductor/ab", b"x"), ("inductor/ab/c.py", b"y")], None, (),
         "'inductor/ab' is listed as a file and as a folder of other files"),
        ([], None, (), "lists no file"),
    ],
    ids=["dotdot", "absolute", "unlisted-dotdot", "symlink", "hardlink", "other-folder",
         "cache-folder-as-file", "file-and-folder", "no-files"],
)  # fmt: skip
def test_a_pack_whose_paths_escape_or_clash_is_refused(cli, tmp_path, members, listed, extra,
                                                        expected):  # fmt: skip
    """Tar slip and malformed listings: refused with what is wrong and a hint, before anything
    reaches the cache (or anywhere outside it)."""
    path = _crafted_pack(tmp_path, members, listed, extra)
    result = cli("cache", "install", path)
    assert_user_error(result, expected, "hint: the pack is damaged")
    assert cli("cache", "list").out.startswith("no compile-cache packs installed")
    assert _cache_files() == []
    home = Path(os.environ["DLLM_HOME"])
    assert not [*home.rglob("slip.py"), *tmp_path.rglob("slip.py")]
    assert not Path("/tmp/slip.py").exists()


def test_a_missing_pack_is_named_with_a_hint(cli, tmp_path):
    assert_user_error(cli("cache", "install", tmp_path / "nothing.tar.zst"),
                      "no such pack", "hint: name a .tar.zst")  # fmt: skip


def test_a_folder_an_empty_file_or_garbage_is_named_for_what_it_is(cli, tmp_path):
    """A folder given to `dllm cache install` was "no such pack", as if nothing were there; an
    empty file was "truncated or incomplete" and garbage a zstd "Unknown frame descriptor".
    Each says what it is now, with what to pass instead, and nothing is installed."""
    from turbo_dllm.cache.packs import check_packs
    from turbo_dllm.errors import DllmError

    folder = tmp_path / "packs"
    folder.mkdir()
    result = cli("cache", "install", folder)
    assert_user_error(result, f"{folder} is a folder, not a pack file", "`dllm cache pack`")
    assert "no such pack" not in result.err
    with pytest.raises(DllmError, match="is a folder, not a pack file"):
        check_packs([folder])  # `dllm bundle publish --packs` as well
    pack = _small_pack(tmp_path)  # written into tmp_path/packs: the hint names it
    result = cli("cache", "install", pack.parent)
    assert_user_error(result, "is a folder, not a pack file", f"pass the pack in it: {pack}")

    empty = tmp_path / "empty.tar.zst"
    empty.write_bytes(b"")
    result = cli("cache", "install", empty)
    assert_user_error(result, "empty.tar.zst: an empty file (0 bytes), not a compile-cache pack")
    assert "truncated" not in result.err
    garbage = tmp_path / "garbage.tar.zst"
    garbage.write_bytes(b"PK\x03\x04 not what `dllm cache pack` writes" * 10)
    result = cli("cache", "install", garbage)
    assert_user_error(
        result,
        "garbage.tar.zst: not a compile-cache pack (not zstd-compressed",
        "`dllm cache pack`",
    )
    assert "frame descriptor" not in result.err
    missing = cli("cache", "install", tmp_path / "nothing.tar.zst")
    assert_user_error(missing, "no such pack", "nothing there")
    assert "no compile-cache packs installed" in cli("cache", "list").out


def _disk_fault(patch, phase: str) -> None:
    """Make the next install meet a full disk, a quota or a read-only cache in `phase`."""
    import errno
    import tempfile

    import turbo_dllm.fsutil
    from turbo_dllm.cache import packs

    if phase == "staging":  # a write() in the staging folder: ENOSPC names no file
        real_extract = packs._extract

        def extract(path, dest):
            real_extract(path, dest)  # the staging folder holds the whole pack by now
            raise OSError(errno.ENOSPC, "No space left on device")

        patch.setattr(packs, "_extract", extract)
    elif phase == "record":
        real_write = turbo_dllm.fsutil.write_atomic

        def write_atomic(path, data):
            if Path(path).parent.name == "installed":
                raise OSError(errno.EDQUOT, "Disk quota exceeded", str(path) + ".tmp")
            return real_write(path, data)

        patch.setattr(turbo_dllm.fsutil, "write_atomic", write_atomic)
    elif phase == "move":  # the third file's move into the cache
        real_rename, done = os.rename, []

        def rename(source, target):
            if len(done) == 2:
                raise OSError(errno.ENOSPC, "No space left on device", str(target))
            done.append(target)
            real_rename(source, target)

        patch.setattr(os, "rename", rename)
    else:  # read-only: the staging folder cannot be made
        real_mkdtemp = tempfile.mkdtemp

        def mkdtemp(suffix=None, prefix=None, dir=None):
            if prefix and prefix.startswith(".dllm-pack-"):
                name = Path(dir) / f"{prefix}x"
                raise OSError(errno.EROFS, "Read-only file system", str(name))
            return real_mkdtemp(suffix, prefix, dir)

        patch.setattr(tempfile, "mkdtemp", mkdtemp)


@pytest.mark.parametrize(
    ("phase", "what", "fix"),
    [
        ("staging", "the compile cache", "the disk is full"),
        ("record", "the installed-pack records", "your disk quota is used up"),
        ("move", "the compile cache", "the disk is full"),
        ("read-only", "the compile cache", "that file system is read-only"),
    ],
)
def test_a_full_or_read_only_cache_names_the_folder_and_installs_nothing(
    cli, tmp_path, monkeypatch, phase, what, fix
):
    """A full disk while the pack was unpacked said only "No space left on device" (a write()
    names no file); a read-only cache named a staging folder that never existed. They name the
    folder being written, its file system's mount point and free space, and that nothing was
    installed, and nothing is: no file, no record, no staging folder."""
    from turbo_dllm.train.compile_cache import compile_cache_dir

    path = _small_pack(tmp_path)
    with monkeypatch.context() as patch:
        _disk_fault(patch, phase)
        result = cli("cache", "install", path)
    folder = compile_cache_dir() if what == "the compile cache" else None
    if folder is None:
        folder = Path(os.environ["DLLM_HOME"]) / "compile-packs" / "installed"
    elif phase == "move":
        folder = folder / "inductor"
    assert_user_error(result, f"cannot write into {what} {folder} while installing {path.name}",
                      "; nothing was installed", f"hint: {fix}", "file system is mounted at ")  # fmt: skip
    assert _cache_files() == []
    assert [p.name for p in compile_cache_dir().iterdir()] == ["inductor", "triton"]  # no staging
    assert cli("cache", "list").out.startswith("no compile-cache packs installed")
    assert json.loads(cli("cache", "install", path, "--json").out)["added"] == 6


def test_installing_an_installed_pack_on_a_read_only_cache_changes_nothing(
    cli, tmp_path, monkeypatch
):
    """Installing a pack that is installed and intact again made a staging folder (and rewrote
    its record) before finding nothing to add: on a cache that had become read-only it failed.
    It is a no-op now."""
    path = _small_pack(tmp_path)
    first = json.loads(cli("cache", "install", path, "--json").out)
    with monkeypatch.context() as patch:
        _disk_fault(patch, "read-only")
        again = cli("cache", "install", path, "--json")
    assert again.code == 0, again.err
    assert json.loads(again.out) == {**first, "added": 0}
    assert cli("cache", "verify").code == 0


@pytest.mark.parametrize("where", ["out", "scratch", "unreadable"])
def test_a_full_disk_while_packing_names_the_folder_and_writes_no_pack(
    cli, tmp_path, monkeypatch, where
):
    """A full --out said only "No space left on device" (a write() names no file); a full
    scratch folder (TMPDIR) said "cannot read <the cache file>", blaming the cache. Each names
    the folder being written and its file system now, and no pack (or scratch copy) is left;
    a cache file that cannot be read is still named, with a hint."""
    import errno
    import shutil
    import tempfile

    import turbo_dllm.bundles.archive
    from turbo_dllm.train.compile_cache import compile_cache_dir

    entry = compile_cache_dir() / "inductor" / "ab" / "c1.py"
    entry.parent.mkdir(parents=True)
    entry.write_text("# c1.py\n")
    scratch = tmp_path / "scratch"
    scratch.mkdir()
    out = tmp_path / "packs"
    with monkeypatch.context() as patch:
        patch.setattr(tempfile, "tempdir", str(scratch))
        if where == "out":

            def pack_members(*args, **kwargs):
                raise OSError(errno.ENOSPC, "No space left on device")

            patch.setattr(turbo_dllm.bundles.archive, "pack_members", pack_members)
        else:
            real_copyfile = shutil.copyfile

            def copyfile(source, target, **kwargs):
                if where == "scratch":  # shutil's sendfile path names the source on ENOSPC
                    raise OSError(errno.ENOSPC, "No space left on device", str(source))
                if Path(source) == entry:
                    raise PermissionError(errno.EACCES, "Permission denied", str(source))
                return real_copyfile(source, target, **kwargs)

            patch.setattr(shutil, "copyfile", copyfile)
        result = cli("cache", "pack", "--out", out)
    if where == "unreadable":
        assert_user_error(result, f"cannot read {entry}: Permission denied",
                          "hint: check that file's permissions")  # fmt: skip
    else:
        folder, what = (out, "the output folder") if where == "out" else (scratch, "the scratch")
        assert_user_error(result, f"cannot write into {what}", f"{folder} while packing: No space "
                          "left on device; no pack was written", "hint: the disk is full",
                          "file system is mounted at ")  # fmt: skip
        assert "cannot read" not in result.err
    assert list(out.iterdir()) == [] and list(scratch.iterdir()) == []


def test_a_read_only_home_is_named_and_an_intact_install_needs_no_lock(cli, tmp_path, monkeypatch):
    """With DLLM_HOME read-only the packs' lock cannot be opened: every install and remove
    stopped on "'.../install.lock': Read-only file system" with a hint to choose another path.
    Installing a pack that is installed with every file in place writes nothing, so it succeeds
    now; one that must write says the lock and DLLM_HOME cannot be written, and nothing changes."""
    import errno

    path = _small_pack(tmp_path)
    sha = json.loads(cli("cache", "install", path, "--json").out)["sha256"]
    other = _small_pack(tmp_path / "other", count=2)
    lock = Path(os.environ["DLLM_HOME"]) / "compile-packs" / "install.lock"
    real_open = os.open

    def open_(file, flags, *args, **kwargs):
        if Path(file) == lock:
            raise OSError(errno.EROFS, "Read-only file system", str(file))
        return real_open(file, flags, *args, **kwargs)

    before = (_cache_files(), cli("cache", "list").out)
    with monkeypatch.context() as patch:
        patch.setattr(os, "open", open_)
        again = cli("cache", "install", path, "--json")
        assert again.code == 0, again.err
        assert json.loads(again.out)["added"] == 0
        refused = [cli("cache", "install", other), cli("cache", "remove", sha[:12])]
        before[0][0].unlink()  # installing the pack again would have a file to put back
        refused.append(cli("cache", "install", path))
    for result in refused:
        assert_user_error(result, f"cannot take the compile-cache packs' lock {lock}: Read-only "
                          "file system; nothing was changed", "hint: that file system is "
                          "read-only: point DLLM_HOME at a folder you can write")  # fmt: skip
    assert _cache_files() == before[0][1:]
    listed = cli("cache", "list").out  # the same record, now one file short in the cache
    assert listed == before[1].replace("\n", "  INCOMPLETE: 1 of 6 files missing or changed\n", 1)
    assert json.loads(cli("cache", "install", path, "--json").out)["added"] == 1


def test_a_pack_larger_than_the_free_space_is_refused_before_a_byte_is_written(
    cli, tmp_path, monkeypatch
):
    """A pack that unpacks to more than the cache's file system has free was extracted until
    the disk was full (breaking whatever else wrote there), then failed. It is refused first."""
    from turbo_dllm.cache import packs
    from turbo_dllm.train.compile_cache import compile_cache_dir

    path = _small_pack(tmp_path)
    with monkeypatch.context() as patch:
        patch.setattr(packs, "file_system", lambda folder: (Path("/mnt/cache"), 10))
        patch.setattr(packs, "_extract", lambda *args: pytest.fail("extracted"))
        result = cli("cache", "install", path)
    assert_user_error(result, f"cannot write into the compile cache {compile_cache_dir()} while "
                      f"installing {path.name}: the pack unpacks to ", "file system has 10 bytes "
                      "free; nothing was installed", "mounted at /mnt/cache")  # fmt: skip
    assert _cache_files() == []
    assert cli("cache", "list").out.startswith("no compile-cache packs installed")


@pytest.mark.parametrize("command", ["verify", "remove"])
def test_an_unknown_pack_id_is_answered_with_a_hint(cli, tmp_path, command):
    """`verify`/`remove` of an id no installed pack has said so with no hint."""
    assert cli("cache", "install", _small_pack(tmp_path)).code == 0
    assert_user_error(cli("cache", command, "abcdefab"), "no installed compile-cache pack "
                      "'abcdefab'", "hint: name one by the sha256 prefix")  # fmt: skip


_KILLED_PACK = """
import os, signal, sys
import turbo_dllm.bundles.archive as archive

def pack_members(first_name, first_data, files, root, out_path):
    out_path.with_name(f".{out_path.name}.tmp-{os.getpid()}").write_bytes(b"half a pack")
    os.kill(os.getpid(), signal.SIGKILL)

archive.pack_members = pack_members
from turbo_dllm.cli import main
main(sys.argv[1:])
"""


def test_a_killed_pack_leaves_nothing_the_next_pack_does_not_sweep(cli, tmp_path, monkeypatch):
    """`dllm cache pack` killed outright (SIGKILL, the OOM killer) while writing its archive left
    its scratch copies of the whole cache in TMPDIR and its half-written archive (hidden) in
    --out, and no later pack removed either: hundreds of MB per kill. The next pack on this host
    sweeps them; another running process's working folders stay."""
    from turbo_dllm.train.compile_cache import compile_cache_dir

    entry = compile_cache_dir() / "inductor" / "ab" / "c1.py"
    entry.parent.mkdir(parents=True)
    entry.write_text("# c1.py\n")
    scratch, out = tmp_path / "scratch", tmp_path / "packs"
    scratch.mkdir()
    env = clean_env(DLLM_HOME=os.environ["DLLM_HOME"], TMPDIR=str(scratch), PYTHONPATH=str(ROOT))
    killed = subprocess.run([sys.executable, "-c", _KILLED_PACK, "cache", "pack", "--out", out],
                            env=env, capture_output=True, timeout=120)  # fmt: skip
    assert killed.returncode == -9, killed.stderr
    assert list(scratch.iterdir()) and list(out.iterdir())  # what the kill left behind
    running = out / f".dllm-pack-{os.uname().nodename}-{os.getppid()}-x"  # a live process's
    running.mkdir()
    monkeypatch.setenv("TMPDIR", str(scratch))
    monkeypatch.setattr("tempfile.tempdir", None)  # read TMPDIR again
    made = cli("cache", "pack", "--out", out, "--json")
    assert made.code == 0, made.err
    assert sorted(out.iterdir()) == sorted([Path(json.loads(made.out)["pack"]), running])
    assert list(scratch.iterdir()) == []


@pytest.mark.parametrize("command", [("pack", "--out", "packs"), ("install", "x.tar.zst"),
                                     ("list",), ("list", "--available")])  # fmt: skip
def test_set_without_config_is_refused(cli, tmp_path, command):
    """`--set` changes the --config spec; without --config it was dropped without a word: `cache
    pack --set training.compile=true` made a pack for any spec, `cache install --set ...` checked
    nothing against the run it described."""
    command = [tmp_path / "packs" if arg == "packs" else arg for arg in command]
    result = cli("cache", *command, "--set", "data.seq_len=64")
    assert_user_error(result, "--set data.seq_len=64 changes the spec of --config, and none was "
                      "given", "hint: pass the RunSpec as well: --config F")  # fmt: skip
    assert not (tmp_path / "packs").exists()


def test_verify_json_names_each_failing_packs_fix(cli, tmp_path):
    """`verify --json` had no `fixes` (the human output printed one, with PACK and ID for the
    user to fill in); it carries each failing pack's fix now, keyed like `packs` as `dllm bundle
    verify --json` does, and the human output prints the same per pack."""
    import shlex

    path = _small_pack(tmp_path, count=2)
    sha = json.loads(cli("cache", "install", path, "--json").out)["sha256"]
    clean = cli("cache", "verify", "--json")
    assert clean.code == 0 and json.loads(clean.out)["fixes"] == {}
    next(p for p in _cache_files() if p.name == "c1.py").unlink()
    report = cli("cache", "verify", "--json")
    assert report.code == 1
    fixes = json.loads(report.out)["fixes"]
    assert list(fixes) == [sha[:12]] == list(json.loads(report.out)["packs"])
    assert f"dllm cache install {shlex.quote(str(path))} puts back" in fixes[sha[:12]]
    assert fixes[sha[:12]].endswith(f"dllm cache remove {sha[:12]}")
    human = cli("cache", "verify")
    assert f"fix {sha[:12]}: {fixes[sha[:12]]}" in human.err
    # The fix's command, as printed, repairs it.
    command = fixes[sha[:12]].removeprefix("install it again: ").split(" puts back")[0]
    assert cli(*shlex.split(command)[1:]).code == 0
    assert cli("cache", "verify").code == 0
    # Its file moved since: the fix says so rather than naming a path that is gone.
    path.rename(tmp_path / "elsewhere.tar.zst")
    next(p for p in _cache_files() if p.name == "c1.py").unlink()
    moved = json.loads(cli("cache", "verify", "--json").out)["fixes"][sha[:12]]
    assert f"its pack file {path.name} is gone from" in moved
    assert moved.startswith(f"remove it: dllm cache remove {sha[:12]} ")  # runs as printed
