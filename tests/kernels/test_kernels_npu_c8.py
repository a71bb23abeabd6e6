"""The npu backend's int8 (C8) KV cache on CPU, torch_npu replaced by tests/kernels/
npu_emulation.py: the emulation follows the documented FIA contract and vLLM-Ascend's C8 calls;
nothing here has run on Ascend hardware."""

import sys

import pytest
import torch
from kernel_cases import make_case, max_relative_error
from npu_emulation import fake_torch_npu

from kvlab.errors import KvlabError
from kvlab.kernels import get_backend
from kvlab.kernels.kv_quant import KVQuant
from kvlab.specs.kv_dtype import kv_cache_dtype

FP16_TOL = 3e-3  # float16 roundings of the dequantized values and of the output


@pytest.fixture
def fake_npu(monkeypatch):
    module = fake_torch_npu()
    monkeypatch.setitem(sys.modules, "torch_npu", module)
    return module


def _c8_case(seq_lens, query_lens, page_size=32, **kwargs):
    case = make_case(seq_lens, query_lens, page_size=page_size, dtype=torch.float16, **kwargs)
    head_dim = case.query.shape[2]
    scale = torch.cat([*case.full_k, *case.full_v]).float().abs().amax(dim=0) / 127
    quant = KVQuant(kv_cache_dtype("int8"), head_dim, k_channel_scale=scale,
                    v_channel_scale=scale)
    caches = []
    for cache, side in ((case.k_cache, "k"), (case.v_cache, "v")):
        rows = cache.view(-1, *cache.shape[2:]).nan_to_num(0.0)
        caches.append(quant.quantize(rows, side).view(*cache.shape))
    return case, quant, *caches


def _both(case, quant, k_cache, v_cache):
    kwargs = dict(scale=case.scale, num_kv_heads=case.num_kv_heads, kv_quant=quant)
    out = get_backend("npu").paged_attention(case.query, k_cache, v_cache, case.meta, **kwargs)
    expected = get_backend("torch").paged_attention(case.query.float(), k_cache, v_cache,
                                                    case.meta, **kwargs)
    return out, expected


def test_c8_decodes_run_fia_bnsd_over_int8_pages(fake_npu):
    case, quant, k_cache, v_cache = _c8_case([1, 40, 100], [1, 1, 1], num_heads=8)
    out, expected = _both(case, quant, k_cache, v_cache)
    assert fake_npu.calls == ["npu_fused_infer_attention_score"]
    assert max_relative_error(out, expected) < FP16_TOL


def test_c8_mixed_batch_splits_decodes_and_dequantized_prefill_chunks(fake_npu):
    # a decode between two chunks (one after a cached prefix): two calls, BNSD and dense TND
    case, quant, k_cache, v_cache = _c8_case([70, 33, 90], [70, 1, 25])
    out, expected = _both(case, quant, k_cache, v_cache)
    assert fake_npu.calls == ["npu_fused_infer_attention_score"] * 2
    assert max_relative_error(out, expected) < FP16_TOL


def test_c8_write_stores_the_reference_bytes(fake_npu):
    key = torch.randn(5, 2, 16, dtype=torch.float16)
    scale = key.float().abs().amax(dim=0) / 100
    quant = KVQuant(kv_cache_dtype("int8"), 16, k_channel_scale=scale, v_channel_scale=scale)
    slots = torch.tensor([3, -1, 40, 7, 63])
    written = []
    for name in ("npu", "torch"):
        k_cache = torch.zeros(2, 32, 2, 16, dtype=torch.int8)
        v_cache = torch.zeros_like(k_cache)
        get_backend(name).write_kv(key, -key, k_cache, v_cache, slots, kv_quant=quant)
        written.append((k_cache, v_cache))
    assert all(torch.equal(a, b) for a, b in zip(*written, strict=True))


def test_int8_pages_need_a_page_size_multiple_of_32(fake_npu):
    case, quant, k_cache, v_cache = _c8_case([20], [1], page_size=16)
    with pytest.raises(KvlabError, match="multiple of 32 that is at most 512 for int8"):
        _both(case, quant, k_cache, v_cache)


def test_precisions_other_than_c8_are_refused(fake_npu):
    quant = KVQuant(kv_cache_dtype("fp8"), 16)
    x = torch.zeros(2, 2, 16, dtype=torch.float16)
    with pytest.raises(KvlabError, match="kv_cache_dtype fp8_e4m3: attention_backend npu "
                                         "stores int8 \\(C8\\) only"):
        get_backend("npu").write_kv(x, x, x, x, torch.zeros(2, dtype=torch.long),
                                    kv_quant=quant)
