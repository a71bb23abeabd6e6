"""The npu backend on kvlab's AscendC kernels, on CPU: torch_npu and the `kvlab_ascendc` ops
replaced by emulations of their documented contracts (tests/kernels/npu_emulation.py)."""

import sys

import pytest
import torch
from kernel_cases import attend, make_case, max_relative_error
from npu_emulation import FakeAscendcOps, fake_torch_npu

import kvlab.kernels.npu_backend as npu_backend
from kvlab.errors import KvlabError
from kvlab.kernels import get_backend
from kvlab.kernels.ascendc_ops import LIBRARY_ENV, AscendcOps, load_ascendc_ops

FP16_TOL = 2e-3


@pytest.fixture
def fake_npu(monkeypatch):
    module = fake_torch_npu()
    monkeypatch.setitem(sys.modules, "torch_npu", module)
    return module


@pytest.fixture
def ascendc(monkeypatch, fake_npu):
    """The emulated AscendC ops, as if libkvlab_ascendc.so had been built and loaded."""
    ops = FakeAscendcOps()
    monkeypatch.setattr(npu_backend, "load_ascendc_ops", lambda: AscendcOps(ops))
    return ops


def test_decode_over_runs_of_pages_takes_kvlabs_extent_decode(ascendc, fake_npu):
    case = make_case([300, 17, 64, 129], [1] * 4, page_size=16, run_pages=4, dtype=torch.float16)
    out = torch.full_like(case.query, float("nan"))
    assert attend(case, get_backend("npu"), out=out) is out
    assert ascendc.calls == ["paged_decode"] and fake_npu.calls == []
    assert max_relative_error(out, attend(case, get_backend("torch"))) < FP16_TOL


def test_decode_over_scattered_single_pages_stays_on_torch_npu(ascendc, fake_npu):
    case = make_case([300, 17], [1, 1], page_size=16, dtype=torch.float16)
    attend(case, get_backend("npu"))
    assert ascendc.calls == [] and fake_npu.calls == ["_npu_paged_attention"]


def test_more_than_16_query_heads_per_kv_head_stay_on_torch_npu(ascendc, fake_npu):
    case = make_case(
        [300], [1], page_size=16, run_pages=4, num_heads=32, num_kv_heads=1, dtype=torch.float16
    )
    out = attend(case, get_backend("npu"))
    assert ascendc.calls == [] and fake_npu.calls == ["_npu_paged_attention"]
    assert max_relative_error(out, attend(case, get_backend("torch"))) < FP16_TOL


def test_prefill_chunks_stay_on_the_fused_op(ascendc, fake_npu):
    case = make_case([70, 5], [30, 1], page_size=16, run_pages=4, dtype=torch.float16)
    attend(case, get_backend("npu"))
    assert fake_npu.calls == ["npu_fused_infer_attention_score"] and ascendc.calls == []


def test_copy_of_disjoint_pages_is_one_kernel_launch(ascendc):
    k_cache, v_cache = torch.randn(2, 6, 16, 2, 16, dtype=torch.float16)
    expected_k, expected_v = k_cache.clone(), v_cache.clone()
    pairs = torch.tensor([[0, 4], [2, 5]])
    get_backend("npu").copy_pages(k_cache, v_cache, pairs)
    get_backend("torch").copy_pages(expected_k, expected_v, pairs)
    assert ascendc.calls == ["copy_pages"]
    assert torch.equal(k_cache, expected_k) and torch.equal(v_cache, expected_v)


def test_copy_chain_is_staged_so_every_source_is_read_before_writing(ascendc):
    k_cache, v_cache = torch.randn(2, 3, 16, 2, 16, dtype=torch.float16)
    k_before, v_before = k_cache.clone(), v_cache.clone()
    get_backend("npu").copy_pages(k_cache, v_cache, torch.tensor([[0, 1], [1, 2]]))
    assert ascendc.calls == ["copy_pages", "copy_pages"]  # gather to staging, then scatter
    assert torch.equal(k_cache[1], k_before[0]) and torch.equal(k_cache[2], k_before[1])
    assert torch.equal(v_cache[2], v_before[1])


def test_swap_moves_consecutive_pages_as_one_run_and_round_trips(ascendc, monkeypatch):
    dev_k, dev_v = torch.randn(2, 8, 16, 2, 16, dtype=torch.float16)
    host_k, host_v = torch.zeros(2, 6, 16, 2, 16, dtype=torch.float16)
    monkeypatch.setattr(npu_backend, "_is_host", lambda t: t is host_k or t is host_v)
    before_k, before_v = dev_k.clone(), dev_v.clone()
    backend = get_backend("npu")
    backend.swap_pages(dev_k, dev_v, host_k, host_v, torch.tensor([[3, 0], [4, 1], [5, 2], [7, 5]]))
    dev_k.zero_(), dev_v.zero_()
    backend.swap_pages(host_k, host_v, dev_k, dev_v, torch.tensor([[0, 3], [1, 4], [2, 5], [5, 7]]))
    assert ascendc.calls == ["swap_pages", "swap_pages"]
    assert ascendc.num_runs == [2, 2]  # pages 3-5 <-> 0-2 coalesced, 7 <-> 5 alone
    for page in (3, 4, 5, 7):
        assert torch.equal(dev_k[page], before_k[page]) and torch.equal(dev_v[page], before_v[page])


def test_no_built_library_means_no_ascendc_ops(monkeypatch, tmp_path):
    monkeypatch.delenv(LIBRARY_ENV, raising=False)
    monkeypatch.setattr("kvlab.kernels.ascendc_ops.DEFAULT_LIBRARY", tmp_path / "absent.so")
    assert load_ascendc_ops() is None


def test_a_named_library_that_is_missing_is_a_kvlab_error(monkeypatch, tmp_path):
    monkeypatch.setenv(LIBRARY_ENV, str(tmp_path / "libkvlab_ascendc.so"))
    with pytest.raises(KvlabError, match="no such file"):
        load_ascendc_ops()
