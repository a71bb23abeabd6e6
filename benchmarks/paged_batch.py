"""What gpu_check.py and npu_check.py share: random paged batches, a backend's attention over
one, the relative error against the reference, and the exactness check of the cache ops.

Imported by name (`from paged_batch import ...`): a script's own folder is on sys.path.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from kvlab.kernels import AttentionMetadata, KernelBackend


@dataclass(slots=True)
class PagedBatch:
    """Random paged caches, their metadata and one query row per new token."""

    query: torch.Tensor
    k_cache: torch.Tensor
    v_cache: torch.Tensor
    meta: AttentionMetadata
    num_kv_heads: int


def make_batch(
    seq_lens: list[int],
    query_lens: list[int],
    *,
    page_size: int,
    shape: tuple[int, int, int],
    dtype: torch.dtype,
    device: torch.device | str,
    run_pages: int = 1,
    fill_on_host: bool = False,
    seed: int = 0,
) -> PagedBatch:
    """Caches filled with random tokens (on the device, or on the host and moved), pages dealt
    out to sequences in shuffled runs of `run_pages` contiguous pages."""
    gen = torch.Generator().manual_seed(seed)
    fill = gen if fill_on_host else torch.Generator(device=device).manual_seed(seed)
    fill_device = "cpu" if fill_on_host else device
    num_heads, num_kv_heads, head_dim = shape
    pages_per_seq = [-(-n // page_size) for n in seq_lens]
    num_runs = -(-sum(pages_per_seq) // run_pages)
    runs = torch.randperm(num_runs, generator=gen)
    order = (runs[:, None] * run_pages + torch.arange(run_pages)).flatten().tolist()
    tables, start = [], 0
    for n in pages_per_seq:
        tables.append(order[start : start + n])
        start += n

    def random(*size: int) -> torch.Tensor:
        return torch.randn(size, generator=fill, device=fill_device).to(dtype).to(device)

    cache_shape = (num_runs * run_pages, page_size, num_kv_heads, head_dim)
    k_cache, v_cache = random(*cache_shape), random(*cache_shape)
    query = random(sum(query_lens), num_heads, head_dim)
    meta = AttentionMetadata.build(block_tables=tables, seq_lens=seq_lens, query_lens=query_lens,
                                   page_size=page_size, device=device)
    return PagedBatch(query, k_cache, v_cache, meta, num_kv_heads)


def attention(backend: KernelBackend, batch: PagedBatch) -> torch.Tensor:
    """The backend's paged attention over the batch."""
    return backend.paged_attention(batch.query, batch.k_cache, batch.v_cache, batch.meta,
                                   scale=batch.query.shape[-1] ** -0.5,
                                   num_kv_heads=batch.num_kv_heads)


def relative_error(actual: torch.Tensor, expected: torch.Tensor) -> float:
    """Largest absolute difference over the largest absolute expected value (NaN stays NaN)."""
    diff = (actual.float() - expected.float()).abs().max()
    return float(diff / expected.float().abs().max().clamp_min(1e-30))


def check_cache_ops(backend: KernelBackend, reference: KernelBackend, *,
                    device: torch.device | str, dtype: torch.dtype, pairs: list[list[int]],
                    label: str = "", fill_on_host: bool = False) -> int:
    """write_kv and copy_pages (of `pairs`) must match the reference bit for bit; prints one
    line and returns the failures (0 or 1)."""
    meta = AttentionMetadata.build(block_tables=[[5, 2, 7], [0, 3]], seq_lens=[300, 200],
                                   query_lens=[300, 1], page_size=128, device=device)
    fill_device = "cpu" if fill_on_host else device
    key, value = (torch.randn(301, 8, 128, device=fill_device).to(dtype).to(device)
                  for _ in range(2))
    caches = [torch.zeros(8, 128, 8, 128, device=device, dtype=dtype) for _ in range(4)]
    backend.write_kv(key, value, caches[0], caches[1], meta.slot_mapping)
    reference.write_kv(key, value, caches[2], caches[3], meta.slot_mapping)
    backend.copy_pages(caches[0], caches[1], torch.tensor(pairs))
    reference.copy_pages(caches[2], caches[3], torch.tensor(pairs))
    ok = torch.equal(caches[0], caches[2]) and torch.equal(caches[1], caches[3])
    named = f"{label:<7} " if label else ""
    print(f"  {'ok  ' if ok else 'FAIL'} {named}write_kv + copy_pages exact")
    return 0 if ok else 1
