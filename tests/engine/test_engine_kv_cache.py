"""KV cache sizing, the startup lines, and MemOps carried out on real cache tensors."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from kvlab.engine.kv_cache import KVCache
from kvlab.engine.kv_mem_ops import copy_batches
from kvlab.engine.kv_sizing import (
    DEFAULT_CPU_KV_CACHE_BYTES,
    determine_num_pages,
    dummy_batch_lens,
    num_swap_pages,
    page_bytes_all_layers,
    profile_peak_activation_bytes,
    startup_lines,
    weights_bytes,
)
from kvlab.engine.loader import load_model
from kvlab.engine.platform import CpuPlatform, get_platform
from kvlab.errors import KvlabError
from kvlab.kernels import get_backend
from kvlab.policies.outputs import MemOps
from kvlab.policies.serving import ServingConfig
from kvlab.specs.kv_groups import KVCacheGroup

CPU = get_platform("cpu")


@pytest.fixture(scope="module")
def tiny():
    model, config, _ = load_model("tiny-llama")
    return model, config


def _cache(num_pages: int = 8, num_host_pages: int = 6) -> KVCache:
    cache = KVCache(
        num_layers=2,
        num_pages=num_pages,
        num_host_pages=num_host_pages,
        page_size=4,
        num_kv_heads=2,
        head_dim=8,
        dtype=torch.float32,
        platform=CPU,
        backend=get_backend("torch"),
    )
    generator = torch.Generator().manual_seed(0)
    for tensor in cache.k_caches + cache.v_caches:
        tensor.copy_(torch.randn(tensor.shape, generator=generator))
    return cache


def _device_pages(cache: KVCache, page: int) -> list[torch.Tensor]:
    return [t[page].clone() for t in cache.k_caches + cache.v_caches]


class FakeGpu(CpuPlatform):
    """A CPU posing as an accelerator with a fixed memory size and a scripted activation peak."""

    name = "fake-gpu"

    def __init__(self, total: int, free: int, peak: int) -> None:
        super().__init__(torch.device("cpu"))
        self.total, self.free, self.peak = total, free, peak
        self.num_profiles = 0

    def total_memory_bytes(self) -> int:
        return self.total

    def free_memory_bytes(self) -> int:
        return self.free

    def memory_allocated_bytes(self) -> int:
        return 0

    def reset_peak_memory_stats(self) -> None:
        self.num_profiles += 1

    def peak_memory_allocated_bytes(self) -> int:
        return self.peak


LIMITS = {"max_num_batched_tokens": 96, "max_num_seqs": 4}


def serving(**settings) -> ServingConfig:
    """The sizing tests' serving config: LIMITS unless given."""
    return ServingConfig(**{**LIMITS, **settings})


def test_page_bytes_count_k_and_v_of_every_layer(tiny):
    _, config = tiny  # 2 layers, 2 KV heads of 32
    assert page_bytes_all_layers(config, 16, torch.float16) == 16 * 2 * 2 * 2 * 32 * 2


def test_override_sets_the_page_count(tiny):
    model, _ = tiny
    config = serving(num_gpu_blocks_override=37, kv_cache_memory_bytes=1)
    assert determine_num_pages(model, CPU, config, 128) == 37


def test_memory_budget_is_divided_by_the_page_size_of_all_layers(tiny):
    model, config = tiny
    page_bytes = page_bytes_all_layers(config, 16, torch.float32)
    config = serving(kv_cache_memory_bytes=10 * page_bytes + page_bytes // 2)
    assert determine_num_pages(model, CPU, config, 128) == 10


def test_cpu_without_a_budget_uses_the_default(tiny):
    model, config = tiny
    page_bytes = page_bytes_all_layers(config, 16, torch.float32)
    num_pages = determine_num_pages(model, CPU, serving(), 128)
    assert num_pages == DEFAULT_CPU_KV_CACHE_BYTES // page_bytes


def test_budget_below_one_page_names_the_setting(tiny):
    model, _ = tiny
    match = "one KV page of 16,384 bytes: kv_cache_memory_bytes"
    with pytest.raises(KvlabError, match=match) as err:
        determine_num_pages(model, CPU, serving(kv_cache_memory_bytes=1000), 128)
    assert err.value.parameters == ("kv_cache_memory_bytes",)


def test_accelerator_budget_is_utilization_minus_weights_and_profiled_peak(tiny):
    model, config = tiny
    platform = FakeGpu(total=100 << 20, free=100 << 20, peak=3 << 20)
    num_pages = determine_num_pages(model, platform, serving(gpu_memory_utilization=0.5), 64)
    budget = (50 << 20) - weights_bytes(model) - (3 << 20)
    assert platform.num_profiles == 1
    assert num_pages == budget // page_bytes_all_layers(config, 16, torch.float32)


def test_weights_and_peak_beyond_the_utilization_name_the_setting(tiny):
    model, _ = tiny
    platform = FakeGpu(total=100 << 20, free=100 << 20, peak=40 << 20)
    with pytest.raises(KvlabError, match=r"gpu_memory_utilization 0\.3 of 104,857,600 bytes"):
        determine_num_pages(model, platform, serving(gpu_memory_utilization=0.3), 64)


def test_kv_cache_larger_than_free_memory_is_refused(tiny):
    model, _ = tiny
    platform = FakeGpu(total=100 << 20, free=20 << 20, peak=1 << 20)
    with pytest.raises(KvlabError, match=r"only 20,971,520 are free.*lower gpu_memory_util"):
        determine_num_pages(model, platform, serving(gpu_memory_utilization=0.9), 64)


def test_profiling_forward_runs_the_full_step_budget(tiny):
    model, _ = tiny
    platform = FakeGpu(total=1 << 30, free=1 << 30, peak=0)
    assert profile_peak_activation_bytes(model, platform, page_size=16, max_model_len=64,
                                         **LIMITS) == 0
    assert platform.num_profiles == 1


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("gpu_memory_utilization", 1.5),
        ("num_gpu_blocks_override", 0),
        ("kv_cache_memory_bytes", -1),
        ("swap_space_bytes", -1),
    ],
)
def test_bad_memory_settings_are_named(field, value):
    with pytest.raises(KvlabError, match=f"^{field} is ") as err:
        ServingConfig(**{field: value})
    assert err.value.parameters == (field,)


def test_swap_space_holds_whole_pages(tiny):
    _, config = tiny
    page_bytes = page_bytes_all_layers(config, 16, torch.float32)
    assert num_swap_pages(config, serving(swap_space_bytes=3 * page_bytes + 1), torch.float32) == 3


def test_startup_lines_use_vllms_wording():
    assert startup_lines(num_pages=1000, page_size=16, max_model_len=4096) == [
        "GPU KV cache size: 16,000 tokens, Maximum concurrency for 4,096 tokens per request: "
        "3.91x"]


def test_concurrency_counts_whole_pages_per_request():
    # 100 tokens need 7 pages of 16: 70 pages hold exactly 10 such requests
    assert startup_lines(70, 16, 100, platform="cpu") == [
        "CPU KV cache size: 1,000 tokens, Maximum concurrency for 100 tokens per request: "
        "10.00x"]


def test_concurrency_counts_every_kv_cache_group():
    # a window of 32 tokens on 16-token pages holds ceil((31 + 64) / 16) + 1 = 7 pages beside
    # the full group's 64 of a 1,024-token request (64 tokens in flight on cpu)
    groups = [KVCacheGroup("sliding_window", 2, 32), KVCacheGroup("full", 2)]
    line = startup_lines(710, 16, 1024, platform="cpu", groups=groups, max_num_batched_tokens=64)
    assert line[0].endswith("Maximum concurrency for 1,024 tokens per request: 10.00x")


def test_profiling_batch_fills_the_step_budget_within_the_model_length():
    assert dummy_batch_lens(8192, 256, 3000) == [3000, 3000, 2192]
    assert dummy_batch_lens(8192, 2, 3000) == [3000, 3000]


def test_cache_tensors_have_the_vllm_ascend_layout(tiny):
    _, config = tiny
    cache = KVCache.for_model(
        config,
        num_pages=5,
        num_host_pages=3,
        page_size=16,
        dtype=torch.float16,
        platform=CPU,
        backend=get_backend("torch"),
    )
    assert len(cache.layers()) == config.num_hidden_layers
    assert cache.k_caches[0].shape == (5, 16, 2, 32) and cache.host_v_caches[1].shape == (
        3,
        16,
        2,
        32,
    )
    assert cache.num_bytes == 5 * page_bytes_all_layers(config, 16, torch.float16)
    assert not cache.host_k_caches[0].is_pinned()  # cpu has no DMA to pin for


def test_swap_out_then_in_restores_pages_bit_exactly():
    cache = _cache()
    before = {page: _device_pages(cache, page) for page in (1, 2, 6)}
    cache.execute_mem_ops(MemOps(swap_outs=[(1, 0), (2, 1), (6, 4)]))
    for tensor in cache.k_caches + cache.v_caches:
        tensor.zero_()  # the device pages are reused by someone else meanwhile
    cache.execute_mem_ops(MemOps(swap_ins=[(0, 3), (1, 5), (4, 7)]))
    for old, new in ((1, 3), (2, 5), (6, 7)):
        for expected, got in zip(before[old], _device_pages(cache, new), strict=True):
            assert torch.equal(expected, got)


def test_swap_out_then_copy_then_swap_in_in_one_step():
    cache = _cache()
    cache.execute_mem_ops(MemOps(swap_outs=[(3, 0)]))
    arriving, old2, old5 = (_device_pages(cache, page) for page in (3, 2, 5))
    # page 5 leaves for host page 1, page 2 is copied into it, host page 0 returns into page 2
    cache.execute_mem_ops(MemOps(swap_outs=[(5, 1)], copies=[(2, 5)], swap_ins=[(0, 2)]))
    host_pages = [h[1] for h in cache.host_k_caches + cache.host_v_caches]
    for expected, got in (
        (old5, host_pages),
        (old2, _device_pages(cache, 5)),
        (arriving, _device_pages(cache, 2)),
    ):
        assert all(torch.equal(a, b) for a, b in zip(expected, got, strict=True))


def test_copies_run_in_list_order_so_copies_chain():
    cache = _cache()
    first = _device_pages(cache, 0)
    cache.execute_mem_ops(MemOps(copies=[(0, 1), (1, 2)]))
    for page in (1, 2):
        assert all(
            torch.equal(a, b) for a, b in zip(first, _device_pages(cache, page), strict=True)
        )


@settings(max_examples=50, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 7), st.integers(0, 7)), max_size=12))
def test_copy_batches_equal_copies_one_by_one(pairs):
    sequential = list(range(8))
    for src, dst in pairs:
        sequential[dst] = sequential[src]
    batched = list(range(8))
    for batch in copy_batches(pairs):
        snapshot = list(batched)  # each batch reads every source before writing
        for src, dst in batch:
            batched[dst] = snapshot[src]
    assert batched == sequential
    assert [pair for batch in copy_batches(pairs) for pair in batch] == pairs


@pytest.mark.cuda
def test_cuda_sizing_leaves_room_for_weights_and_the_profiled_peak():
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU")
    platform = get_platform("cuda")
    model, config, _ = load_model("tiny-llama", device=platform.device)
    limits = {"max_num_batched_tokens": 512, "max_num_seqs": 8, "max_model_len": 256}
    # a first profile allocates what the first matmul keeps (cuBLAS's workspace, 32 MiB on an
    # H200): after it, this profile and the engine's own start from the same memory
    profile_peak_activation_bytes(model, platform, page_size=16, **limits)
    peak = profile_peak_activation_bytes(model, platform, page_size=16, **limits)
    assert peak >= 512 * config.intermediate_size * 2 * 4  # the fused gate/up output, fp32
    serving = ServingConfig(gpu_memory_utilization=0.5, max_num_batched_tokens=512, max_num_seqs=8)
    num_pages = determine_num_pages(model, platform, serving, 256)
    budget = int(platform.total_memory_bytes() * 0.5) - weights_bytes(model) - peak
    assert abs(num_pages - budget // page_bytes_all_layers(config, 16, torch.float32)) <= 1


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float8_e4m3fn,
                                   torch.uint8])
def test_page_zeros_are_zeros_of_the_shape_and_dtype_and_writable(dtype):
    from kvlab.engine.kv_cache import page_zeros

    pages = page_zeros((3, 4, 2, 8), dtype, "cpu")
    assert pages.shape == (3, 4, 2, 8) and pages.dtype == dtype and pages.is_contiguous()
    assert not pages.float().any()
    pages[1, 2] = torch.ones(2, 8).to(dtype)
    assert pages.float().sum() == 16 and not pages[0].float().any()


@pytest.mark.skipif(not hasattr(__import__("os"), "sched_getaffinity"), reason="Linux only")
def test_page_zeros_on_the_cpu_hold_only_the_pages_written():
    # A precision level holds pages for every page id: a 1 GiB one written in one page must
    # not be 1 GiB of resident memory (calloc's zero pages, mapped when first written)
    from kvlab.engine.kv_cache import page_zeros

    def resident_bytes() -> int:
        with open("/proc/self/statm") as statm:
            return int(statm.read().split()[1]) * 4096

    before = resident_bytes()
    pages = page_zeros((1024, 16, 8, 1024), torch.float32, "cpu")  # 512 MiB
    pages[7] = 1.0
    assert resident_bytes() - before < 64 << 20
    assert pages[7].sum() == 16 * 8 * 1024 and not pages[8].any()
