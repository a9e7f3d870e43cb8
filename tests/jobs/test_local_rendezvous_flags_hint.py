"""A one-process launch given a flag of where processes meet (--master-port, --rdzv-id) is
refused; at --backend auto the hint said "or leave --backend at auto", which it was (auto runs
one process in this one), so only `--backend torchrun` or dropping the flag goes on."""

from __future__ import annotations

from tests.helpers import assert_user_error


def test_the_hint_offers_auto_only_where_it_is_not_already(cli, spec_file, workdir):
    auto = cli("launch", "--config", spec_file, "--master-port", "1234", "--dry-run")
    assert_user_error(auto, "has no use for --master-port", "use --backend torchrun, or drop them")
    assert "leave --backend at auto" not in auto.err
    local = ("--backend", "local", "--master-addr", "h0")
    explicit = cli("launch", "--config", spec_file, *local, "--dry-run")
    assert_user_error(explicit, "has no use for --master-addr", "or leave --backend at auto")
    # both ways on work as given
    for way in (("--backend", "torchrun", "--master-port", "1234"), ("--master-addr", "h0")):
        assert cli("launch", "--config", spec_file, *way, "--dry-run").code == 0, way
