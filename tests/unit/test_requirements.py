"""pyproject's requirements say what the code needs: the test extra has what the tests import,
the torch floor is a torch that has the APIs the trainer calls."""

from __future__ import annotations

from pathlib import Path

import tomlkit
from packaging.requirements import Requirement
from packaging.version import Version

PYPROJECT = Path(__file__).resolve().parents[2] / "pyproject.toml"


def requirements(group: str | None = None) -> dict[str, Requirement]:
    project = tomlkit.parse(PYPROJECT.read_text())["project"]
    listed = project["dependencies"] if group is None else project["optional-dependencies"][group]
    return {req.name: req for req in map(Requirement, listed)}


def test_the_test_extra_installs_transformers_for_the_parity_tests():
    assert "transformers" in requirements("test")


def test_the_torch_floor_has_fsdp2_public_and_get_total_norm():
    """torch.distributed.fsdp.fully_shard and torch.nn.utils.get_total_norm: torch 2.6."""
    import torch.distributed.fsdp as fsdp
    import torch.nn.utils as utils

    assert hasattr(fsdp, "fully_shard") and hasattr(utils, "get_total_norm")  # used by train/
    floor = min(Version(spec.version) for spec in requirements()["torch"].specifier)
    assert floor >= Version("2.6"), floor


def test_the_transformers_floor_is_the_oldest_tested():
    """The floor is no lower than 5.17 (the GPU host's), the oldest transformers the tests have
    passed on (docs/training.md); the running one has the qwen3_8 and diffusion_gemma oracles."""
    import transformers

    assert hasattr(transformers, "Qwen3_5ForCausalLM")
    assert hasattr(transformers, "DiffusionGemmaForBlockDiffusion")
    for extra in ("data", "test"):
        floor = min(Version(s.version) for s in requirements(extra)["transformers"].specifier)
        assert floor >= Version("5.17"), (extra, floor)
