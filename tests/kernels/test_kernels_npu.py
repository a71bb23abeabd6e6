"""The npu backend end to end on CPU, torch_npu replaced by an emulation of its documented ops."""

import importlib.util
import sys

import pytest
import torch
from kernel_cases import attend, contiguous_attention, make_case, max_relative_error, move_case
from npu_emulation import ContractError, fake_torch_npu
from npu_emulation import npu_fused_infer_attention_score as emulated_fused_attention

from kvlab.errors import KvlabError
from kvlab.kernels import AttentionMetadata, available_backends, get_backend

FP16_TOL = 2e-3  # one float16 rounding of the output, relative to its largest element


@pytest.fixture
def fake_npu(monkeypatch):
    """The emulated torch_npu module, installed where `import torch_npu` finds it."""
    module = fake_torch_npu()
    monkeypatch.setitem(sys.modules, "torch_npu", module)
    return module


def _reference(case):
    return attend(case, get_backend("torch"))


@pytest.mark.parametrize("page_size", [16, 128])
def test_mixed_batch_runs_the_fused_op_and_matches_reference(fake_npu, page_size):
    case = make_case(
        [37, 150, 1, 9, 200], [37, 20, 1, 1, 1], page_size=page_size, dtype=torch.float16
    )
    out = attend(case, get_backend("npu"))
    assert fake_npu.calls == ["npu_fused_infer_attention_score"]
    assert max_relative_error(out, _reference(case)) < FP16_TOL
    assert max_relative_error(out, contiguous_attention(case)) < FP16_TOL


def test_several_prefill_chunks_pass_cumulative_query_ends(fake_npu):
    # the second chunk is shorter than the first: per-sequence lengths would not be cumulative
    case = make_case([90, 70, 40], [60, 12, 40], page_size=16, dtype=torch.float16)
    assert max_relative_error(attend(case, get_backend("npu")), _reference(case)) < FP16_TOL


def test_decode_only_batch_takes_the_paged_attention_fast_path(fake_npu):
    case = make_case([1, 17, 64, 300], [1] * 4, page_size=32, dtype=torch.float16)
    out = torch.full_like(case.query, float("nan"))
    result = attend(case, get_backend("npu"), out=out)
    assert fake_npu.calls == ["_npu_paged_attention"]
    assert result is out
    assert max_relative_error(out, _reference(case)) < FP16_TOL


@pytest.mark.parametrize(("num_heads", "num_kv_heads"), [(4, 4), (8, 2), (6, 1)])
def test_grouped_query_heads_match_reference(fake_npu, num_heads, num_kv_heads):
    case = make_case(
        [40, 21],
        [15, 1],
        page_size=16,
        num_heads=num_heads,
        num_kv_heads=num_kv_heads,
        dtype=torch.float16,
    )
    assert max_relative_error(attend(case, get_backend("npu")), _reference(case)) < FP16_TOL


def test_bfloat16_batch_matches_reference(fake_npu):
    case = make_case([70, 5], [30, 1], page_size=16, dtype=torch.bfloat16)
    assert max_relative_error(attend(case, get_backend("npu")), _reference(case)) < 1e-2


def test_write_kv_matches_reference_and_skips_minus_one(fake_npu):
    meta = AttentionMetadata.build(
        block_tables=[[3, 0], [1]], seq_lens=[20, 5], query_lens=[20, 1], page_size=16
    )
    slots = meta.slot_mapping.clone()
    slots[[4, 20]] = -1
    key, value = torch.randn(2, 21, 2, 16, dtype=torch.float16)
    caches = [torch.zeros(4, 16, 2, 16, dtype=torch.float16) for _ in range(4)]
    get_backend("npu").write_kv(key, value, caches[0], caches[1], slots)
    get_backend("torch").write_kv(key, value, caches[2], caches[3], slots)
    assert fake_npu.calls == ["npu_scatter_pa_kv_cache"]
    assert torch.equal(caches[0], caches[2]) and torch.equal(caches[1], caches[3])


def test_copy_and_swap_pages_move_whole_pages(fake_npu):
    backend = get_backend("npu")
    dev_k, dev_v = torch.randn(2, 5, 16, 2, 8, dtype=torch.float16)
    host_k, host_v = torch.zeros(2, 3, 16, 2, 8, dtype=torch.float16)
    before = dev_k.clone()
    backend.copy_pages(dev_k, dev_v, torch.tensor([[0, 1], [1, 2]]))
    assert torch.equal(dev_k[1], before[0]) and torch.equal(dev_k[2], before[1])
    backend.swap_pages(dev_k, dev_v, host_k, host_v, torch.tensor([[4, 0]]))
    backend.swap_pages(host_k, host_v, dev_k, dev_v, torch.tensor([[0, 3]]))
    assert torch.equal(dev_k[3], before[4]) and torch.equal(dev_v[3], dev_v[4])


@pytest.mark.parametrize("page_size", [8, 24, 1024])
def test_page_size_cann_rejects_is_a_kvlab_error(fake_npu, page_size):
    case = make_case([10], [10], page_size=page_size, dtype=torch.float16)
    with pytest.raises(KvlabError, match=f"page size \\(--block-size\\) {page_size} "):
        attend(case, get_backend("npu"))


def test_float32_cache_is_a_kvlab_error(fake_npu):
    case = make_case([10], [1], page_size=16)
    with pytest.raises(KvlabError, match=r"float16 or bfloat16 caches, not torch\.float32"):
        attend(case, get_backend("npu"))


def test_missing_torch_npu_is_a_kvlab_error(monkeypatch):
    monkeypatch.setitem(sys.modules, "torch_npu", None)  # makes `import torch_npu` fail
    with pytest.raises(KvlabError, match="needs torch_npu and the CANN toolkit"):
        get_backend("npu")


def test_npu_is_available_when_torch_npu_is_importable(fake_npu):
    assert "npu" in available_backends()


def _emulated_tnd(case, atten_mask, query_ends, kv_lens):
    """The emulated fused op over the case's pages in the TND layout, sparse_mode=3."""
    return emulated_fused_attention(
        case.query,
        case.k_cache.flatten(2),
        case.v_cache.flatten(2),
        atten_mask=atten_mask,
        actual_seq_lengths=query_ends,
        actual_seq_lengths_kv=kv_lens,
        block_table=case.meta.block_tables,
        num_heads=4,
        num_key_value_heads=2,
        input_layout="TND",
        sparse_mode=3,
        block_size=16,
    )


def test_emulation_rejects_per_sequence_query_lengths_in_tnd():
    case = make_case([90, 70], [60, 12], page_size=16, dtype=torch.float16)
    with pytest.raises(ContractError, match="must be cumulative"):
        _emulated_tnd(case, torch.ones(2048, 2048, dtype=torch.int8).triu(1), [60, 12], [90, 70])


def test_emulation_rejects_a_lower_triangular_mask_for_sparse_mode_3():
    case = make_case([20], [20], page_size=16, dtype=torch.float16)
    with pytest.raises(ContractError, match="1 above the diagonal"):
        _emulated_tnd(case, torch.ones(2048, 2048, dtype=torch.int8).tril(), [20], [20])


def _npu_device_or_skip() -> str:
    if importlib.util.find_spec("torch_npu") is None:
        pytest.skip("needs torch_npu with CANN on an Ascend machine")
    import torch_npu  # noqa: F401  (registers the npu device with torch)

    if not torch.npu.is_available():
        pytest.skip("torch_npu is installed but no NPU is visible")
    return "npu"


@pytest.mark.npu
@pytest.mark.parametrize("page_size", [128, 16])
def test_real_npu_ops_match_reference(page_size):
    device = _npu_device_or_skip()
    case = make_case(
        [300, 129, 1, 40],
        [64, 1, 1, 40],
        page_size=page_size,
        num_heads=8,
        num_kv_heads=2,
        head_dim=128,
        dtype=torch.bfloat16,
        poison=0.0,
    )
    expected = _reference(case)
    on_npu = move_case(case, device)
    assert max_relative_error(attend(on_npu, get_backend("npu")).cpu(), expected) < 1e-2
    decode = make_case(
        [300, 129, 1],
        [1, 1, 1],
        page_size=page_size,
        dtype=torch.bfloat16,
        head_dim=128,
        poison=0.0,
    )
    decode_expected = _reference(decode)
    result = attend(move_case(decode, device), get_backend("npu")).cpu()
    assert max_relative_error(result, decode_expected) < 1e-2


@pytest.mark.npu
def test_real_npu_write_kv_matches_reference():
    device = _npu_device_or_skip()
    meta = AttentionMetadata.build(
        block_tables=[[3, 0], [1]], seq_lens=[200, 5], query_lens=[200, 1], page_size=128
    )
    key, value = torch.randn(2, 201, 2, 128, dtype=torch.bfloat16)
    ours = [torch.zeros(4, 128, 2, 128, dtype=torch.bfloat16, device=device) for _ in range(2)]
    ref = [torch.zeros(4, 128, 2, 128, dtype=torch.bfloat16) for _ in range(2)]
    get_backend("npu").write_kv(
        key.to(device), value.to(device), *ours, meta.slot_mapping.to(device)
    )
    get_backend("torch").write_kv(key, value, *ref, meta.slot_mapping)
    assert torch.equal(ours[0].cpu(), ref[0]) and torch.equal(ours[1].cpu(), ref[1])
