"""Carries out one scheduled step on the device: memory work, one forward pass, sampling."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import torch

from kvlab.engine.kv_cache import KVCache
from kvlab.engine.platform import Platform
from kvlab.engine.sampler import Sampler, SamplingParams
from kvlab.kernels import AttentionMetadata
from kvlab.policies.outputs import SchedulerOutput
from kvlab.policies.request import Request

# A request's block tables, one per KV-cache group in the model's group order; entries of pages
# given back behind a sliding window are NULL_PAGE (-1).
BlockTables = Callable[[Request], list[list[int]]]


def group_block_tables(manager: Any) -> BlockTables:
    """The manager's `block_tables` (one table per KV-cache group), or, for a manager with one
    table per request, `[manager.block_table(request)]`."""
    block_tables: BlockTables | None = getattr(manager, "block_tables", None)
    if block_tables is not None:
        return block_tables
    block_table = manager.block_table
    return lambda request: [block_table(request)]


@dataclass(slots=True)
class ModelInput:
    """A step's flat batch: every scheduled token in batch order, and which rows sample.

    `meta` is the step's attention metadata, or where layers read different KV-cache groups a
    list of one per layer (layers of a group share one). `sample_indices[i]` is the index in
    the step's batch of the request whose last row, `sample_rows[i]`, is turned into logits
    (only requests that reach their last known token).
    """

    input_ids: torch.Tensor
    positions: torch.Tensor
    meta: AttentionMetadata | list[AttentionMetadata]
    sample_indices: list[int]
    sample_rows: torch.Tensor


def prepare_input(
    output: SchedulerOutput,
    block_tables: BlockTables,
    page_size: int,
    device: torch.device,
    layer_groups: Sequence[int] = (),
) -> ModelInput:
    """The flat batch of a step: token ids, positions, attention metadata, sampling rows.

    `layer_groups[i]` is the KV-cache group of layer i, an index into what `block_tables`
    returns; empty: one group, whose metadata every layer shares.
    """
    num_groups = max(layer_groups, default=0) + 1
    input_ids: list[int] = []
    positions: list[int] = []
    seq_lens: list[int] = []
    request_tables: list[list[list[int]]] = []  # per request, one table per group
    sample_indices: list[int] = []
    sample_rows: list[int] = []
    num_rows = 0
    for index, (request, num_new, start) in enumerate(
        zip(output.requests, output.num_new_tokens, output.num_computed_tokens, strict=True)
    ):
        end = start + num_new
        if num_new == 1:  # decodes: most of a batch, kept cheap
            input_ids.append(request.token_slice(start, end)[0])
            positions.append(start)
        else:
            input_ids.extend(request.token_slice(start, end))
            positions.extend(range(start, end))
        num_rows += num_new
        seq_lens.append(end)
        request_tables.append(block_tables(request))
        if end == request.num_tokens:
            sample_indices.append(index)
            sample_rows.append(num_rows - 1)
    if set(map(len, request_tables)) - {num_groups}:
        counts = sorted(set(map(len, request_tables)) - {num_groups})
        raise ValueError(
            f"{counts[0]} block tables for a request, for the model's {num_groups} KV-cache groups"
        )
    # per group, one table per request
    tables = [list(group) for group in zip(*request_tables, strict=True)] or [[]] * num_groups
    meta = AttentionMetadata.build(
        block_tables=tables[0],
        seq_lens=seq_lens,
        query_lens=output.num_new_tokens,
        page_size=page_size,
        device=device,
    )
    return ModelInput(
        input_ids=torch.tensor(input_ids, dtype=torch.long, device=device),
        positions=torch.tensor(positions, dtype=torch.long, device=device),
        meta=_layer_metadata(meta, tables, layer_groups),
        sample_indices=sample_indices,
        sample_rows=torch.tensor(sample_rows, dtype=torch.long, device=device),
    )


def _layer_metadata(
    meta: AttentionMetadata, tables: list[list[list[int]]], layer_groups: Sequence[int]
) -> AttentionMetadata | list[AttentionMetadata]:
    """`meta` (group 0's) where there is one group, else one metadata per layer."""
    if len(tables) == 1:
        return meta
    metas = [meta, *(meta.with_block_tables(group) for group in tables[1:])]
    return [metas[group] for group in layer_groups]


class ModelRunner:
    """Runs a SchedulerOutput: its MemOps, then one forward over all tokens, then the sampler.

    Every scheduled token of the step (decodes and prefill chunks alike) goes through a single
    forward pass; only the rows that sample reach the LM head. `block_tables` gives a request's
    block table per KV-cache group; `layer_groups[i]` is layer i's group (empty: every layer
    in group 0, the one table a single-table manager gives).
    """

    def __init__(
        self,
        model: Any,
        kv_cache: KVCache,
        platform: Platform,
        block_tables: BlockTables,
        sampler: Sampler | None = None,
        layer_groups: Sequence[int] = (),
    ) -> None:
        self.model = model
        self.kv_cache = kv_cache
        self.platform = platform
        self.block_tables = block_tables
        num_layers = len(kv_cache.layers())
        if layer_groups and len(layer_groups) != num_layers:
            raise ValueError(f"{len(layer_groups)} layer_groups for {num_layers} layers")
        if layer_groups and set(layer_groups) != set(range(max(layer_groups) + 1)):
            raise ValueError(f"layer_groups {list(layer_groups)}: expected groups 0..n-1, all used")
        self.layer_groups = tuple(layer_groups)
        self.sampler = sampler or Sampler()
        self.page_size = kv_cache.page_size
        self.device = platform.device
        self._kv_layers = kv_cache.layers()

    def execute(
        self, output: SchedulerOutput, params: Mapping[int, SamplingParams]
    ) -> list[int | None]:
        """Sampled token ids aligned with the step's batch (None where a row did not sample).

        `params` maps request id to its SamplingParams. Returns once the device is done.
        """
        if output.mem_ops or self.kv_cache.precision is not None:  # (page levels each step)
            self.kv_cache.execute_mem_ops(output.mem_ops)
        sampled: list[int | None] = [None] * len(output.requests)
        if output.requests:
            batch = prepare_input(
                output, self.block_tables, self.page_size, self.device, self.layer_groups
            )
            with torch.inference_mode():
                hidden = self.model(batch.input_ids, batch.positions, self._kv_layers, batch.meta)
                if batch.sample_indices:
                    logits = self.model.compute_logits(hidden[batch.sample_rows])
                    requests = [output.requests[i] for i in batch.sample_indices]
                    tokens = self.sampler(
                        logits,
                        [params[r.request_id] for r in requests],
                        [r.request_id for r in requests],
                    )
                    for index, token in zip(batch.sample_indices, tokens, strict=True):
                        sampled[index] = token
        self.platform.synchronize()
        return sampled

    def warm_up(self, num_tokens: int, num_decodes: int) -> None:
        """Run one prefill of `num_tokens` (the largest a step can hold) and one batch of
        `num_decodes` decodes, so that the first real steps do not pay one-off costs (allocator
        growth and first-touch page faults of the largest temporaries, reference-backend
        workspaces, op dispatch set-up), as vLLM's start-up profile run does. Nothing is
        recorded.

        Uses the cache's own pages as scratch, before any request holds them: a request writes
        every slot it later reads, so what the warm-up leaves there is never seen.
        """
        cache = self.kv_cache
        page_size = self.page_size
        num_tokens = min(num_tokens, cache.num_pages * page_size)
        if num_tokens > 0:
            self.forward_tokens([0] * num_tokens, list(range(-(-num_tokens // page_size))))
        if num_decodes > 0:
            # Two tokens each (one in the cache, one new) in a page of their own, as far as
            # there are pages; the slots they write are scratch too.
            seq_len = min(2, page_size)
            meta = AttentionMetadata.build(
                block_tables=[[i % cache.num_pages] for i in range(num_decodes)],
                seq_lens=[seq_len] * num_decodes,
                query_lens=[1] * num_decodes,
                page_size=page_size,
                device=self.device,
            )
            ids = torch.zeros(num_decodes, dtype=torch.long, device=self.device)
            positions = torch.full((num_decodes,), seq_len - 1, device=self.device)
            with torch.inference_mode():
                hidden = self.model(ids, positions, self._kv_layers, meta)
                self.model.compute_logits(hidden).argmax(dim=-1).tolist()
        self.platform.synchronize()

    def forward_tokens(self, token_ids: list[int], block_table: list[int]) -> None:
        """One prefill of `token_ids` into the pages of `block_table` (to time a recomputation)."""
        num_tokens = len(token_ids)
        meta = AttentionMetadata.build(
            block_tables=[block_table],
            seq_lens=[num_tokens],
            query_lens=[num_tokens],
            page_size=self.page_size,
            device=self.device,
        )
        ids = torch.tensor(token_ids, dtype=torch.long, device=self.device)
        positions = torch.arange(num_tokens, device=self.device)
        with torch.inference_mode():
            hidden = self.model(ids, positions, self._kv_layers, meta)
            self.model.compute_logits(hidden[-1:])
        self.platform.synchronize()
