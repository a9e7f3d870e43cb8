"""A launch stopped before it recorded its manifest (Ctrl-C, a full disk) takes back what it
wrote: its spec.yaml (and SLURM script) held the run dir as "a run's files without a manifest",
and the same launch was then refused there."""

from __future__ import annotations

import pytest

from turbo_dllm.jobs import launcher


@pytest.fixture
def stop_at_the_manifest(monkeypatch):
    """Ctrl-C while the manifest is written (after spec.yaml and the script)."""

    def interrupted(manifest, run_dir):
        raise KeyboardInterrupt

    monkeypatch.setattr(launcher, "write_manifest", interrupted)
    return monkeypatch


@pytest.mark.parametrize("backend", [(), ("--backend", "slurm")])
@pytest.mark.parametrize("existing", [False, True])
def test_a_launch_stopped_before_its_manifest_leaves_the_run_dir_as_it_found_it(
    cli, spec_file, workdir, stop_at_the_manifest, backend, existing
):
    run_dir = workdir / "r"
    if existing:  # a folder the user made, with a file of theirs
        run_dir.mkdir()
        (run_dir / "notes.txt").write_text("mine")
    stopped = cli("launch", "--config", spec_file, "--run-dir", run_dir, *backend)
    assert stopped.code == 130 and "dllm: interrupted" in stopped.err
    if existing:
        assert sorted(p.name for p in run_dir.iterdir()) == ["notes.txt"]
    else:
        assert not run_dir.exists()
    stop_at_the_manifest.undo()
    result = cli("launch", "--config", spec_file, "--run-dir", run_dir, *backend)
    assert result.code == 0, result.err
    assert (run_dir / "manifest.json").is_file()
