"""The real vLLM peer: tests here carry the `peer` marker (pytestmark in each module) and
skip without `make vllm-peer`."""

from __future__ import annotations

import pytest

from tests.peer.vllm_server import missing_reason


@pytest.fixture(autouse=True)
def _needs_peer():
    reason = missing_reason()
    if reason is not None:
        pytest.skip(reason)
