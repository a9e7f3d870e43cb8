"""doctor's data fit check compares an artifact whose folder holds an unlisted file (a warning
of the data artifact check): it was skipped ("pass ... skipped"), so a run whose seq_len did
not fit the data reported ready (so did `dllm launch`, which runs these checks)."""

from __future__ import annotations

import json


def test_data_fit_compares_an_artifact_with_an_unlisted_file(cli, tmp_path):
    project = tmp_path / "p"
    assert cli("init", project).code == 0
    assert cli("data", "prepare", "--config", project / "prepare.yaml").code == 0
    (project / "data/prepared/notes.txt").write_text("mine\n")
    train = project / "train.yaml"
    train.write_text(train.read_text().replace("seq_len: 256", "seq_len: 128"))
    result = cli("doctor", "--config", train, "--json")
    checks = {c["name"]: c for c in json.loads(result.out)["checks"]}
    assert checks["data artifact"]["status"] == "warn", checks["data artifact"]
    assert "notes.txt" in checks["data artifact"]["detail"]
    fit = checks["data fit"]
    assert fit["status"] == "fail" and "data.seq_len: 128" in fit["detail"], fit
    assert result.code == 1
