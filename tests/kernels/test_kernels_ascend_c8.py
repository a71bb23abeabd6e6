"""The ascend backend's int8 KV cache (kv_cache_dtype int8, vLLM-Ascend's C8) in Triton's CPU
interpreter: attention over int8 pages equals the torch reference's over the same pages, writes
store the reference's bytes, copies and swaps move int8 pages bit-exactly. `make test-ascend`
runs them again under triton-ascend 3.2.0's interpreter. fp32 queries (the interpreter's bf16
arithmetic is wrong); tiny shapes (it is slow)."""

import warnings

import pytest
import torch
from kernel_cases import contiguous_attention, make_case, max_relative_error

from kvlab.errors import KvlabError, KvlabWarning
from kvlab.kernels import AttentionMetadata, get_backend
from kvlab.kernels.kv_quant import KVQuant
from kvlab.specs.kv_dtype import kv_cache_dtype

pytest.importorskip("triton")

TOL = 1e-5  # fp32 relative error against the reference over the same int8 pages
C8_TOL = 0.05  # against float attention: calibrated per-channel int8 (a step is absmax/127)
POISON = 1e4  # unwritten slots: quantized to +127 everywhere, far from any written value


@pytest.fixture(scope="module")
def ascend():
    return get_backend("ascend")


def _c8(k_rows: torch.Tensor, v_rows: torch.Tensor) -> KVQuant:
    """C8 scales calibrated on K and V rows `[num_tokens, num_kv_heads, head_dim]`."""
    k_scale, v_scale = (rows.abs().amax(dim=0) / 127 for rows in (k_rows, v_rows))
    return KVQuant(kv_cache_dtype("int8"), k_rows.shape[-1], k_channel_scale=k_scale,
                   v_channel_scale=v_scale)


def _int8_case(seq_lens, query_lens, **kwargs):
    """A make_case batch with its pages quantized to int8, and their KVQuant."""
    case = make_case(seq_lens, query_lens, poison=POISON, **kwargs)
    quant = _c8(torch.cat(case.full_k), torch.cat(case.full_v))
    num_pages, page_size, num_kv_heads, head_dim = case.k_cache.shape
    caches = [quant.quantize(cache.view(-1, num_kv_heads, head_dim), side)
              .view(num_pages, page_size, num_kv_heads, head_dim)
              for cache, side in ((case.k_cache, "k"), (case.v_cache, "v"))]
    return case, quant, *caches


def _check(ascend, seq_lens, query_lens, **kwargs):
    case, quant, k_cache, v_cache = _int8_case(seq_lens, query_lens, **kwargs)
    assert k_cache.dtype == torch.int8
    args = (case.query, k_cache, v_cache, case.meta)
    params = dict(scale=case.scale, num_kv_heads=case.num_kv_heads, kv_quant=quant)
    out = torch.full_like(case.query, float("nan"))
    assert ascend.paged_attention(*args, **params, out=out) is out
    expected = get_backend("torch").paged_attention(*args, **params)
    assert max_relative_error(out, expected) < TOL
    # and both are attention over the dequantized values: near the float result
    assert max_relative_error(out, contiguous_attention(case)) < C8_TOL


@pytest.mark.parametrize("page_size", [32, 128])
def test_int8_prefill_chunks_and_decodes_match_reference(ascend, page_size):
    _check(ascend, [37, 150, 1, 9, 70], [37, 20, 1, 1, 1], page_size=page_size, head_dim=16)


@pytest.mark.parametrize(("num_heads", "num_kv_heads"), [(6, 2), (8, 1)])
def test_int8_grouped_query_heads_match_reference(ascend, num_heads, num_kv_heads):
    # each KV head's scales serve the GROUP query heads that read it
    _check(ascend, [40, 70], [15, 1], page_size=32, num_heads=num_heads,
           num_kv_heads=num_kv_heads, head_dim=16)


def test_int8_runs_of_pages_and_a_head_dim_not_a_power_of_two_match_reference(ascend):
    # extents of 2 pages, cut by the context's end; head_dim 24 pads its tile to 32 columns
    _check(ascend, [100, 45], [1, 30], page_size=32, run_pages=2, head_dim=24)


def test_int8_write_kv_stores_the_references_bytes_and_skips_minus_one(ascend):
    meta = AttentionMetadata.build(
        block_tables=[[3, 0], [1]], seq_lens=[40, 5], query_lens=[40, 1], page_size=32
    )
    slots = meta.slot_mapping.clone()
    slots[4] = -1
    kv = torch.randn(41, 2, 2, 16) * 3
    key, value = kv[:, 0], kv[:, 1]  # strided views, as split from a fused projection
    quant = _c8(key, value)
    caches = [torch.full((4, 32, 2, 16), 99, dtype=torch.int8) for _ in range(4)]
    ascend.write_kv(key, value, caches[0], caches[1], slots, kv_quant=quant)
    get_backend("torch").write_kv(key, value, caches[2], caches[3], slots, kv_quant=quant)
    assert torch.equal(caches[0], caches[2]) and torch.equal(caches[1], caches[3])
    # the skipped token's slot and the pages no table names keep their old bytes
    assert bool((caches[0].view(-1, 2, 16)[int(meta.slot_mapping[4])] == 99).all())
    assert bool((caches[0][2] == 99).all())


def test_int8_copy_pages_is_bit_exact_also_along_a_chain(ascend):
    k_cache = torch.randint(-128, 128, (5, 32, 2, 16), dtype=torch.int8)
    v_cache = torch.randint(-128, 128, (5, 32, 2, 16), dtype=torch.int8)
    k_before, v_before = k_cache.clone(), v_cache.clone()
    ascend.copy_pages(k_cache, v_cache, torch.tensor([[0, 3], [2, 4]]))  # disjoint: one launch
    assert torch.equal(k_cache[3], k_before[0]) and torch.equal(v_cache[4], v_before[2])
    ascend.copy_pages(k_cache, v_cache, torch.tensor([[0, 1], [1, 2]]))  # a chain: staged
    assert torch.equal(k_cache[1], k_before[0]) and torch.equal(k_cache[2], k_before[1])
    assert torch.equal(v_cache[2], v_before[1]) and torch.equal(v_cache[0], v_before[0])


def test_int8_swap_out_then_in_restores_pages_bit_exact(ascend):
    dev_k = torch.randint(-128, 128, (5, 32, 2, 16), dtype=torch.int8)
    dev_v = torch.randint(-128, 128, (5, 32, 2, 16), dtype=torch.int8)
    host_k, host_v = torch.zeros(3, 32, 2, 16, dtype=torch.int8), torch.zeros(3, 32, 2, 16,
                                                                             dtype=torch.int8)
    original = dev_k[[1, 3]].clone(), dev_v[[1, 3]].clone()
    ascend.swap_pages(dev_k, dev_v, host_k, host_v, torch.tensor([[1, 2], [3, 0]]))
    assert torch.equal(host_k[2], original[0][0]) and torch.equal(host_v[0], original[1][1])
    ascend.swap_pages(host_k, host_v, dev_k, dev_v, torch.tensor([[2, 4], [0, 0]]))
    assert torch.equal(dev_k[[4, 0]], original[0]) and torch.equal(dev_v[[4, 0]], original[1])


def test_int8_pages_cann_would_refuse_run_with_a_warning_naming_block_size(ascend):
    from kvlab.kernels.ascend_backend import warn_c8_page_size

    warn_c8_page_size.cache_clear()
    case, quant, k_cache, v_cache = _int8_case([20], [1], page_size=16, head_dim=16)
    params = dict(scale=case.scale, num_kv_heads=case.num_kv_heads, kv_quant=quant)
    no_rows = torch.empty(0, case.num_kv_heads, 16)
    with pytest.warns(KvlabWarning, match="block_size 16: .* multiple of 32 .* int8 KV cache"):
        ascend.write_kv(no_rows, no_rows, k_cache, v_cache, torch.empty(0, dtype=torch.long),
                        kv_quant=quant)
    with warnings.catch_warnings():  # said once per page size; 32 is CANN's multiple too
        warnings.simplefilter("error", KvlabWarning)
        out = ascend.paged_attention(case.query, k_cache, v_cache, case.meta, **params)
        _check(ascend, [20], [1], page_size=32, head_dim=16)
    expected = get_backend("torch").paged_attention(case.query, k_cache, v_cache, case.meta,
                                                    **params)
    assert max_relative_error(out, expected) < TOL


@pytest.mark.parametrize("name", ["int8_per_token_head", "fp8_e5m2"])
def test_quantized_pages_other_than_c8_are_a_kvlab_error_naming_both_settings(ascend, name):
    x = torch.randn(3, 2, 16)
    cache = torch.zeros(2, 32, 2, 20, dtype=torch.uint8)
    with pytest.raises(KvlabError, match=f"kv_cache_dtype {name}: attention_backend ascend "
                                         "stores int8 \\(C8\\) only") as err:
        ascend.write_kv(x, x, cache, cache.clone(), torch.zeros(3, dtype=torch.long),
                        kv_quant=KVQuant(kv_cache_dtype(name), 16))
    assert set(err.value.parameters) == {"kv_cache_dtype", "attention_backend"}
