"""Sliding-window models keep transformers' greedy tokens (fp32, CPU), with prompts longer than
the window: Mistral's window on every layer, Qwen2's use_sliding_window + max_window_layers, and
interleaved layer_types (Qwen2 with layer_types, as gpt-oss and Gemma 3 write them), through
chunked prefill, prefix hits and recompute preemption; and with a block table per KV-cache
group whose pages behind the window are NULL_PAGE: the hybrid KV manager's own (the model's
KV-cache groups) and a patched one."""

from __future__ import annotations

import pytest
import torch
from engine_hf_models import (
    save_hf_model,
    tiny_mistral_config,
    tiny_qwen2_config,
    transformers_greedy,
)

from kvlab.engine import LLM, SamplingParams
from kvlab.engine.config import EngineConfig
from kvlab.engine.engine import LLMEngine
from kvlab.errors import KvlabError
from kvlab.policies import KVCacheManager
from kvlab.policies.serving import ServingConfig
from kvlab.specs.kv_groups import NULL_PAGE, KVCacheGroup

PAGE = 4
WINDOW = 8
SHARED_PREFIX = [7, 11, 13, 17, 19, 23, 29, 31, 37, 41, 43, 47]  # 3 pages, beyond the window

pytestmark = pytest.mark.usefixtures("one_torch_thread")


def _ids(n: int, seed: int) -> list[int]:
    return torch.randint(3, 384, (n,), generator=torch.Generator().manual_seed(seed)).tolist()


PROMPTS = [_ids(30, 1), SHARED_PREFIX + _ids(9, 2), _ids(5, 3), SHARED_PREFIX + _ids(14, 4)]
MAX_TOKENS = [10, 7, 12, 6]

# layout -> (config, fields dropped from config.json, expected layer windows)
LAYOUTS = {
    "mistral": (tiny_mistral_config(), (), (WINDOW, WINDOW)),
    # older Qwen2 checkpoints write no layer_types: layers i >= max_window_layers slide
    "qwen2_max_window_layers": (
        tiny_qwen2_config(
            num_hidden_layers=3, use_sliding_window=True, sliding_window=WINDOW,
            max_window_layers=1,
        ),
        ("layer_types",),
        (0, WINDOW, WINDOW),
    ),
    "interleaved_layer_types": (
        tiny_qwen2_config(
            num_hidden_layers=4, use_sliding_window=True, sliding_window=WINDOW,
            layer_types=["sliding_attention", "full_attention"] * 2,
        ),
        (),
        (WINDOW, 0, WINDOW, 0),
    ),
}


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    """layout -> (folder, transformers' greedy tokens of PROMPTS)."""
    out = {}
    for name, (config, dropped, _) in LAYOUTS.items():
        folder = save_hf_model(
            tmp_path_factory.mktemp(name), config, seed=7, drop_fields=dropped
        )
        out[name] = (folder, transformers_greedy(folder, PROMPTS, MAX_TOKENS))
    return out


def _params(max_tokens: list[int]) -> list[SamplingParams]:
    return [SamplingParams(temperature=0.0, max_tokens=n, ignore_eos=True) for n in max_tokens]


def _generate(folder, **kwargs) -> tuple[LLM, list[list[int]]]:
    llm = LLM(str(folder), verbose=False, **kwargs)
    outputs = llm.generate(PROMPTS, _params(MAX_TOKENS), use_tqdm=False)
    return llm, [out.outputs[0].token_ids for out in outputs]


@pytest.mark.parametrize("layout", LAYOUTS)
def test_layer_windows_are_read_as_transformers_reads_them(models, layout):
    llm = LLM(str(models[layout][0]), verbose=False, num_gpu_blocks_override=8)
    windows = LAYOUTS[layout][2]
    assert llm.engine.model_config.layer_windows == windows
    attention = [layer.self_attn for layer in llm.engine.model.model.layers]
    assert tuple(a.sliding_window for a in attention) == windows
    assert llm.engine.max_model_len == 256  # no longer capped by the window


@pytest.mark.parametrize("layout", LAYOUTS)
def test_greedy_tokens_equal_transformers_past_the_window(models, layout):
    folder, expected = models[layout]
    _, tokens = _generate(folder, policy=f"paged:block_size={PAGE}", num_gpu_blocks_override=64)
    assert tokens == expected


@pytest.mark.parametrize("layout", LAYOUTS)
def test_chunked_prefill_and_prefix_hits_keep_transformers_tokens(models, layout):
    folder, expected = models[layout]
    llm, tokens = _generate(
        folder, policy=f"paged:block_size={PAGE},eviction=lru", num_gpu_blocks_override=64,
        max_num_batched_tokens=8,
    )
    assert tokens == expected
    assert llm.engine.manager.num_prefix_hits >= len(SHARED_PREFIX) // PAGE
    assert max(llm.last_run.steps.columns["num_prefill_tokens"]) == 8


# layout -> the manager's KV-cache groups: (kind, layers) each (vLLM's grouping)
MANAGER_GROUPS = {
    "mistral": [("sliding_window", 2)],
    "qwen2_max_window_layers": [("full", 1), ("sliding_window", 1), ("sliding_window", 1)],
    "interleaved_layer_types": [("sliding_window", 2), ("full", 2)],
}


@pytest.mark.parametrize("layout", LAYOUTS)
def test_the_manager_takes_the_models_kv_cache_groups(models, layout):
    llm = LLM(str(models[layout][0]), verbose=False, policy=f"paged:block_size={PAGE}",
              num_gpu_blocks_override=16)
    manager = llm.engine.manager
    assert [(g.kind, g.num_layers) for g in manager.groups] == MANAGER_GROUPS[layout]
    # layers of different groups share the cache tensors: one per layer of a group
    group_size = max(n for _, n in MANAGER_GROUPS[layout])
    assert len(llm.engine.kv_cache.k_caches) == group_size


@pytest.mark.parametrize("layout", LAYOUTS)
def test_recompute_preemption_keeps_transformers_tokens(models, layout):
    folder, expected = models[layout]
    # the largest request (40 tokens, 10 pages a group) alone and a little more; prompts in
    # chunks of 8, so several grow at once
    num_pages = 11 * len(MANAGER_GROUPS[layout])
    llm, tokens = _generate(folder, policy=f"paged:block_size={PAGE}",
                            num_gpu_blocks_override=num_pages, max_num_batched_tokens=8,
                            scheduler_reserve_full_isl=False)
    assert tokens == expected
    assert llm.engine.scheduler.num_preemptions > 0


@pytest.mark.parametrize("layout", LAYOUTS)
def test_pages_behind_the_window_are_given_back(models, layout):
    folder, expected = models[layout]
    llm = LLM(str(folder), verbose=False, policy=f"paged:block_size={PAGE}",
              num_gpu_blocks_override=64)
    engine = llm.engine
    request = engine.make_request(PROMPTS[0], _params([MAX_TOKENS[0]])[0])
    engine.run([request])
    assert list(request.output_token_ids) == expected[0]
    # (freed at the end: the tables as the last step left them are gone; run a prefill of
    # the prompt alone and a decode, and look at the sliding group's table)
    request = engine.make_request(PROMPTS[0], _params([3])[0])
    tables: list[list[list[int]]] = []
    runner_tables = engine.runner.block_tables
    engine.runner.block_tables = lambda r: tables.append(runner_tables(r)) or tables[-1]
    engine.run([request])
    sliding = [index for index, (kind, _) in enumerate(MANAGER_GROUPS[layout])
               if kind == "sliding_window"]
    last = tables[-1]
    assert all(NULL_PAGE in last[group] for group in sliding)  # 30+ tokens, window 8
    assert all(NULL_PAGE not in table for group, table in enumerate(last) if group not in sliding)


def _window_group_tables(group_windows: tuple[int, ...], seen: list[int]):
    """A `block_tables` method as a KV manager with these groups (0: full) gives: its one table
    per group, pages behind a group's window NULL_PAGE. `seen` counts the NULL entries."""

    def block_tables(self, request) -> list[list[int]]:
        table = list(self.block_table(request))
        tables = []
        for window in group_windows:
            group_table = list(table)
            if window:
                group = KVCacheGroup("sliding_window", window=window)
                skipped = group.num_skipped_tokens(request.num_computed_tokens)
                for index in range(min(skipped // self.page_size, len(table))):
                    group_table[index] = NULL_PAGE
                    seen.append(index)
            tables.append(group_table)
        return tables

    return block_tables


def _engine_tokens(folder, layer_groups, *, backend="torch", num_pages=64, prompts=None,
                   max_tokens=None) -> tuple[LLMEngine, list[list[int]]]:
    serving = ServingConfig.create(
        f"paged:block_size={PAGE}", num_gpu_blocks_override=num_pages,
        max_num_batched_tokens=8, scheduler_reserve_full_isl=False,
    )
    engine = LLMEngine(EngineConfig(
        model=str(folder), serving=serving, attention_backend=backend,
        layer_groups=layer_groups,
    ))
    params = _params(max_tokens or MAX_TOKENS)
    requests = [engine.make_request(p, q) for p, q in zip(prompts or PROMPTS, params, strict=True)]
    engine.run(requests)
    return engine, [list(r.output_token_ids) for r in requests]


# layout -> (layer_groups, the window of each group)
GROUPINGS = {
    "mistral": ((0, 0), (WINDOW,)),
    "qwen2_max_window_layers": ((0, 1, 1), (0, WINDOW)),
    "interleaved_layer_types": ((1, 0, 1, 0), (0, WINDOW)),
}


@pytest.mark.parametrize("layout", LAYOUTS)
def test_block_table_per_group_with_null_pages_keeps_transformers_tokens(
    models, layout, monkeypatch
):
    folder, expected = models[layout]
    layer_groups, group_windows = GROUPINGS[layout]
    seen: list[int] = []
    monkeypatch.setattr(KVCacheManager, "block_tables",
                        _window_group_tables(group_windows, seen), raising=False)
    engine, tokens = _engine_tokens(folder, layer_groups, num_pages=14)
    assert tokens == expected
    assert seen  # pages behind the window were NULL_PAGE
    assert engine.scheduler.num_preemptions > 0


def test_a_manager_with_more_groups_than_the_layers_read_is_refused(models, monkeypatch):
    folder, _ = models["mistral"]
    monkeypatch.setattr(KVCacheManager, "block_tables",
                        _window_group_tables((0, WINDOW), []), raising=False)
    with pytest.raises(ValueError, match="2 block tables for a request, for the model's 1 KV"):
        _engine_tokens(folder, (0, 0))  # (layer_groups named: the patched manager's tables)


pytest.importorskip("triton")

TRITON_PROMPTS = PROMPTS[:2]
TRITON_MAX_TOKENS = [5, 4]


@pytest.mark.parametrize("layout", ["mistral", "interleaved_layer_types"])
def test_triton_backend_with_null_pages_under_preemption_keeps_transformers_tokens(
    models, layout, monkeypatch
):
    folder, _ = models[layout]
    expected = transformers_greedy(folder, TRITON_PROMPTS, TRITON_MAX_TOKENS)
    layer_groups, group_windows = GROUPINGS[layout]
    seen: list[int] = []
    monkeypatch.setattr(KVCacheManager, "block_tables",
                        _window_group_tables(group_windows, seen), raising=False)
    engine, tokens = _engine_tokens(
        folder, layer_groups, backend="triton", num_pages=12, prompts=TRITON_PROMPTS,
        max_tokens=TRITON_MAX_TOKENS,
    )
    assert tokens == expected
    assert seen
    assert engine.scheduler.num_preemptions > 0


def test_triton_backend_with_the_hybrid_manager_under_preemption(models):
    folder, _ = models["interleaved_layer_types"]
    expected = transformers_greedy(folder, TRITON_PROMPTS, TRITON_MAX_TOKENS)
    llm = LLM(str(folder), verbose=False, policy=f"paged:block_size={PAGE}",
              attention_backend="triton", num_gpu_blocks_override=20,
              max_num_batched_tokens=8, scheduler_reserve_full_isl=False)
    outputs = llm.generate(TRITON_PROMPTS, _params(TRITON_MAX_TOKENS), use_tqdm=False)
    assert [out.outputs[0].token_ids for out in outputs] == expected
    assert llm.engine.scheduler.num_preemptions > 0


@pytest.mark.parametrize("layout", ["mistral", "interleaved_layer_types"])
def test_swap_preemption_on_the_hybrid_manager_keeps_transformers_tokens(models, layout):
    folder, expected = models[layout]
    num_pages = 11 * len(MANAGER_GROUPS[layout])
    llm, tokens = _generate(folder, policy=f"paged:block_size={PAGE},preemption=swap",
                            num_gpu_blocks_override=num_pages, max_num_batched_tokens=8,
                            scheduler_reserve_full_isl=False)
    assert tokens == expected
    assert llm.engine.scheduler.num_swaps_out > 0


@pytest.mark.parametrize("layout", ["mistral", "interleaved_layer_types"])
def test_host_tier_hits_on_the_hybrid_manager_keep_transformers_tokens(models, layout):
    """Each prompt run twice, one at a time, on a device that keeps about one prompt's pages:
    the second run finds its prefix (a window's pages too) in the host tier, loads it back and
    decodes transformers' tokens."""
    folder, expected = models[layout]
    llm = LLM(str(folder), verbose=False, policy=f"paged:block_size={PAGE},eviction=lru",
              num_gpu_blocks_override=13 * len(MANAGER_GROUPS[layout]), max_num_seqs=1,
              kv_tiers="host:256p")
    outputs = llm.generate(PROMPTS * 2, _params(MAX_TOKENS * 2), use_tqdm=False)
    assert [out.outputs[0].token_ids for out in outputs] == expected * 2
    manager = llm.engine.manager
    host = manager.tiers[0]
    assert host.stats.num_hits >= 2 * len(MANAGER_GROUPS[layout])  # pages of every group
    manager.check_tiers()


@pytest.mark.parametrize("layout", ["mistral", "interleaved_layer_types"])
def test_the_hybrid_manager_off_keeps_every_token_and_transformers_tokens(models, layout):
    """vLLM's --disable-hybrid-kv-cache-manager: one full group, windows read from whole
    tables."""
    folder, expected = models[layout]
    llm, tokens = _generate(folder, policy=f"paged:block_size={PAGE}",
                            num_gpu_blocks_override=64, hybrid_kv_cache_manager=False)
    assert tokens == expected
    assert type(llm.engine.manager) is KVCacheManager
    assert len(llm.engine.kv_cache.k_caches) == len(LAYOUTS[layout][2])  # a tensor per layer


def test_the_retention_interval_caches_fewer_window_pages_and_keeps_tokens(models):
    """vLLM 0.32's default interval 0: a sliding-window page leaving the window is cached
    only where a hit at a prompt's end needs it."""
    folder, expected = models["interleaved_layer_types"]
    cached = {}
    for interval in (None, 0):
        llm, tokens = _generate(folder, policy=f"paged:block_size={PAGE},eviction=lru",
                                num_gpu_blocks_override=64, max_num_seqs=1,
                                prefix_cache_retention_interval=interval)
        assert tokens == expected
        cached[interval] = sum(1 for key in llm.engine.manager.pool.cached
                               if isinstance(key, tuple))  # the sliding group's keys
    assert cached[0] < cached[None]
    with pytest.raises(KvlabError, match="prefix_cache_retention_interval"):
        LLM(str(folder), verbose=False, policy=f"paged:block_size={PAGE}",
            num_gpu_blocks_override=64, prefix_cache_retention_interval=6)
