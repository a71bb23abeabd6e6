"""kvlab's offloading CachePolicy adapters (kvlab.integrations.vllm.offload) against vLLM
0.32's CachePolicy contract, in the peer venv (tests/peer/offload_contract.py runs there, with
kvlab installed by `make vllm-plugin`). vLLM 0.32 runs the offloading connector's worker side on
CUDA/XPU only, so the end-to-end path (a vLLM offloading to CPU through these) is unverified
here. Marked `peer` (make test-peer)."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from tests.peer.vllm_server import PEER_PYTHON, plugin_missing_reason

pytestmark = pytest.mark.peer

SCRIPT = Path(__file__).with_name("offload_contract.py")
CLASSES = ("KvlabLRU", "KvlabFIFO", "KvlabLFU", "KvlabSLRU", "KvlabARC", "KvlabCost")
CONTRACT = ("inserted_chunks_come_back", "evicts_exactly_n", "too_many_changes_nothing",
            "protected_chunks_stay", "pending_and_read_chunks_stay", "clear_forgets_everything",
            "removed_chunk_is_gone")
SINGLE = ("lru_matches_vllms_lru", "lfu_keeps_the_reused_chunk",
          "arc_keeps_the_reused_chunk_through_a_scan", "every_class_serves_vllms_manager")


@pytest.fixture(scope="module")
def results(tmp_path_factory):
    if plugin_missing_reason() is not None:
        pytest.skip(plugin_missing_reason())
    run = subprocess.run([str(PEER_PYTHON), str(SCRIPT)], capture_output=True, text=True,
                         cwd=tmp_path_factory.mktemp("offload"), timeout=300)
    assert run.returncode == 0, run.stderr[-3000:]
    return json.loads(run.stdout)


@pytest.mark.parametrize("name", CLASSES)
@pytest.mark.parametrize("case", CONTRACT)
def test_adapter_keeps_vllms_cache_policy_contract(results, case, name):
    assert results[f"{case}[{name}]"] == "ok"


@pytest.mark.parametrize("case", SINGLE)
def test_adapter_behaves_as_its_kvlab_policy(results, case):
    assert results[case] == "ok"
