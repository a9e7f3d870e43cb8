"""merge_attention_partials: reference semantics, and native/jit kernels against the reference."""

from __future__ import annotations

import contextlib
import functools
import json
import math
import os

import pytest
import torch

from tests.bundles.crafting import damage_library, variant
from turbo_dllm.errors import DllmError
from turbo_dllm.kernels import merge_attention_partials, reference
from turbo_dllm.kernels.selftest import _random_partials, compare_merge_attention_partials


def attention(q, k, v):
    """Plain softmax attention -> (out, lse) over the given keys."""
    scores = q @ k.transpose(-1, -2) / math.sqrt(q.shape[-1])
    lse = torch.logsumexp(scores, dim=-1)
    return torch.softmax(scores, dim=-1) @ v, lse


# --- reference semantics -----------------------------------------------------------------------


def test_merging_two_key_halves_equals_attention_over_all_keys():
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(2, 4, 16, 32, generator=g, dtype=torch.float64) for _ in range(3))
    out_a, lse_a = attention(q, k[..., :7, :], v[..., :7, :])
    out_b, lse_b = attention(q, k[..., 7:, :], v[..., 7:, :])
    out, lse = merge_attention_partials(out_a, lse_a.float(), out_b, lse_b.float())
    full_out, full_lse = attention(q, k, v)
    torch.testing.assert_close(out, full_out, atol=1e-6, rtol=1e-6)
    torch.testing.assert_close(lse, full_lse.float())


def test_masked_partials_weigh_nothing_and_never_make_nan():
    out_a = torch.randn(3, 5, 8)
    out_b = torch.full((3, 5, 8), float("nan"))  # a fully masked partial may hold anything
    lse_a = torch.randn(3, 5)
    lse_b = torch.full((3, 5), float("-inf"))
    lse_a[0] = float("-inf")  # row 0: both sides masked
    leaves = [t.clone().requires_grad_(True) for t in (out_a, lse_a, out_b, lse_b)]
    out, lse = reference.merge_attention_partials(*leaves)
    assert torch.equal(out[1:], out_a[1:])
    assert torch.equal(lse[1:], lse_a[1:])
    assert torch.all(out[0] == 0) and torch.all(torch.isneginf(lse[0]))
    (out.sum() + torch.where(torch.isfinite(lse), lse, 0).sum()).backward()
    for leaf in leaves:
        assert torch.isfinite(leaf.grad).all()
    assert torch.all(leaves[2].grad == 0) and torch.all(leaves[3].grad == 0)


def test_closed_form_backward_matches_autograd():
    g = torch.Generator().manual_seed(1)
    inputs = _random_partials((2, 9, 16), torch.float64, "cpu", g, masked=0.4)
    grad_out = torch.randn(2, 9, 16, generator=g, dtype=torch.float64)
    grad_lse = torch.randn(2, 9, generator=g)
    leaves = [t.clone().requires_grad_(True) for t in inputs]
    out, lse = reference.merge_attention_partials(*leaves)
    lse = torch.where(torch.isfinite(lse), lse, 0)
    torch.autograd.backward([out, lse], [grad_out, grad_lse])
    closed = reference.merge_attention_partials_backward(grad_out, grad_lse, *inputs)
    for got, leaf in zip(closed, leaves, strict=True):
        torch.testing.assert_close(got, leaf.grad.to(got.dtype), atol=1e-6, rtol=1e-5)


def test_reference_passes_gradcheck():
    g = torch.Generator().manual_seed(2)
    out_a, out_b = (torch.randn(2, 3, 4, generator=g, dtype=torch.float64) for _ in range(2))
    lse_a, lse_b = (torch.randn(2, 3, generator=g, dtype=torch.float64) for _ in range(2))

    def merged(oa, la, ob, lb):  # gradcheck wants one dtype; lse is float32 in the op
        w_a, w_b, lse = reference._merge_weights(la, lb)
        return w_a.unsqueeze(-1) * oa + w_b.unsqueeze(-1) * ob, lse

    leaves = [t.requires_grad_(True) for t in (out_a, lse_a, out_b, lse_b)]
    assert torch.autograd.gradcheck(merged, leaves)


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"out_b": torch.zeros(2, 3, 5)}, "must match in shape"),
        ({"lse_a": torch.zeros(2, 4)}, "lse must be"),
        ({"lse_b": torch.zeros(2, 3, dtype=torch.float64)}, "float32"),
    ],
)
def test_bad_inputs_are_rejected(kwargs, message):
    args = {
        "out_a": torch.zeros(2, 3, 4),
        "lse_a": torch.zeros(2, 3),
        "out_b": torch.zeros(2, 3, 4),
    }
    args["lse_b"] = torch.zeros(2, 3)
    args.update(kwargs)
    with pytest.raises(ValueError, match=message):
        merge_attention_partials(**args)


# --- native (from the installed bundle) ---------------------------------------------------------

native = functools.partial(merge_attention_partials, backend="native")


@pytest.mark.parametrize(
    ("dtype", "shape", "tolerance"),
    [
        (torch.float32, (2, 3, 37, 40), 1e-5),
        (torch.float64, (1, 5, 64), 1e-5),  # weights are float32 (lse is float32)
        (torch.bfloat16, (2, 2, 33, 128), 3e-2),
        (torch.float16, (4, 17, 8), 3e-3),
    ],
)
def test_native_matches_reference_forward_and_backward(installed, dtype, shape, tolerance):
    for seed in range(3):
        errors = compare_merge_attention_partials(native, dtype=dtype, shape=shape, seed=seed)
        assert max(errors.values()) <= tolerance, errors


def test_native_handles_strided_inputs_and_one_sided_gradients(installed):
    g = torch.Generator().manual_seed(5)
    base = torch.randn(2, 6, 10, 16, generator=g)
    out_a = base[:, ::2].transpose(1, 2)  # non-contiguous
    out_b = base[:, 1::2].transpose(1, 2)
    lse_a, lse_b = torch.randn(2, 10, 3, generator=g), torch.randn(2, 10, 3, generator=g)
    lse_b[0, 0, 0] = float("-inf")
    got = native(out_a, lse_a, out_b, lse_b)
    want = reference.merge_attention_partials(out_a, lse_a, out_b, lse_b)
    torch.testing.assert_close(got, want)
    for pick in (0, 1):  # gradient through out only, then through lse only
        leaves = [t.clone().requires_grad_(True) for t in (out_a, lse_a, out_b, lse_b)]
        native(*leaves)[pick].sum().backward()
        ref_leaves = [t.clone().requires_grad_(True) for t in (out_a, lse_a, out_b, lse_b)]
        reference.merge_attention_partials(*ref_leaves)[pick].sum().backward()
        for a, b in zip(leaves, ref_leaves, strict=True):
            want_grad = b.grad if b.grad is not None else torch.zeros_like(b)  # unused input
            torch.testing.assert_close(a.grad, want_grad, atol=1e-5, rtol=1e-5)


def test_native_op_works_under_torch_compile(installed):
    g = torch.Generator().manual_seed(6)
    inputs = [t.requires_grad_(True) for t in _random_partials((3, 8, 16), torch.float32, "cpu", g)]
    compiled = torch.compile(
        lambda *xs: native(*xs)[0].square().sum(), backend="aot_eager", fullgraph=True
    )
    compiled(*inputs).backward()
    ref_inputs = [t.detach().clone().requires_grad_(True) for t in inputs]
    reference.merge_attention_partials(*ref_inputs)[0].square().sum().backward()
    for a, b in zip(inputs, ref_inputs, strict=True):
        torch.testing.assert_close(a.grad, b.grad, atol=1e-5, rtol=1e-5)


# --- loader checks -------------------------------------------------------------------------------


def _install(archive, tmp_path, release, **options):
    from turbo_dllm.bundles.install import plan_install, run_install
    from turbo_dllm.bundles.publish import publish

    mirror = tmp_path / f"mirror-{release}"
    result = publish([archive], release=release, mirror=mirror)
    return run_install(
        plan_install(release, index=str(mirror), catalog_sha256=result.catalog_sha256, **options)
    )


def test_native_without_a_bundle_says_how_to_install():
    with pytest.raises(DllmError) as caught:
        native(torch.zeros(1, 2, 4), torch.zeros(1, 2), torch.zeros(1, 2, 4), torch.zeros(1, 2))
    assert "no native-kernel bundle is installed" in caught.value.message
    assert "dllm bundle install --release v" in caught.value.hint


def test_loader_refuses_kernels_built_from_other_sources(cpu_bundle, tmp_path):
    op = cpu_bundle.manifest.ops[0].model_copy(update={"source_sha256": "0" * 64})
    _install(variant(cpu_bundle, tmp_path, ops=(op,)), tmp_path, "v-other-sources")
    with pytest.raises(DllmError, match="built from other sources") as caught:
        native(torch.zeros(1, 2, 4), torch.zeros(1, 2), torch.zeros(1, 2, 4), torch.zeros(1, 2))
    assert "dllm bundle install" in caught.value.hint


def test_loader_refuses_a_bundle_for_another_python(cpu_bundle, tmp_path, monkeypatch):
    from turbo_dllm.bundles.target import BundleTarget

    ours = cpu_bundle.manifest.target
    other = BundleTarget.parse(str(ours).replace(str(ours.python), "cp399", 1))
    monkeypatch.setenv("DLLM_OVERRIDE_PYTHON", "cp399")  # install as if for that host ...
    _install(variant(cpu_bundle, tmp_path, target=other), tmp_path, "v-other-python")
    monkeypatch.delenv("DLLM_OVERRIDE_PYTHON")  # ... then load in this one
    with pytest.raises(DllmError, match=r"python: host cp3\d+, bundle cp399"):
        native(torch.zeros(1, 2, 4), torch.zeros(1, 2), torch.zeros(1, 2, 4), torch.zeros(1, 2))


def test_loader_refuses_a_modified_library(installed):
    damage_library(installed)
    with pytest.raises(DllmError, match="does not match its bundle.json"):
        native(torch.zeros(1, 2, 4), torch.zeros(1, 2), torch.zeros(1, 2, 4), torch.zeros(1, 2))


# --- jit ---------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def jit_home(tmp_path_factory):
    return tmp_path_factory.mktemp("jit-home")


def test_jit_lock_held_by_another_process_times_out(jit_home, monkeypatch):
    from filelock import FileLock

    from turbo_dllm.kernels.jit import jit_build, load_jit_op

    monkeypatch.setenv("DLLM_HOME", str(jit_home))
    monkeypatch.setenv("DLLM_JIT_LOCK_TIMEOUT", "0.2")
    _, build_dir = jit_build("merge_attention_partials")
    build_dir.parent.mkdir(parents=True, exist_ok=True)
    with FileLock(str(build_dir) + ".lock"):
        with pytest.raises(DllmError, match="another process has been building"):
            load_jit_op("merge_attention_partials")


@pytest.mark.slow
def test_jit_builds_from_source_past_a_stale_torch_baton(jit_home, monkeypatch):
    from turbo_dllm.kernels.jit import jit_build

    monkeypatch.setenv("DLLM_HOME", str(jit_home))
    _, build_dir = jit_build("merge_attention_partials")
    build_dir.mkdir(parents=True, exist_ok=True)
    (build_dir / "lock").write_text("")  # what a killed cpp_extension build leaves behind
    jit = functools.partial(merge_attention_partials, backend="jit")
    errors = compare_merge_attention_partials(jit)
    assert max(errors.values()) <= 1e-5, errors
    assert not (build_dir / "lock").exists()


# --- a Triton op in a bundle -------------------------------------------------------------------


def _with_triton_op(cpu_bundle, tmp_path, **op_changes):
    """The CPU bundle plus block_diffusion_attention packed the way `dllm bundle build` packs it
    for a GPU target (its source under triton/<op>/, hashed into bundle.json)."""
    from tests.bundles.crafting import unpack
    from turbo_dllm.bundles.archive import pack_bundle
    from turbo_dllm.bundles.build import _pack_triton_op
    from turbo_dllm.bundles.manifest import BundleManifest, BundleOp, archive_name
    from turbo_dllm.bundles.native import load_native_op

    unpacked = unpack(cpu_bundle.archive, tmp_path / "unpacked-triton")
    op = load_native_op("block_diffusion_attention")
    shipped = _pack_triton_op(op, unpacked.root, verbose=False)  # self-test: no GPU here
    entry = BundleOp(
        name=op.name,
        namespace="turbo_dllm_bundle_triton0000",
        library=shipped[0].path,
        source_sha256=op.source_sha256(),
        devices=("cpu",),  # a CPU target: only the loader's checks are under test
    ).model_copy(update=op_changes)
    target = unpacked.manifest.target
    manifest = unpacked.manifest.model_dump(mode="json") | {
        "version": "0.1.2",
        "name": archive_name("0.1.2", target).removesuffix(".tar.zst"),
        "files": [f.model_dump(mode="json") for f in (*unpacked.manifest.files, *shipped)],
        "ops": [o.model_dump(mode="json") for o in (*unpacked.manifest.ops, entry)],
    }
    manifest = BundleManifest.model_validate(manifest)
    return pack_bundle(manifest, unpacked.root, tmp_path / "dist" / archive_name("0.1.2", target))


def test_bundle_ships_the_triton_source_and_the_loader_checks_and_imports_it(cpu_bundle, tmp_path):
    from turbo_dllm.bundles.native import load_native_op
    from turbo_dllm.kernels.loader import load_bundle_op, load_bundle_triton_op

    bundle = _install(_with_triton_op(cpu_bundle, tmp_path), tmp_path, "v-triton").bundle
    loaded = load_bundle_op("block_diffusion_attention")
    copy = bundle.path / "triton" / "block_diffusion_attention" / "block_diffusion_attention.py"
    assert loaded.source == str(copy)
    shipped = load_native_op("block_diffusion_attention")
    assert copy.read_bytes() == shipped.triton_source_paths()[0].read_bytes()
    assert loaded.namespace.startswith("turbo_dllm_triton_block_diffusion_attention_")
    assert load_bundle_triton_op("block_diffusion_attention") == (
        str(copy),
        shipped.source_sha256(),
    )


def test_loader_refuses_a_triton_op_from_other_sources(cpu_bundle, tmp_path):
    from turbo_dllm.kernels.loader import load_bundle_op

    archive = _with_triton_op(cpu_bundle, tmp_path, source_sha256="1" * 64)
    _install(archive, tmp_path, "v-triton-other")
    with pytest.raises(DllmError, match="built from other sources") as caught:
        load_bundle_op("block_diffusion_attention")
    assert "dllm bundle install" in caught.value.hint


def test_loader_refuses_a_modified_triton_source(cpu_bundle, tmp_path):
    from turbo_dllm.kernels.loader import load_bundle_op

    bundle = _install(_with_triton_op(cpu_bundle, tmp_path), tmp_path, "v-triton-mod").bundle
    copy = bundle.path / "triton" / "block_diffusion_attention" / "block_diffusion_attention.py"
    copy.chmod(0o644)
    copy.write_text(copy.read_text().replace("exp2", "exp"))
    with pytest.raises(DllmError, match="does not match its bundle.json"):
        load_bundle_op("block_diffusion_attention")


def test_turbo_attention_needs_a_bundle_with_its_gpu_kernels(installed):
    from turbo_dllm.config.load import load_model
    from turbo_dllm.config.runspec import RunSpec
    from turbo_dllm.kernels.readiness import require_attention_kernels

    turbo = load_model(RunSpec, {"model": {"attention": "turbo"}}, "test")
    with pytest.raises(DllmError, match="no GPU kernels for block_diffusion_attention") as caught:
        require_attention_kernels(turbo)  # the CPU bundle skips Triton ops
    assert "dllm bundle install" in caught.value.hint
    jit = turbo.model_copy(update={"kernels": "jit"})
    assert "shipped Triton source" in require_attention_kernels(jit)
    flex = load_model(RunSpec, {"model": {"attention": "flex"}}, "test")
    assert "no kernel bundle needed" in require_attention_kernels(flex)


# --- compiled Triton kernels in a bundle --------------------------------------------------------


@contextlib.contextmanager
def _selftest_that_compiles():
    """Stand in for the GPU self-test: write one kernel entry into the Triton cache the build
    hands it, through Triton's own cache manager (its real layout: absolute child paths)."""
    import subprocess
    from unittest import mock

    real_run = subprocess.run

    def run(command, *args, env=None, **kwargs):
        if command[-2:] != ["--op", "block_diffusion_attention"]:
            return real_run(command, *args, env=env, **kwargs)
        from triton.runtime.cache import FileCacheManager

        with mock.patch.dict(os.environ, {"TRITON_CACHE_DIR": env["TRITON_CACHE_DIR"]}):
            manager = FileCacheManager(KERNEL_KEY)
            files = (
                ("_fwd_kernel.cubin", b"\x7fELF-kernel"),
                ("_fwd_kernel.json", "{}"),
                ("_fwd_kernel.ptx", "// ptx"),  # IRs: in the cache, not needed to launch
                ("_fwd_kernel.ttgir", "module {}"),
            )
            manager.put_group("_fwd_kernel.json", {n: manager.put(d, n) for n, d in files})
        return subprocess.CompletedProcess(command, 0, "", "")

    with mock.patch.object(subprocess, "run", run):
        yield


KERNEL_KEY = "k" * 52  # the shape of a Triton cache key


def test_bundle_ships_compiled_triton_kernels_and_the_loader_seeds_triton_cache(
    cpu_bundle, tmp_path, monkeypatch
):
    from triton.runtime.cache import FileCacheManager

    from turbo_dllm.kernels.loader import seed_compiled_kernels

    with _selftest_that_compiles():
        archive = _with_triton_op(cpu_bundle, tmp_path)
    bundle = _install(archive, tmp_path, "v-triton-compiled").bundle
    compiled = bundle.path / "triton" / "block_diffusion_attention" / "compiled" / KERNEL_KEY
    group = json.loads((compiled / "__grp___fwd_kernel.json").read_text())
    # No path of the build host in the bundle: the group names its files only, and only what a
    # launch reads (the metadata and the binary); the IRs stay out of the bundle.
    assert group == {"child_paths": {n: n for n in ("_fwd_kernel.cubin", "_fwd_kernel.json")}}
    assert sorted(p.name for p in compiled.iterdir()) == [
        "__grp___fwd_kernel.json", "_fwd_kernel.cubin", "_fwd_kernel.json"
    ]  # fmt: skip

    cache = tmp_path / "triton-cache"
    monkeypatch.setenv("TRITON_CACHE_DIR", str(cache))
    assert seed_compiled_kernels("block_diffusion_attention") == 1
    assert seed_compiled_kernels("block_diffusion_attention") == 0  # already there: kept
    # Triton itself finds the kernel: every file its group lists exists in this cache.
    found = FileCacheManager(KERNEL_KEY).get_group("_fwd_kernel.json")
    assert found == {n: str(cache / KERNEL_KEY / n) for n in group["child_paths"]}
    assert (cache / KERNEL_KEY / "_fwd_kernel.cubin").read_bytes() == b"\x7fELF-kernel"


def test_loader_refuses_a_modified_compiled_kernel(cpu_bundle, tmp_path, monkeypatch):
    from turbo_dllm.kernels.loader import seed_compiled_kernels

    with _selftest_that_compiles():
        archive = _with_triton_op(cpu_bundle, tmp_path)
    bundle = _install(archive, tmp_path, "v-triton-compiled-mod").bundle
    cubin = (
        bundle.path / "triton/block_diffusion_attention/compiled" / KERNEL_KEY / "_fwd_kernel.cubin"
    )
    cubin.chmod(0o644)
    cubin.write_bytes(b"\x7fELF-other")
    cache = tmp_path / "triton-cache"
    monkeypatch.setenv("TRITON_CACHE_DIR", str(cache))
    with pytest.raises(DllmError, match="does not match its bundle.json"):
        seed_compiled_kernels("block_diffusion_attention")
    assert not cache.exists() or not any(cache.iterdir())  # nothing reached Triton's cache


@pytest.mark.parametrize("damage", ["removed", "modified"])
def test_loading_a_triton_op_refuses_a_damaged_compiled_kernel(cpu_bundle, tmp_path, damage):
    """Refused where doctor and the trainer's start load the op, with the file and the fix (it
    loaded, and only the op's first launch, seeding Triton's cache, refused it)."""
    from turbo_dllm.kernels.loader import load_bundle_op

    with _selftest_that_compiles():
        archive = _with_triton_op(cpu_bundle, tmp_path)
    bundle = _install(archive, tmp_path, f"v-triton-compiled-{damage}").bundle
    cubin = (
        bundle.path / "triton/block_diffusion_attention/compiled" / KERNEL_KEY / "_fwd_kernel.cubin"
    )
    if damage == "removed":
        cubin.unlink()
    else:
        cubin.chmod(0o644)
        cubin.write_bytes(b"\x7fELF-other")
    message = "is missing from the bundle" if damage == "removed" else "does not match"
    with pytest.raises(DllmError, match=message) as caught:
        load_bundle_op("block_diffusion_attention")
    assert str(cubin) in caught.value.message
    # a command to paste as it is (it read "dllm bundle verify; then dllm ...": bash stopped)
    assert caught.value.hint.startswith("install the bundle again: dllm bundle install ")
    assert "; then" not in caught.value.hint
