"""Mirror layout, verify and the HTTP server, on small fixture wheels (fast, no bundle)."""

from __future__ import annotations

import hashlib
import json
import random
import signal
import socket
import struct
import subprocess
import sys
import time
from pathlib import Path

import pytest
import requests

from tests.envs.wheelfactory import make_wheel
from tests.helpers import assert_user_error
from turbo_dllm.envs.manifest import EnvManifest, Index, Pin, Project, WheelFile, dump_manifest
from turbo_dllm.errors import DllmError
from turbo_dllm.mirror.create import MirrorPlan, create_mirror
from turbo_dllm.mirror.serve import MirrorServer
from turbo_dllm.mirror.verify import verify_mirror


def sha256(path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


@pytest.fixture
def wheels(tmp_path):
    folder = tmp_path / "wheels-in"
    make_wheel(folder, "dllm-fixture-a", "1.0", requires_python=">=3.9")
    make_wheel(folder, "Dllm.Fixture_B", "2.0")
    make_wheel(folder, "turbo-dllm", "0.1.0")  # stands in for the project's wheel
    make_wheel(folder, "unrelated", "1.0")
    return folder


def manifest_for(wheels, *names) -> EnvManifest:
    pins = []
    for path in sorted(wheels.glob("*.whl")):
        name, version = path.name.split("-")[:2]
        if name in names:
            wheel = WheelFile(filename=path.name, sha256=sha256(path), size=path.stat().st_size)
            pins.append(Pin(name=name, version=version, wheels=[wheel]))
    return EnvManifest(
        target="cpu-x86_64",
        bundle_target="cp311-torch2.13-cpu-cxx11-linux_x86_64",
        python="3.11",
        python_platform="x86_64-manylinux_2_28",
        resolver="test",
        project=Project(name="turbo-dllm", version="0.1.0"),
        requirements=[],
        packages=pins,
    )


@pytest.fixture
def mirror(tmp_path, wheels):
    plan = MirrorPlan(
        dest=tmp_path / "mirror",
        release=None,
        manifests=[manifest_for(wheels, "dllm_fixture_a", "dllm_fixture_b")],
        wheels_from=wheels,
    )
    index = create_mirror(plan)
    return plan.dest, index


def test_layout_inventory_and_simple_index(mirror, wheels):
    root, index = mirror
    assert sorted(p.name for p in (root / "wheels").iterdir()) == [
        "dllm_fixture_a-1.0-py3-none-any.whl",
        "dllm_fixture_b-2.0-py3-none-any.whl",
        "turbo_dllm-0.1.0-py3-none-any.whl",
    ]  # the unrelated wheel stayed out
    data = json.loads((root / "MIRROR.json").read_text())
    assert data["format"] == "turbo_dllm.mirror.v1"
    assert data["project"]["wheel"] == "wheels/turbo_dllm-0.1.0-py3-none-any.whl"
    listed = {f["path"]: f for f in data["files"]}
    assert listed["manifests/cpu-x86_64.toml"]["kind"] == "manifest"
    assert listed["simple/dllm-fixture-b/index.html"]["kind"] == "index"
    for entry in data["files"]:
        assert entry["sha256"] == sha256(root / entry["path"])
    page = (root / "simple/dllm-fixture-a/index.html").read_text()
    digest = sha256(wheels / "dllm_fixture_a-1.0-py3-none-any.whl")
    assert f'href="../../wheels/dllm_fixture_a-1.0-py3-none-any.whl#sha256={digest}"' in page
    assert 'data-requires-python="&gt;=3.9"' in page
    assert '<a href="dllm-fixture-b/">' in (root / "simple/index.html").read_text()


def test_verify_passes_then_names_every_problem(mirror, cli):
    root, _ = mirror
    assert verify_mirror(root).ok
    assert cli("mirror", "verify", root).code == 0
    wheel = root / "wheels/dllm_fixture_a-1.0-py3-none-any.whl"
    wheel.write_bytes(wheel.read_bytes() + b"tampered")
    (root / "wheels/stray.whl").write_bytes(b"x")
    (root / "simple/turbo-dllm/index.html").unlink()
    report = verify_mirror(root)
    text = "\n".join(report.problems)
    assert "wheels/dllm_fixture_a-1.0-py3-none-any.whl: sha256" in text
    assert "wheels/stray.whl: not listed" in text
    assert "simple/turbo-dllm/index.html: missing" in text
    result = cli("mirror", "verify", root, "--json")
    assert result.code == 1 and json.loads(result.out)["ok"] is False


def test_verify_gives_a_fix_for_a_damaged_mirror_and_it_works(mirror, cli):
    """`dllm mirror verify` named each problem and exited 1 with no fix at all (`dllm bundle
    verify` and `dllm cache verify` give one per failing bundle or pack): what is a cluster
    admin to do with a tampered wheel or a stray file? Now `fix:` on stderr, `fix` in JSON."""
    root, _ = mirror
    assert json.loads(cli("mirror", "verify", root, "--json").out)["fix"] is None
    (root / "wheels/stray.whl").write_bytes(b"x")
    result = cli("mirror", "verify", root)
    assert result.code == 1
    fix = result.err.strip().removeprefix("fix: ")
    assert result.err.startswith("fix: ") and "wheels/stray.whl" in fix and "delete" in fix
    (root / "wheels/stray.whl").unlink()  # the fix
    assert cli("mirror", "verify", root).code == 0

    wheel = root / "wheels/dllm_fixture_a-1.0-py3-none-any.whl"
    wheel.write_bytes(wheel.read_bytes() + b"tampered")
    report = json.loads(cli("mirror", "verify", root, "--json").out)
    assert "copy the mirror again" in report["fix"]
    assert "dllm mirror create DIR --release" in report["fix"] and "--force" in report["fix"]
    assert "--with-wheels" in report["fix"]
    text = cli("mirror", "verify", root)
    assert text.code == 1 and text.err == f"fix: {report['fix']}\n"


def test_a_missing_manifest_is_one_problem(mirror, cli):
    """A deleted manifest was named twice, by the file check and by the manifest check
    ("2 problems" for one missing file)."""
    root, _ = mirror
    (root / "manifests/cpu-x86_64.toml").unlink()
    assert verify_mirror(root).problems == ["manifests/cpu-x86_64.toml: missing"]
    result = cli("mirror", "verify", root)
    assert result.code == 1
    assert result.out.count("manifests/cpu-x86_64.toml: missing") == 1, result.out
    assert result.out.rstrip().endswith("1 problem"), result.out


@pytest.mark.parametrize(
    "path", ["../outside.txt", "/etc/hostname", "wheels/../../outside.txt", "a//b", "./x"]
)
def test_a_mirror_index_naming_a_file_outside_the_mirror_is_refused(mirror, cli, path):
    """MIRROR.json's paths were joined to the mirror's root unchecked: verify (the check of a
    mirror one was handed) hashed files outside it, and '../../dev/zero' with a large size kept
    it reading for ever."""
    root, _ = mirror
    (root.parent / "outside.txt").write_text("not part of the mirror")
    data = json.loads((root / "MIRROR.json").read_text())
    data["files"].append({"path": path, "sha256": "0" * 64, "size": 22, "kind": "other"})
    (root / "MIRROR.json").write_text(json.dumps(data))
    result = cli("mirror", "verify", root)
    assert_user_error(result, "is not a valid mirror index", "is not a plain relative path")
    data["files"].pop()
    data["project"]["wheel"] = path
    (root / "MIRROR.json").write_text(json.dumps(data))
    assert_user_error(cli("mirror", "verify", root), "is not a plain relative path")


def test_verify_names_damaged_and_unreadable_files_instead_of_stopping(mirror, cli):
    """A page or manifest that is not UTF-8 was a UnicodeDecodeError traceback, and a listed
    file that cannot be read (here a folder in its place) stopped verify at that file."""
    root, _ = mirror
    (root / "simple/dllm-fixture-a/index.html").write_bytes(b"\xff\xfe damaged")
    (root / "manifests/cpu-x86_64.toml").write_bytes(b"\xff\xfe damaged")
    wheel = root / "wheels/dllm_fixture_b-2.0-py3-none-any.whl"
    wheel.unlink()
    wheel.mkdir()
    result = cli("mirror", "verify", root)
    assert result.code == 1, result.err
    assert "Traceback" not in result.err
    assert "problem: simple/dllm-fixture-a/index.html: sha256" in result.out
    assert "simple/dllm-fixture-a/index.html: does not match the wheels" in result.out
    assert "manifests/cpu-x86_64.toml is not UTF-8 text" in result.out
    assert "problem: wheels/dllm_fixture_b-2.0-py3-none-any.whl: cannot read" in result.out
    assert result.out.rstrip().endswith("problems"), result.out


def test_verify_catches_a_manifest_pin_without_a_wheel(tmp_path, wheels):
    manifest = manifest_for(wheels, "dllm_fixture_a")
    root = tmp_path / "m"
    create_mirror(MirrorPlan(dest=root, release=None, manifests=[manifest], wheels_from=wheels))
    other = manifest_for(wheels, "dllm_fixture_a", "unrelated")
    (root / "manifests/cpu-x86_64.toml").write_text(dump_manifest(other))
    text = "\n".join(verify_mirror(root).problems)
    assert "manifests/cpu-x86_64.toml: sha256" in text
    assert "no wheel in the mirror for unrelated==1.0" in text


def test_a_mirror_manifest_that_is_not_the_one_mirror_json_lists_is_refused(mirror, tmp_path, cli):
    """The mirror's manifests were read without a look at MIRROR.json: one edited or damaged
    after `mirror create` (a pin dropped, a torn copy) was installed from, and the error, if
    any, came late and pointed at `dllm env lock` (a maintainer's command, of no use on an
    air-gapped host). It is now refused up front, naming `dllm mirror verify`."""
    root, _ = mirror
    path = root / "manifests" / "cpu-x86_64.toml"
    good = path.read_text()
    edited = good.replace('name = "dllm-fixture-b"', 'name = "dllm-fixture-c"')
    assert edited != good
    venv = tmp_path / "venv"
    for text in (edited, good[: len(good) // 2]):
        path.write_text(text)
        for command in (
            ("env", "sync", "--mirror", root, "--offline", "--venv", venv),
            ("env", "check", "--mirror", root, "--target", "cpu-x86_64"),
            ("env", "requirements", "--mirror", root),
        ):
            result = cli(*command)
            assert_user_error(result, "manifests/cpu-x86_64.toml", "MIRROR.json",
                              f"dllm mirror verify {root}")  # fmt: skip
            assert "dllm env lock" not in result.err and result.out == ""
        assert not venv.exists()
    path.write_text(good)
    assert cli("env", "requirements", "--mirror", root).code == 0


def test_verify_counts_one_problem_in_the_singular(mirror, cli):
    root, _ = mirror
    (root / "wheels/stray.whl").write_bytes(b"x")
    result = cli("mirror", "verify", root)
    assert result.code == 1 and result.out.rstrip().endswith(", 1 problem"), result.out


def test_requirements_from_a_mirror_without_wheels_names_the_fix(tmp_path, wheels, cli):
    """Such a mirror has no simple/ index: `--index-url M/simple/` would name nothing."""
    root = tmp_path / "m"
    manifest = manifest_for(wheels, "dllm_fixture_a")
    create_mirror(MirrorPlan(dest=root, release=None, manifests=[manifest]))
    result = cli("env", "requirements", "--mirror", root, "--target", "cpu-x86_64")
    assert_user_error(result, "carries no wheels", "--with-wheels", "--no-sources")
    assert result.out == ""
    pins = cli("env", "requirements", "--mirror", root, "--target", "cpu-x86_64", "--no-sources")
    assert pins.code == 0 and "--index-url" not in pins.out
    assert "dllm-fixture-a==1.0 --hash=sha256:" in pins.out
    # env sync needs the index too: refused before any venv is made
    venv = tmp_path / "venv"
    sync = cli("env", "sync", "--mirror", root, "--target", "cpu-x86_64", "--venv", venv)
    assert_user_error(sync, "carries no wheels", "--with-wheels")
    assert "--no-sources" not in sync.err and not venv.exists()


def test_requirements_refuse_a_mirror_of_another_release_as_sync_does(mirror, tmp_path, cli):
    """`env requirements --manifest X --mirror M` printed the mirror's turbo-dllm 0.1.0 line for
    a manifest of turbo-dllm 0.2.0, which `env sync` with the same arguments refuses."""
    root, _ = mirror
    pins = manifest_for(root / "wheels", "dllm_fixture_a")
    manifest = tmp_path / "other-release.toml"
    newer = pins.model_copy(update={"project": Project(name="turbo-dllm", version="0.2.0")})
    manifest.write_text(dump_manifest(newer))
    venv = tmp_path / "venv"
    for command in (
        ("env", "requirements", "--manifest", manifest, "--mirror", root),
        ("env", "requirements", "--manifest", manifest, "--mirror", root, "--no-sources"),
        ("env", "sync", "--manifest", manifest, "--mirror", root, "--offline", "--venv", venv),
    ):
        result = cli(*command)
        assert_user_error(result, "mirror has turbo-dllm 0.1.0; manifest cpu-x86_64 is for 0.2.0",
                          "hint: use the mirror made for this release")  # fmt: skip
        assert result.out == "", result.out
        assert not venv.exists()  # sync refuses before it makes the venv
    manifest.write_text(dump_manifest(pins))  # the mirror's release: its line, hash-pinned
    fits = cli("env", "requirements", "--manifest", manifest, "--mirror", root)
    assert fits.code == 0, fits.err
    assert fits.out.splitlines()[-1].startswith("turbo-dllm==0.1.0 --hash=sha256:")


def test_create_refuses_missing_wheels_and_existing_folders(tmp_path, wheels):
    manifest = manifest_for(wheels, "dllm_fixture_a")
    empty = tmp_path / "empty"
    empty.mkdir()
    with pytest.raises(DllmError, match="dllm-fixture-a==1.0") as error:
        create_mirror(MirrorPlan(tmp_path / "m1", None, [manifest], wheels_from=empty))
    assert "--with-wheels" in error.value.hint
    assert not (tmp_path / "m1").exists()  # nothing half-built left behind
    create_mirror(MirrorPlan(tmp_path / "m2", None, [manifest], wheels_from=wheels))
    with pytest.raises(DllmError, match="not empty"):
        create_mirror(MirrorPlan(tmp_path / "m2", None, [manifest], wheels_from=wheels))
    create_mirror(MirrorPlan(tmp_path / "m2", None, [manifest], wheels_from=wheels, force=True))
    assert verify_mirror(tmp_path / "m2").ok


def test_force_replaces_a_mirror_never_a_folder_of_other_files(tmp_path, wheels, cli):
    """`DIR exists and is not empty, hint: pass --force to replace it` was said of any folder,
    and --force then deleted it whole: a USB stick's root, a home folder, a checkout. --force
    replaces a mirror (a folder with MIRROR.json); other files are never deleted."""
    manifest_file = tmp_path / "m.toml"
    manifest_file.write_text(dump_manifest(manifest_for(wheels, "dllm_fixture_a")))
    usb = tmp_path / "usb"
    usb.mkdir()
    (usb / "holiday.jpg").write_text("a photo")
    create = ("mirror", "create", usb, "--release", "v0", "--manifest", manifest_file)
    refused = cli(*create, "--wheels-from", wheels)
    assert_user_error(refused, "not a mirror", "no MIRROR.json", f"{usb}/dllm")
    assert "--force" not in refused.err.split("hint:")[1].split("(")[0]
    manifest = manifest_for(wheels, "dllm_fixture_a")
    with pytest.raises(DllmError, match="not a mirror") as error:
        create_mirror(MirrorPlan(usb, None, [manifest], wheels_from=wheels, force=True))
    assert "--force replaces only a mirror" in error.value.hint
    assert sorted(p.name for p in usb.iterdir()) == ["holiday.jpg"]
    assert sorted(p.name for p in tmp_path.iterdir() if p.name.startswith(".")) == []
    # a mirror is replaced with --force as before (and refused without it)
    mirror = tmp_path / "mirror"
    create_mirror(MirrorPlan(mirror, None, [manifest], wheels_from=wheels))
    assert_user_error(cli(*create[:2], mirror, *create[3:], "--wheels-from", wheels), "--force")
    create_mirror(MirrorPlan(mirror, None, [manifest], wheels_from=wheels, force=True))
    assert verify_mirror(mirror).ok


@pytest.mark.parametrize("atomic", [True, False], ids=["exchange", "two-renames"])
def test_force_never_leaves_the_destination_missing(tmp_path, wheels, monkeypatch, atomic):
    """--force over an existing mirror renamed it to .NAME.old, then the new one into place:
    when that second rename failed (or the process died there), there was no mirror at all,
    and the next create deleted the old one. The new mirror is exchanged in one step; where
    that is impossible, a failed second rename puts the old mirror back."""
    from pathlib import Path

    manifest = manifest_for(wheels, "dllm_fixture_a")
    dest = tmp_path / "m"
    create_mirror(MirrorPlan(dest, None, [manifest], wheels_from=wheels))
    before = (dest / "MIRROR.json").read_text()
    real_rename = Path.rename

    def failing_rename(self, target):
        if self.name.startswith(".m.partial-"):  # the new mirror into place
            raise OSError(5, "Input/output error", str(self))
        return real_rename(self, target)

    monkeypatch.setattr(Path, "rename", failing_rename)
    if not atomic:
        monkeypatch.setattr("turbo_dllm.bundles.store.exchange", lambda new, dest: False)
        with pytest.raises(OSError, match="Input/output error"):
            create_mirror(MirrorPlan(dest, None, [manifest], wheels_from=wheels, force=True))
        assert (dest / "MIRROR.json").read_text() == before  # the old mirror, back
    else:
        if not _exchange_works(tmp_path):
            pytest.skip("this file system has no renameat2(RENAME_EXCHANGE)")
        create_mirror(MirrorPlan(dest, None, [manifest], wheels_from=wheels, force=True))
    assert verify_mirror(dest).ok
    assert sorted(p.name for p in tmp_path.iterdir() if p.name.startswith(".")) == []


def _exchange_works(folder) -> bool:
    from turbo_dllm.bundles.store import exchange

    (folder / "x").mkdir()
    (folder / "y").mkdir()
    done = exchange(folder / "x", folder / "y")
    (folder / "x").rmdir()
    (folder / "y").rmdir()
    return done


def _held_create(tmp_path, wheels, hold: str = "    time.sleep(60)\n"):
    """`dllm mirror create` in a child process that stands still once its staging folder holds
    the wheels (the step after them, `_carry_packs`, runs `hold`; no release is fetched): (the
    process, the create's CLI arguments, the staging folder). The caller kills the process."""
    manifest_file = tmp_path / "m.toml"
    manifest_file.write_text(dump_manifest(manifest_for(wheels, "dllm_fixture_a")))
    marker = tmp_path / "copying"
    driver = (
        "import sys, time\n"
        "from pathlib import Path\n"
        "from turbo_dllm.mirror import create, release\n"
        "release.add_release = lambda plan, staging: None\n"
        "def carry_packs(packs, staging):\n"
        f"    Path({str(marker)!r}).write_text(str(staging))\n"
        f"{hold}"
        "create._carry_packs = carry_packs\n"
        "from turbo_dllm.cli import main\n"
        "sys.exit(main(sys.argv[1:]))\n"
    )
    create = ("mirror", "create", tmp_path / "out" / "mirror", "--release", "v0", "--manifest",
              manifest_file, "--wheels-from", wheels)  # fmt: skip
    proc = subprocess.Popen(
        [sys.executable, "-c", driver, *map(str, create)],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        deadline = time.monotonic() + 60
        while not marker.is_file():
            assert proc.poll() is None and time.monotonic() < deadline, proc.communicate()
            time.sleep(0.05)
    except BaseException:
        proc.kill()
        raise
    return proc, create, Path(marker.read_text())


def test_sigterm_during_create_leaves_no_staging_folder(tmp_path, wheels):
    """SIGTERM (`timeout`, a scheduler's limit) ended `mirror create` on the spot and left its
    hidden .DIR.partial-* folder, with every wheel copied so far, next to DIR."""
    out = tmp_path / "out"
    proc, _, staging = _held_create(tmp_path, wheels)
    try:
        assert (staging / "wheels").is_dir()
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=30)
        assert proc.returncode == -signal.SIGTERM, (proc.returncode, err)
        assert "Traceback" not in err
        assert list(out.iterdir()) == []
    finally:
        proc.kill()


def test_a_killed_create_s_staging_folder_is_swept_by_the_next_one(
    tmp_path, wheels, cli, monkeypatch
):
    """SIGKILL (the OOM killer, a lost node) left `.DIR.partial-*`, holding every file copied
    so far (gigabytes of wheels), next to DIR for good: no later create removed it. A create
    that is still running keeps its own."""
    from turbo_dllm.mirror import release

    out = tmp_path / "out"
    proc, create, staging = _held_create(tmp_path, wheels)
    try:
        monkeypatch.setattr(release, "add_release", lambda plan, staging: None)
        assert cli(*create).code == 0  # while the other create runs: its folder stays
        assert (staging / "wheels").is_dir()
        proc.kill()
        proc.communicate(timeout=30)
    finally:
        proc.kill()
    assert (staging / "wheels").is_dir()  # what the kill left
    again = cli(*create, "--force")
    assert again.code == 0, again.err
    assert f"removed {staging}" in again.err
    assert sorted(out.iterdir()) == [out / "mirror"]
    assert cli("mirror", "verify", out / "mirror").code == 0


def test_a_create_racing_another_replaces_nothing_without_force(tmp_path, wheels, cli, monkeypatch):
    """Two creates of one new DIR at once both passed the 'DIR exists: pass --force' check, and
    the one that finished last replaced the other's mirror without --force."""
    from turbo_dllm.mirror import release

    out, go = tmp_path / "out", tmp_path / "go"
    hold = f"    while not Path({str(go)!r}).exists():\n        time.sleep(0.05)\n"
    proc, create, _ = _held_create(tmp_path, wheels, hold)  # stands still until `go` exists
    try:
        monkeypatch.setattr(release, "add_release", lambda plan, staging: None)
        assert cli(*create).code == 0  # the other create, done first
        first = (out / "mirror" / "MIRROR.json").read_bytes()
        go.write_text("")
        _, err = proc.communicate(timeout=60)
    finally:
        proc.kill()
    assert proc.returncode == 2, err
    assert "was filled while this create ran" in err and "Traceback" not in err
    assert (out / "mirror" / "MIRROR.json").read_bytes() == first
    assert sorted(out.iterdir()) == [out / "mirror"]


def test_create_refuses_a_destination_that_is_a_file(tmp_path, wheels, cli):
    """A file as DIR (or inside DIR's path) was a NotADirectoryError traceback."""
    afile = tmp_path / "afile"
    afile.write_text("not a folder")
    manifest = manifest_for(wheels, "dllm_fixture_a")
    with pytest.raises(DllmError, match="is a file, not a folder"):
        create_mirror(MirrorPlan(afile, None, [manifest], wheels_from=wheels, force=True))
    with pytest.raises(DllmError, match="cannot write into .*afile: it is a file"):
        create_mirror(MirrorPlan(afile / "m", None, [manifest], wheels_from=wheels))
    assert afile.read_text() == "not a folder"


def test_server_content_types_ranges_and_no_listings(mirror):
    root, _ = mirror
    with MirrorServer(root, quiet=True) as server:
        assert server.url.startswith("http://127.0.0.1:")
        page = requests.get(f"{server.url}/simple/dllm-fixture-a/", timeout=10)
        assert page.status_code == 200
        assert page.headers["Content-Type"] == "text/html; charset=utf-8"
        assert "#sha256=" in page.text
        mirror_json = requests.get(f"{server.url}/MIRROR.json", timeout=10)
        assert mirror_json.headers["Content-Type"] == "application/json"
        wheel = root / "wheels/dllm_fixture_a-1.0-py3-none-any.whl"
        data = wheel.read_bytes()
        url = f"{server.url}/wheels/{wheel.name}"
        whole = requests.get(url, timeout=10)
        assert whole.content == data and whole.headers["Accept-Ranges"] == "bytes"
        part = requests.get(url, headers={"Range": "bytes=10-19"}, timeout=10)
        assert part.status_code == 206 and part.content == data[10:20]
        assert part.headers["Content-Range"] == f"bytes 10-19/{len(data)}"
        tail = requests.get(url, headers={"Range": "bytes=-5"}, timeout=10)
        assert tail.status_code == 206 and tail.content == data[-5:]
        rest = requests.get(url, headers={"Range": f"bytes={len(data) - 3}-"}, timeout=10)
        assert rest.content == data[-3:]
        beyond = requests.get(url, headers={"Range": f"bytes={len(data)}-"}, timeout=10)
        assert beyond.status_code == 416
        assert requests.get(f"{server.url}/wheels/", timeout=10).status_code == 404
        assert requests.get(f"{server.url}/../../etc/passwd", timeout=10).status_code == 404


def test_server_sends_large_files_and_ranges_whole(mirror):
    """Files are sent with sendfile from the page cache: many MiB, whole and from an offset
    past the first MiB, byte for byte; HEAD sends headers only."""
    root, _ = mirror
    blob = root / "bundles" / "big.bin"
    blob.parent.mkdir(exist_ok=True)
    data = random.Random(0).randbytes(5 * 1024 * 1024 + 123)
    blob.write_bytes(data)
    with MirrorServer(root, quiet=True) as server:
        url = f"{server.url}/bundles/big.bin"
        whole = requests.get(url, timeout=30)
        assert whole.status_code == 200 and whole.content == data
        assert whole.headers["Content-Length"] == str(len(data))
        start = 1024 * 1024 + 7
        part = requests.get(
            url, headers={"Range": f"bytes={start}-{start + 3 * 1024 * 1024}"}, timeout=30
        )
        assert part.status_code == 206
        assert part.content == data[start : start + 3 * 1024 * 1024 + 1]
        rest = requests.get(url, headers={"Range": f"bytes={start}-"}, timeout=30)
        assert rest.content == data[start:]
        head = requests.head(url, timeout=10)
        assert head.status_code == 200 and head.content == b""
        assert head.headers["Content-Length"] == str(len(data))


def test_server_never_follows_a_link_out_of_the_mirror_and_answers_a_nul(mirror, tmp_path):
    """A link in a carried mirror folder (`escape -> /`) served the host's files to anyone who
    could reach the server, and verify passed; a NUL in the path got no answer at all (a
    ValueError traceback in the server)."""
    root, _ = mirror
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "secret.txt").write_text("not for the cluster")
    (root / "escape").symlink_to(outside, target_is_directory=True)
    (root / "wheels" / "secret.txt").symlink_to(outside / "secret.txt")
    (root / "simple" / "alias.json").symlink_to(root / "MIRROR.json")  # inside: served
    with MirrorServer(root, quiet=True) as server:
        for path in ("escape/secret.txt", "escape/", "wheels/secret.txt"):
            for headers in ({}, {"Range": "bytes=0-3"}):
                answer = requests.get(f"{server.url}/{path}", headers=headers, timeout=10)
                assert answer.status_code == 404, (path, headers)
                assert b"not for the cluster" not in answer.content
        assert requests.head(f"{server.url}/escape/secret.txt", timeout=10).status_code == 404
        alias = requests.get(f"{server.url}/simple/alias.json", timeout=10)
        assert alias.content == (root / "MIRROR.json").read_bytes()
        assert requests.get(f"{server.url}/MIRROR.json%00", timeout=10).status_code == 400
    problems = verify_mirror(root).problems
    assert "escape: not listed in MIRROR.json" in problems
    assert "wheels/secret.txt: not listed in MIRROR.json" in problems


def _big_file(path):
    """A sparse file larger than the socket buffers hold: its download blocks on the client."""
    path.parent.mkdir(exist_ok=True)
    with open(path, "wb") as handle:
        handle.truncate(256 * 1024 * 1024)


def test_a_client_that_goes_away_mid_download_is_one_log_line(mirror, capsys):
    """pip/uv cancelling a download, or a cut connection, printed socketserver's traceback
    ('Exception occurred during processing of request', BrokenPipeError) even with --quiet."""
    root, _ = mirror
    _big_file(root / "bundles" / "big.bin")
    with MirrorServer(root) as server:
        host, port = server.httpd.server_address[:2]
        client = socket.create_connection((host, port), timeout=10)
        client.sendall(b"GET /bundles/big.bin HTTP/1.1\r\nHost: x\r\n\r\n")
        assert client.recv(4096).startswith(b"HTTP/1.0 200")
        # gone: a reset, as from a killed process
        client.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        client.close()
        err = ""
        deadline = time.monotonic() + 20
        while "went away" not in err and "Traceback" not in err and time.monotonic() < deadline:
            time.sleep(0.05)
            err += capsys.readouterr().err
    assert "Traceback" not in err
    assert "/bundles/big.bin: client went away" in err


def test_a_silent_or_stalled_client_is_disconnected(mirror, capsys, monkeypatch):
    """A connection that sent nothing, or stopped reading a download, held its server thread
    forever (no socket timeout)."""
    from turbo_dllm.mirror import serve

    assert 0 < serve.MirrorRequestHandler.timeout == serve.IDLE_TIMEOUT_S <= 300
    monkeypatch.setattr(serve.MirrorRequestHandler, "timeout", 0.5)  # as short, to watch it
    root, _ = mirror
    _big_file(root / "bundles" / "big.bin")
    with MirrorServer(root) as server:
        host, port = server.httpd.server_address[:2]
        silent = socket.create_connection((host, port), timeout=20)
        assert silent.recv(4096) == b""  # closed by the server, well before our own timeout
        silent.close()
        stalled = socket.create_connection((host, port), timeout=20)
        stalled.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        stalled.sendall(b"GET /bundles/big.bin HTTP/1.1\r\nHost: x\r\n\r\n")
        err = ""
        deadline = time.monotonic() + 20  # never read: the server's sends stall
        while err.count("Request timed out") < 2 and time.monotonic() < deadline:
            time.sleep(0.05)
            err += capsys.readouterr().err
        stalled.close()
        assert requests.get(f"{server.url}/MIRROR.json", timeout=10).status_code == 200
    assert "Traceback" not in err
    assert err.count("Request timed out") == 2  # the silent one, then the stalled download


def test_serve_and_verify_refuse_a_folder_that_is_not_a_mirror(tmp_path, cli):
    """serve said "not a mirror (no MIRROR.json)" of a path that does not exist, of a file and
    of a URL (as /cwd/http:/host); it now names each as verify and --mirror do."""
    (tmp_path / "file").write_text("x")
    for command in (("mirror", "serve", "--port", "0"), ("mirror", "verify")):
        assert_user_error(cli(*command, tmp_path), "not a mirror", "no MIRROR.json")
        missing = cli(*command, tmp_path / "nope")
        assert_user_error(missing, f"{tmp_path / 'nope'}' does not exist")
        assert "MIRROR.json" not in missing.err
        a_file = cli(*command, tmp_path / "file")
        assert_user_error(a_file, "is a file, not a folder")
        assert "MIRROR.json" not in a_file.err
    served_url = cli("mirror", "serve", "--port", "0", "http://127.0.0.1:9")
    assert_user_error(served_url, "is a URL", "mirror's folder")
    # what `dllm bundle publish` writes is a bundle index: named so, with the ways it is used
    published = tmp_path / "published"
    (published / "releases" / "v9").mkdir(parents=True)
    (published / "releases" / "v9" / "catalog.toml").write_text("")
    for command in (("mirror", "serve", "--port", "0"), ("mirror", "verify")):
        assert_user_error(
            cli(*command, published),
            f"{published} is a bundle index (what `dllm bundle publish` writes), not a mirror",
            f"dllm bundle install --mirror {published} --auto",
            f"python3 -m http.server --directory {published} 8000",
        )


@pytest.mark.parametrize(
    ("args", "needle"),
    [
        (("--port", "-1"), "--port must be 0-65535"),
        (("--port", "70000"), "--port must be 0-65535"),
        (("--host", "nosuchhost.invalid", "--port", "0"), "pass another --host"),
        # an address of no interface here (TEST-NET-1) said to pass another --port
        (("--host", "192.0.2.1", "--port", "0"), "pass another --host"),
    ],
)
def test_serve_refuses_a_port_out_of_range_and_names_a_bad_host(mirror, cli, args, needle):
    """A port outside 0-65535 was a traceback from bind(); a host name that does not resolve
    said to pass another --port."""
    assert_user_error(cli("mirror", "serve", mirror[0], *args), needle)


def test_serve_on_a_port_in_use_names_the_port(mirror, cli):
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        result = cli("mirror", "serve", mirror[0], "--port", port)
    assert_user_error(result, f"cannot listen on 127.0.0.1:{port}", "pass another --port")
    assert "--host" not in result.err


def _ipv6_loopback() -> bool:
    try:
        with socket.socket(socket.AF_INET6) as probe:
            probe.bind(("::1", 0))
    except OSError:
        return False
    return True


@pytest.mark.skipif(not _ipv6_loopback(), reason="no IPv6 loopback here")
def test_serve_listens_on_an_ipv6_host(mirror):
    """--host ::1 (or ::) was 'cannot listen on ::1:0: Address family for hostname not
    supported', hint 'pass another --host': the server was IPv4 only, though its URL and the
    mirror readers bracket an IPv6 host."""
    from turbo_dllm.mirror.source import open_mirror

    root, index = mirror
    with MirrorServer(root, host="::1", quiet=True) as server:
        assert server.url.startswith("http://[::1]:")
        answer = requests.get(f"{server.url}/MIRROR.json", timeout=10)
        assert answer.status_code == 200
        assert open_mirror(server.url).index() == index


def test_with_wheels_downloads_from_the_manifest_index_by_hash(mirror, wheels, tmp_path):
    root, _ = mirror
    with MirrorServer(root, quiet=True) as server:
        manifest = manifest_for(wheels, "dllm_fixture_a", "dllm_fixture_b")
        online = manifest.model_copy(update={"indexes": [Index(url=f"{server.url}/simple")]})
        plan = MirrorPlan(tmp_path / "copy", None, [online], with_wheels=True)
        create_mirror(plan)
        copied = sorted(p.name for p in (tmp_path / "copy" / "wheels").iterdir())
        assert copied == [
            "dllm_fixture_a-1.0-py3-none-any.whl",
            "dllm_fixture_b-2.0-py3-none-any.whl",
        ]
        assert any("no turbo-dllm 0.1.0 wheel" in note for note in plan.notes)
        assert verify_mirror(tmp_path / "copy").ok

        data = online.model_dump()
        data["packages"][0]["wheels"][0]["sha256"] = "e" * 64
        forged = EnvManifest.model_validate(data)
        with pytest.raises(DllmError, match="is not the manifest's"):
            create_mirror(MirrorPlan(tmp_path / "forged", None, [forged], with_wheels=True))
        assert not (tmp_path / "forged").exists()


def test_env_sync_offline_from_a_mirror_folder(mirror, tmp_path, monkeypatch, cli):
    root, _ = mirror
    monkeypatch.setenv("UV_CACHE_DIR", str(tmp_path / "uv-cache"))
    venv = tmp_path / "venv"
    result = cli("env", "sync", "--mirror", root, "--offline", "--venv", venv,
                 "--target", "cpu-x86_64", "--json")  # fmt: skip
    assert result.code == 0, result.err
    report = json.loads(result.out)
    assert report["clean"] is True and report["packages"] == 2
    assert report["project"] == f"turbo-dllm 0.1.0 from {root}"  # the mirror's wheel, hash-checked
    checked = cli("env", "check", "--python", venv / "bin" / "python", "--json")
    assert checked.code == 0, checked.out
    listed = cli("env", "list", "--mirror", root)
    assert "cpu-x86_64" in listed.out
    assert_user_error(
        cli("env", "sync", "--mirror", root, "--target", "sm90", "--venv", venv),
        "no environment manifest for target sm90",
    )


def test_a_stopped_with_wheels_create_resumes_from_the_wheels_it_downloaded(
    mirror, wheels, tmp_path, monkeypatch
):
    """Ctrl-C during `--with-wheels` threw away every wheel downloaded so far with the staging
    folder (gigabytes for a CUDA target): the same command again started from nothing. Now
    whole, hash-checked downloads are kept next to DIR and reused; a half-written one never is."""
    from turbo_dllm.mirror import create

    root, _ = mirror
    real_download = create.download_wheel
    fetched: list[str] = []

    def stopped_mid_second(urls, wheel, dest):
        if fetched:  # the second wheel: part of it written, then Ctrl-C
            (dest / f".{wheel.filename}.part").write_bytes(b"half a wheel")
            raise KeyboardInterrupt
        fetched.append(wheel.filename)
        return real_download(urls, wheel, dest)

    with MirrorServer(root, quiet=True) as server:
        manifest = manifest_for(wheels, "dllm_fixture_a", "dllm_fixture_b")
        online = manifest.model_copy(update={"indexes": [Index(url=f"{server.url}/simple")]})
        dest = tmp_path / "out" / "copy"
        monkeypatch.setattr(create, "download_wheel", stopped_mid_second)
        with pytest.raises(KeyboardInterrupt):
            create_mirror(MirrorPlan(dest, None, [online], with_wheels=True))
        kept = tmp_path / "out" / ".copy.downloads"
        assert sorted(p.name for p in (tmp_path / "out").iterdir()) == [".copy.downloads"]
        assert [p.name for p in kept.iterdir()] == fetched  # no .part: never taken as whole
        first = kept / fetched[0]
        assert sha256(first) == sha256(wheels / fetched[0])

        again: list[str] = []

        def counting(urls, wheel, dest):
            again.append(wheel.filename)
            return real_download(urls, wheel, dest)

        monkeypatch.setattr(create, "download_wheel", counting)
        create_mirror(MirrorPlan(dest, None, [online], with_wheels=True))
        assert again == ["dllm_fixture_b-2.0-py3-none-any.whl"]  # only what was missing
        assert fetched == ["dllm_fixture_a-1.0-py3-none-any.whl"]
        assert not kept.exists()  # done with once the mirror is in place
        assert verify_mirror(dest).ok

        # A kept file that is not the manifest's wheel (torn, tampered) is downloaded again.
        kept.mkdir()
        (kept / fetched[0]).write_bytes(b"torn")
        again.clear()
        create_mirror(MirrorPlan(dest, None, [online], with_wheels=True, force=True))
        assert sorted(again) == [fetched[0], "dllm_fixture_b-2.0-py3-none-any.whl"]
        assert verify_mirror(dest).ok and not kept.exists()


def test_create_prints_its_next_step_quoted(tmp_path, wheels, cli, monkeypatch):
    """`next: dllm mirror verify /media/usb/my mirror && ...` split at the space when pasted."""
    import shlex

    from turbo_dllm.mirror import release

    monkeypatch.setattr(release, "add_release", lambda plan, staging: None)  # wheels only
    manifest_file = tmp_path / "m.toml"
    manifest_file.write_text(dump_manifest(manifest_for(wheels, "dllm_fixture_a")))
    dest = tmp_path / "usb stick" / "my mirror"
    result = cli("mirror", "create", dest, "--release", "v0", "--manifest", manifest_file,
                 "--wheels-from", wheels)  # fmt: skip
    assert result.code == 0, result.err
    line = next(x for x in result.out.splitlines() if x.startswith("next: "))
    verify, serve = (shlex.split(part) for part in line.removeprefix("next: ").split(" && "))
    assert verify == ["dllm", "mirror", "verify", str(dest)]
    assert serve == ["dllm", "mirror", "serve", str(dest)]
    assert cli(*verify[1:]).code == 0


def test_create_s_next_step_for_a_folder_named_like_an_option(tmp_path, wheels, cli, monkeypatch):
    """`dllm mirror create --release v0 ... -- -m` printed `next: dllm mirror verify -m`, which
    argparse reads as an option."""
    import shlex

    from turbo_dllm.mirror import release

    monkeypatch.setattr(release, "add_release", lambda plan, staging: None)  # wheels only
    manifest_file = tmp_path / "m.toml"
    manifest_file.write_text(dump_manifest(manifest_for(wheels, "dllm_fixture_a")))
    monkeypatch.chdir(tmp_path)
    result = cli("mirror", "create", "--release", "v0", "--manifest", manifest_file,
                 "--wheels-from", wheels, "--", "-m")  # fmt: skip
    assert result.code == 0, result.err
    line = next(x for x in result.out.splitlines() if x.startswith("next: "))
    verify, _ = (shlex.split(part) for part in line.removeprefix("next: ").split(" && "))
    assert cli(*verify[1:]).code == 0


def test_serve_on_every_interface_prints_a_url_other_hosts_can_use(mirror, cli, monkeypatch):
    """`--host 0.0.0.0` printed `install: dllm env sync --mirror http://0.0.0.0:8000 --offline`
    for the nodes: no other host can connect to the wildcard address. It names this host now."""
    from turbo_dllm.mirror import serve

    root, index = mirror
    started = []

    def serve_once(self):  # answer as `serve` would, then stop (as Ctrl-C does)
        started.append(self)
        raise KeyboardInterrupt

    monkeypatch.setattr(serve.MirrorServer, "serve_forever", serve_once)
    result = cli("mirror", "serve", root, "--host", "0.0.0.0", "--port", "0", "--quiet")
    assert result.code == 0, result.err
    port = started[0].httpd.server_address[1]
    expected = f"http://{socket.gethostname()}:{port}"
    assert f"install: dllm env sync --mirror {expected} --offline" in result.out
    assert f"pip/uv index: {expected}/simple/" in result.out
    # With the default host, the loopback URL is what the nodes (this host) use.
    result = cli("mirror", "serve", root, "--port", "0", "--quiet")
    assert "install: dllm env sync --mirror http://127.0.0.1:" in result.out


def test_serve_of_a_mirror_without_wheels_prints_what_it_can_serve(tmp_path, cli, monkeypatch):
    """A mirror made without wheels (`dllm mirror create DIR --release R --from SITE`, the
    bundles only) was served with "pip/uv index: URL/simple/" (there is no simple/) and
    "install: dllm env sync --mirror URL --offline", which fails ("carries no wheels"); the
    bundle install line, the one command that works, was not printed."""
    from turbo_dllm.mirror import serve
    from turbo_dllm.mirror.layout import MIRROR_FILE, MirrorFile, MirrorIndex

    root = tmp_path / "bundles-only"
    catalog = root / "releases" / "v9.9.9" / "catalog.toml"
    catalog.parent.mkdir(parents=True)
    catalog.write_text('format = "turbo_dllm.catalog.v1"\nrelease = "v9.9.9"\n')
    index = MirrorIndex(
        created_by="test",
        release="v9.9.9",
        files=[
            MirrorFile(
                path="releases/v9.9.9/catalog.toml",
                sha256=sha256(catalog),
                size=catalog.stat().st_size,
                kind="catalog",
            )
        ],
    )
    (root / MIRROR_FILE).write_text(index.model_dump_json())
    monkeypatch.setattr(serve.MirrorServer, "serve_forever", lambda self: _interrupt())
    result = cli("mirror", "serve", root, "--port", "0", "--quiet")
    assert result.code == 0, result.err
    assert "install: dllm env sync" not in result.out and "/simple/" not in result.out
    assert "no wheels" in result.out
    line = next(x for x in result.out.splitlines() if x.startswith("bundles: "))
    assert line.startswith("bundles: dllm bundle install --auto --index http://127.0.0.1:")
    assert line.endswith(" --release v9.9.9")


def _interrupt():
    raise KeyboardInterrupt


@pytest.mark.parametrize("catalog", [None, "no-entry"])
def test_create_refuses_a_release_it_cannot_carry_before_downloading_wheels(
    tmp_path, wheels, monkeypatch, catalog
):
    """No --from, or a release without a bundle for a target (v0.1.0 has no sm90 one), was
    refused only after every pinned wheel had been downloaded."""
    from turbo_dllm.bundles.catalog import sha256_bytes
    from turbo_dllm.mirror import create
    from turbo_dllm.mirror.release import add_release

    fetched: list[str] = []
    monkeypatch.setattr(create, "download_wheel", lambda urls, w, dest: fetched.append(w.filename))
    monkeypatch.delenv("DLLM_BUNDLE_INDEX", raising=False)
    manifest = manifest_for(wheels, "dllm_fixture_a")
    plan = MirrorPlan(tmp_path / "out" / "m", "v-test", [manifest], with_wheels=True)
    needle = "where do release v-test's catalog and bundles come from"
    if catalog:
        site = tmp_path / "site"
        data = b'format = "turbo_dllm.catalog.v1"\nrelease = "v-test"\nbundles = []\n'
        (site / "releases" / "v-test").mkdir(parents=True)
        (site / "releases" / "v-test" / "catalog.toml").write_bytes(data)
        plan.bundles_from, plan.catalog_sha256 = str(site), sha256_bytes(data)
        needle = "release v-test has no bundle for cp311-torch2.13-cpu-cxx11-linux_x86_64"
    with pytest.raises(DllmError, match=needle):
        create_mirror(plan, add_release=add_release)
    assert fetched == []
    assert list((tmp_path / "out").iterdir()) == []  # no staging folder, no kept downloads


def test_a_disk_that_fills_while_the_mirror_is_written_is_named_with_the_size(
    tmp_path, wheels, cli, monkeypatch
):
    """A full disk while `dllm mirror create` wrote its staging folder said "No space left on
    device" naming a file inside that folder, deleted by then, and no size (found by the bundle
    crash audit). It names the mirror, what was written, and the file system's free space."""
    import errno

    from turbo_dllm.mirror import create, release

    monkeypatch.setattr(release, "add_release", lambda plan, staging: None)  # wheels only

    def full(*args, **kwargs):
        raise OSError(errno.ENOSPC, "No space left on device", "/gone/.x.partial-1/MIRROR.json")

    monkeypatch.setattr(create, "_carry_packs", full)  # the step after the wheels are in
    manifest_file = tmp_path / "m.toml"
    manifest_file.write_text(dump_manifest(manifest_for(wheels, "dllm_fixture_a")))
    dest = tmp_path / "m"
    result = cli("mirror", "create", dest, "--release", "v0", "--manifest", manifest_file,
                 "--wheels-from", wheels)  # fmt: skip
    assert_user_error(
        result,
        f"the disk filled while the mirror {dest} was written (",
        "written by then); the staging folder was removed and nothing was kept",
        "hint: the mirror needs more than ",
    )
    assert "/gone/" not in result.err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["m.toml", wheels.name]  # nothing else
