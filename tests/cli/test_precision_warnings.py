"""`kvlab sim` and `serve` (`run`: tests/engine/test_run_cli.py) say when a precision policy's
prefix-cache settings cannot act: `cached=1` or `recompute=1` given without prefix caching (the
default `cached=1` says nothing)."""

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


def test_kvlab_serve_names_them_before_it_serves(monkeypatch, capsys):
    import kvlab.server

    served = []
    monkeypatch.setattr(kvlab.server, "serve", lambda config: served.append(config) or 0)
    assert main(["serve", "tiny-llama", "--policy",
                 "paged:precision=age:recent=64,cached=1,preemption=swap"]) == 0
    err = capsys.readouterr().err
    assert f"precision cached=1: {WARNING}" in err and "preemption=swap: vLLM V1" in err
    assert len(served) == 1  # (the warnings do not stop it)
