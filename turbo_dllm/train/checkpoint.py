"""Checkpoints: torch.distributed.checkpoint (DCP) for model and optimizer, JSON for the rest.

A checkpoint is a folder `step_<NNNNNNNN>/` (N = optimizer steps completed) holding the DCP
files of {"model", "optim"} (sharded tensors; DCP reshards them on load, so a checkpoint saved
at one data-parallel size loads at another), `checkpoint.json` (format
`turbo_dllm.checkpoint.v1`: step, model config, scheduler, loader state, seed, world layout)
and one `rank_<r>.pt` per rank (RNG states). It is written under `.tmp-step_<N>` and renamed
into place once every rank's files are synced to disk, so a folder named `step_*` is always
complete: a crash mid-save leaves only a temp folder, which the next save removes. A part of a
save that fails on one rank fails it on every rank, with that rank's error (`_agree`). A save over an existing
`step_<N>` renames that one to `.old-step_<N>` first and deletes it only once the new one is in
(`_replace`), so a complete step N exists at every instant: where a crash left the aside copy
as the only one, listing takes it for step N and the next save moves it back (`_settle_asides`).

`checkpoint.json` fields this version does not know are ignored on read (a newer turbo-dllm
adding optional information, as `settings` once was); a change an older reader must not ignore
comes with a new `format`, which is refused by name (`read_meta`).
"""

from __future__ import annotations

import contextlib
import errno
import json
import logging
import os
import re
import shutil
import sys
import warnings
from pathlib import Path
from typing import Any, Literal

import torch
from pydantic import BaseModel, ConfigDict, ValidationError

from turbo_dllm.errors import DllmError, describe_validation_error
from turbo_dllm.fsutil import flock_holder, fsync_dir, write_atomic
from turbo_dllm.train.metrics import METRICS_NAME

__all__ = [
    "CHECKPOINT_FORMAT",
    "CheckpointMeta",
    "Checkpointer",
    "find_latest",
    "load_tensors",
    "model_differences",
    "quiet_dcp_warnings",
    "read_meta",
    "resolve_checkpoint",
    "same_model",
    "steps_after",
]

CHECKPOINT_FORMAT = "turbo_dllm.checkpoint.v1"
_STEP_DIR = re.compile(r"^step_(\d{8})$")
# A complete `step_<N>` moved aside by a save replacing it (see `_replace`).
_ASIDE = ".old-"
_ASIDE_DIR = re.compile(r"^\.old-step_(\d{8})$")


class CheckpointMeta(BaseModel):
    model_config = ConfigDict(extra="forbid")

    format: Literal["turbo_dllm.checkpoint.v1"]
    step: int
    world_size: int
    dp_replicate: int
    dp_shard: int
    seed: int
    objective: str
    family: str | None = None  # model.family (None: written before the registry; see export)
    model: dict[str, Any]  # Hugging Face config.json of the trained model
    param_dtype: str
    scheduler: dict[str, Any]
    loader: dict[str, Any]
    data_fingerprint: str | None
    train_time_s: float
    # Where export finds the files a Hugging Face folder needs beside the weights
    # (generation_config.json, the tokenizer): the model.path folder and the data artifact.
    model_path: str | None = None
    data_artifact: str | None = None
    # The mask token id the objective denoised from (`objective.mask_token_id`, else the data
    # artifact's mask token, else synthetic data's default: its vocabulary's last id), for an
    # objective that masks with it (`export._MASKING_OBJECTIVES`); None for one that masks
    # nothing, or written before it was recorded (export then reads the spec's or the
    # artifact's, and synthetic data's default is unknown).
    mask_token_id: int | None = None
    # The RunSpec settings a resume may change, by their spec path ("data.seq_len": 256, ...):
    # a resume names each one that differs (None: written before they were recorded).
    settings: dict[str, Any] | None = None
    # A drafter's frozen target (model.dflash.target): {path, fingerprint, files: {name: stamp}}
    # (the family runtime's `target_record`); a resume against other weights is refused.
    # None: not a drafter, or written before it was recorded (such a resume is not checked).
    target: dict[str, Any] | None = None
    # The checkpoint outside the run's checkpoint folder that its steps descend from (a
    # `checkpoint.resume` path, carried on by each resume; None: the run started from its own
    # init, or written before it was recorded): a restart with the same path continues this
    # run's later steps, another run's are refused (`Trainer._restart_or_refuse`).
    resumed_from: str | None = None


def _own_tensors(model, state: dict) -> dict:
    """The model state without its `external_weights` (tensors another folder owns, e.g. a
    DFlash drafter's frozen target embeddings and head): checkpoints never copy them."""
    from turbo_dllm.train.weights import clean_fqn

    external = set(getattr(model, "external_weights", ()))
    return {k: v for k, v in state.items() if clean_fqn(k) not in external}


def read_meta(path: str | Path) -> CheckpointMeta:
    meta_path = Path(path) / "checkpoint.json"
    if not meta_path.is_file():
        path = Path(path)
        run_dir = (path / "checkpoints").is_dir() or (path / METRICS_NAME).is_file()
        if run_dir or (path.name == "checkpoints" and path.is_dir()):
            # A run dir or its checkpoints/ (what `dllm export` takes for its newest step):
            # "not a checkpoint (no checkpoint.json)" sent one to look for the wrong thing.
            raise DllmError(
                f"{str(path)!r} holds no complete checkpoint (no step_<N> with its "
                "checkpoint.json)",
                hint="its run stopped before its first save (checkpoint.interval), or every save "
                "was cut short: train it on (`dllm train --run-dir`), or pass a step_<N> folder",
            )
        hint = (
            "pass a checkpoints/step_<N> folder written by `dllm train`, its checkpoints/ "
            "folder or its run dir (their newest complete step)"
        )
        if (path / "config.json").is_file():  # an exported (or any) Hugging Face folder
            hint = (
                f"{path} is a Hugging Face model folder, not a training checkpoint: train from "
                "it with model.path (a new run), or " + hint
            )
        # a step that is not there: say which of its siblings are
        if steps := _complete_steps(path.parent):
            hint += f"; {path.parent} has {', '.join(child.name for child in steps[-3:])}"
        why = "no checkpoint.json" if path.exists() else "it does not exist"
        raise DllmError(f"not a checkpoint: {str(path)!r} ({why})", hint=hint)
    # A torn or edited file (no JSON, no format field, bad fields) is damaged, not another
    # version's: the fix is another step, not another turbo-dllm.
    damaged = (
        "its checkpoint.json is damaged; use another step_<N> folder (`resume:` or "
        "--checkpoint names one)"
    )
    try:
        document = json.loads(meta_path.read_text())
    except ValueError as error:  # not UTF-8, not JSON
        raise DllmError(
            f"{meta_path}: invalid checkpoint metadata: {error}", hint=damaged
        ) from None
    found = document.get("format") if isinstance(document, dict) else None
    if found is None:
        raise DllmError(f"{meta_path}: invalid checkpoint metadata: no format field", hint=damaged)
    if found != CHECKPOINT_FORMAT:
        raise DllmError(
            f"{meta_path}: the checkpoint's format is {found!r}, and this turbo-dllm reads "
            f"{CHECKPOINT_FORMAT!r}",
            hint="it was written by another turbo-dllm version (a newer one, if its format "
            "number is higher): resume or export it with a version that reads its format",
        )
    # Fields a newer version added are optional information this one does without (a change
    # that alters the meaning of the rest comes with a new format, refused above).
    known = {k: v for k, v in document.items() if k in CheckpointMeta.model_fields}
    try:
        return CheckpointMeta.model_validate(known)
    except ValidationError as error:
        problems = describe_validation_error(error, limit=8)
        raise DllmError(
            f"{meta_path}: invalid checkpoint metadata: {problems}", hint=damaged
        ) from None


# config.json fields that name tokens rather than shape the model; checkpoints written before
# the decoder config carried them lack them, and still resume.
_TOKEN_ID_FIELDS = ("bos_token_id", "eos_token_id", "pad_token_id")


def _shape(config: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in config.items() if k not in _TOKEN_ID_FIELDS}


def same_model(saved: dict[str, Any], current: dict[str, Any]) -> bool:
    """Whether a checkpoint's model config (`meta.model`) is the model a run would build."""
    return _shape(saved) == _shape(current)


def _fields(config: dict[str, Any]) -> dict[str, Any]:
    """A config as flat `field: value` pairs for `model_differences`: a `text_config`'s keys
    (diffusion_gemma, multimodal qwen3_5) are the text model's and read as top-level ones (so
    a decoder's `vocab_size` meets diffusion_gemma's `text_config.vocab_size`), any other
    nested object's as `parent.key` (`vision_config.hidden_size`, `rope_parameters.rope_theta`)."""
    flat: dict[str, Any] = {}

    def walk(prefix: str, value: Any) -> None:
        if isinstance(value, dict) and value:
            for key, inner in value.items():
                walk(f"{prefix}.{key}" if prefix else key, inner)
        else:
            flat[prefix] = value

    for key, value in config.items():
        if key == "text_config" and isinstance(value, dict):
            for inner, field in value.items():
                walk(f"text_config.{inner}" if inner in config else inner, field)
        else:
            walk(key, value)
    return flat


def model_differences(saved: dict[str, Any], current: dict[str, Any], limit: int = 6) -> str:
    """The config fields where a checkpoint's model and a run's differ, as `field saved ->
    current` (`-` where one lacks the field), for an error message; nested configs (a
    `text_config`, `rope_parameters`) are compared field by field (`_fields`)."""
    saved, current = _fields(_shape(saved)), _fields(_shape(current))
    keys = [k for k in {**saved, **current} if saved.get(k, "-") != current.get(k, "-")]
    shown = ", ".join(f"{k} {saved.get(k, '-')} -> {current.get(k, '-')}" for k in keys[:limit])
    return shown + (f" and {len(keys) - limit} more" if len(keys) > limit else "")


def _complete_steps(directory: Path) -> list[Path]:
    """The complete checkpoints in `directory`, by step: each `step_<N>` with its
    checkpoint.json, or, for a step whose save was interrupted between its two renames, the
    `.old-step_<N>` it moved aside (read only: every rank lists, rank 0 alone renames)."""
    if not directory.is_dir():
        return []
    found: dict[int, Path] = {}
    for child in directory.iterdir():
        match = _STEP_DIR.match(child.name) or _ASIDE_DIR.match(child.name)
        if match and (child / "checkpoint.json").is_file():
            step = int(match[1])
            if step not in found or _STEP_DIR.match(child.name):  # step_<N> wins
                found[step] = child
    return [found[step] for step in sorted(found)]


def _step_of(path: Path) -> int:
    """The step of a `step_<N>` (or `.old-step_<N>`) folder."""
    return int(path.name.rsplit("_", 1)[1])


def find_latest(directory: str | Path) -> Path | None:
    """The complete checkpoint with the highest step in `directory`, if any."""
    steps = _complete_steps(Path(directory))
    return steps[-1] if steps else None


def steps_after(directory: str | Path, step: int) -> list[Path]:
    """The complete checkpoints in `directory` of a step after `step`, by step."""
    return [p for p in _complete_steps(Path(directory)) if _step_of(p) > step]


def resolve_checkpoint(path: str | Path) -> Path:
    """A `step_<N>` folder as given, or the newest complete step of a `checkpoints/` folder or
    of a run dir's (what `checkpoint.resume` and `dllm export` accept), the step folder of a
    `checkpoint.json` named itself; anything else as given (read_meta says what is wrong)."""
    path = Path(path)
    if path.name == "checkpoint.json" and path.is_file():
        path = path.parent
    if (path / "checkpoint.json").is_file():
        return path
    if _STEP_DIR.match(path.name):  # a step whose replacement was interrupted: its aside copy
        aside = path.with_name(_ASIDE + path.name)
        return aside if (aside / "checkpoint.json").is_file() else path
    return find_latest(path) or find_latest(path / "checkpoints") or path


# DCP in one process (no process group) says so on every save and load; nothing else is hidden.
_KNOWN_DCP_NOISE = r"torch\.distributed is disabled, unavailable or uninitialized"


# A load whose metadata is missing or unreadable logs each failed read with its traceback on
# the root logger before it raises; the error that follows (load_tensors) names both reads.
_DCP_METADATA_LOGS = ("Global metadata is not found", "Rank local metadata is not found")


def _not_metadata_noise(record: logging.LogRecord) -> bool:
    return not str(record.msg).startswith(_DCP_METADATA_LOGS)


@contextlib.contextmanager
def quiet_dcp_warnings():
    """Silence only DCP's known notices; every other warning and log line still shows."""
    root = logging.getLogger()
    root.addFilter(_not_metadata_noise)
    try:
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", message=_KNOWN_DCP_NOISE, category=UserWarning)
            yield
    finally:
        root.removeFilter(_not_metadata_noise)


def _unreadable(path: Path, error: BaseException) -> DllmError:
    failures = getattr(error, "failures", None)  # DCP's CheckpointException: the ranks' errors
    if failures:
        error = next(iter(failures.values()))[0]
    text = str(error).strip()
    reason = f"{type(error).__name__}: {text.splitlines()[0]}" if text else type(error).__name__
    return DllmError(f"cannot read the checkpoint {str(path)!r}: {reason[:300]}", hint=_DAMAGED)


_DAMAGED = (
    "its files are damaged or incomplete; use another step_<N> folder "
    "(`resume:` or --checkpoint names one)"
)


def load_tensors(state: dict[str, Any], path: str | Path) -> None:
    """`dcp.load` into `state` (collective); a damaged or incomplete checkpoint is a DllmError."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.api import CheckpointException

    with quiet_dcp_warnings():
        try:
            dcp.load(state, checkpoint_id=str(path))
        # DCP raises many types (missing files, unpickling, keys); a failed read comes wrapped
        # in CheckpointException, a BaseException
        except (Exception, CheckpointException) as error:
            raise _unreadable(Path(path), error) from None


# Free space below which a failed save is taken for a full disk: DCP turns ENOSPC into
# torch.save's "unexpected pos" RuntimeError, which names no cause.
_NEARLY_FULL = 16 * 2**20


def _reason(error: BaseException) -> str:
    failures = getattr(error, "failures", None)  # DCP's CheckpointException: the ranks' errors
    if failures:
        error = next(iter(failures.values()))[0]
    if isinstance(error, OSError) and error.strerror:
        return error.strerror
    text = str(error).strip()
    reason = f"{type(error).__name__}: {text.splitlines()[0]}" if text else type(error).__name__
    return reason[:300]


def _has_errno(error: BaseException | None, *codes: int) -> bool:
    """Whether `error`, a DCP rank failure in it, or an error it was raised from has one of
    `codes` as its errno."""
    seen = 0
    while error is not None and seen < 16:
        if isinstance(error, OSError) and error.errno in codes:
            return True
        for failure in (getattr(error, "failures", None) or {}).values():
            if _has_errno(failure[0] if isinstance(failure, tuple) else failure, *codes):
                return True
        error, seen = error.__cause__ or error.__context__, seen + 1
    return False


def _settle_asides(directory: Path) -> None:
    """Finish what an interrupted `_replace` left (rank 0, before a save): an aside copy whose
    `step_<N>` is complete is stale and goes; one that is the only complete copy of its step
    is moved back to `step_<N>`."""
    for aside in directory.iterdir():
        if not _ASIDE_DIR.match(aside.name):
            continue
        final = directory / aside.name.removeprefix(_ASIDE)
        complete = (aside / "checkpoint.json").is_file()
        if complete and not (final / "checkpoint.json").is_file():
            if final.exists():  # an incomplete step_<N>, which a save would replace anyway
                shutil.rmtree(final)
            os.replace(aside, final)
            fsync_dir(directory)
        else:  # stale (its step_<N> is complete), or not a checkpoint
            shutil.rmtree(aside, ignore_errors=True)


def _replace(new: Path, final: Path) -> None:
    """Rename the folder `new` to `final` so that a complete `final` exists at every instant:
    an existing one is moved aside first and deleted only once the new one is in place."""
    aside = final.with_name(_ASIDE + final.name)
    if final.exists():
        os.replace(final, aside)
    os.replace(new, final)
    fsync_dir(final.parent)
    shutil.rmtree(aside, ignore_errors=True)  # a leftover is settled by the next save


def _scheduler_state(scheduler) -> dict[str, Any]:
    state = dict(scheduler.state_dict())
    state.pop("lr_lambdas", None)  # functions, rebuilt from the RunSpec
    return json.loads(json.dumps(state))


def _rng_state() -> dict[str, Any]:
    state: dict[str, Any] = {"torch": torch.get_rng_state()}
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def _save_synced(state: dict[str, Any], path: Path) -> None:
    """`torch.save` to `path`, on disk before it returns (as DCP's `sync_files` keeps its own)."""
    with open(path, "wb") as handle:
        torch.save(state, handle)
        handle.flush()
        os.fsync(handle.fileno())


# What failed in one rank's part of a save: (the rank, what, why, hint), sent to every rank.
_Failure = tuple[int, str, str, str]


def _agreed_failure(failure: _Failure | None, world_size: int) -> DllmError:
    """After a vote that found a part failed on some rank (`any_rank_now`), on every rank (a
    collective): the same error everywhere, the failing rank's own account (the lowest, where
    several failed), naming that rank."""
    from turbo_dllm.train.distributed import gather_from_ranks

    found = gather_from_ranks(failure)
    origins = sorted({f[0] for f in found if f is not None})
    # the failing rank's own account (a DCP write that failed is raised on every rank)
    first = found[origins[0]] if origins[0] < len(found) else None
    origin, what, why, hint = first or next(f for f in found if f is not None)
    if world_size > 1:
        others = len(origins) - 1
        more = f" and {others} more" if others else ""
        what = f"{what} (rank {origin}{more} of {world_size})"
    return DllmError(f"{what}: {why}", hint=hint)


class Checkpointer:
    """Saves and restores the whole training state of one rank (collective calls)."""

    def __init__(
        self, directory: str | Path, *, keep_last: int, rank: int, world_size: int
    ) -> None:
        self.directory = Path(directory)
        self.keep_last = keep_last
        self.rank = rank
        self.world_size = world_size
        self._lock: int | None = None

    # --- one writer ----------------------------------------------------------------------------
    def acquire(self) -> None:
        """Take the checkpoint folder for this run (rank 0, before resuming): an exclusive
        `flock` on the folder itself (no file in it), held until `release` or this process
        ends (a SIGKILL frees it). A folder another process holds is refused, naming that
        process: two runs saving and pruning into one folder would interleave their steps."""
        import fcntl

        self.directory.mkdir(parents=True, exist_ok=True)
        fd = os.open(self.directory, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = flock_holder(fd)
            os.close(fd)
            by = f" (pid {holder})" if holder else ""
            raise DllmError(
                f"{self.directory} is in use by another dllm train{by}",
                hint="two runs would interleave their checkpoints: wait for that one to end (or "
                "stop it), or train into another run dir (--run-dir)",
            ) from None
        except OSError as error:  # a file system without flock (some NFS and Lustre mounts)
            os.close(fd)
            print(
                f"warning: {self.directory} cannot be locked ({error.strerror}): nothing stops "
                "a second run from training into it at the same time",
                file=sys.stderr,
                flush=True,
            )
        else:
            self._lock = fd
        # What a run killed mid-save or mid-prune left (no other process writes here now): a
        # temp folder can be as large as a checkpoint, and a run that resumes to find nothing to
        # do saves nothing that would sweep it.
        _settle_asides(self.directory)
        self._sweep()

    def release(self) -> None:
        if (fd := self._lock) is not None:
            self._lock = None
            os.close(fd)

    # --- save ----------------------------------------------------------------------------------
    def save(
        self,
        step: int,
        *,
        model,
        optimizer,
        scheduler,
        loader_state: dict[str, Any],
        meta: dict[str, Any],
    ) -> Path:
        import torch.distributed.checkpoint as dcp
        from torch.distributed.checkpoint.api import CheckpointException
        from torch.distributed.checkpoint.state_dict import get_state_dict

        final = self.directory / f"step_{step:08d}"
        tmp = self.directory / f".tmp-step_{step:08d}"
        # Each part ends in a vote of every rank (`_agree`), where a barrier would be: a part
        # that failed on one rank stops them all with its error. Raised there alone, it would
        # leave the others waiting in their next collective (NCCL hangs; gloo says 'Connection
        # closed by peer', which names neither the rank nor the cause).
        failure = None
        if self.rank == 0:
            try:
                self.directory.mkdir(parents=True, exist_ok=True)
                _settle_asides(self.directory)  # an earlier save's interrupted replacement
                if tmp.exists():
                    shutil.rmtree(tmp)
                tmp.mkdir()
            except Exception as error:
                failure = self._unwritable(final, error)
        self._agree(failure, tmp)
        model_state, optim_state = get_state_dict(model, optimizer)
        model_state = _own_tensors(model, model_state)
        try:
            with quiet_dcp_warnings():
                dcp.save({"model": model_state, "optim": optim_state}, checkpoint_id=str(tmp))
            # Our own file is synced as DCP syncs its own, and so are the folder's entries (DCP
            # syncs no folder): the step is renamed into place only once every rank's files are
            # on disk, so a power cut never leaves a `step_*` with a torn file.
            _save_synced({"rng": _rng_state()}, tmp / f"rank_{self.rank:05d}.pt")
            fsync_dir(tmp)
        # DCP wraps a failed write (a full disk reaches torch.save as a RuntimeError, not an
        # OSError) in CheckpointException, a BaseException, and raises it on every rank
        except (Exception, CheckpointException) as error:
            failure = self._unwritable(final, error)
        self._agree(failure, tmp)
        if self.rank == 0:
            try:
                record = CheckpointMeta(
                    format=CHECKPOINT_FORMAT,
                    step=step,
                    world_size=self.world_size,
                    scheduler=_scheduler_state(scheduler),
                    loader=loader_state,
                    **meta,
                )
                write_atomic(tmp / "checkpoint.json", record.model_dump_json(indent=2) + "\n")
                _replace(tmp, final)
            except Exception as error:
                failure = self._unwritable(final, error)
            else:
                try:
                    self._prune(step)
                except Exception as error:
                    failure = self._unprunable(final, error)
        self._agree(failure, tmp)
        return final

    def _agree(self, failure: _Failure | None, tmp: Path) -> None:
        """The end of one part of a save, on every rank (a collective: one all-reduce of a flag
        where a barrier was): where a rank's part failed, rank 0 removes the temp folder (its
        space back; no step is marked complete) and every rank raises the same error
        (`_agreed_failure`)."""
        from turbo_dllm.train.distributed import any_rank_now

        if not any_rank_now(failure is not None):
            return
        if self.rank == 0:  # gone before any rank raises
            shutil.rmtree(tmp, ignore_errors=True)
        raise _agreed_failure(failure, self.world_size)

    def _origin(self, error: BaseException) -> int:
        """The rank where `error` happened: DCP raises a write that failed on one rank on every
        rank, as a CheckpointException naming the ranks it failed on."""
        failures = getattr(error, "failures", None)
        return min(failures) if failures else self.rank

    def _then(self) -> str:
        latest = find_latest(self.directory)
        return (
            f"`dllm train` then resumes from {latest.name}"
            if latest
            else "`dllm train` then starts over (no earlier checkpoint)"
        )

    def _unwritable(self, final: Path, error: BaseException) -> _Failure:
        """A save that failed (a full disk, an I/O error), named by its checkpoint; the earlier
        ones are intact (`_agree` removes the temp folder, giving its space back)."""
        reason = _reason(error)
        try:
            free = shutil.disk_usage(self.directory).free
        except OSError:
            free = None
        full = _has_errno(error, errno.ENOSPC, errno.EDQUOT) or (
            free is not None and free < _NEARLY_FULL
        )
        if full:
            where = "" if free is None else f", {free / 2**20:.1f} MiB free"
            reason = f"the disk is full (no space left on device{where})"
        fix = (
            "free some space on that disk (or set checkpoint.dir to a larger one)"
            if full
            else "fix the cause"
        )
        what = f"cannot write the checkpoint {str(final)!r}"
        return self._origin(error), what, reason, f"{fix}; {self._then()}"

    def _unprunable(self, final: Path, error: BaseException) -> _Failure:
        """A prune that failed after its step was in place: that one is complete."""
        what = f"saved the checkpoint {str(final)!r}, but cannot remove the older ones"
        hint = f"fix the cause (checkpoint.keep_last is {self.keep_last}); {self._then()}"
        return self.rank, what, _reason(error), hint

    def _prune(self, saved: int) -> None:
        """Keep the newest `keep_last` complete steps up to the one just saved (`saved`). Steps
        after it (a rewind's older timeline, each replaced as the run saves its step) are not
        counted: with them, a rewind with a smaller keep_last pruned the step it had just saved."""
        # Renamed out of sight first: a prune killed midway leaves a temp folder (swept below on
        # the next save), never a `step_N` with its checkpoint.json but some shards gone.
        upto = [p for p in _complete_steps(self.directory) if _step_of(p) <= saved]
        for old in upto[: -self.keep_last]:
            doomed = old.with_name(f".tmp-step_pruned-{old.name}")
            shutil.rmtree(doomed, ignore_errors=True)
            os.replace(old, doomed)
            shutil.rmtree(doomed, ignore_errors=True)
        self._sweep()

    def _sweep(self) -> None:
        for child in self.directory.iterdir():  # temp folders of saves that never finished
            if child.name.startswith(".tmp-step_"):
                shutil.rmtree(child, ignore_errors=True)

    # --- load ----------------------------------------------------------------------------------
    def load(self, path: str | Path, *, model, optimizer, scheduler, loader) -> CheckpointMeta:
        """Restore everything saved at `path`; returns its metadata (meta.step = next step)."""
        from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict

        path = Path(path)
        meta = read_meta(path)
        from torch.distributed.checkpoint.state_dict import StateDictOptions

        model_state, optim_state = get_state_dict(model, optimizer)
        state = {"model": _own_tensors(model, model_state), "optim": optim_state}
        load_tensors(state, path)
        set_state_dict(
            model,
            optimizer,
            model_state_dict=state["model"],
            optim_state_dict=state["optim"],
            # a model's external weights are not in its checkpoint (they stay as loaded)
            options=StateDictOptions(strict=not getattr(model, "external_weights", ())),
        )
        scheduler.load_state_dict(
            {**meta.scheduler, "lr_lambdas": [None] * len(scheduler.lr_lambdas)}
        )
        loader.load_state_dict(meta.loader)
        rank_file = path / f"rank_{self.rank:05d}.pt"
        if meta.world_size != self.world_size and self.rank == 0:
            # Per-rank RNG streams do not map onto another number of ranks; noise is keyed by
            # (seed, step, sample), so the loss trace is unaffected, but say what was skipped.
            print(
                f"warning: {path} was saved by {meta.world_size} rank(s) and this run has "
                f"{self.world_size}: the RNG states are not restored (nothing the trace depends "
                "on: the noise and the data order are keyed by seed, step and sample)",
                file=sys.stderr,
                flush=True,
            )
        if meta.world_size == self.world_size:
            self._restore_rng(rank_file)
        return meta

    def _restore_rng(self, rank_file: Path) -> None:
        """This rank's RNG states from its file; one missing (a checkpoint copied in part),
        truncated or foreign on any rank ends the load on every rank with that rank's error
        (a collective: a rank raising alone would leave the others in the next one)."""
        from turbo_dllm.train.distributed import any_rank_now

        rng, failure = None, None
        try:
            rng = torch.load(rank_file, weights_only=False)["rng"]
        except Exception as error:
            what = f"cannot read the checkpoint {str(rank_file)!r}"
            failure = (self.rank, what, _reason(error), _DAMAGED)
        if any_rank_now(failure is not None):
            raise _agreed_failure(failure, self.world_size)
        torch.set_rng_state(rng["torch"])
        if "cuda" in rng and torch.cuda.is_available():
            torch.cuda.set_rng_state_all(rng["cuda"])
