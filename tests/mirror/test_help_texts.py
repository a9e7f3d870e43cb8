"""`dllm mirror serve --help` gives --port's default."""

from __future__ import annotations


def test_serve_port_help_names_its_default(cli):
    result = cli("mirror", "serve", "--help")
    assert result.code == 0, result.err
    text = " ".join(result.out.split())
    assert "--port PORT TCP port (default 8000; 0: any free port)" in text, text
