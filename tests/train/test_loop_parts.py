"""The loop's smaller parts: schedules, synthetic data, data checks, checkpoint atomicity,
time limit, profiler, W&B, and the benchmark's CPU smoke mode."""

from __future__ import annotations

import gzip
import json
import math
import os
import shutil
import sys
import types
from pathlib import Path

import pytest
import torch

from tests.helpers import benchmark_module
from tests.train.util import losses, metrics, tiny_spec
from turbo_dllm.errors import DllmError
from turbo_dllm.train.checkpoint import find_latest, read_meta, resolve_checkpoint
from turbo_dllm.train.data import build_data
from turbo_dllm.train.entry import train
from turbo_dllm.train.schedules import lr_multiplier
from turbo_dllm.train.synthetic import SyntheticLoader


def test_schedules():
    kw = dict(warmup_steps=4, total_steps=14, min_lr_ratio=0.1)
    assert [lr_multiplier(s, name="constant", **kw) for s in range(6)] == [0.25, 0.5, 0.75, 1, 1, 1]
    linear = [lr_multiplier(s, name="linear", **kw) for s in range(4, 14)]
    assert linear[0] == 1.0 and math.isclose(linear[-1], 0.1)
    assert all(a > b for a, b in zip(linear, linear[1:], strict=False))
    cosine = [lr_multiplier(s, name="cosine", **kw) for s in range(4, 14)]
    assert cosine[0] == 1.0 and math.isclose(cosine[-1], 0.1)
    assert math.isclose(lr_multiplier(4 + 4.5, name="cosine", **kw), 0.55)  # halfway
    # wsd: the peak until the last 30 % of the 9 decay intervals, then linear to 0.1
    wsd = [lr_multiplier(s, name="wsd", decay_fraction=0.3, **kw) for s in range(4, 14)]
    assert wsd[:7] == [1.0] * 7 and math.isclose(wsd[-1], 0.1)
    assert math.isclose(wsd[8], 0.1 + 0.9 * (1 / 9) / 0.3)
    assert all(a > b for a, b in zip(wsd[6:], wsd[7:], strict=False))


def test_synthetic_loader_slices_the_global_stream_by_rank():
    common = dict(num_sequences=10, vocab_size=50, seq_len=16, seed=3)
    whole = SyntheticLoader(micro_batch_size=4, **common)
    ranks = [SyntheticLoader(micro_batch_size=2, dp_rank=r, dp_size=2, **common) for r in (0, 1)]
    for _ in range(5):  # crosses an epoch boundary (10 sequences, 4 per call)
        expected = next(whole)["input_ids"]
        got = torch.cat([next(loader)["input_ids"] for loader in ranks])
        assert torch.equal(got, expected)
    assert whole.state_dict() == ranks[0].state_dict() == {"epoch": 2, "cursor": 4}
    batch = next(whole)
    assert batch["input_ids"].max() < 49  # the last id is left for the mask token
    assert batch["loss_mask"].all() and (batch["doc_ids"] == 0).all()
    resumed = SyntheticLoader(micro_batch_size=4, **common)
    resumed.load_state_dict(ranks[0].state_dict())
    assert torch.equal(next(resumed)["input_ids"], batch["input_ids"])


def test_synthetic_tokens_avoid_the_run_s_mask_token():
    """With objective.mask_token_id inside the synthetic vocabulary (a migrated checkpoint's
    480 of 512), real tokens equal to the mask token were drawn: masked and real positions
    looked alike and their targets were the softmax's excluded entry. The stream now avoids
    the run's mask token; the default (the last id) draws exactly what it drew before."""
    common = dict(num_sequences=64, vocab_size=16, seq_len=64, micro_batch_size=64, seed=1)
    before = SyntheticLoader(**common)
    # the previous pool: Zipf over the ids below the last, drawn with the same generator
    gen = torch.Generator().manual_seed(1 * 1_000_003 + 17)
    zipf = 1.0 / torch.arange(1, 16, dtype=torch.float64)
    pool = torch.multinomial(zipf, 64 * 8, replacement=True, generator=gen).view(64, 8)
    assert torch.equal(before._motifs, pool)
    assert (next(before)["input_ids"] == 5).any()  # a frequent id of this vocabulary
    avoiding = next(SyntheticLoader(avoid=5, **common))["input_ids"]
    assert not (avoiding == 5).any() and (avoiding == 15).any()
    one = tiny_spec("objective.mask_token_id=5")
    source = build_data(one, model_vocab_size=512, dp_rank=0, dp_size=1)
    assert source.mask_token_id == 5 and not (next(source.loader)["input_ids"] == 5).any()
    default = build_data(tiny_spec(), model_vocab_size=512, dp_rank=0, dp_size=1)
    assert source.fingerprint != default.fingerprint  # another stream, another identity
    last = build_data(tiny_spec("objective.mask_token_id=511"), model_vocab_size=512,
                      dp_rank=0, dp_size=1)  # fmt: skip
    assert last.fingerprint == default.fingerprint


def test_synthetic_batch_larger_than_dataset_is_a_user_error():
    with pytest.raises(DllmError, match="num_sequences"):
        SyntheticLoader(num_sequences=3, vocab_size=50, seq_len=8, micro_batch_size=2, dp_size=2)


def test_mask_token_and_vocab_checks():
    source = build_data(tiny_spec(), model_vocab_size=512, dp_rank=0, dp_size=1)
    assert source.mask_token_id == 511
    # Synthetic data has a fingerprint too (a resume compares it): its sequences' identity.
    same = build_data(tiny_spec("data.seq_len=32"), model_vocab_size=512, dp_rank=0, dp_size=1)
    other = build_data(tiny_spec("launch.seed=1"), model_vocab_size=512, dp_rank=0, dp_size=1)
    assert len(source.fingerprint) == 64 and same.fingerprint == source.fingerprint
    assert other.fingerprint != source.fingerprint
    chosen = build_data(
        tiny_spec("objective.mask_token_id=7"), model_vocab_size=512, dp_rank=0, dp_size=1
    )
    assert chosen.mask_token_id == 7
    with pytest.raises(DllmError, match="vocabulary"):
        build_data(tiny_spec(), model_vocab_size=256, dp_rank=0, dp_size=1)


def test_unfinished_checkpoint_is_invisible_and_cleaned(tmp_path):
    train(tiny_spec("training.steps=2", "checkpoint.interval=1"), tmp_path)
    ckpts = tmp_path / "checkpoints"
    partial = ckpts / ".tmp-step_00000003"
    partial.mkdir()
    (partial / "__0_0.distcp").write_bytes(b"half")
    not_done = ckpts / "step_00000004"  # a step folder without checkpoint.json is not complete
    not_done.mkdir()
    assert find_latest(ckpts).name == "step_00000002"
    train(tiny_spec("training.steps=3", "checkpoint.interval=1"), tmp_path)
    assert not partial.exists()
    assert find_latest(ckpts).name == "step_00000003"


class Killed(BaseException):
    """The process dying at one point of a save: a BaseException, so no `except Exception` of
    the save (which turns a failed write into an error every rank reports) runs, as none would
    in a process that died there."""


def _kill_at(monkeypatch, module, name: str, folder: str) -> None:
    """`module.name` (os.replace, shutil.rmtree) dies when its first argument is `folder`."""
    real = getattr(module, name)

    def call(path, *args, **kwargs):
        if Path(path).name == folder:
            raise Killed(f"{name} {folder}")
        return real(path, *args, **kwargs)

    monkeypatch.setattr(module, name, call)


@pytest.mark.parametrize(
    ("kill", "found"),
    [  # where the save dies, and the complete step 4 it leaves
        ((os, "replace", ".tmp-step_00000004"), ".old-step_00000004"),  # the new one moving in
        ((shutil, "rmtree", ".old-step_00000004"), "step_00000004"),  # the old one's deletion
    ],
    ids=["moving_the_new_one_in", "deleting_the_old_one"],
)
def test_a_save_over_an_existing_step_killed_midway_keeps_a_complete_step(
    tmp_path, monkeypatch, capsys, kill, found
):
    """Saving step_4 again (a resume from step 2) used to delete step_4 and then rename the new
    one in: killed between the two, the run had no step 4 left. The old one is now moved aside
    first and deleted last; wherever the save dies, a complete step 4 is found, and the next
    run settles it back in place before it resumes from it."""
    args = ("checkpoint.interval=2", "checkpoint.keep_last=3")
    undisturbed = tmp_path / "undisturbed"  # 4 steps, then resumed to 6 (the lr schedule too)
    for steps in (4, 6):
        train(tiny_spec(f"training.steps={steps}", *args), undisturbed)
    run, ckpts = tmp_path / "run", tmp_path / "run/checkpoints"
    train(tiny_spec("training.steps=4", *args), run)
    old = json.loads((ckpts / "step_00000004/checkpoint.json").read_text())
    _kill_at(monkeypatch, *kill)
    with pytest.raises(Killed):
        train(tiny_spec("training.steps=4", *args, f"checkpoint.resume={ckpts}/step_00000002"), run)
    monkeypatch.undo()
    latest = find_latest(ckpts)
    assert latest.name == found and read_meta(latest).step == 4
    assert resolve_checkpoint(ckpts / "step_00000004") == latest  # as `resume:` and export name it
    if latest.name.startswith(".old-"):  # the only complete copy is the old one, unchanged
        assert json.loads((latest / "checkpoint.json").read_text()) == old
    capsys.readouterr()
    train(tiny_spec("training.steps=6", *args), run)  # resume: auto
    # the run, holding the folder, first puts a step moved aside back in place (13ff522)
    assert f"resumed from {ckpts / 'step_00000004'} (step 4)" in capsys.readouterr().err
    assert sorted(p.name for p in ckpts.iterdir()) == [f"step_0000000{n}" for n in (2, 4, 6)]
    assert read_meta(ckpts / "step_00000004").step == 4
    assert [r["step"] for r in metrics(run)] == [1, 2, 3, 4, 5, 6]
    assert losses(run) == losses(undisturbed)  # bitwise: the step-4 state was the right one


def test_a_prune_killed_midway_leaves_no_step_with_files_missing(tmp_path, monkeypatch):
    """Pruning used to delete `step_N` in place: killed midway, it left a step_N whose
    checkpoint.json still claimed a step whose shards were partly gone. It is now renamed out of
    sight first, and the next save sweeps what is left."""
    args = ("checkpoint.interval=1", "checkpoint.keep_last=1", "scheduler.warmup_steps=0")
    ckpts = tmp_path / "checkpoints"
    real = shutil.rmtree

    def half_deletes_then_dies(path, *a, **k):
        path = Path(path)
        if path.name.startswith(".tmp-step_pruned-") and path.exists():
            next(path.glob("*.distcp")).unlink()
            raise Killed(f"rmtree {path.name}")
        return real(path, *a, **k)

    train(tiny_spec("training.steps=1", *args), tmp_path)
    monkeypatch.setattr(shutil, "rmtree", half_deletes_then_dies)
    with pytest.raises(Killed):
        train(tiny_spec("training.steps=2", *args), tmp_path)
    monkeypatch.undo()
    assert [p.name for p in ckpts.glob("step_*")] == ["step_00000002"]
    assert find_latest(ckpts).name == "step_00000002"
    with pytest.raises(DllmError, match="not a checkpoint"):
        read_meta(resolve_checkpoint(ckpts / "step_00000001"))
    train(tiny_spec("training.steps=3", *args), tmp_path)
    assert sorted(p.name for p in ckpts.iterdir()) == ["step_00000003"]


def test_max_duration_stops_after_a_checkpoint(tmp_path):
    train(tiny_spec("training.steps=50", "training.max_duration_s=0.001"), tmp_path)
    assert [r["step"] for r in metrics(tmp_path)] == [1]
    assert find_latest(tmp_path / "checkpoints").name == "step_00000001"


def test_max_duration_is_each_attempts_budget_not_the_whole_runs(tmp_path):
    """A job stopped by training.max_duration_s (set below its scheduler's limit) resumed in a
    new job of the same limit: the budget was compared with the training time of every attempt
    together, so the resumed job trained one step and stopped again (a launched run, whose
    spec a resume may not change, never finished). Each attempt now gets the whole budget;
    metrics' time_s still counts across resumes."""
    import json

    args = ("training.steps=3", "checkpoint.interval=1")
    train(tiny_spec(*args, "training.max_duration_s=0.001"), tmp_path)
    assert [r["step"] for r in metrics(tmp_path)] == [1]
    meta_file = tmp_path / "checkpoints/step_00000001/checkpoint.json"
    meta = json.loads(meta_file.read_text())
    meta["train_time_s"] = 1000.0  # earlier jobs trained this long
    meta_file.write_text(json.dumps(meta))
    train(tiny_spec(*args, "training.max_duration_s=600"), tmp_path)
    records = metrics(tmp_path)
    assert [r["step"] for r in records] == [1, 2, 3]
    assert records[-1]["time_s"] > 1000.0


def test_profiler_window_writes_a_trace(tmp_path):
    train(
        tiny_spec(
            "training.steps=3",
            "profiler.enabled=true",
            "profiler.start_step=1",
            "profiler.num_steps=1",
        ),
        tmp_path,
    )
    traces = list((tmp_path / "profile").glob("*.json"))
    assert [t.name for t in traces] == ["trace_rank0_steps1-1.json"]
    assert "traceEvents" in json.loads(traces[0].read_text())
    # and a readable table of where the step's time went, by op
    table = (tmp_path / "profile" / "ops_rank0_steps1-1.txt").read_text()
    assert "Self CPU time total" in table and "aten::mm" in table


def test_wandb_receives_the_step_records(tmp_path, monkeypatch):
    logged, finished = [], []

    class Run:
        def log(self, record, step):
            logged.append((step, record))

        def finish(self):
            finished.append(True)

    fake = types.ModuleType("wandb")
    fake.init = lambda **kwargs: Run()
    monkeypatch.setitem(sys.modules, "wandb", fake)
    train(tiny_spec("training.steps=2", "logging.wandb.project=p"), tmp_path)
    assert [step for step, _ in logged] == [1, 2] and "loss" in logged[0][1]
    assert "mfu" not in logged[0][1]  # None values are not sent
    assert finished == [True]


def test_benchmark_smoke_on_cpu(tmp_path):
    train_step = benchmark_module("train_step")
    out, profile = tmp_path / "bench.json", tmp_path / "profile.txt"
    argv = ["--tiny", "--steps", "1", "--warmup", "1", "--out", str(out), "--profile", str(profile)]
    assert train_step.main(argv + ["--inductor", "max_autotune=False"]) == 0
    report = json.loads(out.read_text())
    names = [r["name"] for r in report["results"]]
    assert names == ["turbo-dllm", "hf-sdpa-dense-mask"]
    assert all(r["tokens_per_s"] > 0 for r in report["results"]) and report["speedup"] > 0
    assert report["inductor"] == ["max_autotune=False"]
    # The profile names the kernels the two extra steps ran (on CPU: the aten ops).
    assert profile.read_text().startswith("2 steps: wall") and "aten::mm" in profile.read_text()
    trace = json.loads(gzip.decompress(profile.with_suffix(".trace.json.gz").read_bytes()))
    assert any(e.get("name") == "aten::mm" for e in trace["traceEvents"])  # the timeline too


def test_benchmark_gpu_busy_counts_overlapping_kernels_once():
    """The profile's busy time is the union of the kernels' spans (idle = wall - busy), their
    sum the kernel time; CPU events count in neither."""
    from torch.autograd import DeviceType

    train_step = benchmark_module("train_step")

    def event(start, end, device=DeviceType.CUDA):
        span = types.SimpleNamespace(start=start, end=end)
        return types.SimpleNamespace(time_range=span, device_type=device)

    spans = [event(0, 10), event(5, 20), event(30, 40), event(0, 100, DeviceType.CPU)]
    prof = types.SimpleNamespace(events=lambda: spans)
    assert train_step.gpu_busy(prof) == (35e-6, 30e-6)


def test_benchmark_gpu_gaps_are_the_idle_stretches_between_kernels():
    """Longest first, each between the kernel that ended last and the next one; an overlapped
    kernel or a CPU event opens no gap."""
    from torch.autograd import DeviceType

    train_step = benchmark_module("train_step")

    def event(name, start, end, device=DeviceType.CUDA):
        span = types.SimpleNamespace(start=start, end=end)
        return types.SimpleNamespace(time_range=span, device_type=device, name=name)

    spans = [
        event("a", 0, 10),
        event("b", 5, 20),  # overlaps a: ends later, so the next gap starts after b
        event("c", 30, 40),
        event("d", 41, 50),
        event("e", 90, 95),
        event("cpu", 0, 200, DeviceType.CPU),
    ]
    prof = types.SimpleNamespace(events=lambda: spans)
    assert train_step.gpu_gaps(prof) == [(40e-6, "d", "e"), (10e-6, "b", "c"), (1e-6, "c", "d")]
    assert train_step.gpu_gaps(prof, top=1) == [(40e-6, "d", "e")]


def test_batches_move_to_a_device_named_by_string_or_object():
    from turbo_dllm.train.objectives.base import to_device

    t = torch.arange(6).view(2, 3)
    for device in ("cpu", torch.device("cpu")):
        moved = to_device(t, device)
        assert moved.device.type == "cpu" and torch.equal(moved, t)
