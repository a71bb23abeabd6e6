"""vLLM-style KV-cache sizing and its start-up lines."""

import math

import pytest

from kvlab.errors import KvlabError
from kvlab.specs import (
    KVCapacity,
    estimate_activation_bytes,
    get_hardware,
    get_model,
    kv_cache_capacity_tokens,
)

GiB = 1024**3


def test_capacity_is_utilised_hbm_minus_weights_and_activations_in_whole_pages():
    llama, a100 = get_model("llama-2-7b"), get_hardware("a100-80g")
    capacity = kv_cache_capacity_tokens(
        llama, a100, page_size=16, gpu_memory_utilization=0.9, activation_reserve_bytes=2 * GiB
    )
    usable = math.ceil(80 * GiB * 0.9) - 2 * 6_738_415_616 - 2 * GiB
    assert capacity.num_pages == usable // (16 * 512 * 1024)
    assert capacity.num_tokens == capacity.num_pages * 16


def test_llama_2_7b_on_a100_holds_about_a_hundred_thousand_tokens():
    capacity = kv_cache_capacity_tokens(
        get_model("llama-2-7b"), get_hardware("a100-80g"), page_size=16
    )
    # (77 GB usable - 13.5 GB weights - ~1.5 GB activations) / 512 KiB
    assert 110_000 < capacity.num_tokens < 125_000


def test_default_reserve_is_the_activation_estimate():
    llama, a100 = get_model("llama-2-7b"), get_hardware("a100-80g")
    default = kv_cache_capacity_tokens(llama, a100, page_size=16)
    explicit = kv_cache_capacity_tokens(
        llama, a100, page_size=16, activation_reserve_bytes=estimate_activation_bytes(llama)
    )
    assert default == explicit


def test_kv_cache_memory_bytes_sizes_the_cache_whatever_the_utilisation():
    llama, a100 = get_model("llama-2-7b"), get_hardware("a100-80g")
    page_bytes = 16 * 512 * 1024  # 16 tokens of 512 KiB each
    for utilization in (0.3, 0.9):
        capacity = kv_cache_capacity_tokens(llama, a100, page_size=16,
                                            gpu_memory_utilization=utilization,
                                            kv_cache_memory_bytes=10 * page_bytes + 1)
        assert capacity.num_pages == 10
    overridden = kv_cache_capacity_tokens(llama, a100, page_size=16, num_gpu_blocks_override=3,
                                          kv_cache_memory_bytes=10 * page_bytes)
    assert overridden.num_pages == 3  # the page count wins, as in vLLM


def test_kv_cache_memory_below_one_page_names_the_setting():
    with pytest.raises(KvlabError, match="kv_cache_memory_bytes is 1,000") as caught:
        kv_cache_capacity_tokens(get_model("llama-2-7b"), get_hardware("a100-80g"),
                                 page_size=16, kv_cache_memory_bytes=1000)
    assert caught.value.parameters == ("kv_cache_memory_bytes",)


def test_startup_lines_have_vllm_format():
    capacity = KVCapacity(
        num_pages=7321,
        page_size=16,
        page_bytes=16 * 512 * 1024,
        num_tokens=117_136,
        weight_bytes=0,
        activation_bytes=0,
    )
    # vLLM 0.32's one line; its tokens are concurrency x max_model_len (whole pages each)
    assert capacity.startup_lines(4096) == [
        "GPU KV cache size: 117,136 tokens, Maximum concurrency for 4,096 tokens per request: "
        "28.60x"]
    assert capacity.startup_lines(4000, device="CPU") == [
        "CPU KV cache size: 117,136 tokens, Maximum concurrency for 4,000 tokens per request: "
        "29.28x"]


def test_max_concurrency_counts_whole_pages_per_request():
    capacity = KVCapacity(
        num_pages=10, page_size=16, page_bytes=1, num_tokens=160, weight_bytes=0, activation_bytes=0
    )
    assert capacity.max_concurrency(17) == 5.0  # 17 tokens take 2 pages


def test_num_gpu_blocks_override_sets_the_page_count():
    capacity = kv_cache_capacity_tokens(
        get_model("llama-2-7b"), get_hardware("a100-80g"), page_size=16, num_gpu_blocks_override=100
    )
    assert (capacity.num_pages, capacity.num_tokens) == (100, 1600)


def test_num_gpu_blocks_override_applies_even_when_memory_is_short():
    capacity = kv_cache_capacity_tokens(
        get_model("llama-2-70b"), get_hardware("a100-80g"), page_size=16, num_gpu_blocks_override=8
    )
    assert capacity.num_pages == 8


def test_model_too_large_for_memory_names_the_settings_to_change():
    with pytest.raises(KvlabError, match="tensor_parallel_size") as err:
        kv_cache_capacity_tokens(get_model("llama-2-70b"), get_hardware("a100-80g"), page_size=16)
    assert "gpu_memory_utilization" in str(err.value)


def test_tensor_parallelism_makes_room_for_a_large_model():
    capacity = kv_cache_capacity_tokens(
        get_model("llama-2-70b"), get_hardware("a100-80g"), page_size=16, tensor_parallel_size=4
    )
    assert capacity.num_pages > 0


def test_tensor_parallelism_shrinks_each_devices_page():
    llama, box = get_model("llama-2-70b"), get_hardware("atlas-800t-a2")
    tp4 = kv_cache_capacity_tokens(llama, box, page_size=128, tensor_parallel_size=4)
    tp8 = kv_cache_capacity_tokens(llama, box, page_size=128, tensor_parallel_size=8)
    assert tp8.page_bytes * 2 == tp4.page_bytes


def test_tensor_parallel_size_above_the_box_is_a_user_error():
    with pytest.raises(KvlabError, match="exceeds the 8 device"):
        kv_cache_capacity_tokens(
            get_model("llama-2-70b"),
            get_hardware("h100-80g"),
            page_size=16,
            tensor_parallel_size=16,
        )


def test_single_card_preset_rejects_tensor_parallelism():
    with pytest.raises(KvlabError, match="atlas-800t-a2"):
        kv_cache_capacity_tokens(
            get_model("llama-2-7b"),
            get_hardware("ascend-910b"),
            page_size=128,
            tensor_parallel_size=2,
        )


def test_tensor_parallel_size_must_divide_the_heads():
    with pytest.raises(KvlabError, match="does not divide the 28 attention heads"):
        kv_cache_capacity_tokens(
            get_model("qwen2.5-7b"), get_hardware("h100-80g"), page_size=16, tensor_parallel_size=8
        )


@pytest.mark.parametrize(
    ("flags", "flag_name"),
    [
        ({"page_size": 0}, "block_size"),
        ({"page_size": 16, "gpu_memory_utilization": 1.5}, "gpu_memory_utilization"),
        ({"page_size": 16, "num_gpu_blocks_override": 0}, "num_gpu_blocks_override"),
    ],
)
def test_bad_sizing_settings_are_user_errors(flags, flag_name):
    with pytest.raises(KvlabError, match=flag_name):
        kv_cache_capacity_tokens(get_model("llama-2-7b"), get_hardware("a100-80g"), **flags)
