"""sha256_files: the digests of weight files, read once per file version across processes."""

from __future__ import annotations

import hashlib
import json
import os

import pytest

from turbo_dllm import digests, fsutil
from turbo_dllm.digests import CACHE_NAME, sha256_files


@pytest.fixture
def home(tmp_path, monkeypatch):
    """A fresh dllm home, and files remembered as soon as written (the tests' files are new)."""
    monkeypatch.setenv("DLLM_HOME", str(tmp_path / "home"))
    monkeypatch.setattr(digests, "_SETTLE_NS", 0)
    return tmp_path / "home"


@pytest.fixture
def reads(monkeypatch):
    """The files sha256_files actually read, in order."""
    seen = []

    def counting(path, *args, **kwargs):
        seen.append(os.path.basename(path))
        return fsutil.sha256_file(path, *args, **kwargs)

    monkeypatch.setattr(digests, "sha256_file", counting)
    return seen


def _files(tmp_path, **contents):
    paths = []
    for name, data in contents.items():
        (tmp_path / name).write_bytes(data)
        paths.append(tmp_path / name)
    return paths


def test_digests_are_hashlibs_in_order_and_read_once(home, reads, tmp_path):
    paths = _files(tmp_path, a=b"alpha" * 1000, b=b"", c=os.urandom(3 << 20))
    expected = [hashlib.sha256(p.read_bytes()).hexdigest() for p in paths]
    assert sha256_files(paths) == expected
    assert sorted(reads) == ["a", "b", "c"]
    assert sha256_files(list(reversed(paths))) == list(reversed(expected))  # another process
    assert len(reads) == 3  # nothing read again
    assert (home / CACHE_NAME).is_file()


def test_a_rewritten_file_is_read_again_even_with_its_size_and_mtime_kept(home, reads, tmp_path):
    (path,) = _files(tmp_path, w=b"0" * 4096)
    sha256_files([path])
    before = path.stat()
    path.write_bytes(b"1" * 4096)  # same size; mtime set back, as a careless copy tool might
    os.utime(path, ns=(before.st_atime_ns, before.st_mtime_ns))
    assert path.stat().st_mtime_ns == before.st_mtime_ns
    assert sha256_files([path]) == [hashlib.sha256(b"1" * 4096).hexdigest()]
    assert reads == ["w", "w"]


def test_a_file_changed_just_before_it_was_read_is_not_remembered(
    home, reads, tmp_path, monkeypatch
):
    # Two writes within one tick of the file clock can leave the same stamp.
    monkeypatch.setattr(digests, "_SETTLE_NS", 60_000_000_000)
    (path,) = _files(tmp_path, n=b"new")
    sha256_files([path])
    sha256_files([path])
    assert reads == ["n", "n"]


def test_a_replaced_file_is_read_again(home, reads, tmp_path):
    (path,) = _files(tmp_path, r=b"old")
    sha256_files([path])
    (tmp_path / "new").write_bytes(b"new")
    os.replace(tmp_path / "new", path)  # another inode under the same name
    assert sha256_files([path]) == [hashlib.sha256(b"new").hexdigest()]


def test_a_damaged_cache_is_ignored_and_rewritten(home, reads, tmp_path):
    (path,) = _files(tmp_path, d=b"data")
    home.mkdir()
    for damaged in ("{not json", "[1, 2]", json.dumps({"1:2": "not an entry"})):
        (home / CACHE_NAME).write_text(damaged)
        assert sha256_files([path]) == [hashlib.sha256(b"data").hexdigest()]
    assert json.loads((home / CACHE_NAME).read_text())  # a good cache again
    # A cache entry whose digest was tampered into something that is not a digest is not used.
    cache = json.loads((home / CACHE_NAME).read_text())
    for entry in cache.values():
        entry["sha256"] = "x"
    (home / CACHE_NAME).write_text(json.dumps(cache))
    assert sha256_files([path]) == [hashlib.sha256(b"data").hexdigest()]


def test_an_unwritable_home_still_gives_the_digests(tmp_path, monkeypatch, reads):
    blocker = tmp_path / "file"
    blocker.write_text("a file where the home folder would be")
    monkeypatch.setenv("DLLM_HOME", str(blocker / "home"))
    monkeypatch.setattr(digests, "_SETTLE_NS", 0)
    (path,) = _files(tmp_path, u=b"unwritable")
    assert sha256_files([path]) == [hashlib.sha256(b"unwritable").hexdigest()]
    assert sha256_files([path]) == [hashlib.sha256(b"unwritable").hexdigest()]
    assert reads == ["u", "u"]  # nothing remembered, nothing wrong


def test_a_missing_file_raises_like_open(home, tmp_path):
    with pytest.raises(FileNotFoundError):
        sha256_files([tmp_path / "absent"])


def test_the_cache_keeps_the_newest_digests(home, tmp_path, monkeypatch, reads):
    monkeypatch.setattr(digests, "_MAX_ENTRIES", 2)
    paths = _files(tmp_path, x=b"x", y=b"y", z=b"z")
    for path in paths:
        sha256_files([path])
    kept = json.loads((home / CACHE_NAME).read_text())
    inodes = {f"{p.stat().st_dev}:{p.stat().st_ino}": p.name for p in paths}
    assert sorted(inodes[key] for key in kept) == ["y", "z"]
    sha256_files(paths)
    assert reads == ["x", "y", "z", "x"]  # only the dropped one is read again
