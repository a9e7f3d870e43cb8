"""Typed identifiers parse many spellings and print one canonical form (round trip)."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st
from pydantic import BaseModel, ValidationError

from turbo_dllm.bundles.target import BundleTarget
from turbo_dllm.errors import DllmError
from turbo_dllm.host import (
    CudaVersion,
    GpuArch,
    InvalidIdentifier,
    Platform,
    PythonTag,
    TorchRelease,
)


@pytest.mark.parametrize(
    ("cls", "text", "canonical"),
    [
        (PythonTag, "3.12", "cp312"),
        (PythonTag, "cp310", "cp310"),
        (PythonTag, "cp313t", "cp313t"),
        (GpuArch, "sm_90", "sm90"),
        (GpuArch, "9.0", "sm90"),
        (GpuArch, "90a", "sm90a"),
        (GpuArch, "sm100", "sm100"),
        (TorchRelease, "2.11.0+cu130", "torch2.11"),
        (TorchRelease, "torch2.9", "torch2.9"),
        (CudaVersion, "13.0", "cu130"),
        (CudaVersion, "cu128", "cu128"),
        (CudaVersion, "12.8.1", "cu128"),
        (Platform, "linux-x86_64", "linux_x86_64"),
    ],
)
def test_parse_prints_canonical_form(cls, text, canonical):
    value = cls.parse(text)
    assert str(value) == canonical
    assert cls.parse(str(value)) == value


@pytest.mark.parametrize(
    ("cls", "text"),
    [
        (PythonTag, "python3"),
        (GpuArch, "hopper"),
        (TorchRelease, "latest"),
        (CudaVersion, "cuda"),
        (Platform, "linux"),
    ],
)
def test_invalid_identifier_names_the_input(cls, text):
    with pytest.raises(InvalidIdentifier) as caught:
        cls.parse(text)
    assert repr(text) in caught.value.message
    assert isinstance(caught.value, DllmError) and isinstance(caught.value, ValueError)


def test_identifier_is_a_pydantic_field_type():
    class Model(BaseModel):
        arch: GpuArch
        target: BundleTarget

    model = Model(arch="9.0", target="cp312-torch2.11-cu130-cxx11-linux_x86_64-sm90")
    assert model.arch == GpuArch(9, 0)
    assert model.model_dump(mode="json") == {
        "arch": "sm90",
        "target": "cp312-torch2.11-cu130-cxx11-linux_x86_64-sm90",
    }
    with pytest.raises(ValidationError, match="invalid GPU architecture"):
        Model(arch="volta", target="cp312-torch2.11-cpu-cxx11-linux_x86_64")


def test_bundle_target_fields():
    target = BundleTarget.parse("cp312-torch2.11-cu130-cxx11-linux_x86_64-sm90+sm80")
    assert target.python == PythonTag.parse("cp312")
    assert target.torch == TorchRelease(2, 11)
    assert target.cuda == CudaVersion(13, 0)
    assert target.cxx11_abi is True
    assert target.archs == (GpuArch(8, 0), GpuArch(9, 0))  # sorted: one canonical form
    assert str(target) == "cp312-torch2.11-cu130-cxx11-linux_x86_64-sm80+sm90"
    cpu = BundleTarget.parse("cp311-torch2.13-cpu-cxx98-linux_aarch64")
    assert cpu.kind == "cpu" and cpu.cxx11_abi is False and cpu.archs == ()


@pytest.mark.parametrize(
    "text",
    [
        "cp312-torch2.11-cu130-cxx11-linux_x86_64",  # CUDA without architectures
        "cp312-torch2.11-cpu-cxx11-linux_x86_64-sm90",  # CPU with architectures
        "cp312-2.11-cpu-cxx11-linux_x86_64",  # torch field without its prefix
        "cp312-torch2.11-cpu-abi1-linux_x86_64",
        "cp312-torch2.11-cpu",
    ],
)
def test_bundle_target_rejects_malformed(text):
    with pytest.raises(InvalidIdentifier):
        BundleTarget.parse(text)


pythons = st.builds(
    PythonTag, st.just("cp"), st.integers(3, 3), st.integers(8, 14), st.sampled_from(["", "t"])
)
archs = st.lists(
    st.builds(GpuArch, st.integers(7, 12), st.integers(0, 9), st.sampled_from(["", "a"])),
    min_size=1,
    max_size=3,
)


@given(
    python=pythons,
    torch=st.builds(TorchRelease, st.integers(1, 3), st.integers(0, 20)),
    cuda=st.one_of(st.none(), st.builds(CudaVersion, st.integers(10, 13), st.integers(0, 9))),
    abi=st.booleans(),
    platform=st.sampled_from(["linux_x86_64", "linux_aarch64"]),
    arch_list=archs,
)
def test_bundle_target_round_trips(python, torch, cuda, abi, platform, arch_list):
    target = BundleTarget(
        python=python,
        torch=torch,
        cuda=cuda,
        cxx11_abi=abi,
        platform=Platform(platform),
        archs=tuple(arch_list) if cuda else (),
    )
    assert BundleTarget.parse(str(target)) == target
