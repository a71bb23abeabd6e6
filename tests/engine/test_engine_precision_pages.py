"""Mixed-precision pages in the engine (engine/precision_pages.py) against a shadow: under
random workloads with demotion, preemption (recompute and swap) and prefix caching, every slot
a request's block table reads holds its own content (the K and V of its tokens), at the level
the manager's ledger says, with the values the executed requantizations left (computed here
apart from the engine's code), and attention over the table equals attention over the
shadow's values. Planted faults (a demoted page read at its old precision, a demotion that
loses a slot) fail it."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from kvlab.engine import LLM, SamplingParams
from kvlab.engine.kv_cache import KVCache
from kvlab.engine.platform import get_platform
from kvlab.engine.precision_pages import PrecisionPages
from kvlab.kernels import AttentionMetadata, get_backend
from kvlab.kernels.kv_quant import KVQuant
from kvlab.kernels.mixed_attention import mixed_paged_attention
from kvlab.policies import KVCacheManager, Request, Scheduler, SchedulerConfig
from kvlab.policies.precision.ladder import build_ladder
from kvlab.policies.precision.summary import precision_summary
from kvlab.specs.kv_dtype import kv_cache_dtype
from tests.policies.harness import ShadowCost, serve_steps

MAX_MODEL_LEN = 64
KV_HEADS, HEAD_DIM, HOST_PAGES = 2, 8, 64
LADDER = build_ladder("auto", 2, head_dim=HEAD_DIM, model_dtype_bytes=4)
QUANTS = [None] + [KVQuant(kv_cache_dtype(name), HEAD_DIM) for name in LADDER.names[1:]]

pytestmark = pytest.mark.usefixtures("one_torch_thread")


def _requant(values: torch.Tensor, level: int) -> torch.Tensor:
    """float32 K or V rows `[..., heads, dim]` stored at `level` and read back (K's side)."""
    quant = QUANTS[level]
    if quant is None:
        return values.clone()
    flat = values.reshape(-1, KV_HEADS, HEAD_DIM)
    return quant.dequantize(quant.quantize(flat, "k"), "k").view(values.shape)


def _content(tokens: list[int]) -> torch.Tensor:
    """The K (and V) of the last of `tokens`: a function of the whole prefix, as a model's."""
    seed = hash(tuple(tokens)) & 0x7FFFFFFF
    return torch.randn(KV_HEADS, HEAD_DIM, generator=torch.Generator().manual_seed(seed))


class Shadow:
    """Each device and host page's slots: (content key, float32 K values) and its level; the
    pool's word that content left is applied after the step's MemOps, as the engine does."""

    def __init__(self, page_size: int) -> None:
        self.page_size = page_size
        self.slots: dict[int, dict[int, tuple[tuple[int, ...], torch.Tensor]]] = {}
        self.host: dict[int, dict[int, tuple[tuple[int, ...], torch.Tensor]]] = {}
        self.level: dict[int, int] = {}
        self.left: list[int] = []
        self.num_demoted_moved = 0  # demoted pages a swap-out or a copy read

    def raw(self, page: int) -> dict[int, tuple[tuple[int, ...], torch.Tensor]]:
        """The page as a raw read moves it: its values at level 0."""
        level = self.level.get(page, 0)
        return {slot: (key, _requant(values, 0) if level else values)
                for slot, (key, values) in self.slots.get(page, {}).items()}

    def apply(self, ops) -> None:
        for page, before, after in ops.requantize:
            assert self.level.get(page, 0) == before, "requantized from a level it is not at"
            self.slots[page] = {slot: (key, _requant(values, after))
                                for slot, (key, values) in self.slots.get(page, {}).items()}
            self.level[page] = after
        for src, dst in ops.swap_outs:
            self.num_demoted_moved += bool(self.level.get(src, 0))
            self.host[dst] = self.raw(src)
        for src, dst in ops.copies:
            self.num_demoted_moved += bool(self.level.get(src, 0))
            self.slots[dst], self.level[dst] = self.raw(src), 0
        for src, dst in ops.swap_ins:
            self.slots[dst], self.level[dst] = dict(self.host[src]), 0
        for page in self.left:  # content gone: the page is written anew at level 0
            if not any(page == dst for _, dst in ops.copies + ops.swap_ins):
                self.slots.pop(page, None)
            self.level.pop(page, None) if page not in self.requantized(ops) else None
        self.left = []

    @staticmethod
    def requantized(ops) -> set[int]:
        return {page for page, _, _ in ops.requantize}


class _Told:
    """The ledger, telling the shadow first which pages' content left."""

    def __init__(self, ledger, shadow: Shadow) -> None:
        self.ledger, self.shadow = ledger, shadow

    def __getattr__(self, name: str) -> object:
        return getattr(self.ledger, name)

    def drop(self, pages: list[int], reuse: bool) -> list[int]:
        self.shadow.left.extend(pages)
        return self.ledger.drop(pages, reuse)


@st.composite
def workloads(draw):
    block_size = draw(st.sampled_from([2, 4]))
    num_pages = draw(st.integers(MAX_MODEL_LEN // block_size, 3 * MAX_MODEL_LEN // block_size // 2))
    eviction = draw(st.sampled_from(["none", "lru"]))
    recompute = draw(st.integers(0, 1)) if eviction != "none" else 0
    cached = 0 if recompute else draw(st.integers(0, 1))
    spec = (f"paged:block_size={block_size},eviction={eviction},"
            f"preemption={draw(st.sampled_from(['recompute', 'swap']))},"
            f"precision=age:recent={draw(st.sampled_from([1, 4, 16]))},"
            f"depth={draw(st.integers(1, 2))},pressure={draw(st.sampled_from([0.0, 0.5]))},"
            f"cached={cached},recompute={recompute}")
    requests = []
    for request_id in range(draw(st.integers(1, 8))):
        prompt = draw(st.integers(1, 48))
        shared = draw(st.booleans())
        ids = [(i if shared else i * 7 + request_id) % 11 for i in range(prompt)]
        requests.append(Request(request_id, prompt, draw(st.integers(1, 16)),
                                arrival_s=draw(st.integers(0, 3)) / 10, prompt_token_ids=ids))
    config = SchedulerConfig(max_num_seqs=draw(st.integers(1, 4)),
                             max_num_batched_tokens=draw(st.integers(8, 32)),
                             max_model_len=MAX_MODEL_LEN, enable_chunked_prefill=True)
    return spec, num_pages, config, requests


def run_shadowed(workload) -> tuple[int, int]:
    """Runs `workload` with mixed-precision pages, checking each step; returns the
    requantizations executed and the demoted pages swapped out or copied."""
    spec, num_pages, config, requests = workload
    manager = KVCacheManager(spec, num_pages, max_model_len=MAX_MODEL_LEN, costs=ShadowCost(),
                             num_host_pages=HOST_PAGES, precision_ladder=LADDER)
    assert manager.precision is not None
    page_size = manager.page_size
    num_ids = manager.num_total_pages + manager.precision.ledger.num_extra
    cache = KVCache(num_layers=1, num_pages=num_ids, num_host_pages=HOST_PAGES,
                    page_size=page_size, num_kv_heads=KV_HEADS, head_dim=HEAD_DIM,
                    dtype=torch.float32, platform=get_platform("cpu"),
                    backend=get_backend("torch"))
    pages = PrecisionPages(cache, LADDER, HEAD_DIM, torch.float32)
    cache.precision = pages
    pages.follow(manager.precision.ledger.levels)
    shadow = Shadow(page_size)
    manager.pool.ledger = _Told(manager.precision.ledger, shadow)
    scheduler = Scheduler(config, manager)
    requantized = 0

    def execute(output):
        nonlocal requantized
        shadow.apply(output.mem_ops)
        cache.execute_mem_ops(output.mem_ops)
        requantized += len(output.mem_ops.requantize)
        _write_and_check(output, manager, cache, pages, shadow)
        return [_token(r.token_slice(0, done + new)) if done + new == r.num_tokens else None
                for r, new, done in zip(output.requests, output.num_new_tokens,
                                        output.num_computed_tokens, strict=True)]

    serve_steps(scheduler, requests, execute, max_steps=5_000)
    return requantized, shadow.num_demoted_moved


def _token(tokens: list[int]) -> int:
    return hash(tuple(tokens)) % 11


def _write_and_check(output, manager, cache, pages: PrecisionPages, shadow: Shadow) -> None:
    """Write the step's new tokens at level 0, then check every slot each request reads and
    attention over the batch against the shadow."""
    page_size = manager.page_size
    layer = pages.layers()[0]
    tables, seq_lens = [], []
    for request, new, done in zip(output.requests, output.num_new_tokens,
                                  output.num_computed_tokens, strict=True):
        table = manager.block_table(request)
        tokens = request.token_slice(0, done + new)
        for position in range(done, done + new):
            page, slot = table[position // page_size], position % page_size
            assert shadow.level.get(page, 0) == 0, "a new token written into a demoted page"
            values = _content(tokens[: position + 1])
            pages_slots = torch.tensor([page * page_size + slot])
            pages.cache.backend.write_kv(values[None], values[None], layer[0], layer[1],
                                         pages_slots)
            shadow.slots.setdefault(page, {})[slot] = (tuple(tokens[: position + 1]), values)
        for position in range(done + new):
            page, slot = table[position // page_size], position % page_size
            key, values = shadow.slots[page][slot]
            assert key == tuple(tokens[: position + 1]), "a slot holds another's content"
            level = int(pages.state.page_levels[page])
            assert level == shadow.level.get(page, 0) == manager.precision.ledger.level(page), (
                f"page {page} read at level {level}, demoted to {shadow.level.get(page, 0)}")
            k, v = pages.tensor_levels[0][level].dequantize(torch.tensor([page]))
            assert torch.equal(k[slot], values) and torch.equal(v[slot], values), (
                f"page {page} slot {slot} at level {level} is not what was stored")
        tables.append(table[: -(-(done + new) // page_size)])
        seq_lens.append(done + new)
    if tables:
        _check_attention(output, tables, seq_lens, pages, shadow, page_size)


def _check_attention(output, tables, seq_lens, pages: PrecisionPages, shadow: Shadow,
                     page_size: int) -> None:
    """The engine's mixed attention over the batch equals attention over the shadow's
    values (float32, relative error < 1e-5)."""
    meta = AttentionMetadata.build(block_tables=tables, seq_lens=seq_lens,
                                   query_lens=list(output.num_new_tokens), page_size=page_size)
    query = torch.randn(meta.num_tokens, 2 * KV_HEADS, HEAD_DIM,
                        generator=torch.Generator().manual_seed(len(seq_lens)))
    levels = pages.tensor_levels[0]
    got = mixed_paged_attention(query, levels, pages.state.page_levels, meta, scale=0.3,
                                num_kv_heads=KV_HEADS)
    dense = torch.zeros_like(levels[0].k_cache)
    for table, seq_len in zip(tables, seq_lens, strict=True):
        for position in range(seq_len):
            page, slot = table[position // page_size], position % page_size
            dense[page, slot] = shadow.slots[page][slot][1]
    want = get_backend("torch").paged_attention(query, dense, dense, meta, scale=0.3,
                                                num_kv_heads=KV_HEADS)
    assert ((got - want).abs().max() / want.abs().max().clamp(min=1e-30)) < 1e-5


@settings(max_examples=40)
@given(workload=workloads())
def test_each_slot_holds_its_content_at_the_level_the_manager_says(workload):
    run_shadowed(workload)


def _planted() -> tuple:
    config = SchedulerConfig(max_num_seqs=4, max_num_batched_tokens=16,
                             max_model_len=MAX_MODEL_LEN, enable_chunked_prefill=True)
    requests = [Request(i, 24, 36, prompt_token_ids=[(3 * j + i) % 11 for j in range(24)])
                for i in range(6)]
    return ("paged:block_size=4,eviction=lru,preemption=swap,precision=age:recent=1,depth=2",
            16, config, requests)


def test_the_planted_workload_demotes_and_swaps_demoted_pages_out_and_in():
    requantized, moved = run_shadowed(_planted())
    assert requantized > 0 and moved > 0


def test_a_demoted_page_read_at_its_old_precision_is_caught(monkeypatch):
    def keep_old(self, pages, before, after):  # levels move, the values stay where they were
        return None

    monkeypatch.setattr(PrecisionPages, "requantize", keep_old)
    monkeypatch.setattr(PrecisionPages, "after_mem_ops", _levels_not_updated)
    with pytest.raises(AssertionError, match=r"read at level 0, demoted to [12]"):
        run_shadowed(_planted())


def _levels_not_updated(self) -> None:
    """after_mem_ops with every page read at level 0 (its old precision)."""
    self.state.page_levels.zero_()
    self.state.any_demoted = False


def test_a_demotion_that_loses_a_slot_is_caught(monkeypatch):
    requantize = PrecisionPages.requantize

    def lose_last_slot(self, pages, before, after):
        requantize(self, pages, before, after)
        for levels in self.tensor_levels:
            levels[after].k_cache[torch.tensor(pages), -1] = 0

    monkeypatch.setattr(PrecisionPages, "requantize", lose_last_slot)
    with pytest.raises(AssertionError, match="not what was stored"):
        run_shadowed(_planted())


def test_greedy_outputs_with_recent_longer_than_any_request_equal_the_plain_cache():
    prompts = [[(7 * i + 3 * j) % 200 + 1 for j in range(12 + 5 * i)] for i in range(4)]
    params = SamplingParams(max_tokens=12, temperature=0.0, ignore_eos=True)

    def generate(policy: str) -> list[list[int]]:
        llm = LLM("tiny-llama", policy=policy, num_gpu_blocks_override=16, max_num_seqs=2,
                  max_num_batched_tokens=32, verbose=False)
        outputs = llm.generate([{"prompt_token_ids": p} for p in prompts], params)
        return [list(o.outputs[0].token_ids) for o in outputs]

    plain = generate("paged:block_size=4")
    assert generate("paged:block_size=4,precision=age:recent=1000") == plain


def test_the_triton_backend_demotes_as_the_torch_backend(monkeypatch):
    """Triton's kernels (the interpreter on cpu) for pages at the cache's dtype and its mixed
    kernel once pages are demoted (kvkernels/triton_mixed.py): the same greedy outputs and the
    same mix as torch's segments."""
    from kvlab.kernels import triton_mixed

    calls = []
    kernel = triton_mixed.triton_mixed_attention
    monkeypatch.setattr(triton_mixed, "triton_mixed_attention",
                        lambda *a, **k: calls.append(1) or kernel(*a, **k))
    prompts = [[(5 * i + 3 * j) % 200 + 1 for j in range(10 + 6 * i)] for i in range(3)]
    params = SamplingParams(max_tokens=8, temperature=0.0, ignore_eos=True)

    def generate(backend: str) -> tuple[list[list[int]], dict]:
        llm = LLM("tiny-llama", policy="paged:block_size=4,precision=age:recent=4,depth=2",
                  num_gpu_blocks_override=16, max_num_seqs=2, max_num_batched_tokens=32,
                  attention_backend=backend, verbose=False)
        outputs = llm.generate([{"prompt_token_ids": p} for p in prompts], params)
        precision = llm.engine.manager.precision
        assert precision is not None
        return [list(o.outputs[0].token_ids) for o in outputs], precision_summary(precision, 1.0)

    torch_outputs, torch_mix = generate("torch")
    assert torch_mix["precision_demotions_per_s"] > 0 and not calls
    assert generate("triton") == (torch_outputs, torch_mix)
    assert calls, "the triton backend attended over demoted pages without its mixed kernel"


@pytest.mark.slow  # about 30 s: Triton's interpreter, every step
def test_the_triton_kernel_reads_the_planted_workload_as_the_shadow(monkeypatch):
    """The shadow's attention check, every step, with the Triton kernel (kvkernels/
    triton_mixed.py) in place of the torch segments."""
    from kvlab.kernels.triton_mixed import triton_mixed_attention

    monkeypatch.setitem(globals(), "mixed_paged_attention", triton_mixed_attention)
    requantized, _ = run_shadowed(_planted())
    assert requantized > 0
