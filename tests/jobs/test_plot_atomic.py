"""`dllm run plot` replaces each PNG whole: a plot stopped while it writes (Ctrl-C, a full disk)
keeps the last whole one, where savefig left a torn file in its place."""

from __future__ import annotations

import io
import json

import matplotlib.figure


def test_a_plot_stopped_while_it_writes_keeps_the_last_whole_png(cli, workdir, monkeypatch):
    run_dir = workdir / "plain"
    run_dir.mkdir()
    records = [{"step": s, "loss": 5.0 - s, "tokens_per_s": 10.0, "mem_gb": 1.0} for s in (1, 2)]
    (run_dir / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    assert cli("run", "plot", run_dir).code == 0
    png = run_dir / "plots" / "loss.png"
    whole = png.read_bytes()

    save = matplotlib.figure.Figure.savefig

    def stopped_halfway(figure, fname, **kwargs):
        image = io.BytesIO()
        save(figure, image, **{**kwargs, "format": "png"})
        data = image.getvalue()[: len(image.getvalue()) // 2]
        if hasattr(fname, "write"):
            fname.write(data)
        else:
            with open(fname, "wb") as out:
                out.write(data)
        raise KeyboardInterrupt

    monkeypatch.setattr(matplotlib.figure.Figure, "savefig", stopped_halfway)
    result = cli("run", "plot", run_dir)
    assert result.code == 130
    assert png.read_bytes() == whole
