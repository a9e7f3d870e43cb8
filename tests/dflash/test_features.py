"""Offline target features: `dllm dflash prepare-features` writes what the online path computes,
so training from them gives the online loss trace exactly; a mismatched artifact is refused."""

from __future__ import annotations

import json
import shutil

import pytest
import yaml

from tests.dflash.helpers import drafter_document, drafter_spec
from tests.dflash.test_dflash2_training import DFLASH2
from tests.helpers import assert_user_error, wait_for_file
from tests.train.util import metrics
from turbo_dllm.families.dflash.features import read_features_manifest
from turbo_dllm.train.entry import train

ARGS = ("training.steps=4", "checkpoint.interval=null")


@pytest.fixture(scope="module")
def data(small_artifact):
    """The data every feature artifact here is made of: the world's target run over its rows
    one by one is these tests' time, and nothing they check depends on how many rows there are
    (more than three shards of 8)."""
    return small_artifact


def _config(world, data, path, *overrides):
    path.write_text(yaml.safe_dump(drafter_document(world["target"], data, *ARGS, *overrides)))
    return path


@pytest.fixture(scope="module")
def whole(world, data, tmp_path_factory):
    """The paper_ce features of `data` made in one uninterrupted run, 8 rows a shard: what a
    resumed run must make (read only: a test that changes an artifact makes its own)."""
    from turbo_dllm.config.load import load_runspec
    from turbo_dllm.families.dflash.features import prepare_features

    root = tmp_path_factory.mktemp("whole-features")
    spec = load_runspec(_config(world, data, root / "train.yaml", "objective.dflash_loss=paper_ce"))
    return prepare_features(spec, root / "whole", rows_per_shard=8, progress=False)


def _interrupt_before_the_manifest(spec, out, monkeypatch) -> None:
    """Run `prepare_features` into `out` and stop it (KeyboardInterrupt) as it would write
    features.json: every shard and progress.json stay in `.<out>.partial`."""
    from turbo_dllm.families.dflash import features

    real = features.FeaturesManifest

    def interrupted(**fields):
        raise KeyboardInterrupt

    monkeypatch.setattr(features, "FeaturesManifest", interrupted)
    with pytest.raises(KeyboardInterrupt):
        features.prepare_features(spec, out, rows_per_shard=8, progress=False)
    monkeypatch.setattr(features, "FeaturesManifest", real)


@pytest.mark.parametrize(
    "loss",
    [
        (),
        ("objective.dflash_loss=greedy_ce", "objective.greedy_path=true"),
        (*DFLASH2, "objective.greedy_path=true"),
    ],
    ids=["kl", "greedy-ce-on-path", "dflash2-dpace-on-path"],
)
def test_offline_features_train_the_online_trace_exactly(cli, world, data, tmp_path, loss):
    config = _config(world, data, tmp_path / "train.yaml", *loss)
    features = tmp_path / "features"
    result = cli(
        "dflash",
        "prepare-features",
        "--config",
        config,
        "--out",
        features,
        "--rows-per-shard",
        "8",
        "--json",
    )
    assert result.code == 0, result.err
    manifest = read_features_manifest(features)
    assert manifest.teacher and len(manifest.shards) > 1
    assert json.loads(result.out)["fingerprint"] == manifest.fingerprint
    online, offline = tmp_path / "online", tmp_path / "offline"
    train(drafter_spec(world["target"], data, *ARGS, *loss), online)
    train(
        drafter_spec(world["target"], data, *ARGS, *loss, f"model.dflash.features={features}"),
        offline,
    )
    for key in ("loss", "grad_norm"):
        assert [r[key] for r in metrics(offline)] == [r[key] for r in metrics(online)]


def test_prepare_features_resumes_after_an_interruption(world, data, whole, tmp_path, monkeypatch):
    import safetensors.torch

    from turbo_dllm.config.load import load_runspec
    from turbo_dllm.families.dflash.features import prepare_features

    config = _config(world, data, tmp_path / "train.yaml", "objective.dflash_loss=paper_ce")
    spec = load_runspec(config)
    real_save, written = safetensors.torch.save_file, []

    def save(tensors, path, *args, **kwargs):
        if len(written) == 2:
            raise KeyboardInterrupt  # killed while writing the third shard
        written.append(path)
        return real_save(tensors, path, *args, **kwargs)

    monkeypatch.setattr(safetensors.torch, "save_file", save)
    try:
        prepare_features(spec, tmp_path / "again", rows_per_shard=8, progress=False)
    except KeyboardInterrupt:
        pass
    assert not (tmp_path / "again").exists() and (tmp_path / ".again.partial").is_dir()
    monkeypatch.setattr(safetensors.torch, "save_file", real_save)
    again = prepare_features(spec, tmp_path / "again", rows_per_shard=8, progress=False)
    assert not (tmp_path / ".again.partial").exists()
    shards = len(read_features_manifest(whole).shards)
    assert shards > 3
    assert read_features_manifest(again).fingerprint == read_features_manifest(whole).fingerprint


@pytest.mark.parametrize("batch_rows", [1, 3])
def test_rows_give_the_same_features_in_any_batch(world, data, whole, tmp_path, batch_rows):
    # `whole` ran the micro-batch (4 rows a forward); one row, or 3 (no divisor of the shard's
    # 8 rows: a short last batch in every shard), must write the same shards on CPU
    from turbo_dllm.config.load import load_runspec
    from turbo_dllm.families.dflash.features import prepare_features

    spec = load_runspec(
        _config(world, data, tmp_path / "train.yaml", "objective.dflash_loss=paper_ce")
    )
    assert spec.training.micro_batch_size == 4
    out = prepare_features(
        spec, tmp_path / "rows", rows_per_shard=8, batch_rows=batch_rows, progress=False
    )
    assert read_features_manifest(out).fingerprint == read_features_manifest(whole).fingerprint
    # written on the writer thread, each shard still gets the mode open() gives (0666 - umask)
    from turbo_dllm.fsutil import file_mode

    modes = {p.stat().st_mode & 0o777 for p in out.glob("shard_*.safetensors")}
    assert modes == {file_mode()}


def test_out_of_memory_names_batch_rows_and_keeps_the_shards_written(
    world, data, whole, tmp_path, monkeypatch
):
    """A forward of --batch-rows rows that does not fit the device was torch's own error; it
    names the option now, and a rerun with a smaller batch keeps the finished shards."""
    import torch

    from turbo_dllm.config.load import load_runspec
    from turbo_dllm.errors import DllmError
    from turbo_dllm.families.dflash import features, target

    spec = load_runspec(
        _config(world, data, tmp_path / "train.yaml", "objective.dflash_loss=paper_ce")
    )
    real, calls = target.TargetFeatures.__call__, []

    def call(self, input_ids, doc_ids):
        calls.append(len(input_ids))
        if len(input_ids) > 2 and len(calls) > 2:  # the second shard, at 4 rows a forward
            raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB")
        return real(self, input_ids, doc_ids)

    monkeypatch.setattr(target.TargetFeatures, "__call__", call)
    with pytest.raises(DllmError) as caught:
        features.prepare_features(spec, tmp_path / "again", rows_per_shard=8, progress=False)
    assert "ran out of device memory on 4 rows of 64 tokens" in caught.value.message
    assert "--batch-rows 2" in caught.value.hint
    staging = tmp_path / ".again.partial"
    kept = sorted(p.name for p in staging.glob("shard_*.safetensors"))
    assert kept == ["shard_00000.safetensors"], kept
    # recorded as finished (written on the thread while the failing shard was computed)
    assert list(json.loads((staging / "progress.json").read_text())["shards"]) == kept
    calls.clear()
    out = features.prepare_features(
        spec, tmp_path / "again", rows_per_shard=8, batch_rows=2, progress=False
    )
    assert read_features_manifest(out).fingerprint == read_features_manifest(whole).fingerprint
    assert sum(calls) == read_features_manifest(whole).num_rows - 8  # not the kept shard's


def test_prepare_features_resumes_when_every_shard_was_written(
    world, data, whole, tmp_path, monkeypatch
):
    """Interrupted after the last shard (its record written, the manifest not yet): the rerun
    keeps every shard and writes the manifest (it was an UnboundLocalError, at every rerun)."""
    from turbo_dllm.config.load import load_runspec
    from turbo_dllm.families.dflash import features

    config = _config(world, data, tmp_path / "train.yaml", "objective.dflash_loss=paper_ce")
    spec = load_runspec(config)
    shards = len(read_features_manifest(whole).shards)
    _interrupt_before_the_manifest(spec, tmp_path / "again", monkeypatch)
    progress = json.loads((tmp_path / ".again.partial/progress.json").read_text())
    assert len(progress["shards"]) == shards > 1
    again = features.prepare_features(spec, tmp_path / "again", rows_per_shard=8, progress=False)
    assert read_features_manifest(again) == read_features_manifest(whole)
    assert read_features_manifest(again).dtype == "float32"


def test_features_of_another_target_are_refused_before_any_work(cli, world, data, whole, tmp_path):
    features = whole  # the world's target's (read only: the refusal must come before any work)
    other = tmp_path / "other-target"  # the same shape, other weights
    other.mkdir()
    for file in world["target"].iterdir():
        (other / file.name).write_bytes(file.read_bytes())
    from safetensors.torch import load_file, save_file

    tensors = load_file(str(other / "model.safetensors"))
    tensors["model.norm.weight"] = tensors["model.norm.weight"] + 1
    save_file(tensors, str(other / "model.safetensors"))
    document = drafter_document(
        other,
        data,
        *ARGS,
        "objective.dflash_loss=paper_ce",
        f"model.dflash.features={features}",
    )
    (tmp_path / "bad.yaml").write_text(yaml.safe_dump(document))
    result = cli("train", "--config", tmp_path / "bad.yaml", "--run-dir", tmp_path / "run")
    assert_user_error(result, "model.dflash.features", "made from another target")
    assert not (tmp_path / "run").exists()


@pytest.mark.parametrize(
    ("option", "needle"),
    [
        (("--rows-per-shard", "0"), "--rows-per-shard must be at least 1"),
        (("--rows-per-shard", "-1"), "--rows-per-shard must be at least 1"),
        (("--batch-rows", "0"), "--batch-rows must be at least 1"),
        (("--device", "foo"), "not a torch device"),
    ],
)
def test_bad_prepare_features_options_leave_nothing_behind(
    cli, world, data, tmp_path, option, needle
):
    # these were tracebacks, after the staging folder `.features.partial` was made
    config = _config(world, data, tmp_path / "train.yaml")
    features = tmp_path / "features"
    result = cli("dflash", "prepare-features", "--config", config, "--out", features, *option)
    assert_user_error(result, needle)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["train.yaml"]


def test_a_seq_len_the_artifact_does_not_hold_is_refused_with_the_fix(cli, world, data, tmp_path):
    from turbo_dllm.data.artifact import DataArtifact

    held = DataArtifact(data).manifest.seq_len
    config = _config(world, data, tmp_path / "train.yaml", f"data.seq_len={held * 2}")
    result = cli("dflash", "prepare-features", "--config", config, "--out", tmp_path / "f")
    assert_user_error(
        result, f"the artifact holds {held}", f"set data.seq_len: {held}", "prepare the data again"
    )
    assert sorted(p.name for p in tmp_path.iterdir()) == ["train.yaml"]


def test_an_empty_out_folder_is_replaced_and_a_taken_one_refused(cli, world, data, tmp_path):
    """As `dllm export` and `dllm dflash export` take --out: an existing empty folder is
    replaced by the artifact (it read 'already exists'); a folder with files in it is refused,
    and a file is named as one."""
    config = _config(world, data, tmp_path / "train.yaml", "objective.dflash_loss=paper_ce")
    features = tmp_path / "features"
    features.mkdir()
    result = cli("dflash", "prepare-features", "--config", config, "--out", features)
    assert result.code == 0, result.err
    assert read_features_manifest(features).num_rows > 0
    assert not (tmp_path / ".features.partial").exists()
    result = cli("dflash", "prepare-features", "--config", config, "--out", features)
    assert_user_error(result, f"{str(features)!r} already exists and is not empty")
    (tmp_path / "a-file").write_text("")
    result = cli("dflash", "prepare-features", "--config", config, "--out", tmp_path / "a-file")
    assert_user_error(result, "is a file, not a folder")


def test_the_current_folder_as_out_is_refused(cli, world, data, tmp_path, monkeypatch):
    config = _config(world, data, tmp_path / "train.yaml", "objective.dflash_loss=paper_ce")
    (tmp_path / "here").mkdir()
    monkeypatch.chdir(tmp_path / "here")
    result = cli("dflash", "prepare-features", "--config", config, "--out", ".")
    assert_user_error(result, "is the current folder", "--out features")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["here", "train.yaml"]


def test_an_out_under_a_file_is_named_before_hashing(cli, world, data, tmp_path, monkeypatch):
    """`--out somefile/feats`: the error named the hidden staging folder `.feats.partial`, and
    only after the target was hashed (seconds per GB)."""
    from turbo_dllm.families.dflash import features

    def hashed(*args, **kwargs):
        raise AssertionError("the target was hashed")

    monkeypatch.setattr(features, "target_fingerprint", hashed)
    config = _config(world, data, tmp_path / "train.yaml", "objective.dflash_loss=paper_ce")
    (tmp_path / "somefile").write_text("")
    for out in (tmp_path / "somefile/feats", tmp_path / "somefile/deeper/feats"):
        result = cli("dflash", "prepare-features", "--config", config, "--out", out)
        assert_user_error(result, f"{str(tmp_path / 'somefile')!r} is a file, not a folder")
        assert str(out) in result.err and ".partial" not in result.err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["somefile", "train.yaml"]


def test_data_of_another_tokenizer_is_refused_before_the_target_is_read(
    cli, world, data, tmp_path
):
    """prepare-features computed features of data tokenized for another model (other text to
    the target) and only training refused them, by the family's input rule; it is refused
    first, before the target is hashed or loaded, leaving nothing behind."""
    from tests.dflash.test_target_tokenizer import _with_tokenizer

    target = _with_tokenizer(world["target"], tmp_path / "target")
    document = drafter_document(target, data, *ARGS)  # byte-level data
    config = tmp_path / "train.yaml"
    config.write_text(yaml.safe_dump(document))
    result = cli("dflash", "prepare-features", "--config", config, "--out", tmp_path / "f")
    assert_user_error(result, "data.artifact: ", "another tokenizer", str(target))
    assert sorted(p.name for p in tmp_path.iterdir()) == ["target", "train.yaml"]


def test_a_resume_remakes_a_shard_that_changed_and_a_damaged_progress_record(
    world, data, whole, tmp_path, monkeypatch
):
    """A resume kept every shard its progress.json listed, unread: a shard changed since (a
    disk error, a torn copy) went into the manifest under the sha256 it no longer had. It is
    made again; a progress.json that is not JSON starts over (it was a traceback)."""
    from turbo_dllm.config.load import load_runspec
    from turbo_dllm.families.dflash import features
    from turbo_dllm.fsutil import sha256_file

    config = _config(world, data, tmp_path / "train.yaml", "objective.dflash_loss=paper_ce")
    spec = load_runspec(config)
    _interrupt_before_the_manifest(spec, tmp_path / "again", monkeypatch)
    # the same interrupted run's staging folder, for the damaged progress record below
    shutil.copytree(tmp_path / ".again.partial", tmp_path / ".third.partial")
    shard = tmp_path / ".again.partial" / "shard_00001.safetensors"
    raw = shard.read_bytes()
    shard.write_bytes(raw[:-1] + bytes([raw[-1] ^ 1]))
    again = features.prepare_features(spec, tmp_path / "again", rows_per_shard=8, progress=False)
    manifest = read_features_manifest(again)
    assert manifest == read_features_manifest(whole)
    for entry in manifest.shards:
        assert sha256_file(again / entry.file) == entry.sha256, entry.file
    # a damaged progress record: the staging folder starts over
    (tmp_path / ".third.partial" / "progress.json").write_text("{not json")
    third = features.prepare_features(spec, tmp_path / "third", rows_per_shard=8, progress=False)
    assert read_features_manifest(third) == read_features_manifest(whole)


def test_a_missing_shard_is_refused_before_any_work(cli, world, data, whole, tmp_path):
    """A feature artifact with a shard file gone trained until a batch first read its rows
    (a FileNotFoundError traceback, maybe hours in): `dllm train` refuses it up front."""
    features = tmp_path / "features"
    shutil.copytree(whole, features)
    (features / "shard_00001.safetensors").unlink()
    config = _config(
        world,
        data,
        tmp_path / "train.yaml",
        "objective.dflash_loss=paper_ce",
        f"model.dflash.features={features}",
    )
    result = cli("train", "--config", config, "--run-dir", tmp_path / "run")
    assert_user_error(
        result, "model.dflash.features", "shards is missing (shard_00001.safetensors)"
    )
    assert not (tmp_path / "run").exists()


def test_a_changed_shard_is_an_error_not_other_features(whole, tmp_path):
    """A shard whose bytes changed after it was written (a disk error, a torn copy) was read as
    it was: wrong features (3e38 where a byte flipped), trained on silently. Its first read
    checks the sha256 features.json records and names the file; a truncated one likewise (a
    safetensors traceback before)."""
    import torch

    from turbo_dllm.errors import DllmError
    from turbo_dllm.families.dflash.features import FeatureStore

    features = tmp_path / "features"
    shutil.copytree(whole, features)
    manifest = read_features_manifest(features)
    shard = manifest.shards[1]
    rows = torch.arange(shard.first_row, shard.first_row + shard.rows)
    intact, _ = FeatureStore(whole).lookup(rows, "cpu")
    file = features / shard.file
    raw = bytearray(file.read_bytes())
    raw[len(raw) // 2] ^= 0x40  # inside the features tensor's bytes
    file.write_bytes(bytes(raw))
    with pytest.raises(DllmError, match=f"{shard.file} cannot be read .*sha256"):
        FeatureStore(features).lookup(rows, "cpu")
    file.write_bytes(bytes(raw[:1000]))
    with pytest.raises(DllmError, match=f"{shard.file} cannot be read"):
        FeatureStore(features).lookup(rows, "cpu")
    # an intact artifact reads as before, its shards checked once each
    store = FeatureStore(whole)
    assert torch.equal(store.lookup(rows, "cpu")[0], intact)
    assert torch.equal(store.lookup(rows, "cpu")[0], intact)
    assert store._checked == {shard.file}


def test_a_second_run_into_the_same_out_is_refused_while_the_first_writes(
    cli, world, data, whole, tmp_path, monkeypatch
):
    """Two prepare-features into one --out (the command started twice) shared
    `.<out>.partial`: each wrote the other's shard temp files and progress record, and the later
    failed on a temp name the earlier one's rename had taken away ('No such file or directory'),
    or, with another --rows-per-shard, emptied the folder under the first. The staging folder is
    held (flock) by the run writing it: a second is refused naming --out, the first's shards
    untouched; once it is free, a rerun goes on from them."""
    import fcntl
    import os

    from turbo_dllm.config.load import load_runspec

    config = _config(world, data, tmp_path / "train.yaml", "objective.dflash_loss=paper_ce")
    _interrupt_before_the_manifest(load_runspec(config), tmp_path / "features", monkeypatch)
    staging = tmp_path / ".features.partial"
    before = {p.name: p.read_bytes() for p in staging.iterdir()}
    fd = os.open(staging, os.O_RDONLY | os.O_DIRECTORY)  # the first run, still writing
    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    try:
        for extra in ((), ("--rows-per-shard", "5")):
            result = cli(
                "dflash",
                "prepare-features",
                "--config",
                config,
                "--out",
                tmp_path / "features",
                "--rows-per-shard",
                "8",
                *extra,
            )
            assert_user_error(result, "another prepare-features is writing", "features")
            assert {p.name: p.read_bytes() for p in staging.iterdir()} == before
            assert not (tmp_path / "features").exists()
    finally:
        os.close(fd)
    result = cli(
        "dflash",
        "prepare-features",
        "--config",
        config,
        "--out",
        tmp_path / "features",
        "--rows-per-shard",
        "8",
    )
    assert result.code == 0, result.err
    assert read_features_manifest(tmp_path / "features") == read_features_manifest(whole)
    assert not staging.exists()


HELD_AT_THE_SECOND_SHARD = """
import sys, time
from pathlib import Path
from turbo_dllm.config.load import load_runspec
from turbo_dllm.families.dflash import features

real, calls = features._shard_tensors, []

def held(*args, **kwargs):
    calls.append(1)
    if len(calls) == 2:  # the first shard is on the writer thread, not yet recorded
        Path(sys.argv[3]).write_text("")
        time.sleep(60)
    return real(*args, **kwargs)

features._shard_tensors = held
features.prepare_features(load_runspec(sys.argv[1]), sys.argv[2], rows_per_shard=8, progress=False)
"""


def test_sigterm_records_the_shard_written_meanwhile(world, data, whole, tmp_path):
    """SIGTERM (`timeout`, a scheduler's time limit) ended prepare-features on the spot: the
    shard the writer thread had finished was not recorded, so the rerun made it again (Ctrl-C
    recorded it). It now unwinds as Ctrl-C does, then ends by SIGTERM; the rerun keeps the
    shard and gives the uninterrupted run's features."""
    import os
    import signal
    import subprocess
    import sys

    from turbo_dllm.config.load import load_runspec
    from turbo_dllm.families.dflash.features import prepare_features

    config = _config(world, data, tmp_path / "train.yaml", "objective.dflash_loss=paper_ce")
    out, computing = tmp_path / "features", tmp_path / "computing"
    child = subprocess.Popen(
        [sys.executable, "-c", HELD_AT_THE_SECOND_SHARD, str(config), str(out), str(computing)],
        env={**os.environ, "OMP_NUM_THREADS": "1"},
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        wait_for_file(child, computing, "prepare-features never reached its second shard")
        child.send_signal(signal.SIGTERM)
        assert child.wait(timeout=60) == -signal.SIGTERM
    finally:
        if child.poll() is None:
            child.kill()
            child.wait()
    progress = json.loads((tmp_path / ".features.partial" / "progress.json").read_text())
    assert list(progress["shards"]) == ["shard_00000.safetensors"]
    again = prepare_features(load_runspec(config), out, rows_per_shard=8, progress=False)
    assert read_features_manifest(again) == read_features_manifest(whole)
