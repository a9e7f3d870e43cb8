"""The `dllm bundle` commands' error contract, and the doctor / launcher kernel checks."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.bundles.server import MirrorServer
from tests.helpers import assert_user_error
from turbo_dllm.errors import DllmError
from turbo_dllm.kernels.readiness import require_kernels


def test_cli_fingerprint_json(cli, monkeypatch):
    monkeypatch.setenv("DLLM_OVERRIDE_GPUS", "sm90")
    result = cli("bundle", "fingerprint", "--json")
    assert result.code == 0, result.err
    data = json.loads(result.out)
    assert data["format"] == "turbo_dllm.fingerprint.v1"
    assert data["gpus"][0]["arch"] == "sm90" and "gpus" in data["overrides"]
    human = cli("bundle", "fingerprint", "--no-overrides")
    assert human.code == 0 and "python_tag" in human.out and "overridden" not in human.out


def test_empty_store_commands(cli):
    assert cli("bundle", "list").out.startswith("no bundles installed")
    status = json.loads(cli("bundle", "status", "--json").out)
    assert status["active"] is None and status["fits_host"] is False
    assert cli("bundle", "verify").code == 0


@pytest.mark.parametrize(
    ("args", "needles"),
    [
        (["install", "--auto"], ["no bundle index given", "DLLM_BUNDLE_INDEX"]),
        (["install", "--target", "cp3-x", "--mirror", "."], ["invalid bundle target"]),
        (["install", "--auto", "--index", "ftp://example.com/x"], ["unsupported bundle source"]),
        (["install", "--auto", "--mirror", "/nonexistent/mirror"], ["does not exist"]),
        (["install", "--auto", "--release", "../x", "--mirror", "."], ["invalid release name"]),
        (
            ["install", "--auto", "--release", "v9", "--mirror", "."],
            ["not pinned", "--catalog-sha256"],
        ),
        (["uninstall", "abcdef"], ["no installed bundle"]),
        (["install", "--auto", "--offline", "--index", "https://example.org/x"], ["offline mode"]),
        (["build", "--target", "sm75", "--out", "out"], ["unknown build target"]),
    ],
)
def test_user_errors(cli_process, tmp_path, args, needles):
    result = cli_process("bundle", *args, cwd=tmp_path)
    assert_user_error(result, *needles)


def test_offline_mode_allows_local_sources(cli, mirror, monkeypatch):
    root, catalog_sha = mirror
    monkeypatch.setenv("DLLM_OFFLINE", "1")
    refused = cli(
        "bundle", "install", "--auto", "--release", "v-test", "--index", "http://10.1.2.3:8000"
    )
    assert_user_error(refused, "offline mode: refusing to contact '10.1.2.3'")
    with MirrorServer(root) as server:
        loopback = cli(
            "bundle", "install", "--auto", "--release", "v-test", "--index", server.url,
            "--catalog-sha256", catalog_sha, "--dry-run",
        )  # fmt: skip
    assert loopback.code == 0, loopback.err
    folder = cli(
        "bundle",
        "install",
        "--auto",
        "--release",
        "v-test",
        "--mirror",
        root,
        "--catalog-sha256",
        catalog_sha,
    )
    assert folder.code == 0, folder.err


@pytest.mark.parametrize("value", ["on", "ON "])
def test_offline_on_is_offline(cli, monkeypatch, value):
    monkeypatch.setenv("DLLM_OFFLINE", value)  # read as off: the network was contacted
    refused = cli(
        "bundle", "install", "--auto", "--release", "v-test", "--index", "http://10.1.2.3:8000",
        "--retries", "0",
    )  # fmt: skip
    assert_user_error(refused, "offline mode: refusing to contact '10.1.2.3'")


@pytest.mark.parametrize("value", ["2", "y", "offline"])
def test_an_offline_value_neither_on_nor_off_is_refused(cli, monkeypatch, value):
    monkeypatch.setenv("DLLM_OFFLINE", value)
    refused = cli(
        "bundle", "install", "--auto", "--release", "v-test", "--index", "http://10.1.2.3:8000",
        "--retries", "0",
    )  # fmt: skip
    assert_user_error(refused, f"DLLM_OFFLINE={value!r} is neither on nor off", "DLLM_OFFLINE=1")
    # a folder too (it was read only for a URL, so `--mirror DIR` took any value)
    folder = cli("bundle", "install", "--auto", "--release", "v-test", "--mirror", ".")
    assert_user_error(folder, f"DLLM_OFFLINE={value!r} is neither on nor off")


def test_install_needs_auto_or_target(cli):
    result = cli("bundle", "install", "--mirror", ".")
    assert result.code == 2 and "--auto" in result.err


def test_missing_release_over_http(cli, tmp_path):
    with MirrorServer(tmp_path) as server:
        result = cli(
            "bundle",
            "install",
            "--auto",
            "--release",
            "v9",
            "--index",
            server.url,
            "--catalog-sha256",
            "a" * 64,
        )
    assert_user_error(result, "was not found (HTTP 404)")


def test_publish_prints_the_pin_and_updates_a_lock(cli, cpu_bundle, tmp_path):
    lock = tmp_path / "releases.lock"
    lock.write_text('format = "turbo_dllm.releases.v1"\n[releases]\n')
    result = cli(
        "bundle",
        "publish",
        cpu_bundle.archive,
        "--release",
        "v1",
        "--mirror",
        tmp_path / "m",
        "--lock",
        lock,
        "--json",
    )
    assert result.code == 0, result.err
    data = json.loads(result.out)
    assert data["pinned"] is True and data["catalog_sha256"] in lock.read_text()
    text = cli(
        "bundle", "publish", cpu_bundle.archive, "--release", "v1", "--mirror", tmp_path / "m"
    )
    assert f"--catalog-sha256 {data['catalog_sha256']}" in text.out


def test_publish_prints_an_install_line_that_runs_as_printed(cli, cpu_bundle, tmp_path):
    """`install: ... --mirror /media/usb/my mirror --catalog-sha256 ...` split at the space when
    pasted (argparse: unrecognized arguments)."""
    import shlex

    mirror = tmp_path / "usb stick ü" / "my mirror"
    result = cli("bundle", "publish", cpu_bundle.archive, "--release", "v1", "--mirror", mirror)
    assert result.code == 0, result.err
    line = next(x for x in result.out.splitlines() if x.startswith("install: "))
    command = shlex.split(line.removeprefix("install: "))
    assert command[command.index("--mirror") + 1] == str(mirror)
    installed = cli(*command[1:], "--json")
    assert installed.code == 0, installed.err
    assert json.loads(installed.out)["installed"]["sha256"] == cpu_bundle.sha256


def test_build_prints_a_publish_line_for_an_archive_in_a_folder_with_a_space(
    cli_process, tmp_path, build_home
):
    import shlex

    out = tmp_path / "dist dir"
    result = cli_process(
        "bundle", "build", "--out", out, "--op", "merge_attention_partials",
        env={"DLLM_HOME": str(build_home)},  # its build cache: a relink, not a compile
    )  # fmt: skip
    assert result.code == 0, result.err
    line = next(x for x in result.out.splitlines() if x.startswith("next: "))
    command = shlex.split(line.removeprefix("next: "))
    assert command[:3] == ["dllm", "bundle", "publish"]
    assert Path(command[3]).parent == out and Path(command[3]).is_file(), command


@pytest.mark.parametrize(
    ("content", "needle"),
    [
        (None, "No such file or directory"),
        ("x = 1\n", "unknown field"),
        ("[releases\n", "not a readable releases lock"),
    ],
)
def test_publish_refuses_an_unusable_lock_before_publishing(
    cli, cpu_bundle, tmp_path, content, needle
):
    """A missing, foreign or broken --lock file was a traceback, after the mirror was written."""
    lock = tmp_path / "releases.lock"
    if content is not None:
        lock.write_text(content)
    mirror = tmp_path / "m"
    result = cli("bundle", "publish", cpu_bundle.archive, "--release", "v1", "--mirror", mirror,
                 "--lock", lock)  # fmt: skip
    assert_user_error(result, f"--lock {lock}", needle, 'format = "turbo_dllm.releases.v1"')
    assert not mirror.exists()


def test_an_output_folder_that_is_a_file_is_refused(cli, cpu_bundle, tmp_path):
    """`--out FILE` / `--mirror FILE` were a FileExistsError traceback (for build, after
    compiling)."""
    afile = tmp_path / "afile"
    afile.write_text("not a folder")
    built = cli("bundle", "build", "--out", afile)
    assert_user_error(built, f"cannot write into {afile}: it is a file")
    published = cli("bundle", "publish", cpu_bundle.archive, "--release", "v1", "--mirror", afile)
    assert_user_error(published, f"cannot write into {afile}: it is a file")
    assert_user_error(cli("bundle", "build", "--out", afile / "x"), "Not a directory")
    assert afile.read_text() == "not a folder"


# --- doctor and launcher checks -----------------------------------------------------------------


def _doctor(cli, tmp_path, kernels):
    config = tmp_path / "train.yaml"
    config.write_text(f"kernels: {kernels}\n")
    result = cli("doctor", "--config", config, "--json")
    checks = {c["name"]: c for c in json.loads(result.out)["checks"]}
    return result.code, checks


def test_doctor_passes_on_cpu_with_reference_kernels(cli, tmp_path):
    _, checks = _doctor(cli, tmp_path, "reference")
    assert checks["fingerprint"]["status"] == "pass"
    assert checks["kernel bundle"]["status"] == "pass"
    assert checks["kernels"]["status"] == "pass"


@pytest.mark.parametrize("size", ["0", "-3"])
def test_doctor_refuses_a_world_size_below_one(cli, size):
    """It checked for a launch of 0 or -3 processes and said "ready"."""
    assert_user_error(cli("doctor", "--world-size", size), "--world-size must be 1 or more")


def test_doctor_fails_native_without_a_bundle_with_the_install_command(cli, tmp_path):
    code, checks = _doctor(cli, tmp_path, "native")
    assert code == 1
    for name in ("kernel bundle", "kernels"):
        assert checks[name]["status"] == "fail"
        assert "dllm bundle install --release v" in checks[name]["fix"]


def test_doctor_names_a_file_in_the_way_of_the_bundle_store(cli, tmp_path):
    """Was: "none installed" with the install command as the fix, which then failed with
    "File exists" (the home itself is writable, so the cache dir check passed)."""
    from turbo_dllm.paths import dllm_home

    blocker = dllm_home() / "bundles"
    blocker.parent.mkdir(parents=True, exist_ok=True)
    blocker.write_text("")
    code, checks = _doctor(cli, tmp_path, "native")
    bundle = checks["kernel bundle"]
    assert code == 1 and bundle["status"] == "fail", bundle
    assert bundle["detail"] == (
        f"none installed, and none can be: {blocker / 'store'}: "
        f"the path goes through {blocker}, which is a file, not a folder"
    )
    assert bundle["fix"].startswith(f"move the file {blocker} out of the way, or set DLLM_HOME")
    assert checks["cache dir"]["status"] == "pass"
    _, checks = _doctor(cli, tmp_path, "reference")  # not needed: said, as a warning
    assert checks["kernel bundle"]["status"] == "warn"
    blocker.unlink()  # the fix
    _, checks = _doctor(cli, tmp_path, "reference")
    assert checks["kernel bundle"]["status"] == "pass"


def test_doctor_passes_native_with_a_matching_bundle(cli, tmp_path, installed):
    code, checks = _doctor(cli, tmp_path, "native")
    assert checks["kernel bundle"]["status"] == "pass", checks["kernel bundle"]
    assert checks["kernels"]["status"] == "pass"
    assert "loaded merge_attention_partials" in checks["kernels"]["detail"]


def test_doctor_fails_native_when_the_bundle_does_not_fit(cli, tmp_path, installed, monkeypatch):
    monkeypatch.setenv("DLLM_OVERRIDE_CXX11_ABI", "0" if installed.target.cxx11_abi else "1")
    _, checks = _doctor(cli, tmp_path, "native")
    assert checks["fingerprint"]["status"] == "warn"  # overrides are never silent
    assert checks["kernel bundle"]["status"] == "fail"
    assert "cxx11_abi: host" in checks["kernel bundle"]["detail"]


def test_doctor_without_a_config_does_not_blame_a_runspec_for_a_bundle_that_does_not_fit(
    cli, installed, monkeypatch
):
    """Was: plain `dllm doctor` (no --config) warned "the RunSpec asks for `kernels: native`,
    but the active bundle ... does not fit", naming a RunSpec nobody gave; its fix lacked the
    `--index URL` note the kernel bundle check gives."""
    monkeypatch.setenv("DLLM_OVERRIDE_CXX11_ABI", "0" if installed.target.cxx11_abi else "1")
    result = cli("doctor", "--json")
    checks = {c["name"]: c for c in json.loads(result.out)["checks"]}
    kernels = checks["kernels"]
    assert kernels["status"] == "warn", kernels
    assert "RunSpec" not in kernels["detail"]
    assert kernels["detail"].startswith(f"not loaded: the active bundle {installed.bundle_id}")
    assert "cxx11_abi: host" in kernels["detail"]
    assert kernels["fix"] == checks["kernel bundle"]["fix"]


def test_doctor_on_a_login_node_compares_the_bundle_with_the_overridden_host(
    cli, tmp_path, cpu_bundle, monkeypatch
):
    """DLLM_OVERRIDE_* describe the compute nodes: their bundle fits them and is not loaded
    here (it was, and failed "built for another environment" with a fix that installs this
    node's bundle). Without the overrides the same bundle does not fit."""
    from tests.bundles.crafting import variant
    from tests.bundles.test_kernels import _install
    from turbo_dllm.bundles.target import BundleTarget

    ours = cpu_bundle.manifest.target
    other = BundleTarget.parse(str(ours).replace(str(ours.python), "cp399", 1))
    monkeypatch.setenv("DLLM_OVERRIDE_PYTHON", "cp399")
    _install(variant(cpu_bundle, tmp_path, target=other), tmp_path, "v-compute-nodes")
    for config in ("native", None):
        if config:
            _, checks = _doctor(cli, tmp_path, config)
        else:
            checks = {c["name"]: c for c in json.loads(cli("doctor", "--json").out)["checks"]}
        assert checks["kernel bundle"]["status"] == "pass", checks["kernel bundle"]
        assert checks["kernels"]["status"] == "pass", checks["kernels"]
        assert "fits this host (the DLLM_OVERRIDE_* host" in checks["kernels"]["detail"]
    monkeypatch.delenv("DLLM_OVERRIDE_PYTHON")
    code, checks = _doctor(cli, tmp_path, "native")
    assert code == 1 and "bundle cp399" in checks["kernels"]["detail"]


def test_doctor_reports_a_bad_override_in_its_check_and_goes_on(cli, tmp_path, monkeypatch):
    """Was: the fingerprint check failed with the fix, then the gpus check raised the same
    error: `dllm: error:`, exit 2, no report (no JSON with --json)."""
    monkeypatch.setenv("DLLM_OVERRIDE_GPUS", "sm9x")
    code, checks = _doctor(cli, tmp_path, "reference")
    assert code == 1
    assert checks["fingerprint"]["status"] == "fail"
    assert "DLLM_OVERRIDE_GPUS='sm9x'" in checks["fingerprint"]["detail"]
    assert "sm90" in checks["fingerprint"]["fix"]
    assert checks["kernels"]["status"] == "pass"  # reference kernels need no host
    assert checks["gpus"]["status"] == "pass"  # judged on the real host
    assert checks["attention merge"]["status"] == "pass"
    # The checks that compare with the fingerprint are skips naming the fingerprint check: they
    # repeated its failure as warnings (the kernel bundle's, the environment's)
    for name in ("kernel bundle", "environment"):
        assert checks[name]["status"] == "skip", checks[name]
        assert "(see the fingerprint check)" in checks[name]["detail"]
    text = cli("doctor")
    assert text.code == 1 and "not ready" in text.out and "Traceback" not in text.err


def test_require_kernels_for_launchers(installed, monkeypatch):
    assert "nothing to install" in require_kernels("reference")
    assert "jit" in require_kernels("jit")
    assert "fits this host" in require_kernels("native")
    assert "loaded merge_attention_partials" in require_kernels("native", load=True)
    monkeypatch.setenv("DLLM_OVERRIDE_PYTHON", "3.99")
    with pytest.raises(DllmError, match="does not fit this host: python") as caught:
        require_kernels("native")
    assert caught.value.hint.startswith("dllm bundle install")


def test_require_kernels_without_a_bundle(monkeypatch):
    import shlex

    monkeypatch.delenv("DLLM_BUNDLE_INDEX", raising=False)
    with pytest.raises(DllmError, match="no kernel bundle is installed") as caught:
        require_kernels("native")
    hint = caught.value.hint
    assert hint.startswith("dllm bundle install --release v") and "--auto --index URL" in hint
    # the whole line pastes into a shell: the alternative is a comment, not "(or set ...)"
    assert shlex.split(hint, comments=True)[-1] == "URL"
    assert hint.endswith("# or set `kernels: reference`")


def test_require_kernels_jit_with_a_cxx_that_is_not_installed(monkeypatch, tmp_path):
    """torch builds with $CXX whatever else is installed: the fix is CXX (was "install g++")."""
    monkeypatch.setenv("CXX", str(tmp_path / "no-such-g++"))
    with pytest.raises(DllmError, match=r"no-such-g\+\+' \(from CXX\) was not found") as caught:
        require_kernels("jit")
    assert caught.value.hint == "set CXX to a C++ compiler that is installed, or unset it"


def test_doctor_prints_each_fix_on_one_line_to_paste(cli, tmp_path, monkeypatch):
    """rich wrapped a fix wider than the terminal with hard line breaks: a command copied from
    the report ran cut in two (`dllm config validate` without its --config, say)."""
    monkeypatch.setenv("COLUMNS", "60")
    config = tmp_path / ("a-folder-with-a-long-name-" * 3) / "train.yaml"
    config.parent.mkdir()
    config.write_text("training: {stpes: 1}\n")
    report = json.loads(cli("doctor", "--config", config, "--json").out)
    fix = next(c["fix"] for c in report["checks"] if c["name"] == "config")
    assert len(fix) > 60
    text = cli("doctor", "--config", config)
    assert text.code == 1
    assert f"      fix: {fix}\n" in text.out, text.out


def test_doctor_given_a_config_path_that_is_no_file_is_an_error(cli, tmp_path):
    """A config that is not there (or a folder) read "edit the fields named above in
    nope.yaml": there are no fields; then it was a failed config check under a report of the
    host, exit 1. A path that holds nothing to check is bad input (README's CLI contract), as
    `dllm config validate` and `dllm launch` say it: exit 2, the loader's message naming the
    path and its hint, and under --json one error object."""
    missing = tmp_path / "nope.yaml"
    result = cli("doctor", "--config", missing)
    assert_user_error(
        result, f"config file not found: '{missing}'", "hint: check the path, or create one"
    )
    assert result.out == ""  # no report of the host
    result = cli("doctor", "--config", missing, "--json")
    assert_user_error(result, f"config file not found: '{missing}'")
    assert json.loads(result.out) == {
        "error": f"config file not found: '{missing}'",
        "hint": "check the path, or create one with `dllm init DIR`",
    }
    cli("init", tmp_path / "p")
    result = cli("doctor", "--config", tmp_path / "p", "--json")
    assert_user_error(result, f"{tmp_path / 'p'} is a folder, not a config file")
    assert str(tmp_path / "p" / "train.yaml") in json.loads(result.out)["hint"]


def test_doctor_given_an_empty_config_is_an_error(cli):
    """`dllm doctor --config "$SPEC"` with SPEC unset read as no --config: the host alone was
    checked and reported "ready", exit 0; `dllm launch` refuses it so."""
    for empty in ("", " "):
        result = cli("doctor", "--config", empty, "--json")
        assert_user_error(result, "--config is empty (an unset shell variable?)")
        assert json.loads(result.out)["hint"].startswith("pass the RunSpec to check")


def test_doctor_install_fix_works_without_an_index_variable(cli, tmp_path, monkeypatch):
    """The kernel bundle check's fix, `dllm bundle install --release vX --auto`, stopped at
    "no bundle index given" when pasted on a host without DLLM_BUNDLE_INDEX."""
    from turbo_dllm.kernels.loader import install_command

    monkeypatch.delenv("DLLM_BUNDLE_INDEX", raising=False)
    code, checks = _doctor(cli, tmp_path, "native")
    fix = checks["kernel bundle"]["fix"]
    assert code == 1 and fix.startswith(f"{install_command()}   # URL: your release server")
    assert install_command().endswith("--auto --index URL")
    assert fix.endswith("build it here: dllm bundle install --auto --build missing")
    monkeypatch.setenv("DLLM_BUNDLE_INDEX", "http://127.0.0.1:9/dllm")
    _, checks = _doctor(cli, tmp_path, "native")
    assert checks["kernel bundle"]["fix"] == install_command()  # pasted, it reads the index


def test_empty_store_next_command_names_an_index(cli, monkeypatch):
    """`bundle list` and `bundle status` on an empty store suggested `dllm bundle install
    --release vX --auto`, which stops at "no bundle index given" when pasted without
    DLLM_BUNDLE_INDEX; they print the command doctor prints."""
    from turbo_dllm.kernels.loader import install_command

    monkeypatch.delenv("DLLM_BUNDLE_INDEX", raising=False)
    assert cli("bundle", "list").out.strip().endswith("--auto --index URL)")
    assert "active    none (dllm bundle install --release v" in cli("bundle", "status").out
    assert f"({install_command()})" in cli("bundle", "status").out
    monkeypatch.setenv("DLLM_BUNDLE_INDEX", "http://127.0.0.1:9/dllm")
    assert cli("bundle", "list").out.strip().endswith("--auto)")  # pasted, it reads the index


def test_publish_onto_a_disk_without_room_writes_nothing(cli, cpu_bundle, tmp_path, monkeypatch):
    """Publishing onto a disk with less room than the archives copied until it was full,
    printed the raw OS error of its temporary file and left an empty `bundles/` folder (found by
    the bundle crash audit). It is refused first, naming the sizes."""
    from turbo_dllm import fsutil

    monkeypatch.setattr(fsutil, "file_system", lambda path: (Path("/mnt/small"), 1024))
    mirror = tmp_path / "m"
    result = cli("bundle", "publish", cpu_bundle.archive, "--release", "v1", "--mirror", mirror)
    assert_user_error(
        result,
        "the archives to publish hold ",
        "(mounted at /mnt/small) has 1.0 KiB free; nothing was written",
        "hint: free space there, or publish into a --mirror on a larger disk",
    )
    assert not mirror.exists()
