"""Strict records (`turbo_dllm.records`): the formats on the install path validate like
`extra="forbid"` pydantic models, collect every problem with its location, and round-trip."""

from __future__ import annotations

import json
import pickle

import pytest

from turbo_dllm.bundles.catalog import Catalog, CatalogEntry, ReleasePin, ReleasesLock
from turbo_dllm.bundles.manifest import BundleFile, canonical_version
from turbo_dllm.bundles.store import InstallRecord
from turbo_dllm.bundles.target import BundleTarget
from turbo_dllm.host import GpuArch, GpuInfo, HostFingerprint, collect_fingerprint
from turbo_dllm.records import RecordError

TARGET = "cp312-torch2.11-cpu-cxx11-linux_x86_64"
ENTRY = {
    "target": TARGET,
    "version": "0.1.0",
    "file": f"turbo-dllm-kernels-0.1.0-{TARGET}.tar.zst",
    "size": 10,
    "sha256": "a" * 64,
}


def problems(error: RecordError) -> dict[str, str]:
    return dict(error.problems)


def test_every_problem_is_reported_with_its_location():
    bad = {
        "format": "turbo_dllm.catalog.v2",
        "bundles": [{**ENTRY, "size": "10", "sha256": "XYZ", "extra": 1}, {"target": "nope"}],
        "surplus": True,
    }
    with pytest.raises(RecordError) as caught:
        Catalog.model_validate(bad)
    found = problems(caught.value)
    assert "'turbo_dllm.catalog.v2'" in found["format"]
    assert found["bundles.0.size"] == "expected an integer, got str '10'"
    assert "not a sha256 hex digest" in found["bundles.0.sha256"]
    assert found["bundles.0.extra"] == "unknown field"
    assert "invalid bundle target" in found["bundles.1.target"]
    assert found["bundles.1.version"] == "field required"
    assert found["surplus"] == "unknown field"
    assert found["release"] == "field required"
    assert str(caught.value).startswith("format: must be 'turbo_dllm.catalog.v1'")


@pytest.mark.parametrize(
    ("field", "value", "message"),
    [
        ("size", True, "expected an integer, got bool True"),  # a bool is not an int
        ("size", 1.0, "expected an integer, got float 1.0"),
        ("size", 0, "must be > 0"),
        ("version", "not a version", "invalid version"),
        ("file", "renamed.tar.zst", "should be"),
        ("target", 3, "expected a BundleTarget string"),
    ],
)
def test_field_types_are_not_coerced(field, value, message):
    with pytest.raises(RecordError, match=message):
        CatalogEntry.model_validate({**ENTRY, field: value})


def test_checks_normalize_and_values_round_trip():
    entry = CatalogEntry.model_validate({**ENTRY, "version": "v0.1.0"})
    assert entry.version == "0.1.0"  # canonical PEP 440 spelling
    assert entry.target == BundleTarget.parse(TARGET)
    dumped = entry.model_dump(mode="json")
    assert dumped == {**ENTRY, "target": TARGET}
    assert CatalogEntry.model_validate(json.loads(json.dumps(dumped))) == entry
    assert entry.model_dump()["target"] == entry.target  # python mode keeps the typed values


@pytest.mark.parametrize(
    "text",
    ["0", "0.1.0", "10.20.30", "2026.12.2", "01.0", "1.00", "v1.0", "1.0a1", "1.0.POST1",
     "1.0.post64", "1.0+local", "1.0\n", " 1.0", "1.0rc1", "1.0b0.post2.dev3", "1.0.dev0",
     "1.0a01", "1.0c1", "1.0-post1", "1.0post1", "1.0.post", "1.0alpha1", "0!1.0", "1!1.0",
     "1.0.RC1", "1.0.a1", "1.0rc1.dev1+g1"],
)  # fmt: skip
def test_canonical_version_agrees_with_packaging(text):
    """Versions already in canonical form skip packaging (the install path does not import it);
    the answer is packaging's canonical spelling either way."""
    from packaging.version import Version

    assert canonical_version(text) == str(Version(text))


@pytest.mark.parametrize(
    "text", ["0.1.0", "2026.12.2", "1.0rc1", "0.1.0.post64", "1.0a1.post2.dev3", "1.0.dev0"]
)
def test_canonical_versions_skip_packaging(text, monkeypatch):
    """What the fast path accepts is checked without packaging (a blocked import would fail)."""
    import sys

    monkeypatch.setitem(sys.modules, "packaging.version", None)
    assert canonical_version(text) == text
    with pytest.raises(ImportError):
        canonical_version("1.0.POST1")  # not canonical: needs packaging


@pytest.mark.parametrize("text", ["", "1.", ".1", "1..0", "1_0", "one", "\u0661.\u0660"])
def test_canonical_version_refuses_what_packaging_refuses(text):
    from packaging.version import InvalidVersion, Version

    with pytest.raises(InvalidVersion):
        Version(text)
    with pytest.raises(ValueError, match="invalid version"):
        canonical_version(text)


def test_records_are_immutable_values():
    entry = CatalogEntry.model_validate(ENTRY)
    with pytest.raises(AttributeError, match="immutable"):
        entry.size = 11  # type: ignore[misc]
    same = CatalogEntry.model_validate(dict(ENTRY))
    assert entry == same and hash(entry) == hash(same) and len({entry, same}) == 1
    bigger = entry.model_copy(update={"size": 11})
    assert bigger.size == 11 and entry.size == 10
    with pytest.raises(RecordError, match="must be > 0"):
        entry.model_copy(update={"size": -1})  # a copy is validated like a new record
    assert pickle.loads(pickle.dumps(entry)) == entry
    assert "size=10" in repr(entry)


def test_keyword_construction_validates_and_applies_defaults():
    lock = ReleasesLock(releases={"v1": ReleasePin(catalog_sha256="b" * 64)})
    assert lock.format == "turbo_dllm.releases.v1"
    assert ReleasesLock().releases == {} and ReleasesLock().releases is not lock.releases
    read = {"format": lock.format, "releases": {"v1": {"catalog_sha256": "b" * 64}}}
    assert ReleasesLock.model_validate(read) == lock
    with pytest.raises(RecordError, match=r"releases\.v1\.catalog_sha256: "):
        ReleasesLock.model_validate({**read, "releases": {"v1": {"catalog_sha256": "short"}}})
    with pytest.raises(TypeError, match="unknown fields"):
        ReleasePin(catalog_sha256="b" * 64, note="x")  # type: ignore[call-arg]
    with pytest.raises(RecordError, match="not a plain relative path"):
        BundleFile(path="../x", sha256="c" * 64, size=1)


def test_json_input_errors():
    with pytest.raises(RecordError, match="not valid JSON"):
        InstallRecord.model_validate_json(b"{")
    with pytest.raises(RecordError, match=r"\(top\): expected an object, got list"):
        InstallRecord.model_validate_json(b"[]")
    record = InstallRecord(archive_sha256="d" * 64, installed_at="2026-11-30T00:00:00Z")
    assert InstallRecord.model_validate_json(record.model_dump_json(indent=2)) == record


def test_fingerprint_is_a_strict_record():
    fingerprint = collect_fingerprint(environ={"DLLM_OVERRIDE_GPUS": "sm90,sm80"})
    data = fingerprint.model_dump(mode="json")
    assert data["gpus"][1] == {"index": 1, "name": "override sm80", "arch": "sm80"}
    assert HostFingerprint.model_validate(data) == fingerprint
    with pytest.raises(RecordError) as caught:
        HostFingerprint.model_validate({**data, "cxx11_abi": 1, "gpus": [{"index": 0}], "x": 0})
    found = problems(caught.value)
    assert found["cxx11_abi"] == "expected true or false, got int 1"
    assert found["gpus.0.name"] == "field required" and found["gpus.0.arch"] == "field required"
    assert found["x"] == "unknown field"
    with pytest.raises(RecordError, match="index: must be >= 0"):
        GpuInfo(index=-1, name="x", arch=GpuArch(9, 0))
