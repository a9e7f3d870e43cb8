"""`dllm env lock --from-environment` locks what runs (each package by the strongest identity
the environment has, said in the manifest), `dllm env check` reports drift from it, and
`dllm env requirements --mirror` points at the mirror's index and pins turbo-dllm itself."""

from __future__ import annotations

import json

import tomlkit

from turbo_dllm.envs.manifest import dump_manifest, load_manifest


def test_lock_from_the_running_environment_then_check(cli, tmp_path):
    out = tmp_path / "cpu.toml"
    result = cli("env", "lock", "--target", "cpu-x86_64", "--from-environment", "--output", out)
    assert result.code == 0, result.err
    manifest = load_manifest(out)
    assert manifest.identity and "RECORD" in manifest.identity
    torch = next(p for p in manifest.provided if p.name == "torch")
    assert torch.version.startswith("2.") and torch.record_sha256
    assert manifest.bundle_target.startswith(f"cp{manifest.python.replace('.', '')}-torch")
    assert not any(p.name in {"pip", "turbo-dllm"} for p in manifest.provided)

    check = cli("env", "check", "--manifest", out, "--json")
    report = json.loads(check.out)
    assert check.code == 0 and report["clean"], report

    # Drift: another version of one package, other files under the same version of another.
    document = tomlkit.parse(out.read_text())
    rows = document["provided"]
    rows[0]["version"] = "0.0.1"
    rows[1]["record_sha256"] = "0" * 64
    drifted = tmp_path / "drifted.toml"
    drifted.write_text(tomlkit.dumps(document))
    report = json.loads(cli("env", "check", "--manifest", drifted, "--json").out)
    found = {m["name"]: m for m in report["mismatched"]}
    assert found[rows[0]["name"]]["expected"] == "0.0.1"
    assert "RECORD 000000000000" in found[rows[1]["name"]]["expected"]


def test_requirements_from_a_mirror_use_its_index_and_pin_the_project(cli, tmp_path):
    from tests.envs.test_manifest import manifest

    root = tmp_path / "mirror"
    (root / "manifests").mkdir(parents=True)
    text = dump_manifest(manifest())
    (root / "manifests" / "cpu-x86_64.toml").write_text(text)
    import hashlib

    (root / "MIRROR.json").write_text(
        json.dumps(
            {
                "format": "turbo_dllm.mirror.v1",
                "created_by": "test",
                "project": {
                    "name": "turbo-dllm",
                    "version": "0.1.0",
                    "wheel": "turbo_dllm-0.1.0-py3-none-any.whl",
                    "sha256": "ab" * 32,
                },
                "files": [
                    {
                        "path": "manifests/cpu-x86_64.toml",
                        "sha256": hashlib.sha256(text.encode()).hexdigest(),
                        "size": len(text.encode()),
                        "kind": "manifest",
                    }
                ],
            }
        )
    )
    result = cli("env", "requirements", "--target", "cpu-x86_64", "--mirror", root)
    assert result.code == 0, result.err
    lines = result.out.splitlines()
    assert f"--index-url {(root / 'simple').as_uri()}/" in lines
    assert not any("pypi.org" in line or "download.pytorch.org" in line for line in lines)
    assert f"turbo-dllm==0.1.0 --hash=sha256:{'ab' * 32}" in lines


def test_from_environment_refuses_resolution_flags(cli, tmp_path):
    from tests.helpers import assert_user_error

    result = cli("env", "lock", "--target", "cpu-x86_64", "--from-environment", "--torch", "2.11.0",
                 "--output", tmp_path / "x.toml")  # fmt: skip
    assert_user_error(result, "--torch")
    assert not (tmp_path / "x.toml").exists()


def test_a_wheel_whose_hash_the_installer_recorded_becomes_a_pin(tmp_path, monkeypatch):
    """pip records `archive_info.hashes` in direct_url.json for a wheel installed from a file or
    URL: then the manifest pins that wheel's sha256, not just the installed files."""
    from turbo_dllm.envs.freeze import lock_from_environment

    info = tmp_path / "site" / "dllm_fixture_pinned-1.2.0.dist-info"
    info.mkdir(parents=True)
    (info / "METADATA").write_text(
        "Metadata-Version: 2.1\nName: dllm-fixture-pinned\nVersion: 1.2.0\n"
    )
    (info / "RECORD").write_text("dllm_fixture_pinned-1.2.0.dist-info/METADATA,,\n")
    wheel = "dllm_fixture_pinned-1.2.0-py3-none-any.whl"
    (info / "direct_url.json").write_text(
        json.dumps(
            {"url": f"file:///wheels/{wheel}", "archive_info": {"hashes": {"sha256": "cd" * 32}}}
        )
    )
    monkeypatch.syspath_prepend(str(tmp_path / "site"))
    manifest = lock_from_environment("cpu-x86_64")
    pin = manifest.pin("dllm-fixture-pinned")
    assert pin is not None and pin.version == "1.2.0"
    assert [(w.filename, w.sha256) for w in pin.wheels] == [(wheel, "cd" * 32)]
    assert "dllm-fixture-pinned" not in {p.name for p in manifest.provided}


def test_a_lock_that_cannot_finish_writing_leaves_the_old_manifest(cli, tmp_path, monkeypatch):
    """`--output` over an existing manifest is replaced whole or not at all: a write that fails
    half-way (here the disk fills at the sync) leaves the old manifest and no temporary file."""
    import errno
    import os

    out = tmp_path / "cpu.toml"
    assert (
        cli("env", "lock", "--target", "cpu-x86_64", "--from-environment", "--output", out).code
        == 0
    )
    out.write_bytes(out.read_bytes() + b"# the old one\n")
    old = out.read_bytes()

    def full_disk(fd):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(os, "fsync", full_disk)
    result = cli("env", "lock", "--target", "cpu-x86_64", "--from-environment", "--output", out)
    assert result.code == 2 and "No space left on device" in result.err, result.err
    assert out.read_bytes() == old
    assert sorted(p.name for p in tmp_path.iterdir()) == ["cpu.toml"]
