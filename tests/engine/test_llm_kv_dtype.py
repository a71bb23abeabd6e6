"""The engine with a quantized KV cache (`kv_cache_dtype`): pages sized and stored in the
precision, attention over them equal to attention over the dequantized values, greedy runs end
to end, and swap, copy-on-write and the host tier moving pages with their scales bit-exactly."""

from __future__ import annotations

import shutil

import pytest
import torch
from engine_hf_models import save_hf_model, tiny_llama_config, tiny_qwen2_config
from safetensors.torch import save_file

from kvlab.engine import LLM, SamplingParams
from kvlab.engine.kv_cache import KVCache
from kvlab.engine.kv_scales import calibration_token_ids
from kvlab.engine.kv_sizing import page_bytes_all_layers
from kvlab.engine.models.presets import build_preset
from kvlab.engine.platform import get_platform
from kvlab.errors import KvlabError
from kvlab.fidelity.bridge import model_spec_for
from kvlab.kernels import AttentionMetadata, get_backend
from kvlab.kernels.kv_quant import KVQuant
from kvlab.policies import MemOps
from kvlab.policies.outputs import TierBatch
from kvlab.specs.capacity import num_pages_for_budget
from kvlab.specs.kv_dtype import KV_CACHE_DTYPES, kv_cache_dtype

PAGE = 4
QUANTIZED = [name for name, dtype in KV_CACHE_DTYPES.items() if dtype.is_quantized]
CPU = get_platform("cpu")

pytestmark = pytest.mark.usefixtures("one_torch_thread")


def _llm(kv_cache_dtype: str, **kwargs) -> LLM:
    settings = dict(policy=f"paged:block_size={PAGE}", num_gpu_blocks_override=32,
                    max_num_seqs=4, max_num_batched_tokens=64, verbose=False)
    return LLM(kwargs.pop("model", "tiny-llama"), kv_cache_dtype=kv_cache_dtype,
               **{**settings, **kwargs})


# ---------------------------------------------------------------------------------- sizing


def test_fp8_doubles_the_pages_of_a_bf16_cache_at_one_budget():
    budget = 64 * page_bytes_all_layers(build_preset("tiny-llama", attn_backend="torch").config,
                                        16, torch.bfloat16)
    pages = {name: LLM("tiny-llama", dtype="bfloat16", kv_cache_memory=budget, block_size=16,
                       max_num_batched_tokens=64, verbose=False, kv_cache_dtype=name).engine
             for name in ("auto", "fp8", "int8_per_token_head")}
    assert pages["auto"].num_pages == 64
    assert pages["fp8"].num_pages == 128  # vLLM's num_gpu_blocks from the same budget
    # a per-token-head row is head_dim + 4 scale bytes: 32 + 4 of every 64 bf16 bytes
    assert pages["int8_per_token_head"].num_pages == 64 * 64 // 36
    for engine in pages.values():  # the simulator sizes a page alike (scales included)
        spec = model_spec_for(engine)
        page_bytes = spec.kv_bytes_per_token() * 16
        assert num_pages_for_budget(budget, page_bytes, "", ()) == engine.num_pages
        assert engine.kv_cache.num_bytes == engine.num_pages * page_bytes


@pytest.mark.parametrize("name", QUANTIZED)
def test_pages_are_stored_in_the_precision(name):
    cache = _llm(name).engine.kv_cache
    dtype = kv_cache_dtype(name)
    row = {"per_token_head": dtype.head_token_bytes(32, 4)}.get(dtype.scales, 32)
    element = {"per_tensor": torch.uint8, "per_channel": torch.int8}.get(dtype.scales,
                                                                          torch.uint8)
    for tensor in (*cache.k_caches, *cache.host_v_caches):
        assert tensor.dtype == element and tensor.shape[1:] == (PAGE, 2, row)
    assert all(len(layer) == 3 and layer[2].dtype == dtype for layer in cache.layers())


def test_float_precisions_cast_the_pages():
    cache = _llm("bfloat16").engine.kv_cache
    assert cache.k_caches[0].dtype == torch.bfloat16 and cache.kv_quants is None
    assert all(len(layer) == 2 for layer in cache.layers())


# -------------------------------------------------------------- attention over the pages


class FakeQuantTorch:
    """The torch backend over float pages, storing each row as `kv_quant` would read it back."""

    name = "fake-quant"

    def __init__(self, kv_quant: KVQuant) -> None:
        self.torch = get_backend("torch")
        self.kv_quant = kv_quant

    def write_kv(self, key, value, k_cache, v_cache, slot_mapping):
        quant = self.kv_quant
        key = quant.dequantize(quant.quantize(key, "k"), "k")
        value = quant.dequantize(quant.quantize(value, "v"), "v")
        self.torch.write_kv(key, value, k_cache, v_cache, slot_mapping)

    def paged_attention(self, *args, **kwargs):
        return self.torch.paged_attention(*args, **kwargs)


def _steps(model, kv_caches) -> list[torch.Tensor]:
    """Hidden states of a 13-token prefill, then of a 2-token chunk and one decode."""
    outputs = []
    with torch.inference_mode():
        for start, end in ((0, 13), (13, 15), (15, 16)):
            meta = AttentionMetadata.build(block_tables=[[3, 0, 5, 1]], seq_lens=[end],
                                           query_lens=[end - start], page_size=PAGE)
            ids = torch.arange(start, end) * 37 % 2048
            outputs.append(model(ids, torch.arange(start, end), kv_caches, meta))
    return outputs


@pytest.mark.parametrize("name", QUANTIZED)
def test_attention_over_quantized_pages_equals_attention_over_their_values(name):
    dtype = kv_cache_dtype(name)
    scales = 0.01 * torch.ones(2, 32) if dtype.scales == "per_channel" else None
    quant = KVQuant(dtype, 32, k_scale=0.5, v_scale=0.25, k_channel_scale=scales,
                    v_channel_scale=scales)
    quantized = build_preset("tiny-llama", attn_backend=get_backend("torch"))
    cache = KVCache.for_model(quantized.config, num_pages=6, num_host_pages=0, page_size=PAGE,
                              dtype=torch.float32, platform=CPU, backend=get_backend("torch"),
                              kv_cache_dtype=name, kv_quants=[quant, quant])
    reference = build_preset("tiny-llama", attn_backend=FakeQuantTorch(quant))
    float_cache = KVCache.for_model(reference.config, num_pages=6, num_host_pages=0,
                                    page_size=PAGE, dtype=torch.float32, platform=CPU,
                                    backend=get_backend("torch"))
    for got, expected in zip(_steps(quantized, cache.layers()),
                             _steps(reference, float_cache.layers()), strict=True):
        torch.testing.assert_close(got, expected, rtol=1e-5, atol=1e-6)


# ------------------------------------------------------------------------- end to end

PROMPTS = [list(range(3, 21)), [7, 9, 11, 13, 2, 4, 6], list(range(40, 70, 2))]


def _greedy(llm: LLM) -> list[list[int]]:
    params = SamplingParams(temperature=0.0, max_tokens=6, ignore_eos=True)
    return [out.outputs[0].token_ids for out in llm.generate(PROMPTS, params, use_tqdm=False)]


@pytest.mark.parametrize("name", ["fp8", "int8", "int4_per_token_head"])
def test_greedy_generation_runs_end_to_end_under_preemption(name):
    # 8 pages of 4 tokens for three prompts: swap preemption moves quantized pages out and in
    llm = _llm(name, policy=f"paged:block_size={PAGE},preemption=swap",
               num_gpu_blocks_override=8)
    tokens = _greedy(llm)
    assert [len(t) for t in tokens] == [6, 6, 6]
    assert all(0 <= token < 2048 for t in tokens for token in t)
    assert llm.last_run is not None and sum(llm.last_run.steps.columns["num_swap_out_pages"]) > 0
    # with all the memory it needs, the same tokens
    assert _greedy(_llm(name)) == tokens


def test_fp8_greedy_tokens_are_the_same_on_torch_and_triton():
    torch_tokens = _greedy(_llm("fp8"))
    assert _greedy(_llm("fp8", attention_backend="triton")) == torch_tokens


@pytest.fixture(scope="module")
def interleaved_folder(tmp_path_factory):
    """A tiny Qwen2 whose layers alternate sliding window 8 and full attention: two KV-cache
    groups sharing cache tensors (engine/cache_layout.py)."""
    config = tiny_qwen2_config(num_hidden_layers=4, use_sliding_window=True, sliding_window=8,
                               layer_types=["sliding_attention", "full_attention"] * 2)
    return str(save_hf_model(tmp_path_factory.mktemp("interleaved"), config))


def test_quantized_pages_of_kv_cache_groups_keep_one_kv_quant_per_layer(interleaved_folder):
    llms = [_llm("int8", model=interleaved_folder, attention_backend=backend,
                 num_gpu_blocks_override=24) for backend in ("torch", "triton")]
    cache = llms[0].engine.kv_cache
    assert len(cache.k_caches) == 2 and len(cache.layers()) == 4  # tensors shared by groups
    scales = [layer[2].k_channel_scale for layer in cache.layers()]
    assert not torch.equal(scales[0], scales[2])  # layers sharing a tensor keep their scales
    prompts = [[5 + (i * 7) % 300 for i in range(30)], [9, 8, 7, 6, 5, 4, 3, 2, 1, 11, 12]]
    params = SamplingParams(temperature=0.0, max_tokens=6, ignore_eos=True)
    tokens = [[out.outputs[0].token_ids for out in llm.generate(prompts, params,
                                                                use_tqdm=False)]
              for llm in llms]
    assert tokens[0] == tokens[1] and [len(t) for t in tokens[0]] == [6, 6]


# ------------------------------------------------------------------ moves, bit-exactly


def _token_bytes(engine, request) -> list[torch.Tensor]:
    """The stored rows of every computed token of `request`, layer by layer, via its table."""
    table = torch.tensor(engine.manager.block_table(request))
    out = []
    for cache in (*engine.kv_cache.k_caches, *engine.kv_cache.v_caches):
        pages = cache.index_select(0, table)
        out.append(pages.reshape(-1, *cache.shape[2:])[: request.num_computed_tokens].clone())
    return out


def _run_steps(engine, params, num_steps: int):
    """An 18-token prompt prefilled, then `num_steps - 1` decodes."""
    request = engine.make_request(list(range(3, 21)), params)
    engine.scheduler.add_request(request)
    for _ in range(num_steps):
        output = engine.scheduler.schedule()
        sampled = engine.runner.execute(output, {request.request_id: params})
        engine.scheduler.update(output, sampled)
    return request


def _scramble(engine) -> None:
    for cache in (*engine.kv_cache.k_caches, *engine.kv_cache.v_caches):
        cache.view(torch.uint8).fill_(0x5A)  # whatever was on the device is gone


@pytest.mark.parametrize("name", QUANTIZED)
def test_swap_out_then_in_restores_quantized_pages_bit_exactly(name):
    engine = _llm(name, policy=f"paged:block_size={PAGE},preemption=swap").engine
    params = SamplingParams(temperature=0.0, max_tokens=8, ignore_eos=True)
    request = _run_steps(engine, params, 3)  # 20 tokens
    before = _token_bytes(engine, request)
    engine.kv_cache.execute_mem_ops(engine.manager.swap_out(request))
    _scramble(engine)
    engine.manager.allocate(engine.make_request([7] * 4, params), 4)  # takes a freed page
    engine.kv_cache.execute_mem_ops(engine.manager.swap_in(request))
    after = _token_bytes(engine, request)
    assert all(torch.equal(a, b) for a, b in zip(before, after, strict=True))


@pytest.mark.parametrize("name", ["fp8_e5m2", "int8", "int4_per_token_head"])
def test_a_fork_copies_the_shared_quantized_page_bit_exactly(name):
    engine = _llm(name).engine
    params = SamplingParams(temperature=0.0, max_tokens=8, ignore_eos=True)
    parent = _run_steps(engine, params, 2)  # 19 tokens: its last page holds 3
    child = engine.make_request(parent.token_slice(0, parent.num_tokens), params)
    child.num_computed_tokens = parent.num_computed_tokens
    engine.manager.fork(parent, child)
    ops = engine.manager.allocate(child, 1)  # the first write copies the shared page
    assert ops is not None and len(ops.copies) == 1
    engine.kv_cache.execute_mem_ops(ops)
    assert engine.manager.block_table(child)[-1] != engine.manager.block_table(parent)[-1]
    parent_rows, child_rows = _token_bytes(engine, parent), _token_bytes(engine, child)
    assert all(torch.equal(a, b) for a, b in zip(parent_rows, child_rows, strict=True))


@pytest.mark.parametrize("backend", ["torch", "triton"])
@pytest.mark.parametrize("name", ["fp8_e4m3", "int8_per_token_head"])
def test_the_host_tier_and_page_copies_move_scales_with_pages(backend, name):
    cache = KVCache(num_layers=2, num_pages=6, num_host_pages=2, page_size=PAGE, num_kv_heads=2,
                    head_dim=32, dtype=torch.float32, platform=CPU,
                    backend=get_backend(backend), num_tier_pages=4, kv_cache_dtype=name)
    generator = torch.Generator().manual_seed(0)
    for tensor in (*cache.k_caches, *cache.v_caches):
        tensor.view(torch.uint8).copy_(torch.randint(0, 120, tensor.shape, generator=generator,
                                                     dtype=torch.uint8))
    pages = (*cache.k_caches, *cache.v_caches)
    before = [t[3].clone() for t in pages]
    cache.execute_mem_ops(MemOps(tier_writes=[TierBatch(0, [3], 1, [2])],
                                 swap_outs=[(3, 1)], copies=[(3, 4)]))
    for t in pages:
        t[3].view(torch.uint8).fill_(0)
    cache.execute_mem_ops(MemOps(tier_loads=[TierBatch(1, [2], 0, [3])], swap_ins=[(1, 5)]))
    for page in (3, 4, 5):
        assert all(torch.equal(a, t[page]) for a, t in zip(before, pages, strict=True))


# ---------------------------------------------------------------------------- scales


@pytest.fixture(scope="module")
def scaled_folder(tmp_path_factory):
    """A tiny Llama checkpoint (head_dim 16) to which tests add KV-scale tensors."""
    return save_hf_model(tmp_path_factory.mktemp("kv_scales"), tiny_llama_config())


def _with_scales(folder, tmp_path, tensors: dict[str, torch.Tensor]):
    for name in ("config.json", "model.safetensors"):
        shutil.copy(folder / name, tmp_path / name)
    save_file(tensors, str(tmp_path / "kv_scales.safetensors"))
    return str(tmp_path)


def test_fp8_scales_come_from_the_checkpoint(scaled_folder, tmp_path):
    attn = "model.layers.{}.self_attn"
    model = _with_scales(scaled_folder, tmp_path, {
        f"{attn.format(0)}.k_scale": torch.tensor(0.5), f"{attn.format(0)}.v_scale":
        torch.tensor([0.25]), f"{attn.format(1)}.kv_scale": torch.tensor(2.0)})
    quants = _llm("fp8", model=model).engine.kv_cache.kv_quants
    assert [(q.k_scale, q.v_scale) for q in quants] == [(0.5, 0.25), (2.0, 2.0)]
    assert [(q.k_scale, q.v_scale) for q in _llm("fp8").engine.kv_cache.kv_quants] == [
        (1.0, 1.0), (1.0, 1.0)]  # none in the checkpoint: vLLM's 1.0


def test_int8_scales_come_from_the_checkpoint(scaled_folder, tmp_path):
    scales = {f"model.layers.{layer}.self_attn.{side}_proj.kv_cache_scale":
              torch.full((32,), 0.01 * (layer + 1) + (side == "v") * 0.001)
              for layer in range(2) for side in "kv"}
    quants = _llm("int8", model=_with_scales(scaled_folder, tmp_path, scales)).engine \
        .kv_cache.kv_quants
    for layer, quant in enumerate(quants):
        assert torch.equal(quant.k_channel_scale, torch.full((2, 16), 0.01 * (layer + 1)))
        assert torch.allclose(quant.v_channel_scale, torch.full((2, 16), 0.01 * layer + 0.011))


def test_int8_offsets_are_refused(scaled_folder, tmp_path):
    tensors = {f"model.layers.{layer}.self_attn.{side}_proj.{kind}":
               torch.full((32,), 0.5 if kind == "kv_cache_offset" else 0.01)
               for layer in range(2) for side in "kv" for kind in ("kv_cache_scale",
                                                                    "kv_cache_offset")}
    with pytest.raises(KvlabError, match="kv_cache_offset' is not zero: kvlab's int8 KV cache"):
        _llm("int8", model=_with_scales(scaled_folder, tmp_path, tensors))


def test_int8_scales_are_calibrated_on_the_documented_prompt():
    engine = _llm("int8", num_gpu_blocks_override=80).engine
    ids = calibration_token_ids(2048, 256)
    layer0 = engine.kv_cache.layers()[0]
    meta = AttentionMetadata.build(block_tables=[list(range(64))], seq_lens=[256],
                                   query_lens=[256], page_size=PAGE)
    with torch.inference_mode():
        engine.model(ids, torch.arange(256), engine.kv_cache.layers(), meta)
    # layer 0's K of that prompt is what calibration saw: each channel's largest maps to 127
    stored = layer0[0].view(-1, 2, 32)[:256].to(torch.int16).abs().amax(dim=0)
    assert bool((stored == 127).all())


# ---------------------------------------------------------------------------- refusals


def test_a_backend_without_quantized_pages_is_refused_at_start_up():
    with pytest.raises(KvlabError, match="kv_cache_dtype fp8_e4m3: attention_backend ascend") \
            as err:
        _llm("fp8", attention_backend="ascend", policy="paged:block_size=16")
    assert {"kv_cache_dtype", "attention_backend"} <= set(err.value.parameters)


def test_a_head_dim_that_misaligns_per_token_head_scales_is_refused():
    with pytest.raises(KvlabError, match="kv_cache_dtype int4_per_token_head packs an fp32"):
        KVCache(num_layers=1, num_pages=2, num_host_pages=0, page_size=PAGE, num_kv_heads=1,
                head_dim=12, dtype=torch.float32, platform=CPU, backend=get_backend("torch"),
                kv_cache_dtype="int4_per_token_head")


def test_an_unknown_precision_names_the_setting():
    with pytest.raises(KvlabError, match="kv_cache_dtype 'nvfp4' is not one kvlab models"):
        _llm("nvfp4")
