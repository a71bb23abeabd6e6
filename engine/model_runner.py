"""Carries out one scheduled step on the device: memory work, one forward pass, sampling."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import torch

from kvlab.engine.kv_cache import KVCache
from kvlab.engine.platform import Platform
from kvlab.engine.sampler import Sampler, SamplingParams
from kvlab.kernels import AttentionMetadata
from kvlab.policies.outputs import SchedulerOutput
from kvlab.policies.request import Request


@dataclass(slots=True)
class ModelInput:
    """A step's flat batch: every scheduled token in batch order, and which rows sample.

    `sample_indices[i]` is the index in the step's batch of the request whose last row,
    `sample_rows[i]`, is turned into logits (only requests that reach their last known token).
    """

    input_ids: torch.Tensor
    positions: torch.Tensor
    meta: AttentionMetadata
    sample_indices: list[int]
    sample_rows: torch.Tensor


def prepare_input(
    output: SchedulerOutput,
    block_table: Callable[[Request], list[int]],
    page_size: int,
    device: torch.device,
) -> ModelInput:
    """The flat batch of a step: token ids, positions, attention metadata, sampling rows."""
    input_ids: list[int] = []
    positions: list[int] = []
    seq_lens: list[int] = []
    tables: list[list[int]] = []
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
        tables.append(block_table(request))
        if end == request.num_tokens:
            sample_indices.append(index)
            sample_rows.append(num_rows - 1)
    meta = AttentionMetadata.build(
        block_tables=tables,
        seq_lens=seq_lens,
        query_lens=output.num_new_tokens,
        page_size=page_size,
        device=device,
    )
    return ModelInput(
        input_ids=torch.tensor(input_ids, dtype=torch.long, device=device),
        positions=torch.tensor(positions, dtype=torch.long, device=device),
        meta=meta,
        sample_indices=sample_indices,
        sample_rows=torch.tensor(sample_rows, dtype=torch.long, device=device),
    )


class ModelRunner:
    """Runs a SchedulerOutput: its MemOps, then one forward over all tokens, then the sampler.

    Every scheduled token of the step (decodes and prefill chunks alike) goes through a single
    forward pass; only the rows that sample reach the LM head.
    """

    def __init__(
        self,
        model: Any,
        kv_cache: KVCache,
        platform: Platform,
        block_table: Callable[[Request], list[int]],
        sampler: Sampler | None = None,
    ) -> None:
        self.model = model
        self.kv_cache = kv_cache
        self.platform = platform
        self.block_table = block_table
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
        if output.mem_ops:
            self.kv_cache.execute_mem_ops(output.mem_ops)
        sampled: list[int | None] = [None] * len(output.requests)
        if output.requests:
            batch = prepare_input(output, self.block_table, self.page_size, self.device)
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
