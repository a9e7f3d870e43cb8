"""The environment manifest format: round trip, strict validation, requirement lines."""

from __future__ import annotations

from pathlib import Path

import pytest
from packaging.utils import canonicalize_name

from turbo_dllm.envs.manifest import (
    EnvManifest,
    Index,
    Pin,
    Project,
    WheelFile,
    dump_manifest,
    load_manifest,
    parse_manifest,
)
from turbo_dllm.errors import DllmError

SHA_A = "a" * 64
SHA_B = "b" * 64


def manifest(**changes) -> EnvManifest:
    fields = dict(
        target="cpu-x86_64",
        bundle_target="cp311-torch2.13-cpu-cxx11-linux_x86_64",
        python="3.11",
        python_platform="x86_64-manylinux_2_28",
        resolver="uv 0.0.0",
        project=Project(name="turbo-dllm", version="0.1.0", extras=["env"]),
        requirements=["numpy>=1.24", "torch==2.13.0+cpu"],
        indexes=[Index(url="https://pypi.org/simple")],
        packages=[
            Pin(
                name="Typing_Extensions",
                version="4.16.0",
                wheels=[
                    WheelFile(filename="typing_extensions-4.16.0-py3-none-any.whl", sha256=SHA_A)
                ],
            ),
            Pin(
                name="torch",
                version="2.13.0+cpu",
                wheels=[
                    WheelFile(
                        filename="torch-2.13.0+cpu-cp311-cp311-manylinux_2_28_x86_64.whl",
                        sha256=SHA_B,
                        size=12,
                    )
                ],
            ),
        ],
    )
    fields.update(changes)
    return EnvManifest(**fields)


def test_round_trip_keeps_content_and_hash(tmp_path):
    original = manifest()
    path = tmp_path / "m.toml"
    path.write_text(dump_manifest(original))
    loaded = load_manifest(path)
    assert loaded == original
    assert loaded.content_sha256() == original.content_sha256()
    text = path.read_text()
    assert 'format = "turbo_dllm.env_manifest.v1"' in text
    assert "[[packages]]" in text and "[[indexes]]" in text
    # names are normalized (PEP 503), so lookups do not depend on spelling
    assert loaded.pin("typing_extensions").version == "4.16.0"


def test_index_is_recorded_apart_from_pins():
    text = dump_manifest(manifest())
    packages_part = text.split("[[packages]]", 1)[1]
    assert "https://" not in packages_part  # pins name files and hashes, never a URL


def test_requirement_lines_carry_every_hash():
    pin = manifest().pin("torch")
    assert pin.requirement_line() == f"torch==2.13.0+cpu --hash=sha256:{SHA_B}"


def test_content_hash_changes_with_a_pin():
    changed = manifest(
        packages=[
            Pin(
                name="torch",
                version="2.13.1+cpu",
                wheels=[WheelFile(filename="torch-2.13.1+cpu-cp311-none-any.whl", sha256=SHA_B)],
            )
        ]
    )
    assert changed.content_sha256() != manifest().content_sha256()


@pytest.mark.parametrize(
    ("edit", "needle"),
    [
        (
            lambda t: t.replace('"turbo_dllm.env_manifest.v1"', '"turbo_dllm.env_manifest.v9"'),
            "format",
        ),
        (lambda t: t.replace("a" * 64, "a" * 63), "sha256"),
        (
            lambda t: t.replace('target = "cpu-x86_64"', 'target = "cpu-x86_64"\nsurprise = 1'),
            "surprise",
        ),
        (lambda t: t.replace('version = "4.16.0"', 'version = "four"'), "version"),
        (
            lambda t: (
                t
                + '[[packages]]\nname = "torch"\nversion = "1.0"\nwheels = [{filename = "t-1.0-py3-none-any.whl", sha256 = "'
                + "c" * 64
                + '"}]\n'
            ),
            "twice",
        ),
        (lambda t: t.replace(".whl", ".tar.gz", 1), "wheel"),
        (lambda t: t + "[[[", "TOML"),
        (lambda t: t.replace("cp311-torch2.13-cpu", "cp311-pytorch2.13-cpu"), "bundle_target"),
    ],
)
def test_invalid_manifests_are_user_errors(edit, needle):
    text = edit(dump_manifest(manifest()))
    with pytest.raises(DllmError) as error:
        parse_manifest(text, "m.toml")
    assert needle in error.value.message
    assert "m.toml" in error.value.message
    assert error.value.hint  # bad TOML had none


def test_project_cannot_be_pinned():
    with pytest.raises(ValueError, match="must not be pinned"):
        manifest(
            packages=[
                Pin(
                    name="turbo-dllm",
                    version="0.1.0",
                    wheels=[WheelFile(filename="turbo_dllm-0.1.0-py3-none-any.whl", sha256=SHA_A)],
                )
            ]
        )


def test_a_manifest_path_that_is_a_folder_or_not_text_is_a_user_error(tmp_path, cli):
    """`dllm env check --manifest DIR` (and a binary file) were tracebacks."""
    from tests.helpers import assert_user_error

    binary = tmp_path / "binary.toml"
    binary.write_bytes(b"\xff\xfe\x00garbage")
    assert_user_error(cli("env", "check", "--manifest", tmp_path), "Is a directory")
    assert_user_error(cli("env", "requirements", "--manifest", binary), "not UTF-8 text")
    with pytest.raises(DllmError, match="cannot read the environment manifest"):
        load_manifest(tmp_path)


def test_a_packaged_manifest_named_after_another_target_is_a_user_error(tmp_path, cli, monkeypatch):
    """`manifests/x.toml` declaring target y: the error had no hint."""
    from tests.helpers import assert_user_error
    from turbo_dllm.envs import select

    (tmp_path / "other-name.toml").write_text(dump_manifest(manifest()))
    monkeypatch.setattr(select, "manifest_dirs", lambda: [tmp_path])
    result = cli("env", "requirements", "--target", "other-name")
    assert_user_error(result, "declares target cpu-x86_64, not other-name", "hint: ", "--manifest")


def _unmet(manifest: EnvManifest, requirements: list[str]) -> list[str]:
    """The requirements (for the manifest's Python on Linux x86_64) no pin or provided satisfies."""
    from packaging.markers import default_environment
    from packaging.requirements import Requirement
    from packaging.version import Version

    marker_env = {
        **default_environment(),
        "python_version": manifest.python,
        "python_full_version": f"{manifest.python}.0",
        "sys_platform": "linux",
        "platform_system": "Linux",
        "platform_machine": "x86_64",
        "extra": "",
    }
    versions = {p.name: p.version for p in [*manifest.packages, *manifest.provided]}
    unmet = []
    for line in requirements:
        requirement = Requirement(line)
        if requirement.marker is not None and not requirement.marker.evaluate(marker_env):
            continue
        found = versions.get(canonicalize_name(requirement.name))
        if found is None or not requirement.specifier.contains(Version(found), prereleases=True):
            unmet.append(f"{line} (manifest: {found or 'absent'})")
    return unmet


SHIPPED = sorted((Path(__file__).resolve().parents[2] / "manifests").glob("*.toml"))


@pytest.mark.parametrize("path", SHIPPED, ids=lambda p: p.stem)
def test_a_shipped_manifest_satisfies_the_projects_current_requirements(path):
    """A manifest pins what was resolved when it was locked; pyproject.toml moves on. A sync from
    a manifest whose pins no longer satisfy the project's own requirements (a raised floor, a new
    dependency) installs an environment this turbo-dllm does not run in, and `env check` calls
    it clean: such a manifest must be re-locked (`dllm env lock`) with the change."""
    import turbo_dllm
    from turbo_dllm.envs.lock import project_requirements

    shipped = load_manifest(path)
    project, requirements = project_requirements(shipped.project.extras)
    assert shipped.project.version == turbo_dllm.__version__, "re-lock for this release"
    assert _unmet(shipped, requirements) == [], f"re-lock {path.name}: `dllm env lock`"


def test_a_pin_below_a_requirement_is_unmet():
    stale = manifest()
    assert _unmet(stale, ["numpy>=1.24"]) == ["numpy>=1.24 (manifest: absent)"]
    assert _unmet(stale, ["typing-extensions>=4.17", "torch>=2.6"]) == [
        "typing-extensions>=4.17 (manifest: 4.16.0)"
    ]
    assert _unmet(stale, ["numpy>=1.24; python_version < '3.10'"]) == []
