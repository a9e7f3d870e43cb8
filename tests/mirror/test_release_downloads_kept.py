"""`dllm mirror create --from URL` downloaded the release's bundles into its staging folder,
which a create that fails or is stopped deletes: the next run downloaded every bundle again
(gigabytes for CUDA targets), and a download cut off said "run the same command again: it
resumes the partial download", which it could not. Bundle downloads now go through the
`.DIR.downloads` folder the wheels use, kept until the mirror is in place."""

from __future__ import annotations

import os
import shutil

import pytest

from tests.adversarial.hostile import published, tiny_bundle
from tests.bundles.server import MirrorServer
from tests.mirror.test_create_verify_serve import manifest_for, wheels  # noqa: F401
from turbo_dllm.errors import DllmError
from turbo_dllm.mirror.create import MirrorPlan, create_mirror
from turbo_dllm.mirror.release import add_release
from turbo_dllm.mirror.verify import verify_mirror


def _bundle_requests(server) -> int:
    return sum("/bundles/" in path for path, _ in server.state.requests)


def test_a_failed_create_keeps_the_bundles_it_downloaded(
    tmp_path,
    wheels,  # noqa: F811 - the fixture's value
    capsys,
):
    index_root, catalog_sha, entry = published(
        tmp_path, tiny_bundle(tmp_path, {"lib/a.so": os.urandom(5000)})
    )
    manifest = manifest_for(wheels, "dllm_fixture_a").model_copy(
        update={"bundle_target": str(entry.target)}
    )
    aside = tmp_path / "aside"
    aside.mkdir()
    (pinned,) = wheels.glob("dllm_fixture_a-*.whl")
    shutil.move(pinned, aside / pinned.name)  # the wheel is missing: the create fails late
    dest = tmp_path / "out" / "mirror"

    def plan():
        return MirrorPlan(
            dest, "v-adv", [manifest], wheels_from=wheels, bundles_from=server.url,
            catalog_sha256=catalog_sha,
        )  # fmt: skip

    with MirrorServer(index_root) as server:
        with pytest.raises(DllmError, match="have no wheel"):
            create_mirror(plan(), add_release)
        assert _bundle_requests(server) == 1
        kept = tmp_path / "out" / ".mirror.downloads"
        assert (
            kept.is_dir() and "the same command again resumes from them" in capsys.readouterr().err
        )

        shutil.move(aside / pinned.name, pinned)  # fixed: the same command again
        create_mirror(plan(), add_release)
        assert _bundle_requests(server) == 1  # the kept archive, hashed again, not downloaded
    assert verify_mirror(dest).ok
    assert (dest / "bundles" / entry.file).stat().st_size == entry.size
    assert not kept.exists()  # done with once the mirror is in place


def test_a_source_whose_catalog_lists_a_missing_bundle_says_it_is_incomplete(
    tmp_path,
    wheels,  # noqa: F811 - the fixture's value
):
    """The catalog was found, so `--from` and the release are right; the hint said to check
    them ("check the mirror folder and the release name")."""
    index_root, catalog_sha, entry = published(
        tmp_path, tiny_bundle(tmp_path, {"lib/a.so": os.urandom(500)})
    )
    (index_root / "bundles" / entry.file).unlink()
    manifest = manifest_for(wheels, "dllm_fixture_a").model_copy(
        update={"bundle_target": str(entry.target)}
    )
    plan = MirrorPlan(
        tmp_path / "out", "v-adv", [manifest], wheels_from=wheels,
        bundles_from=str(index_root), catalog_sha256=catalog_sha,
    )  # fmt: skip
    with pytest.raises(DllmError, match="the release's catalog lists it") as caught:
        create_mirror(plan, add_release)
    assert "release name" not in caught.value.hint and "incomplete" in caught.value.hint
