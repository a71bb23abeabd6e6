"""Mixed-precision pages in the engine (issue 48): each page id's content at one precision
level, requantized as the manager's precision policy decides (`MemOps.requantize`).

Storage: a page id has a slot at every level (level 0 is the `KVCache`'s own tensors, at the
cache's dtype; level k's tensors are of the ladder's k-th dtype, `kvkernels/kv_quant.py`'s page
formats), and `levels` says which slot holds its content. The device bytes this saves are the
manager's accounting (policies/precision/ledger.py: it hands out the page ids the freed bytes
pay for); this storage is not compacted, so the engine allocates every page id at every level
(a lab's layout: attention, requantization and the pages' identities are what it checks).

Each step, before the step's other MemOps: requantize (a page's values read at their level,
dequantized to float32, stored at the new one), then give every demoted page that a copy, a
swap-out or a host-tier write reads raw its values at level 0 in its own (unused) level-0 slot,
so that those move the page as the cache's dtype (a demoted page swapped out comes back as a
full page, as the simulator has it). After them, a page whose content left the device (the
manager's ledger no longer has it demoted) is at level 0 again: new content is written there.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

import torch

from kvlab.engine.kv_cache import KVCache, layer_kv_quants, page_zeros
from kvlab.kernels.kv_quant import KVQuant, page_format
from kvlab.kernels.mixed_attention import LevelPages, MixedBackend, MixedLayer, MixedState
from kvlab.policies import registry
from kvlab.policies.outputs import MemOps
from kvlab.policies.precision.ladder import PrecisionLadder, build_ladder
from kvlab.policies.precision.ledger import extra_pages
from kvlab.specs.kv_dtype import kv_cache_dtype

if TYPE_CHECKING:
    from kvlab.engine.models.config import ModelConfig
    from kvlab.policies.spec import PolicySpec


def engine_ladder(spec: PolicySpec, cache_dtype: str, config: ModelConfig,
                  dtype: torch.dtype) -> PrecisionLadder | None:
    """The levels the policy's precision family demotes through for this model and cache
    (None for `none`), as the simulator builds them."""
    if spec.precision == "none":
        return None
    policy = registry.get("precision", spec.precision).factory()
    return build_ladder(cache_dtype, policy.depth, config.head_dim, dtype.itemsize)


def num_page_ids(ladder: PrecisionLadder | None, num_pages: int) -> int:
    """Page ids the cache holds for `num_pages` device pages: more where pages are demoted
    (the ids their freed bytes pay for)."""
    return num_pages + (extra_pages(ladder, num_pages) if ladder is not None else 0)


class PrecisionPages:
    """Every level's pages of a `KVCache` and each page's level; `attach` builds it."""

    def __init__(self, cache: KVCache, ladder: PrecisionLadder, head_dim: int,
                 model_dtype: torch.dtype) -> None:
        self.cache = cache
        self.ladder = ladder
        device = cache.k_caches[0].device
        num_ids, page_size, num_kv_heads = cache.k_caches[0].shape[:3]
        num_tensors = len(cache.k_caches)
        no_quants: list[KVQuant | None] = [None] * num_tensors
        level0_quants: list[KVQuant | None] = list(cache.kv_quants or no_quants)
        slots = cache.layer_slots or tuple(range(num_tensors))
        # per layer tensor, its pages at every level
        self.tensor_levels: list[list[LevelPages]] = [
            [LevelPages(k, v, level0_quants[slots.index(i)] if cache.kv_quants else None)]
            for i, (k, v) in enumerate(zip(cache.k_caches, cache.v_caches, strict=True))]
        for name in ladder.names[1:]:
            dtype = kv_cache_dtype(name)
            element, row = page_format(dtype, head_dim, model_dtype)
            quants: list[KVQuant | None] = list(
                layer_kv_quants(dtype, head_dim, num_kv_heads, num_tensors, None, device)
                or no_quants)
            shape = (num_ids, page_size, num_kv_heads, row)
            for levels, quant in zip(self.tensor_levels, quants, strict=True):
                levels.append(LevelPages(page_zeros(shape, element, device),
                                         page_zeros(shape, element, device), quant))
        self.state = MixedState(torch.zeros(num_ids, dtype=torch.int8, device=device))
        self.levels: dict[int, int] = {}  # demoted page -> level (absent: 0)
        self.demoted = bytearray()  # the manager's word: its ledger's levels (by page id)
        self.page_size = page_size

    def layers(self) -> list[tuple[torch.Tensor, torch.Tensor, MixedLayer]]:
        """Each model layer's cache item: its level-0 pages and its `MixedLayer`."""
        slots = self.cache.layer_slots or range(len(self.tensor_levels))
        out = []
        for slot in slots:
            levels = self.tensor_levels[slot]
            out.append((levels[0].k_cache, levels[0].v_cache, MixedLayer(levels, self.state)))
        return out

    def follow(self, ledger_levels: bytearray) -> None:
        """Take the manager's ledger's levels (every page id's, kept updated) as the word on
        which pages' content is still demoted."""
        self.demoted = ledger_levels

    def before_mem_ops(self, ops: MemOps) -> None:
        """The step's requantizations, then level-0 values for demoted pages read raw."""
        pairs: dict[tuple[int, int], list[int]] = {}
        for page, before, after in ops.requantize:
            assert self.levels.get(page, 0) == before, (page, self.levels.get(page, 0), before)
            pairs.setdefault((before, after), []).append(page)
        for (before, after), pages in pairs.items():
            self.requantize(pages, before, after)
            for page in pages:
                self.levels[page] = after
        raw = [src for src, _ in ops.copies] + [src for src, _ in ops.swap_outs]
        raw += [page for batch in ops.tier_writes for page in batch.src_pages]
        self.materialize(raw)

    def after_mem_ops(self) -> None:
        """Pages whose content left the device are at level 0 again; the attention state."""
        demoted, levels = self.demoted, self.levels
        for page in [p for p in levels if p >= len(demoted) or not demoted[p]]:
            del levels[page]
        self._publish()

    def demote_to(self, targets: dict[int, int]) -> None:
        """Outside the manager (`kvlab accuracy`'s windows): each of `targets`' pages brought
        down to its level there (none raised), as the step's requantizations would; an empty
        dict puts every page back at level 0 (its values then are what is written anew)."""
        if not targets:
            self.levels.clear()
        by_move: dict[tuple[int, int], list[int]] = {}
        for page, level in targets.items():
            before = self.levels.get(page, 0)
            if level > before:
                by_move.setdefault((before, level), []).append(page)
        for (before, after), pages in sorted(by_move.items()):
            self.requantize(pages, before, after)
            self.levels.update(dict.fromkeys(pages, after))
        self._publish()

    def _publish(self) -> None:
        """Each page's level where attention reads it."""
        levels, state = self.levels, self.state
        state.page_levels.zero_()
        if levels:
            ids = torch.tensor(list(levels), dtype=torch.long, device=state.page_levels.device)
            values = torch.tensor(list(levels.values()), dtype=torch.int8,
                                  device=state.page_levels.device)
            state.page_levels.index_copy_(0, ids, values)
        state.any_demoted = bool(levels)

    def requantize(self, pages: list[int], before: int, after: int) -> None:
        """`pages`' values read at level `before` (dequantized to float32) and stored at
        `after`, every layer."""
        index = torch.tensor(pages, dtype=torch.long, device=self.state.page_levels.device)
        for levels in self.tensor_levels:
            k, v = levels[before].dequantize(index)
            shape = (len(pages), self.page_size, *k.shape[1:])
            levels[after].store(index, k.view(shape), v.view(shape))

    def materialize(self, pages: Iterable[int]) -> None:
        """Level-0 values of the demoted ones of `pages` in their own level-0 slots (their
        level stays)."""
        by_level: dict[int, list[int]] = {}
        for page in dict.fromkeys(pages):
            level = self.levels.get(page, 0)
            if level:
                by_level.setdefault(level, []).append(page)
        for level, group in by_level.items():
            self.requantize(group, level, 0)


def attach(cache: KVCache, ladder: PrecisionLadder, model: Any) -> PrecisionPages:
    """Mixed-precision pages on `cache` (its tensors become level 0) and the model's backend
    wrapped to write at level 0 and attend over pages at their levels."""
    pages = PrecisionPages(cache, ladder, model.config.head_dim, next(model.parameters()).dtype)
    cache.precision = pages
    model.attn_backend = MixedBackend(model.attn_backend)
    return pages
