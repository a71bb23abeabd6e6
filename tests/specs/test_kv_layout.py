"""KV-cache groups of each preset kind (vLLM 0.32's grouping over one pool of equal pages), a
plain model's page unchanged, and per-group capacity worked by hand."""

from __future__ import annotations

import dataclasses

import pytest
from hypothesis import given
from hypothesis import strategies as st

from kvlab.errors import KvlabError
from kvlab.specs import get_hardware, get_model, kv_cache_capacity_tokens, list_models
from kvlab.specs.kv_groups import GROUP_KINDS, KVCacheGroup
from kvlab.specs.kv_layout import GROUP_KIND_OF_LAYER, kv_cache_groups, layer_summary

PLAIN = [name for name, spec in list_models().items() if not spec.is_hybrid]


def labels(layout):
    return [(g.label, g.num_layers, g.num_padding_layers) for g in layout.groups]


@pytest.mark.parametrize("name", PLAIN)
@pytest.mark.parametrize("tp", [1, 2, 8])
def test_a_plain_model_has_one_group_and_todays_page(name, tp):
    model = get_model(name)
    layout = kv_cache_groups(model, 16, tp)
    assert labels(layout) == [("full", model.num_layers, 0)]
    assert layout.page_bytes == 16 * model.kv_bytes_per_token(tp)


def test_gpt_oss_alternates_sliding_and_full_in_two_groups_of_18():
    layout = kv_cache_groups(get_model("gpt-oss-120b"), 16)
    assert labels(layout) == [("sliding_window(128)", 18, 0), ("full", 18, 0)]
    # one pool page: 18 layer slots x 16 tokens x (K+V: 2 x 8 heads x 64 x 2 bytes)
    assert layout.page_bytes == 18 * 16 * 2048


def test_gemma3_splits_52_sliding_layers_into_six_padded_groups_of_ten():
    layout = kv_cache_groups(get_model("gemma-3-27b"), 16)
    assert labels(layout) == [("sliding_window(1024)", 9, 1)] * 4 + \
        [("sliding_window(1024)", 8, 2)] * 2 + [("full", 10, 0)]
    assert layout.page_bytes == 10 * 16 * (2 * 16 * 128 * 2)


def test_qwen3_next_raises_the_block_so_a_page_holds_a_gated_deltanet_state():
    model = get_model("qwen3-next-80b-a3b")
    # conv (2*16*128 + 32*128) x 3 + recurrent 32 x 128 x 128, bf16
    assert model.linear_state_bytes == (8192 * 3 + 32 * 128 * 128) * 2 == 1_097_728
    layout = kv_cache_groups(model, 16)
    assert layout.block_size == 544  # 16 x ceil(1,097,728 / (16 x 2,048)), vLLM's figure
    assert labels(layout) == [("state", 12, 0)] * 3 + [("full", 12, 0)]
    assert layout.layer_page_bytes == 544 * 2048
    assert layout.groups[0].layer_used_bytes == 1_097_728
    assert kv_cache_groups(model, 16, 2).groups[0].layer_used_bytes == 1_097_728 // 2


def test_llama4_scout_has_three_chunked_groups_and_one_full():
    layout = kv_cache_groups(get_model("llama-4-scout"), 16)
    assert labels(layout) == [("chunked_local(8192)", 12, 0)] * 3 + [("full", 12, 0)]


def test_deepseek_v32_caches_the_latent_and_the_indexer_key_in_one_group():
    model = get_model("deepseek-v3.2")
    layout = kv_cache_groups(model, 64)
    assert labels(layout) == [("full", 61, 0)]
    assert layout.page_bytes == 61 * 64 * ((512 + 64) * 2 + 128 + 4)
    assert model.index_topk == 2048


def test_without_the_hybrid_manager_local_layers_keep_every_token():
    layout = kv_cache_groups(get_model("gpt-oss-120b"), 16, hybrid_kv_cache_manager=False)
    assert labels(layout) == [("full", 36, 0)]


def test_group_kinds_are_the_managers_and_every_group_converts():
    assert set(GROUP_KIND_OF_LAYER.values()) == set(GROUP_KINDS)
    for model in list_models().values():
        for group in kv_cache_groups(model, 16).groups:
            converted = KVCacheGroup(group.kind, group.num_layers, group.window)
            assert converted.label == group.label


def test_layer_summary_counts_layers_by_kind():
    assert layer_summary(get_model("gemma-3-27b")) == "sliding_window(1024)x52,fullx10"
    assert layer_summary(get_model("llama-2-7b")) == "fullx32"


def test_bad_block_size_and_layouts_are_user_errors():
    model = get_model("gpt-oss-20b")
    with pytest.raises(KvlabError, match="block_size is 0"):
        kv_cache_groups(model, 0)
    with pytest.raises(KvlabError, match="sliding_window is None"):
        kv_cache_groups(dataclasses.replace(model, sliding_window=None), 16)
    with pytest.raises(KvlabError, match="layer_types lists 3 layers, num_layers is 24"):
        kv_cache_groups(dataclasses.replace(model, layer_types=("full_attention",) * 3), 16)


def test_per_group_concurrency_for_a_sliding_window_model_by_hand():
    """gpt-oss-120b, 32k tokens, 8192 batched tokens x 2 batches in flight: the sliding group
    holds ceil(min(127 + 16384, 32768) / 16) + 1 = 1,033 pages, the full one 2,048."""
    layout = kv_cache_groups(get_model("gpt-oss-120b"), 16)
    assert layout.pages_per_request(32768, max_in_flight_tokens=16384) == (1033, 2048)
    assert layout.max_concurrency(3081 * 10, 32768, max_in_flight_tokens=16384) == 10
    capacity = kv_cache_capacity_tokens(get_model("gpt-oss-120b"), get_hardware("h200"),
                                        page_size=16, kv_cache_memory_bytes=3081 * 589824)
    assert capacity.num_pages == 3081
    usage = capacity.group_usage(32768, max_in_flight_tokens=16384)
    assert [u.num_pages for u in usage] == [1033, 2048]
    assert [u.page_bytes for u in usage] == [1033 * 589824, 2048 * 589824]
    assert capacity.max_concurrency(32768, max_in_flight_tokens=16384) == 1.0


def test_state_groups_take_one_page_or_two_with_prefix_caching():
    layout = kv_cache_groups(get_model("qwen3-next-80b-a3b"), 16)
    assert layout.pages_per_request(32768)[:3] == (1, 1, 1)
    assert layout.pages_per_request(32768, enable_prefix_caching=True)[:3] == (2, 2, 2)
    assert layout.pages_per_request(32768)[3] == -(-32768 // 544)


@given(st.lists(st.sampled_from(["full_attention", "sliding_attention", "linear_attention"]),
                min_size=1, max_size=64),
       st.sampled_from([1, 16, 64, 128]), st.sampled_from([1, 2, 4]))
def test_groups_cover_every_layer_with_equal_pages(types, block_size, tp):
    model = dataclasses.replace(get_model("qwen3-next-80b-a3b"), num_layers=len(types),
                                layer_types=tuple(types), sliding_window=100)
    layout = kv_cache_groups(model, block_size, tp)
    assert sum(g.num_layers for g in layout.groups) == len(types)
    for group in layout.groups:
        assert group.num_layers + group.num_padding_layers == layout.layers_per_group
        assert group.num_padding_layers < layout.layers_per_group
        assert group.layer_page_bytes == layout.layer_page_bytes >= group.layer_used_bytes
    assert layout.page_bytes == layout.layers_per_group * layout.layer_page_bytes
    assert layout.block_size >= block_size
