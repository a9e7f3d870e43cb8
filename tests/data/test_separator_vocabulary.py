"""A `document_separator_id` outside the tokenizer's vocabulary: no valid file of its token ids
can hold it, so every file was prepared as one document without a word. Refused up front."""

from __future__ import annotations

import numpy as np
import pytest

from tests.data.helpers import documents, prepare_config, write_config
from turbo_dllm.errors import DllmError


def test_a_separator_outside_the_vocabulary_is_refused_before_any_work(tmp_path):
    # the built-in byte-level tokenizer: ids 0..259
    np.save(tmp_path / "ids.npy", np.array([1, 2, 3, 4, 5, 6], dtype=np.uint32))
    source = {"kind": "token_ids", "paths": ["ids.npy"], "document_separator_id": 50_000}
    config = write_config(tmp_path, source=source)
    with pytest.raises(DllmError) as caught:
        prepare_config(config)
    assert "document_separator_id 50,000 is outside the tokenizer's vocabulary" in str(
        caught.value
    )
    assert not (tmp_path / "out").exists()

    # One inside it splits the file as before.
    source["document_separator_id"] = 3
    config = write_config(tmp_path, source=source)
    assert len(documents(prepare_config(config).path)) == 2
