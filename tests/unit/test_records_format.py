"""A versioned file read back must say its format, even where the record class defaults it.

The catalog, the releases lock, bundle.json, install.json, pack.json and the host fingerprint
default `format` so that code can build them; reading one without the key accepted it (found by
the architecture audit: `parse_catalog(b'release = "v9"\\n', ...)` returned a Catalog).
"""

from __future__ import annotations

import pytest

from turbo_dllm.bundles.catalog import Catalog, ReleasesLock, parse_catalog
from turbo_dllm.records import RecordError


def test_a_catalog_without_its_format_line_is_refused():
    with pytest.raises(Exception, match="format"):
        parse_catalog(b'release = "v9"\n', "catalog.toml")
    document = {"format": "turbo_dllm.catalog.v1", "release": "v9"}
    assert parse_catalog(b'format = "turbo_dllm.catalog.v1"\nrelease = "v9"\n', "c").release == "v9"
    assert Catalog.model_validate(document).release == "v9"


@pytest.mark.parametrize("record", [Catalog(release="v9"), ReleasesLock()])
def test_every_defaulted_format_is_required_when_read(record):
    document = record.model_dump(mode="json")
    assert type(record).model_validate(document) == record  # as written: read back
    del document["format"]
    with pytest.raises(RecordError, match="format: field required"):
        type(record).model_validate(document)
    # code still builds one without naming it
    assert record.format in ("turbo_dllm.catalog.v1", "turbo_dllm.releases.v1")
