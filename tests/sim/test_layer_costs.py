"""The roofline's attention per layer kind (kvlab.sim.layer_costs): sliding-window, chunked,
linear-attention state and DeepSeek-V3.2 sparse charges on hand-worked examples, the pair sums
against brute force, and plain models untouched."""

import dataclasses

from hypothesis import given
from hypothesis import strategies as st

from kvlab.policies.request import Request
from kvlab.sim.cost_model import RooflineCostModel, StepShape, _per_request
from kvlab.sim.layer_costs import LayerCosts, chunk_pairs, has_layer_kinds, window_pairs
from kvlab.specs import ModelSpec, get_hardware, get_model

# One KV head of width 2 at 1 byte: 4 bytes per token and layer; one query head: 2 x (2 + 2)
# = 8 FLOPs per (query, key) pair and layer. Bandwidth and FLOP/s of 1 give bytes and FLOPs.
TINY = ModelSpec(name="tiny", num_layers=2, hidden_size=8, num_heads=1, num_kv_heads=1,
                 head_dim=2, intermediate_size=8, vocab_size=16, max_model_len=1024,
                 num_params=1e3, num_active_params=1e3, dtype_bytes=1)


def _costs(model: ModelSpec) -> LayerCosts:
    return LayerCosts(model, 1, 1.0, 1.0)


@given(st.integers(0, 60), st.integers(1, 40), st.integers(1, 20))
def test_window_pairs_sum_min_p_w_over_the_chunk(done, new, window):
    expected = sum(min(p, window) for p in range(done + 1, done + new + 1))
    assert window_pairs(done, new, window) == expected


@given(st.integers(0, 60), st.integers(1, 40), st.integers(1, 20))
def test_chunk_pairs_count_the_keys_of_each_querys_chunk(done, new, chunk):
    expected = sum((p - 1) % chunk + 1 for p in range(done + 1, done + new + 1))
    assert chunk_pairs(done, new, chunk) == expected


def test_a_sliding_decode_reads_the_window_not_the_context():
    model = dataclasses.replace(TINY, layer_types=("sliding_attention", "full_attention"),
                                sliding_window=4)
    # one decode at 9 computed: full reads 10 tokens, sliding min(10, 4); both write one.
    memory, compute = _costs(model).step_s(1, 0, 1, 10, 0, ([1], [9], [True]))
    assert memory == (10 + 1) * 4 + (4 + 1) * 4
    assert compute == 10 * 8 + 4 * 8


def test_a_sliding_prefill_chunk_pairs_are_capped_by_the_window():
    model = dataclasses.replace(TINY, layer_types=("sliding_attention", "full_attention"),
                                sliding_window=4)
    # 4 new tokens after 2: positions 3..6 read 3, 4, 4, 4 keys in the sliding layer (15
    # pairs, 6 tokens read); the full layer 3 + 4 + 5 + 6 = 18 pairs.
    memory, compute = _costs(model).step_s(4, 4, 1, 6, 18, ([4], [2], [False]))
    assert memory == (6 + 4) * 4 + (6 + 4) * 4
    assert compute == (18 + 6) * 8 + (15 + 6) * 8


def test_a_chunked_layer_reads_from_the_chunk_of_its_first_query():
    model = dataclasses.replace(TINY, layer_types=("chunked_attention", "full_attention"),
                                attention_chunk_size=4)
    # a decode at position 10 (9 computed): its chunk is 9..12, so it reads 2 tokens
    memory, compute = _costs(model).step_s(1, 0, 1, 10, 0, ([1], [9], [True]))
    assert memory == (10 + 1) * 4 + (2 + 1) * 4
    assert compute == 10 * 8 + 2 * 8


def test_a_state_layer_reads_and_writes_its_state_per_request_and_updates_it_per_token():
    model = dataclasses.replace(TINY, layer_types=("linear_attention", "full_attention"),
                                linear_state_bytes=100)
    # two requests, 3 tokens: the state read and written once each (2 x 100 bytes each),
    # 4 FLOPs per state element per token; the full layer as before
    memory, compute = _costs(model).step_s(3, 2, 2, 12, 3, ([2, 1], [0, 9], [False, True]))
    assert memory == (12 + 3) * 4 + 2 * 2 * 100
    assert compute == (3 + 12) * 8 + 3 * 4 * 100


def test_sparse_attention_reads_top_k_latents_and_every_indexer_key():
    model = dataclasses.replace(TINY, num_layers=1, kv_lora_rank=4, qk_rope_head_dim=0,
                                index_topk=3, index_head_dim=128)
    # latent 4 bytes, indexer key 128 + 4 scale bytes; a decode at 10 tokens reads 3 latents
    # and 10 indexer keys, and scores 10 pairs with 64 heads of 128
    memory, compute = _costs(model).step_s(1, 0, 1, 10, 0, ([1], [9], [True]))
    assert memory == (3 + 1) * 4 + (10 + 1) * 132
    assert compute == 3 * 8 + 10 * 2 * 64 * 128


def test_without_per_request_lists_a_sliding_step_is_charged_an_upper_bound():
    model = dataclasses.replace(TINY, layer_types=("sliding_attention", "full_attention"),
                                sliding_window=4)
    costs = _costs(model)
    exact = costs.step_s(2, 0, 2, 13, 0, ([1, 1], [2, 9], [True, True]))
    bound = costs.step_s(2, 0, 2, 13, 0, None)
    full = _costs(TINY).step_s(2, 0, 2, 13, 0, None)
    assert exact <= bound <= full


def test_plain_models_take_the_plain_roofline():
    assert not has_layer_kinds(get_model("llama-2-7b"))
    model = RooflineCostModel(get_model("llama-2-7b"), get_hardware("a100-80g"), page_size=16)
    assert model._layers is None


def test_a_window_longer_than_every_context_costs_what_full_attention_does():
    hardware = get_hardware("h100")
    base = dataclasses.replace(get_model("gpt-oss-20b"), layer_types=(), sliding_window=None)
    wide = dataclasses.replace(get_model("gpt-oss-20b"), sliding_window=10**6)
    plain = RooflineCostModel(base, hardware, page_size=16)
    layered = RooflineCostModel(wide, hardware, page_size=16)
    requests = [Request(0, 600, 10), Request(1, 300, 10)]  # a prefill chunk, a decode
    requests[1].num_computed_tokens, requests[1].num_output_tokens = 300, 1
    assert _per_request(_Output(requests, [512, 1], [0, 300], 0, 0, 0, 0, 0, 0)) == (
        [512, 1], [0, 300], [False, True])
    shape = _Output(requests, [512, 1], [0, 300], 512, 1, 512 + 301, 2, 512 * 513 // 2, 301)
    assert layered.step_time_s(shape) == plain.step_time_s(shape)
    for decodes in (StepShape(0, 8, 4000, 8, 0, 4000), StepShape(100, 0, 100, 1, 5050, 0)):
        assert layered.step_time_s(decodes) == plain.step_time_s(decodes)
    assert layered.recompute_time_s(700) == plain.recompute_time_s(700)


def test_gpt_oss_decodes_cost_less_than_with_every_layer_full():
    hardware = get_hardware("h100")
    full = dataclasses.replace(get_model("gpt-oss-20b"), layer_types=(), sliding_window=None)
    plain = RooflineCostModel(full, hardware, page_size=16)
    layered = RooflineCostModel(get_model("gpt-oss-20b"), hardware, page_size=16)
    decodes = StepShape(0, 64, 64 * 30000, 64, 0, 64 * 30000)
    assert layered.step_time_s(decodes) < plain.step_time_s(decodes)


@dataclasses.dataclass
class _Output:
    """A scheduler output's fields the cost model reads."""

    requests: list
    num_new_tokens: list
    num_computed_tokens: list
    num_prefill_tokens: int
    num_decode_tokens: int
    num_context_tokens: int
    num_seqs: int
    num_attention_pairs: int
    num_padded_context_tokens: int
