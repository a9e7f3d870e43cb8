"""A step is marked complete (renamed to `step_<N>`) only once its files are on disk.

DCP syncs the files it writes (`sync_files`); the per-rank file we write ourselves
(`rank_<r>.pt`, RNG states) and the temp folder's entries must be synced too before the rename,
or a power cut right after it could leave a `step_*` that resume takes with a torn file.
"""

from __future__ import annotations

import os
import types
from pathlib import Path

import torch

from turbo_dllm.train.checkpoint import Checkpointer, read_meta

META = {
    "dp_replicate": 1,
    "dp_shard": 1,
    "seed": 0,
    "objective": "test",
    "model": {},
    "param_dtype": "float32",
    "data_fingerprint": None,
    "train_time_s": 0.0,
}


def test_every_file_and_the_folder_are_synced_before_the_step_is_renamed_in(tmp_path, monkeypatch):
    events: list[tuple[str, str]] = []
    real_fsync, real_replace = os.fsync, os.replace

    def fsync(fd):
        events.append(("fsync", os.readlink(f"/proc/self/fd/{fd}")))
        return real_fsync(fd)

    def replace(src, dst, **kwargs):
        real_replace(src, dst, **kwargs)
        events.append(("rename", os.fspath(dst)))

    monkeypatch.setattr(os, "fsync", fsync)
    monkeypatch.setattr(os, "replace", replace)
    model = torch.nn.Linear(4, 4)
    optimizer = torch.optim.AdamW(model.parameters())
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: 1.0)
    folder = Path(os.path.realpath(tmp_path)) / "checkpoints"
    saver = Checkpointer(folder, keep_last=2, rank=0, world_size=1)
    final = saver.save(
        1, model=model, optimizer=optimizer, scheduler=scheduler, loader_state={}, meta=META
    )
    assert read_meta(final).step == 1
    tmp = str(folder / ".tmp-step_00000001")
    complete = events.index(("rename", str(final)))
    synced = [path for kind, path in events[:complete] if kind == "fsync"]
    assert any(path.startswith(tmp) and path.endswith(".distcp") for path in synced)  # DCP's
    rank_file = synced.index(f"{tmp}/rank_00000.pt")  # ours
    assert tmp in synced[rank_file:]  # the folder's entries, after its last file
    assert ("fsync", str(folder)) in events[complete:]  # and the rename itself
    loaded = types.SimpleNamespace(load_state_dict=lambda state: None)
    saver.load(final, model=model, optimizer=optimizer, scheduler=scheduler, loader=loaded)
