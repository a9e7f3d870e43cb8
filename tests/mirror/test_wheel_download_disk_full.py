"""A full disk (a used-up quota, a read-only folder) while `dllm mirror create --with-wheels`
wrote a downloaded wheel was taken for a failed download: the next index URL was tried (and
failed the same way), and the error said "cannot download X.whl: URL: [Errno 28] No space left
on device" with the hint to download the wheel yourself and pass --wheels-from, which needs the
same space. It now stops at once, naming the file, the file system and its free space, and says
to free space and run the same command again (wheels downloaded whole are kept)."""

from __future__ import annotations

import errno
import os

import pytest

from turbo_dllm.envs.manifest import WheelFile
from turbo_dllm.errors import DllmError
from turbo_dllm.mirror import wheels


def test_a_full_disk_is_no_failed_download(tmp_path, monkeypatch):
    served = tmp_path / "index"
    served.mkdir()
    (served / "x-1.0-py3-none-any.whl").write_bytes(b"x" * 100)
    dest = tmp_path / "dest"
    dest.mkdir()
    tried = []

    def full_disk(source, target, *args, **kwargs):
        tried.append(source)
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(target))

    monkeypatch.setattr(wheels.shutil, "copyfile", full_disk)
    wheel = WheelFile(filename="x-1.0-py3-none-any.whl", sha256="0" * 64, size=100)
    url = (served / "x-1.0-py3-none-any.whl").as_uri()
    with pytest.raises(DllmError) as caught:
        wheels.download_wheel([url, url], wheel, dest)
    assert len(tried) == 1  # no second URL: the next one would meet the same disk
    message, hint = caught.value.message, caught.value.hint
    assert f"cannot write {dest / '.x-1.0-py3-none-any.whl.part'}: No space left" in message
    assert "--wheels-from" not in hint
    assert hint.startswith("the disk is full: free some space and run it again")
    assert "mounted at" in hint and "downloaded whole so far are kept" in hint
    assert list(dest.iterdir()) == []
