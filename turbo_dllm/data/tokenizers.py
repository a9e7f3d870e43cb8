"""Tokenizers behind one small interface: the built-in byte-level one and local HF folders.

Both give: `encode_texts` (a batch of strings -> flat ids + lengths, no special tokens added),
`encode_chat` (messages -> ids + the template's own assistant mask), `decode`, the special token
ids the artifact records, and an identity (vocab sha256 + chat template sha256) that goes into the
artifact fingerprint. The byte-level tokenizer needs no files, so a fresh project prepares data
offline.
"""

from __future__ import annotations

import hashlib
import itertools
import json
import re
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Protocol

import numpy as np

from turbo_dllm.errors import DllmError

__all__ = [
    "BYTE_CHAT_TEMPLATE",
    "CHAT_TEMPLATES_FOLDER",
    "ByteLevelTokenizer",
    "HuggingFaceTokenizer",
    "TOKENIZER_FILES",
    "TextTokenizer",
    "VOCABULARY_FILES",
    "folder_vocabulary",
    "has_generation_markers",
    "load_tokenizer",
    "named_chat_templates",
    "tokenizer_files",
    "tokenizer_folder_files",
    "vocabulary_fits",
]

# The built-in chat format of the byte-level tokenizer. This text is its definition (hashed into
# the artifact identity), and `ByteLevelTokenizer.encode_chat` implements it exactly.
BYTE_CHAT_TEMPLATE = (
    "turbo_dllm.byte_chat.v1: for each message, the UTF-8 bytes of '<|' + role + '|>' + '\\n', "
    "then the UTF-8 bytes of its content, then the <|eos|> token (id 257). Under assistant_only "
    "the supervised span of an assistant message is its content bytes and that <|eos|>."
)

_GENERATION_MARKER = re.compile(r"\{%-?\s*generation\s*-?%\}")
# The files any transformers tokenizer may read, whatever its class (its configuration, the
# fast tokenizer, chat templates) and the common vocabulary files. `tokenizer_files` adds the
# files the tokenizer's own class names, and sentencepiece and tiktoken files.
TOKENIZER_FILES = (
    "tokenizer.json",
    "tokenizer_config.json",
    "special_tokens_map.json",
    "added_tokens.json",
    "chat_template.jinja",
    "chat_template.json",
    "vocab.json",
    "vocab.txt",
    "merges.txt",
    "tokenizer.model",
)
# Vocabulary files by kind rather than name: sentencepiece models (tokenizer.model,
# spiece.model, sentencepiece.bpe.model, ...) and tiktoken ranks (qwen.tiktoken, ...).
_VOCABULARY_PATTERNS = ("*.model", "*.tiktoken")


def tokenizer_files(folder: str | Path, tokenizer_class: type | None = None) -> list[Path]:
    """The files of the tokenizer saved in `folder` that transformers loads it from: what
    preparation copies into a data artifact (and fingerprints) and export copies beside a
    model. Without one of them the copy may still load, as another tokenizer (a T5 tokenizer
    without its spiece.model loads with its special tokens alone).

    They are TOKENIZER_FILES, the vocabulary files the tokenizer's class names (its
    `vocab_files_names`; the class is `tokenizer_class`, else the one tokenizer_config.json
    (or config.json's model type) names, asked of transformers where it is installed, so a
    new kind of tokenizer needs no change here) and sentencepiece and tiktoken files. Only the
    top level of `folder` (`tokenizer_folder_files` adds its named chat templates); none at all
    where it is not a folder.
    """
    folder = Path(folder)
    if not folder.is_dir():
        return []
    names = dict.fromkeys(TOKENIZER_FILES)
    for pattern in _VOCABULARY_PATTERNS:
        names.update(dict.fromkeys(sorted(p.name for p in folder.glob(pattern))))
    if not any((folder / name).is_file() for name in names):
        return []  # no tokenizer here (a model folder without one): transformers is not asked
    names.update(dict.fromkeys(_class_vocabulary_files(folder, tokenizer_class)))
    return [folder / name for name in names if (folder / name).is_file()]


# Where transformers saves a tokenizer's named chat templates beside the default one
# (chat_template.jinja): one `<name>.jinja` each (`tool_use`, `rag`, ...), all of which
# AutoTokenizer loads from a local folder.
CHAT_TEMPLATES_FOLDER = "additional_chat_templates"


def named_chat_templates(folder: str | Path) -> list[Path]:
    """The named chat templates saved with the tokenizer in `folder` (its
    additional_chat_templates/*.jinja), sorted; none where it has no such folder. A copy of the
    tokenizer without them loads, but `apply_chat_template(..., chat_template="tool_use")` on it
    renders the name itself (transformers takes a name it does not know for a template)."""
    source = Path(folder) / CHAT_TEMPLATES_FOLDER
    if not source.is_dir():
        return []
    return sorted(p for p in source.glob("*.jinja") if p.is_file())


def tokenizer_folder_files(
    folder: str | Path, tokenizer_class: type | None = None
) -> dict[str, Path]:
    """Every file of the tokenizer saved in `folder`, by its path inside the folder: the
    `tokenizer_files` (top level) and, where there are any, its named chat templates
    (`additional_chat_templates/<name>.jinja`). What a copy of the tokenizer needs (a data
    artifact's tokenizer/, an export beside a model); none where `folder` holds no tokenizer."""
    files = {file.name: file for file in tokenizer_files(folder, tokenizer_class)}
    if files:
        for file in named_chat_templates(folder):
            files[f"{CHAT_TEMPLATES_FOLDER}/{file.name}"] = file
    return files


def _class_vocabulary_files(folder: Path, tokenizer_class: type | None) -> list[str]:
    """The file names `tokenizer_class` (else the class the folder's configuration names) reads
    its vocabulary from, and the fast tokenizer files tokenizer_config.json names; [] where
    transformers is not installed or does not know the class."""
    config = _json_object(folder / "tokenizer_config.json")
    fast = config.get("fast_tokenizer_files")
    names = [name for name in fast if isinstance(name, str)] if isinstance(fast, list) else []
    if tokenizer_class is None:
        tokenizer_class = _named_tokenizer_class(folder, config)
    vocab_files = getattr(tokenizer_class, "vocab_files_names", None)
    if isinstance(vocab_files, dict):
        names += [name for name in vocab_files.values() if isinstance(name, str)]
    # Only plain names: a name reaching outside the folder is not the tokenizer's to copy.
    return [name for name in names if Path(name).name == name and name not in ("", ".", "..")]


def _named_tokenizer_class(folder: Path, config: dict[str, Any]) -> type | None:
    name = config.get("tokenizer_class")
    try:
        from transformers.models.auto import tokenization_auto
    except Exception:  # no (working) transformers: the fixed names and the patterns
        return None
    if not isinstance(name, str):  # AutoTokenizer's next guess: the model type's tokenizer
        model_type = _json_object(folder / "config.json").get("model_type")
        mapping = tokenization_auto.TOKENIZER_MAPPING_NAMES
        name = mapping.get(model_type) if isinstance(model_type, str) else None
        if isinstance(name, (tuple, list)):  # transformers 4: (slow, fast)
            name = next((n for n in name if n), None)
    if not isinstance(name, str):
        return None
    try:
        return tokenization_auto.tokenizer_class_from_name(name) or (
            tokenization_auto.tokenizer_class_from_name(name.removesuffix("Fast"))
        )
    except Exception:  # a class transformers cannot import here: it could not load it either
        return None


def _json_object(path: Path) -> dict[str, Any]:
    try:
        value = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError, RecursionError):
        return {}
    return value if isinstance(value, dict) else {}


# The files that hold a vocabulary (one of them must exist): the fast tokenizer's, a
# sentencepiece model, a BPE or WordPiece vocabulary.
VOCABULARY_FILES = ("tokenizer.json", "tokenizer.model", "vocab.json", "vocab.txt")


def _has_vocabulary_file(folder: Path) -> bool:
    """Whether `folder` holds a vocabulary: one of VOCABULARY_FILES, or another sentencepiece
    (`*.model`, e.g. spiece.model) or tiktoken (`*.tiktoken`) file that a tokenizer class reads."""
    if any((folder / name).is_file() for name in VOCABULARY_FILES):
        return True
    return any(p.is_file() for pattern in ("*.model", "*.tiktoken") for p in folder.glob(pattern))


def _sha256_text(text: str) -> str:
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


def _vocab_sha256(pairs: Sequence[tuple[str, int]]) -> str:
    """sha256 of the vocabulary as canonical JSON `[[token, id], ...]` sorted by id."""
    ordered = sorted(pairs, key=lambda item: (item[1], item[0]))
    return _sha256_text(json.dumps(ordered, ensure_ascii=False, separators=(",", ":")))


def folder_vocabulary(folder: str | Path) -> list[tuple[str, int]] | None:
    """The vocabulary, as (token, id) pairs, of the tokenizer saved in a model folder, loaded as
    a `tokenizer.path` is (AutoTokenizer, local files only), so that it hashes as an artifact
    prepared with it records (`vocab_sha256`). None where the folder holds no vocabulary file
    (a `dllm export` of a byte-level run, a folder of weights alone) or transformers cannot load
    it (no data was prepared with it then)."""
    folder = Path(folder)
    if not folder.is_dir() or not _has_vocabulary_file(folder):
        return None
    try:
        from transformers import AutoTokenizer
        from transformers.utils import logging as hf_logging

        hf_logging.set_verbosity_error()
        tokenizer = AutoTokenizer.from_pretrained(str(folder), local_files_only=True)
        return list(tokenizer.get_vocab().items())
    except Exception:  # no transformers, or a tokenizer it cannot load: nothing to compare
        return None


def vocabulary_fits(
    artifact: str | Path, vocab_sha256: str, pairs: Sequence[tuple[str, int]], also=()
) -> bool:
    """Whether data prepared into `artifact` (its tokenizer's recorded `vocab_sha256`) reads as
    the same text under the vocabulary `pairs` of a model folder's tokenizer: the same vocabulary
    (or one whose sha256 is in `also`), or one holding every (token, id) of the tokenizer copy
    the artifact keeps, and more (an instruct model's added chat tokens, a mask token added
    since)."""
    if vocab_sha256 == _vocab_sha256(pairs) or vocab_sha256 in also:
        return True
    prepared_with = folder_vocabulary(Path(artifact) / "tokenizer")
    return (
        prepared_with is not None
        and _vocab_sha256(prepared_with) == vocab_sha256
        and set(prepared_with) <= set(pairs)
    )


def has_generation_markers(template: str) -> bool:
    """True when a chat template marks assistant spans with `{% generation %}` blocks."""
    return bool(_GENERATION_MARKER.search(template))


class TextTokenizer(Protocol):
    kind: str
    vocab_size: int  # the artifact's: covers a mask_token_id past the tokenizer's own ids
    tokenizer_vocab_size: int  # the ids the tokenizer itself defines (what data may hold)
    text_vocab_size: int  # ids below this are what text encodes to (no special added token)
    special_tokens: dict[str, int]

    def encode_texts(self, texts: Sequence[str]) -> tuple[np.ndarray, np.ndarray]: ...

    def encode_chat(
        self, messages: list[dict[str, Any]], assistant_mask: bool
    ) -> tuple[np.ndarray, np.ndarray | None]: ...

    def decode(self, ids: Sequence[int]) -> str: ...

    def special_text(self, texts: Sequence[str]) -> list[str | None]: ...

    def identity(self) -> dict[str, Any]: ...

    def files(self) -> dict[str, Path]: ...


class ByteLevelTokenizer:
    """Ids 0..255 are the bytes of UTF-8 text; 256 <|bos|>, 257 <|eos|>, 258 <|pad|>, 259 <|mask|>.

    Text never produces a special token (the string "<|mask|>" is eight bytes), so any text is
    safe to train on.
    """

    kind = "byte_level"
    BOS, EOS, PAD, MASK = 256, 257, 258, 259
    vocab_size = tokenizer_vocab_size = 260
    text_vocab_size = 256
    special_tokens = {"bos": BOS, "eos": EOS, "pad": PAD, "mask": MASK}
    SPECIAL_NAMES = {BOS: "<|bos|>", EOS: "<|eos|>", PAD: "<|pad|>", MASK: "<|mask|>"}

    def encode(self, text: str) -> np.ndarray:
        return np.frombuffer(text.encode("utf-8"), dtype=np.uint8).astype(np.int64)

    def encode_texts(self, texts: Sequence[str]) -> tuple[np.ndarray, np.ndarray]:
        encoded = [t.encode("utf-8") for t in texts]
        lengths = np.fromiter((len(b) for b in encoded), dtype=np.int64, count=len(encoded))
        flat = np.frombuffer(b"".join(encoded), dtype=np.uint8).astype(np.int64)
        return flat, lengths

    def encode_chat(
        self, messages: list[dict[str, Any]], assistant_mask: bool
    ) -> tuple[np.ndarray, np.ndarray | None]:
        ids: list[np.ndarray] = []
        masks: list[np.ndarray] = []
        for message in messages:
            header = self.encode(f"<|{message['role']}|>\n")
            body = np.append(self.encode(message["content"]), self.EOS)
            ids += [header, body]
            supervised = message["role"] == "assistant"
            masks += [np.zeros(len(header), np.uint8), np.full(len(body), supervised, np.uint8)]
        flat = np.concatenate(ids) if ids else np.zeros(0, np.int64)
        if not assistant_mask:
            return flat, None
        return flat, np.concatenate(masks) if masks else np.zeros(0, np.uint8)

    def decode(self, ids: Sequence[int]) -> str:
        out: list[str] = []
        pending = bytearray()
        for i in ids:
            i = int(i)
            if i < 256:
                pending.append(i)
                continue
            out.append(pending.decode("utf-8", errors="replace"))
            pending.clear()
            out.append(self.SPECIAL_NAMES.get(i, f"<|{i}|>"))
        out.append(pending.decode("utf-8", errors="replace"))
        return "".join(out)

    def special_text(self, texts: Sequence[str]) -> list[str | None]:
        """No text ever encodes to a special token here, so there is nothing to find."""
        return [None] * len(texts)

    def identity(self) -> dict[str, Any]:
        tokens = [(f"<0x{i:02X}>", i) for i in range(256)]
        tokens += [(name, i) for i, name in self.SPECIAL_NAMES.items()]
        return {
            "kind": self.kind,
            "vocab_sha256": _vocab_sha256(tokens),
            "chat_template_sha256": _sha256_text(BYTE_CHAT_TEMPLATE),
        }

    def files(self) -> dict[str, Path]:
        return {}


# Where a tokenizer has no mask token, or one that is also its eos/pad/bos token.
_MASK_TOKEN_FIX = (
    "set tokenizer.mask_token to an unused token of its vocabulary, or "
    "tokenizer.mask_token_id to a spare id the model's embedding covers"
)


class HuggingFaceTokenizer:
    """A local tokenizer folder via `transformers.AutoTokenizer` (offline, no remote code).

    Encoding goes straight to the Rust `tokenizers` backend when there is one (same ids as the
    transformers call, without its per-batch Python overhead).
    """

    kind = "huggingface"

    def __init__(self, spec) -> None:
        path = Path(spec.path)
        if not path.is_dir():
            raise DllmError(
                f"tokenizer.path {str(path)!r} is a file, not a folder"
                if path.exists()
                else f"tokenizer folder not found: {str(path)!r}",
                hint="set tokenizer.path to a folder saved with save_pretrained, "
                "or use tokenizer {kind: byte_level}",
            )
        if not _has_vocabulary_file(path):
            # AutoTokenizer would build a tokenizer of a few special tokens from config.json
            # alone, and every text would encode to nothing.
            raise DllmError(
                f"the tokenizer folder {str(path)!r} has no tokenizer files: none of "
                + ", ".join(VOCABULARY_FILES),
                hint="point tokenizer.path at a folder the tokenizer was saved into "
                "(save_pretrained), or use tokenizer {kind: byte_level}",
            )
        try:
            from transformers import AutoTokenizer
            from transformers.utils import logging as hf_logging
        except ImportError as error:
            raise DllmError(
                f"a huggingface tokenizer needs transformers: {error}",
                hint="pip install 'turbo-dllm[data]'",
            ) from None
        hf_logging.set_verbosity_error()
        try:
            self._tok = AutoTokenizer.from_pretrained(str(path), local_files_only=True)
        except Exception as error:  # transformers raises many types for a bad folder
            raise DllmError(
                f"cannot load the tokenizer at {str(path)!r}: {error}",
                hint="the folder needs tokenizer.json / tokenizer_config.json (save_pretrained)",
            ) from None
        self._path = path
        self._backend = getattr(self._tok, "backend_tokenizer", None)
        # Added tokens marked special are what the tokenizer turns a literal string into.
        literals = {t.content for t in self._tok.added_tokens_decoder.values() if t.special}
        longest_first = sorted(literals, key=lambda t: (-len(t), t))
        self._special_pattern = (
            re.compile("|".join(map(re.escape, longest_first))) if longest_first else None
        )
        self._split_special = spec.special_tokens_in_text != "control"
        vocab = self._tok.get_vocab()
        self._vocab_pairs = list(vocab.items())
        tokenizer_vocab = max(vocab.values()) + 1 if vocab else 0
        self.special_tokens = self._resolve_specials(spec, vocab)
        self.tokenizer_vocab_size = tokenizer_vocab
        # The ids text encodes to: all but the special added tokens (control tokens, often
        # past the rest); an added token that is not special (`<think>`) is text's too.
        control = {i for i, t in self._tok.added_tokens_decoder.items() if t.special}
        self.text_vocab_size = max((i for i in vocab.values() if i not in control), default=-1) + 1
        self.vocab_size = max(tokenizer_vocab, self.special_tokens["mask"] + 1)
        template = self._tok.chat_template
        if isinstance(template, dict):
            template = template.get("default")
        self.chat_template: str | None = template

    def _resolve_specials(self, spec, vocab: dict[str, int]) -> dict[str, int]:
        def token_id(role: str, configured: str | None, fallback: str | None) -> int | None:
            token = configured if configured is not None else fallback
            if token is None:
                return None
            if token not in vocab:
                raise DllmError(
                    f"{role} token {token!r} is not in the vocabulary of {str(self._path)!r}",
                    hint=f"set tokenizer.{role}_token to a token of this tokenizer",
                )
            return vocab[token]

        tok = self._tok
        eos = token_id("eos", spec.eos_token, tok.eos_token)
        if eos is None:
            raise DllmError(
                f"the tokenizer at {str(self._path)!r} has no eos token",
                hint="set tokenizer.eos_token to the token that ends a document",
            )
        pad = token_id("pad", spec.pad_token, tok.pad_token)
        bos = token_id("bos", spec.bos_token, tok.bos_token)
        if spec.mask_token_id is not None:
            mask = spec.mask_token_id
        else:
            mask = token_id("mask", spec.mask_token, tok.mask_token)
        if mask is None:
            raise DllmError(
                f"the tokenizer at {str(self._path)!r} has no mask token",
                hint=_MASK_TOKEN_FIX,
            )
        if mask in (eos, pad, bos):
            shared = [role for role, i in (("eos", eos), ("pad", pad), ("bos", bos)) if i == mask]
            # The setting to change: one that prepare.yaml set to the mask token, else the mask.
            chosen = [role for role in shared if getattr(spec, f"{role}_token") is not None]
            mask_set = spec.mask_token is not None or spec.mask_token_id is not None
            what = f"{self._tok.convert_ids_to_tokens(mask)!r} (id {mask})"
            if chosen and not mask_set:
                hint = (
                    f"set tokenizer.{chosen[0]}_token to another token than the mask token (or "
                    "leave it out for the tokenizer's own)"
                )
            else:
                hint = _MASK_TOKEN_FIX
            raise DllmError(
                f"the mask token {what} is also the {' and '.join(shared)} token: diffusion "
                "needs a mask token that means nothing else",
                hint=hint,
            )
        specials = {"eos": eos, "pad": eos if pad is None else pad, "mask": mask}
        if bos is not None:
            specials["bos"] = bos
        return specials

    def encode_texts(self, texts: Sequence[str]) -> tuple[np.ndarray, np.ndarray]:
        """Ids of plain texts; a special token's literal string stays text unless the spec says
        `special_tokens_in_text: control`."""
        if self._backend is not None:
            # Set on every call: transformers resets it whenever it encodes (chat templates).
            self._backend.encode_special_tokens = self._split_special
            encodings = self._backend.encode_batch_fast(list(texts), add_special_tokens=False)
            id_lists = [e.ids for e in encodings]
        else:
            id_lists = self._tok(
                list(texts), add_special_tokens=False, split_special_tokens=self._split_special
            )["input_ids"]
        lengths = np.fromiter(map(len, id_lists), dtype=np.int64, count=len(id_lists))
        flat = np.fromiter(
            itertools.chain.from_iterable(id_lists), dtype=np.int64, count=int(lengths.sum())
        )
        return flat, lengths

    def encode_chat(
        self, messages: list[dict[str, Any]], assistant_mask: bool
    ) -> tuple[np.ndarray, np.ndarray | None]:
        out = self._tok.apply_chat_template(
            messages,
            tokenize=True,
            return_dict=True,
            return_assistant_tokens_mask=assistant_mask,
        )
        ids = np.asarray(out["input_ids"], dtype=np.int64)
        if not assistant_mask:
            return ids, None
        return ids, np.asarray(out["assistant_masks"], dtype=np.uint8)

    def decode(self, ids: Sequence[int]) -> str:
        return self._tok.decode([int(i) for i in ids], skip_special_tokens=False)

    def special_text(self, texts: Sequence[str]) -> list[str | None]:
        """The first special token literal (`<|endoftext|>`) found in each text, else None."""
        pattern = self._special_pattern
        # One search over the whole batch first: most batches hold none.
        if pattern is None or not pattern.search("\x00".join(texts)):
            return [None] * len(texts)
        return [m.group() if (m := pattern.search(t)) else None for t in texts]

    def identity(self) -> dict[str, Any]:
        return {
            "kind": self.kind,
            "vocab_sha256": _vocab_sha256(self._vocab_pairs),
            "chat_template_sha256": _sha256_text(self.chat_template)
            if self.chat_template
            else None,
        }

    def files(self) -> dict[str, Path]:
        """The tokenizer's own files by their path in its folder (its named chat templates'
        under additional_chat_templates/), copied verbatim into the artifact for `inspect` (and
        for export, which copies them beside a model trained on the artifact)."""
        return tokenizer_folder_files(self._path, type(self._tok))


def load_tokenizer(spec) -> ByteLevelTokenizer | HuggingFaceTokenizer:
    """The tokenizer a `tokenizer:` section names."""
    if spec.kind == "byte_level":
        return ByteLevelTokenizer()
    return HuggingFaceTokenizer(spec)
