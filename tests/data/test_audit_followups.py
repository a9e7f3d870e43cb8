"""Follow-ups of the data-preparation audit: each test failed before its fix."""

from __future__ import annotations

import json

import numpy as np
import pytest

from tests.data.helpers import prepare_config, write_config, write_jsonl
from tests.helpers import assert_failed_check, assert_user_error
from turbo_dllm.errors import DllmError

# --- the tokenizer's named chat templates travel with the artifact ---------------------------

DEFAULT = "{% for m in messages %}<{{ m.role }}>{{ m.content }}{% endfor %}"
TOOL_USE = "TOOLS{% for m in messages %}[{{ m.content }}]{% endfor %}"
MESSAGES = [{"role": "user", "content": "the fox"}]


@pytest.fixture
def templated_tokenizer(hf_tokenizer, tmp_path):
    """The test tokenizer saved with a default and a named (`tool_use`) chat template, as
    transformers saves them: chat_template.jinja and additional_chat_templates/tool_use.jinja."""
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(str(hf_tokenizer))
    tokenizer.chat_template = {"default": DEFAULT, "tool_use": TOOL_USE}
    folder = tmp_path / "templated"
    tokenizer.save_pretrained(str(folder))
    assert (folder / "additional_chat_templates/tool_use.jinja").is_file()
    return folder


def _prepared(tmp_path, tokenizer_folder):
    write_jsonl(tmp_path / "data.jsonl", [{"text": "the quick brown fox"}] * 4)
    tokenizer = {"kind": "huggingface", "path": str(tokenizer_folder)}
    return prepare_config(write_config(tmp_path, tokenizer=tokenizer)).path


def test_the_artifact_keeps_the_tokenizer_s_named_chat_templates(tmp_path, templated_tokenizer):
    """Only the top level of the tokenizer folder was copied into the artifact's tokenizer/:
    a tokenizer loaded from it had lost its named templates, and
    `apply_chat_template(chat_template="tool_use")` returned the literal text "tool_use"."""
    from transformers import AutoTokenizer

    artifact = _prepared(tmp_path, templated_tokenizer)
    copy = artifact / "tokenizer/additional_chat_templates/tool_use.jinja"
    assert (
        copy.read_bytes()
        == (templated_tokenizer / "additional_chat_templates/tool_use.jinja").read_bytes()
    )
    listed = json.loads((artifact / "manifest.json").read_text())["tokenizer_files"]
    assert "additional_chat_templates/tool_use.jinja" in listed
    assert "tokenizer.json" in listed
    loaded = AutoTokenizer.from_pretrained(str(artifact / "tokenizer"), local_files_only=True)
    assert loaded.apply_chat_template(MESSAGES, tokenize=False) == "<user>the fox"
    tools = loaded.apply_chat_template(MESSAGES, tokenize=False, chat_template="tool_use")
    assert tools == "TOOLS[the fox]"


def test_export_hands_on_the_artifact_s_named_chat_templates(tmp_path, templated_tokenizer):
    """A model trained without model.path is exported with the artifact's tokenizer copy: its
    named templates go beside the model in additional_chat_templates/, as they were."""
    from types import SimpleNamespace

    from transformers import AutoTokenizer

    from turbo_dllm.train.export import _copy_generation_files

    artifact = _prepared(tmp_path, templated_tokenizer)
    folder = tmp_path / "export"
    folder.mkdir()
    (folder / "config.json").write_text("{}")
    meta = SimpleNamespace(model_path=None, data_artifact=str(artifact), data_fingerprint=None)
    _copy_generation_files(meta, folder)
    assert (folder / "additional_chat_templates/tool_use.jinja").is_file()
    assert not (folder / "tool_use.jinja").exists()
    exported = AutoTokenizer.from_pretrained(str(folder), local_files_only=True)
    tools = exported.apply_chat_template(MESSAGES, tokenize=False, chat_template="tool_use")
    assert tools == "TOOLS[the fox]"


def test_validate_checks_the_named_chat_templates(cli, tmp_path, templated_tokenizer):
    """The copied templates are listed with their sha256 like the top-level files: validate
    passes the artifact as written, and names a template that changed, went missing, or was
    added after prepare."""
    artifact = _prepared(tmp_path, templated_tokenizer)
    folder = artifact / "tokenizer/additional_chat_templates"
    assert cli("data", "validate", artifact).code == 0
    assert cli("data", "inspect", artifact).code == 0

    original = (folder / "tool_use.jinja").read_bytes()
    (folder / "tool_use.jinja").write_text("TOOLS{{ messages }}")
    assert_failed_check(
        cli("data", "validate", artifact),
        "tokenizer/additional_chat_templates/tool_use.jinja: changed",
    )
    assert_user_error(cli("data", "inspect", artifact), "tool_use.jinja is missing or changed")
    (folder / "tool_use.jinja").unlink()
    assert_failed_check(
        cli("data", "validate", artifact),
        "tokenizer/additional_chat_templates/tool_use.jinja: missing",
    )
    (folder / "tool_use.jinja").write_bytes(original)
    (folder / "rag.jinja").write_text("RAG")
    outcome = cli("data", "validate", artifact)
    assert_failed_check(
        outcome, "tokenizer/additional_chat_templates/rag.jinja: not listed in the manifest"
    )
    assert "tool_use.jinja" not in outcome.out + outcome.err
    (folder / "rag.jinja").unlink()
    assert cli("data", "validate", artifact).code == 0


def test_a_templates_folder_the_manifest_does_not_list_is_flagged(cli, tmp_path, hf_tokenizer):
    """A tokenizer without named templates: an additional_chat_templates/ put into the
    artifact's tokenizer/ afterwards would be loaded (and exported) as its own."""
    artifact = _prepared(tmp_path, hf_tokenizer)
    assert not (artifact / "tokenizer/additional_chat_templates").exists()
    (artifact / "tokenizer/additional_chat_templates").mkdir()
    (artifact / "tokenizer/additional_chat_templates/tool_use.jinja").write_text("X")
    assert_failed_check(
        cli("data", "validate", artifact),
        "tokenizer/additional_chat_templates: not listed in the manifest",
    )


@pytest.mark.parametrize(
    "name", ["../manifest.json", "additional_chat_templates/../../tokens.bin", "a/b.jinja"]
)
def test_a_listed_tokenizer_file_outside_its_folder_is_refused(cli, tmp_path, hf_tokenizer, name):
    """A manifest may list files of tokenizer/ and of tokenizer/additional_chat_templates/
    only: any other name is reported, never read."""
    from turbo_dllm.data.artifact import tokenizer_file

    assert tokenizer_file(tmp_path, name) is None
    assert tokenizer_file(tmp_path, "tokenizer.json") == tmp_path / "tokenizer/tokenizer.json"
    artifact = _prepared(tmp_path, hf_tokenizer)
    path = artifact / "manifest.json"
    manifest = json.loads(path.read_text())
    manifest["tokenizer_files"][name] = manifest["tokenizer_files"]["tokenizer.json"]
    path.write_text(json.dumps(manifest))
    assert_failed_check(cli("data", "validate", artifact), f"tokenizer/{name}: missing")


# --- a separator id a token id file cannot hold -----------------------------------------------

EOS_PAST_UINT16 = 65_536


@pytest.fixture(scope="module")
def eos_past_uint16(tmp_path_factory):
    """A word-level tokenizer whose words are ids 0..99 and whose eos is 65,536: its text ids
    fit uint16, its eos does not."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {f"w{i}": i for i in range(100)}
    vocab.update({"<unk>": 100, "<mask>": 101, "<eos>": EOS_PAST_UINT16})
    tok = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    wrapped = PreTrainedTokenizerFast(
        tokenizer_object=tok, eos_token="<eos>", mask_token="<mask>", unk_token="<unk>"
    )
    folder = tmp_path_factory.mktemp("eos") / "tokenizer"
    wrapped.save_pretrained(str(folder))
    return folder


@pytest.mark.parametrize("name", ["ids.bin", "ids.npy"])
def test_a_separator_the_id_file_cannot_hold_is_refused(tmp_path, eos_past_uint16, name):
    """Text ids that fit uint16 passed the width check, but the eos separator 65,536 cannot be
    in a uint16 file: written there it wrapped around to 0 (w0), the split never happened, and
    the file was prepared as one document with a stray w0 where each separator was."""
    ids = np.array([1, 2, EOS_PAST_UINT16, 3, 4], dtype=np.int64)
    wrapped = ids.astype(np.uint16)  # 1, 2, 0, 3, 4
    if name.endswith(".npy"):
        np.save(tmp_path / name, wrapped)
    else:
        wrapped.tofile(tmp_path / name)
    source = {
        "kind": "token_ids",
        "paths": [name],
        "dtype": "uint16",
        "document_separator_id": EOS_PAST_UINT16,
    }
    tokenizer = {"kind": "huggingface", "path": str(eos_past_uint16)}
    config = write_config(tmp_path, source=source, tokenizer=tokenizer)
    with pytest.raises(DllmError) as caught:
        prepare_config(config)
    assert f"{name}: " in caught.value.message
    assert "document_separator_id is 65,536" in caught.value.message
    assert "uint32" in caught.value.hint
    assert not (tmp_path / "out").exists()

    # Written as uint32 the separator is there, and the file is its two documents.
    from tests.data.helpers import documents

    np.save(tmp_path / "wide.npy", ids.astype(np.uint32))
    source = {"kind": "token_ids", "paths": ["wide.npy"], "document_separator_id": 65_536}
    config = write_config(tmp_path, source=source, tokenizer=tokenizer)
    assert [t.tolist() for t, _ in documents(prepare_config(config).path)] == [
        [1, 2, EOS_PAST_UINT16],
        [3, 4, EOS_PAST_UINT16],
    ]

    # A 2-D uint16 array (a document per row) needs no separator: it is read as before.
    np.save(tmp_path / "rows.npy", np.array([[1, 2], [3, 4]], np.uint16))
    source = {"kind": "token_ids", "paths": ["rows.npy"], "document_separator_id": 65_536}
    config = write_config(tmp_path, source=source, tokenizer=tokenizer, output={"path": "rows"})
    assert len(documents(prepare_config(config).path)) == 2


# --- UTF-16 text without a byte order mark ----------------------------------------------------

TEXT = "The quick brown fox jumps over the lazy dog.\nRivers flow to the sea.\n" * 3


@pytest.mark.parametrize(
    ("name", "source"),
    [
        ("a.txt", {"kind": "text", "unit": "line"}),
        ("a.txt", {"kind": "text", "unit": "document"}),
        ("a.txt.gz", {"kind": "text", "unit": "line"}),
        ("a.jsonl", {"kind": "jsonl"}),
    ],
)
@pytest.mark.parametrize("encoding", ["UTF-16LE", "UTF-16BE", "UTF-32LE"])
def test_unmarked_utf16_text_is_refused_naming_the_file_and_the_fix(
    tmp_path, name, source, encoding
):
    """UTF-16 without a byte order mark (Python's 'utf-16-le', .NET's Encoding.Unicode) is
    valid UTF-8 when its text is ASCII: it was prepared without a word as text with a NUL
    between every character (`T\\x00h\\x00e\\x00 ...`)."""
    import gzip

    text = TEXT if name != "a.jsonl" else '{"text": "hello"}\n{"text": "world"}\n' * 4
    data = text.encode(encoding.lower().replace("utf-", "utf_"))
    assert not data.startswith((b"\xff\xfe", b"\xfe\xff"))
    (tmp_path / name).write_bytes(gzip.compress(data) if name.endswith(".gz") else data)
    config = write_config(tmp_path, source={**source, "paths": [name]}, on_error="skip")
    with pytest.raises(DllmError) as caught:
        prepare_config(config)
    assert f"{tmp_path / name}: " in caught.value.message
    assert f"looks like {encoding} text without a byte order mark" in caught.value.message
    assert f"iconv -f {encoding} -t UTF-8" in caught.value.hint
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize(
    ("name", "builder", "data"),
    [
        ("a.txt", None, TEXT.encode("utf_16_le")),
        ("a.txt.gz", "text", TEXT.encode("utf_16_be")),
        ("a.jsonl", "json", '{"text": "hello"}\n{"text": "world"}\n'.encode("utf_16") * 4),
    ],
    ids=["text-unmarked", "text-gz-named", "json-with-mark"],
)
def test_utf16_data_files_of_a_huggingface_source_are_refused_before_loading(
    tmp_path, name, builder, data
):
    """datasets' text builder read UTF-16 without a byte order mark as UTF-8 without a word:
    the artifact held a NUL between every character. Its data files are checked as the text
    source's are (a UTF-16 JSON file also got datasets' own UnicodeDecodeError before)."""
    import gzip

    (tmp_path / name).write_bytes(gzip.compress(data) if name.endswith(".gz") else data)
    source = {"kind": "huggingface", "data_files": [name]}
    if builder is not None:
        source["name"] = builder
    config = write_config(tmp_path, source=source)
    with pytest.raises(DllmError) as caught:
        prepare_config(config)
    assert caught.value.message.startswith(f"{tmp_path / name}: "), caught.value.message
    assert "UTF-16" in caught.value.message and "iconv -f UTF-16" in caught.value.hint
    assert not (tmp_path / "out").exists()


def test_text_with_an_occasional_nul_is_still_prepared(tmp_path):
    """A NUL here and there is text (the audit's Unicode edge cases hold some): kept as is."""
    from tests.data.helpers import documents

    lines = ["a\x00b", "x" * 40 + "\x00" * 3 + "y" * 40, "naïve café 中文 \x00", "\x00"]
    (tmp_path / "a.txt").write_text("\n".join(lines) + "\n", encoding="utf-8")
    (tmp_path / "short.txt").write_bytes(b"x\x00y")
    write_jsonl(tmp_path / "data.jsonl", [{"text": line} for line in lines])
    for paths, source in (
        (["a.txt"], {"kind": "text", "unit": "line"}),
        (["a.txt", "short.txt"], {"kind": "text", "unit": "document"}),
        (["data.jsonl"], {"kind": "jsonl"}),
    ):
        config = write_config(tmp_path, source={**source, "paths": paths})
        result = prepare_config(config, ["output.overwrite=true"])
        texts = [bytes(t[:-1].tolist()).decode() for t, _ in documents(result.path)]
        if source.get("unit") == "document":
            assert texts == ["\n".join(lines) + "\n", "x\x00y"]
        else:
            assert texts == lines
