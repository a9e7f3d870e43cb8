"""`kernels: native` with an active bundle that holds none of the trainer's ops: readiness
said "loaded  from <bundle>" (an empty list) and the run failed at its first merge."""

from __future__ import annotations

import os

import pytest

from tests.adversarial.hostile import RELEASE, published, tiny_bundle
from turbo_dllm.bundles.install import plan_install, run_install
from turbo_dllm.errors import DllmError
from turbo_dllm.kernels.readiness import require_kernels


def test_a_bundle_without_the_merge_op_is_not_ready(tmp_path):
    archive = tiny_bundle(tmp_path, {"lib/x.so": os.urandom(1024)})
    mirror, catalog_sha, _ = published(tmp_path, archive)
    run_install(plan_install(RELEASE, index=str(mirror), catalog_sha256=catalog_sha))
    assert "fits this host" in require_kernels("native")
    with pytest.raises(DllmError, match="has no op 'merge_attention_partials'") as refused:
        require_kernels("native", load=True)
    assert refused.value.hint.startswith("install the bundle of this turbo-dllm version: dllm")
