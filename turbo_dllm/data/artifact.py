"""The data artifact: `manifest.json` (format `turbo_dllm.data.v1`) + memory-mapped arrays.

Folder layout:

    manifest.json        this format (validated on read)
    tokens.bin           uint16 or uint32, shape (num_sequences, seq_len), little-endian
    loss_mask.bin        uint8 0/1, same shape: which tokens the loss may score
    documents.bin        int64, shape (documents, 2): [stream start, length] of every document
                         in the flattened token stream; gaps are padding
    tokenizer/           the tokenizer's own files (Hugging Face tokenizers), for `inspect`;
                         its named chat templates in tokenizer/additional_chat_templates/

The fingerprint is sha256 over canonical JSON of what training sees: shapes, dtypes and sha256
of every array, seq_len, block size, vocab size, special token ids and the tokenizer identity.
It never includes paths, times, or how the data was produced (worker count, chunking).
"""

from __future__ import annotations

import hashlib
import json
import math
import shlex
from pathlib import Path
from typing import Any, Literal

import numpy as np
from pydantic import BaseModel, ConfigDict, Field, NonNegativeInt, PositiveInt

from turbo_dllm.data.tokenizers import CHAT_TEMPLATES_FOLDER
from turbo_dllm.errors import DllmError, describe_os_error
from turbo_dllm.formats import validate_document
from turbo_dllm.fsutil import sha256_file

__all__ = [
    "ARRAY_FILES",
    "FORMAT",
    "ArrayInfo",
    "ArtifactDamaged",
    "DataArtifact",
    "DataManifest",
    "DataStats",
    "compute_fingerprint",
    "layout_problems",
    "prepare_config_in",
    "prepare_line",
    "read_manifest",
    "tokenizer_file",
    "unlisted_files",
    "unlisted_problems",
    "verify",
]

FORMAT = "turbo_dllm.data.v1"
MANIFEST = "manifest.json"
ARRAY_FILES = {"tokens": "tokens.bin", "loss_mask": "loss_mask.bin", "documents": "documents.bin"}
_ARRAY_DTYPES = {"tokens": ("uint16", "uint32"), "loss_mask": ("uint8",), "documents": ("int64",)}
_MAX_MANIFEST_BYTES = 256 << 20  # a manifest lists source files; this only stops a runaway file


class ArtifactDamaged(DllmError):
    """An artifact that is there but is not what its manifest says (a torn or invalid manifest,
    a changed, missing or extra file, counts the arrays do not hold): `dllm data validate`'s
    failed check (exit 1), unlike a path that holds no artifact (bad input, exit 2).
    `problems`: one line each."""

    def __init__(self, message: str, hint: str | None = None, *, problems: list[str]) -> None:
        super().__init__(message, hint)
        self.problems = problems


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class ArrayInfo(_Strict):
    file: str
    dtype: Literal["uint8", "uint16", "uint32", "int64"]
    shape: list[NonNegativeInt] = Field(max_length=2)
    bytes: NonNegativeInt
    sha256: str


class FileInfo(_Strict):
    bytes: NonNegativeInt
    sha256: str


class TokenizerIdentity(_Strict):
    kind: Literal["byte_level", "huggingface"]
    vocab_sha256: str
    chat_template_sha256: str | None


class PackingInfo(_Strict):
    align: Literal["block", "none"]
    overflow: Literal["split", "truncate", "reject"]
    separator: Literal["eos", "none"]
    prepend_bos: bool


class SourceFile(_Strict):
    name: str
    bytes: int
    sha256: str


class SourceInfo(_Strict):
    kind: str
    records: str
    files: list[SourceFile]
    dataset: dict[str, str | int | None] | None


class DataStats(_Strict):
    records: NonNegativeInt
    documents: NonNegativeInt
    tokens: NonNegativeInt  # document tokens, bos/eos included, padding excluded
    padding_tokens: NonNegativeInt
    supervised_tokens: NonNegativeInt
    empty_documents: NonNegativeInt
    truncated_documents: NonNegativeInt
    truncated_tokens: NonNegativeInt
    dropped_unsupervised_documents: NonNegativeInt
    # Documents whose text holds a special token's literal string (see special_tokens_in_text);
    # 0 in artifacts made before it was counted.
    special_token_text: NonNegativeInt = 0
    skipped: dict[str, NonNegativeInt]


class DataManifest(_Strict):
    format: Literal["turbo_dllm.data.v1"]
    fingerprint: str
    producer: str
    num_sequences: NonNegativeInt
    seq_len: PositiveInt
    block_size: PositiveInt
    vocab_size: PositiveInt
    special_tokens: dict[str, NonNegativeInt]  # mask, eos, pad; bos when the tokenizer has one
    tokenizer: TokenizerIdentity
    supervision: Literal["full", "assistant_only", "completion_only", "provided"]
    packing: PackingInfo
    source: SourceInfo
    arrays: dict[str, ArrayInfo]
    tokenizer_files: dict[str, FileInfo]
    stats: DataStats

    @property
    def num_documents(self) -> int:
        return self.stats.documents


def compute_fingerprint(fields: dict[str, Any]) -> str:
    """sha256 of the canonical content description (see the module docstring)."""
    content = {
        "format": FORMAT,
        "seq_len": fields["seq_len"],
        "block_size": fields["block_size"],
        "vocab_size": fields["vocab_size"],
        "special_tokens": fields["special_tokens"],
        "tokenizer": fields["tokenizer"],
        "arrays": {
            name: {"dtype": info["dtype"], "shape": info["shape"], "sha256": info["sha256"]}
            for name, info in fields["arrays"].items()
        },
    }
    canonical = json.dumps(content, sort_keys=True, separators=(",", ":"), ensure_ascii=True)
    return hashlib.sha256(canonical.encode("ascii")).hexdigest()


def _manifest_path(path: str | Path) -> Path:
    path = Path(path)
    return path if path.name == MANIFEST and path.is_file() else path / MANIFEST


# How many folders above an artifact are searched for the prepare.yaml that writes it (a
# project's data/prepared is two below its prepare.yaml).
_PREPARE_SEARCH_LEVELS = 3


def _prepare_config_above(artifact: Path) -> Path | None:
    """The prepare config (a YAML file in one of the folders above `artifact`) whose
    output.path is `artifact`, read as `dllm data prepare` reads it; None where there is none."""
    try:
        target = artifact.resolve()
    except (OSError, RuntimeError):
        return None
    for folder in list(target.parents)[:_PREPARE_SEARCH_LEVELS]:
        if (found := prepare_config_in(folder, target)) is not None:
            return found
    return None


def prepare_config_in(folder: Path, target: Path) -> Path | None:
    """The prepare config among `folder`'s YAML files whose output.path is `target` (resolved),
    read as `dllm data prepare` reads it, without validating the rest (prepare says what else is
    wrong with it); None where there is none."""
    from turbo_dllm.config.load import absolute_path, read_yaml

    try:
        candidates = sorted(p for p in folder.iterdir() if p.suffix in (".yaml", ".yml"))
    except OSError:
        return None
    for candidate in candidates:
        try:
            document = read_yaml(candidate)
            output = document.get("output") if isinstance(document, dict) else None
            where = output.get("path") if isinstance(output, dict) else None
            if not isinstance(where, str) or "source" not in document:
                continue
            if Path(absolute_path(where, candidate.resolve().parent)).resolve() == target:
                return candidate
        except Exception:  # not YAML, unreadable, too large: not a prepare config
            continue
    return None


def prepare_line(artifact: str | Path, overwrite: bool = False) -> str:
    """The `dllm data prepare` line that writes `artifact`, as run from here, in backquotes:
    the prepare config above it whose output.path it is, else what a PREPARE.yaml must say.
    `dllm data prepare --config prepare.yaml` named a file of the working folder, which a
    command run elsewhere does not have."""
    artifact = Path(artifact)
    config = _prepare_config_above(artifact)
    if config is None:
        command = "dllm data prepare --config PREPARE.yaml"
    else:
        try:
            shown = config.relative_to(Path.cwd())
        except ValueError:
            shown = config
        command = f"dllm data prepare --config {shlex.quote(str(shown))}"
    if overwrite:
        command += " --set output.overwrite=true"
    if config is None:
        return f"`{command}` (a prepare.yaml with output.path: {artifact.absolute()})"
    return f"`{command}`"


def read_manifest(path: str | Path, prepare: str | None = None) -> DataManifest:
    """Read and validate an artifact's manifest (`path`: the folder or its manifest.json).
    `prepare`: the `dllm data prepare` line that writes it (backquoted), for the hint where it
    is missing."""
    manifest_path = _manifest_path(path)
    if not manifest_path.is_file():
        from turbo_dllm.data.writer import restore_hint, staging_note

        what = "no data artifact at" if Path(path).exists() else "data artifact not found:"
        message = f"{what} {str(path)!r} (no {MANIFEST})"
        folder = Path(path).parent if Path(path).name == MANIFEST else Path(path)
        hint = f"create it with {prepare or prepare_line(folder, folder.exists())}"
        if (backup := restore_hint(path)) is not None:
            said, how = backup
            message, hint = f"{message}; {said}", f"{how}; or {hint}"
        elif (note := staging_note(folder)) is not None:
            said, how = note
            message, hint = f"{message}; {said}", f"{how}; {hint}"
        raise DllmError(message, hint=hint)
    try:
        with open(manifest_path, "rb") as handle:
            data = handle.read(_MAX_MANIFEST_BYTES + 1)
        if len(data) > _MAX_MANIFEST_BYTES:
            raise ValueError(f"larger than {_MAX_MANIFEST_BYTES >> 20} MiB")
        document = json.loads(data)
    except OSError as error:  # permission denied, ...: the file may well be intact
        message, hint = describe_os_error(error)
        raise DllmError(f"cannot read the data artifact manifest {message}", hint=hint) from None
    except (ValueError, RecursionError) as error:
        message = f"{manifest_path}: unreadable manifest: {error}"
        raise ArtifactDamaged(
            message,
            hint="re-create the artifact with `dllm data prepare` (output.overwrite: true "
            "replaces an artifact whose manifest is damaged)",
            problems=[message],
        ) from None
    try:
        return validate_document(
            document,
            DataManifest,
            expected=FORMAT,
            what="data artifact manifest",
            source=str(manifest_path),
            hint="re-create the artifact with this version of `dllm data prepare`",
        )
    except DllmError as error:
        if not isinstance(document, dict) or document.get("format") != FORMAT:
            raise  # another file, or another version's: not a damaged artifact of this one
        # Of this format, but fields that cannot be (edited, or torn mid-number).
        raise ArtifactDamaged(error.message, error.hint, problems=[error.message]) from None


def _np_dtype(name: str) -> np.dtype:
    return np.dtype(name).newbyteorder("<")


def layout_problems(manifest: DataManifest) -> list[str]:
    """What the manifest alone gets wrong about its arrays: names, dtypes, shapes and sizes.

    Cheap (no file is read), so every reader checks it before mapping an array: a manifest with
    a negative, huge or mismatched shape must be an error, not an mmap of the wrong size.
    """
    found: list[str] = []
    arrays = manifest.arrays
    if set(arrays) != set(ARRAY_FILES):
        found.append(f"arrays: expected {sorted(ARRAY_FILES)}, found {sorted(arrays)}")
    expected_shapes = {
        "tokens": [manifest.num_sequences, manifest.seq_len],
        "loss_mask": [manifest.num_sequences, manifest.seq_len],
        "documents": [manifest.stats.documents, 2],
    }
    for name, info in sorted(arrays.items()):
        if name not in ARRAY_FILES:
            continue
        where = f"arrays.{name}"
        if info.file != ARRAY_FILES[name]:
            found.append(f"{where}.file: {info.file!r}, expected {ARRAY_FILES[name]!r}")
        if info.dtype not in _ARRAY_DTYPES[name]:
            found.append(
                f"{where}.dtype: {info.dtype}, expected {' or '.join(_ARRAY_DTYPES[name])}"
            )
        if info.shape != expected_shapes[name]:
            found.append(f"{where}.shape: {info.shape}, expected {expected_shapes[name]}")
        size = math.prod(info.shape) * _np_dtype(info.dtype).itemsize
        if info.bytes != size:
            found.append(
                f"{where}.bytes: {info.bytes}, but shape {info.shape} of {info.dtype} is {size}"
            )
    if manifest.seq_len % manifest.block_size:
        found.append(
            f"seq_len: {manifest.seq_len} is not a multiple of block_size {manifest.block_size}"
        )
    return found


def verify(path: str | Path) -> DataManifest:
    """Recompute every hash, the fingerprint and the structural invariants; raise on any problem."""
    root = _manifest_path(path).parent
    manifest = read_manifest(path)
    found = layout_problems(manifest)
    intact = not found
    for info in manifest.arrays.values():
        file = root / info.file
        if not _inside(file, root):  # layout_problems named it
            intact = False
        elif not file.is_file():
            found.append(f"{info.file}: missing")
            intact = False
        elif file.stat().st_size != info.bytes:
            found.append(f"{info.file}: {file.stat().st_size} bytes, manifest says {info.bytes}")
            intact = False
        elif sha256_file(file) != info.sha256:
            found.append(f"{info.file}: sha256 mismatch (the file changed after it was written)")
            intact = False
    for name, info in manifest.tokenizer_files.items():
        file = tokenizer_file(root, name)
        if file is None or not file.is_file():
            found.append(f"tokenizer/{name}: missing")
        elif sha256_file(file) != info.sha256:
            found.append(f"tokenizer/{name}: changed")
    fingerprint = compute_fingerprint(manifest.model_dump(mode="json"))
    if fingerprint != manifest.fingerprint:
        found.append(
            f"fingerprint mismatch: manifest says {manifest.fingerprint[:16]}, "
            f"content gives {fingerprint[:16]}"
        )
    if intact:
        found += _content_problems(DataArtifact(root, manifest, check_index=False))
    unlisted, removal = unlisted_problems(root, manifest)
    if found or unlisted:
        lines = "\n".join(f"  - {p}" for p in found + unlisted)
        hint = f"re-create it with {prepare_line(root, overwrite=True)}"
        if unlisted:
            hint = f"remove what its manifest does not list (`{removal}`)" + (
                f", or {hint}" if not found else f"; {hint}"
            )
        raise ArtifactDamaged(
            f"data artifact {str(root)!r} failed verification:\n{lines}",
            hint=hint,
            problems=found + unlisted,
        )
    return manifest


def unlisted_files(root: str | Path, manifest: DataManifest) -> list[Path]:
    """Entries of the artifact folder `root` that its manifest does not list, sorted: at the
    top level anything but manifest.json, the arrays' files and a tokenizer/ folder; inside
    tokenizer/ anything but `manifest.tokenizer_files` (which may list the tokenizer's named
    chat templates in its additional_chat_templates/). Prepare writes nothing else, so an
    extra file is no longer the artifact the manifest describes (training reads the listed
    files, export copies the listed tokenizer files only). An empty tokenizer/ folder is left
    alone. Cheap (two folder listings, nothing is read): `dllm doctor` makes it as well as
    `dllm data validate`.
    """
    root = Path(root)
    listed = {MANIFEST, *(info.file for info in manifest.arrays.values())}
    found: list[Path] = []
    try:
        entries = sorted(root.iterdir())
        for entry in entries:
            if entry.name in listed:
                continue
            if entry.name == "tokenizer" and entry.is_dir() and not entry.is_symlink():
                found += _unlisted_inside(entry, manifest)
            else:
                found.append(entry)
    except OSError:  # an unreadable folder: the files it names say what is wrong
        return found
    return found


def _unlisted_inside(folder: Path, manifest: DataManifest) -> list[Path]:
    """The entries of an artifact's tokenizer/ that its manifest does not list; inside its
    additional_chat_templates/, where the manifest lists files there, the same per file."""
    listed = manifest.tokenizer_files
    templates = any(name.startswith(f"{_TOKENIZER_SUBFOLDER}/") for name in listed)
    found: list[Path] = []
    for inner in sorted(folder.iterdir()):
        if inner.name in listed:
            continue
        if (
            templates
            and inner.name == _TOKENIZER_SUBFOLDER
            and inner.is_dir()
            and not inner.is_symlink()
        ):
            found += [
                file
                for file in sorted(inner.iterdir())
                if f"{_TOKENIZER_SUBFOLDER}/{file.name}" not in listed
            ]
        else:
            found.append(inner)
    return found


def unlisted_problems(root: str | Path, manifest: DataManifest) -> tuple[list[str], str]:
    """One line per file `unlisted_files` names, and the command that removes them all."""
    root = Path(root)
    files = unlisted_files(root, manifest)
    lines = []
    for file in files:
        shown = file.relative_to(root).as_posix()
        what = "a folder" if file.is_dir() and not file.is_symlink() else "a file"
        beside = " (export would hand it on beside a model)" if "/" in shown else ""
        lines.append(
            f"{shown}: not listed in the manifest: {what} `dllm data prepare` did not write{beside}"
        )
    folders = any(file.is_dir() and not file.is_symlink() for file in files)
    command = ("rm -r " if folders else "rm ") + " ".join(shlex.quote(str(f)) for f in files)
    return lines, command


def _inside(file: Path, folder: Path) -> bool:
    """Whether `file` names an entry of `folder` itself (no `..`, no absolute path, no NUL)."""
    return file.parent == folder and file.name not in ("", ".", "..") and "\x00" not in file.name


# The one folder inside tokenizer/ that a manifest may list files of: the tokenizer's named
# chat templates, as transformers saves them.
_TOKENIZER_SUBFOLDER = CHAT_TEMPLATES_FOLDER


def tokenizer_file(root: str | Path, name: str) -> Path | None:
    """The file of the artifact at `root` that `manifest.tokenizer_files` lists as `name`: a
    file of its tokenizer/ folder, or of tokenizer/additional_chat_templates/ (the tokenizer's
    named chat templates); None for any other name (`..`, an absolute path, a deeper one)."""
    folder = Path(root) / "tokenizer"
    inner, _, base = name.rpartition("/")
    if inner == _TOKENIZER_SUBFOLDER:
        folder = folder / inner
    elif inner:
        return None
    file = folder / base
    return file if _inside(file, folder) else None


def _content_problems(artifact: DataArtifact) -> list[str]:
    found: list[str] = []
    manifest = artifact.manifest
    if artifact.tokens.size:
        top = int(artifact.tokens.max())
        if top >= manifest.vocab_size:
            found.append(f"tokens: id {top} is outside the vocabulary ({manifest.vocab_size})")
    found += artifact.index_problems()
    if not found:
        found += _claim_problems(artifact)
    return found


def _claim_problems(artifact: DataArtifact) -> list[str]:
    """What the manifest says of its arrays that they contradict. The fingerprint covers the
    arrays, not these fields, so an edited manifest passed with them: its counts, the packing it
    records (`validate --config` trusts packing.align) and full supervision."""
    manifest, stats = artifact.manifest, artifact.manifest.stats
    starts, lengths = np.asarray(artifact.documents[:, 0]), np.asarray(artifact.documents[:, 1])
    tokens = int(lengths.sum())
    mask = np.asarray(artifact.loss_mask)
    supervised = int(mask.sum(dtype=np.int64))
    found: list[str] = []
    if mask.size and int(mask.max()) > 1:
        found.append("loss_mask: holds values other than 0 and 1")
    counts = {
        "tokens": (stats.tokens, tokens, "the documents hold"),
        "padding_tokens": (
            stats.padding_tokens,
            manifest.num_sequences * manifest.seq_len - tokens,
            "the rows have",
        ),
        "supervised_tokens": (stats.supervised_tokens, supervised, "the loss mask has"),
    }
    for name, (said, real, where) in counts.items():
        if said != real:
            found.append(f"stats.{name}: {said:,}, but {where} {real:,}")
    packing = manifest.packing
    if packing.align == "block" and len(starts):
        off = np.flatnonzero(starts % manifest.block_size)
        if len(off):
            found.append(
                f"packing.align: block, but document {off[0]} starts at {starts[off[0]]:,}, "
                f"not on a multiple of block_size {manifest.block_size}"
            )
    if packing.overflow != "split" and len(starts):
        across = np.flatnonzero(starts % manifest.seq_len + lengths > manifest.seq_len)
        if len(across):
            found.append(
                f"packing.overflow: {packing.overflow}, but document {across[0]} runs across "
                "a row boundary"
            )
    if manifest.supervision == "full":
        expected = tokens - (len(starts) if packing.prepend_bos else 0)
        if supervised != expected:
            found.append(
                f"supervision: full, but {supervised:,} tokens are supervised, not every "
                f"document token ({expected:,}"
                + (", bos excluded)" if packing.prepend_bos else ")")
            )
    return found


class DataArtifact:
    """Read access to an artifact: memory-mapped arrays and per-row document ids."""

    def __init__(
        self, path: str | Path, manifest: DataManifest | None = None, *, check_index: bool = True
    ) -> None:
        self.root = _manifest_path(path).parent
        self.manifest = manifest or read_manifest(path)
        found = layout_problems(self.manifest)
        if found:
            lines = "\n".join(f"  - {p}" for p in found)
            raise DllmError(
                f"data artifact {str(self.root)!r} has an inconsistent manifest:\n{lines}",
                hint="re-create it with `dllm data prepare`",
            )
        self.tokens = self._open("tokens")
        self.loss_mask = self._open("loss_mask")
        self.documents = self._open("documents")
        found = self.index_problems() if check_index else []
        if found:
            raise DllmError(
                f"data artifact {str(self.root)!r}: {found[0]}",
                hint="`dllm data validate` checks the whole artifact; re-create it with "
                "`dllm data prepare`",
            )

    def _open(self, name: str) -> np.ndarray:
        info = self.manifest.arrays[name]
        file = self.root / info.file
        size = file.stat().st_size if file.is_file() else None
        if size != info.bytes:
            what = (
                "missing"
                if size is None
                else f"{size} bytes, {'more' if size > info.bytes else 'fewer'} than the "
                f"{info.bytes} its manifest says ({'changed' if size > info.bytes else 'truncated'}?)"
            )
            raise DllmError(
                f"{file}: {what}",
                hint="`dllm data validate` checks the whole artifact; re-create it with "
                "`dllm data prepare`",
            )
        if info.bytes == 0:
            return np.zeros(info.shape, _np_dtype(info.dtype))
        return np.memmap(file, dtype=_np_dtype(info.dtype), mode="r", shape=tuple(info.shape))

    def index_problems(self) -> list[str]:
        """Whether the document index is a sorted, non-overlapping cover of the token stream.

        One pass over the index (not the tokens), so every reader checks it on open: `inspect`,
        `stats` and the loader turn it into positions.
        """
        starts, lengths = self.documents[:, 0], self.documents[:, 1]
        total = self.manifest.num_sequences * self.manifest.seq_len
        if (
            len(starts)
            and (
                (starts < 0).any()
                or (starts > total).any()
                or (lengths <= 0).any()
                or (lengths > total).any()  # so that no sum below overflows
                or (starts[1:] < starts[:-1] + lengths[:-1]).any()
                or starts[-1] + lengths[-1] > total
            )
        ):
            return ["documents: the index is not a sorted, non-overlapping cover of the stream"]
        return []

    def __len__(self) -> int:
        return self.manifest.num_sequences

    def _pieces(self, row: int) -> tuple[int, int, np.ndarray]:
        """Stream window of `row` and the [start, length] of every document touching it."""
        length = self.manifest.seq_len
        low, high = row * length, (row + 1) * length
        starts = self.documents[:, 0]
        first = max(int(np.searchsorted(starts, low, side="right")) - 1, 0)
        last = int(np.searchsorted(starts, high, side="left"))
        return low, high, np.asarray(self.documents[first:last])

    def doc_ids(self, row: int) -> np.ndarray:
        """int32 per token of `row`: 0 for its first segment, +1 at every document boundary.

        Segments are documents (or the part of one that falls in this row) and padding runs, so
        equal ids mean "may attend to each other" under document masking.
        """
        low, high, piece = self._pieces(row)
        edges = np.concatenate([piece[:, 0], piece[:, 0] + piece[:, 1]])
        edges = np.unique(edges[(edges > low) & (edges < high)])
        return np.searchsorted(edges, np.arange(low, high), side="right").astype(np.int32)

    def padding(self, row: int) -> np.ndarray:
        """bool per token of `row`: True where no document lies (padding)."""
        low, high, piece = self._pieces(row)
        pad = np.ones(high - low, bool)
        for start, size in piece.tolist():
            pad[max(start, low) - low : max(min(start + size, high) - low, 0)] = False
        return pad

    def row(self, index: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(tokens int64, loss mask bool, document ids int32) of one sequence."""
        return (
            np.asarray(self.tokens[index], dtype=np.int64),
            np.asarray(self.loss_mask[index]).astype(bool),
            self.doc_ids(index),
        )
