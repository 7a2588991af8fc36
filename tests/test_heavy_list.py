"""tests/heavy_tests.txt names tests that exist: a renamed test must not silently come back
into the default suite (or leave CI's ``-m heavy`` run) through a stale line.  Checked for
the files this session collected (all of them under a bare ``python -m pytest``)."""

from __future__ import annotations

from conftest import HEAVY_SEEN, heavy_prefixes


def test_every_line_of_the_heavy_list_names_a_collected_test():
    prefixes = heavy_prefixes()
    assert prefixes
    checked = [p for p in prefixes if p.split("::")[0] in HEAVY_SEEN["files"]]
    stale = [p for p in checked if p not in HEAVY_SEEN["matched"]]
    assert not stale, f"tests/heavy_tests.txt names no test: {stale}"
