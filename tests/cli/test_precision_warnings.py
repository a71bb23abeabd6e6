"""`kvlab sim` says when a precision policy's prefix-cache settings cannot act: `cached=1` or
`recompute=1` given without prefix caching (the default `cached=1` says nothing)."""

from __future__ import annotations

import pytest

from kvlab.cli import main

WARNING = "acts on prefix-cache pages, and prefix caching is off"


@pytest.mark.parametrize("policy, flags, warned", [
    ("paged:precision=age:recent=64,cached=1", [], "precision cached=1"),
    ("paged:precision=age:recent=64,cached=0,recompute=1", [], "precision recompute=1"),
    ("paged:precision=age:recent=64", [], None),  # (cached=1 by default: nothing given)
    ("paged:eviction=lru,precision=age:recent=64,cached=1", ["--enable-prefix-caching"], None),
])
def test_prefix_cache_settings_without_prefix_caching_are_named(policy, flags, warned, capsys):
    assert main(["sim", "--num-prompts", "10", "--disable-tqdm", "--policy", policy,
                 *flags]) == 0
    err = capsys.readouterr().err
    if warned is None:
        assert WARNING not in err
    else:
        assert f"{warned}: {WARNING}" in err
