"""Random paged-attention batches and their contiguous reference, shared by the backend tests."""

from __future__ import annotations

import os
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import Tensor

from kvlab.kernels import AttentionMetadata, KernelBackend, get_backend


@dataclass(slots=True)
class PagedCase:
    """One batch: paged caches, its metadata, the new-token queries and each sequence's full K/V."""

    query: Tensor  # [num_tokens, num_heads, head_dim]
    k_cache: Tensor
    v_cache: Tensor
    meta: AttentionMetadata
    full_q: list[Tensor]  # per sequence [seq_len, num_heads, head_dim]
    full_k: list[Tensor]  # per sequence [seq_len, num_kv_heads, head_dim]
    full_v: list[Tensor]
    num_kv_heads: int
    scale: float


def make_case(
    seq_lens: list[int],
    query_lens: list[int],
    *,
    page_size: int,
    num_heads: int = 4,
    num_kv_heads: int = 2,
    head_dim: int = 16,
    dtype: torch.dtype = torch.float32,
    shuffle: bool = True,
    poison: float = float("nan"),
    seed: int = 0,
    run_pages: int = 1,
) -> PagedCase:
    """A batch whose pages are scattered (shuffled) over a cache whose other slots hold `poison`.

    `run_pages` > 1 shuffles runs of that many contiguous pages instead of single pages, as a
    dynamic block size (runs of 2^k pages) lays a sequence out.
    """
    gen = torch.Generator().manual_seed(seed)
    pages_per_seq = [-(-n // page_size) for n in seq_lens]
    num_pages = sum(pages_per_seq) + 3  # spare pages that no table names
    # its own generator, so shuffling changes where the data sits but not the data
    page_gen = torch.Generator().manual_seed(seed + 1)
    num_pages = -(-num_pages // run_pages) * run_pages
    if shuffle:
        runs = torch.randperm(num_pages // run_pages, generator=page_gen)
        order = (runs[:, None] * run_pages + torch.arange(run_pages)).flatten()
    else:
        order = torch.arange(num_pages)
    shape = (num_pages, page_size, num_kv_heads, head_dim)
    k_cache = torch.full(shape, poison, dtype=dtype)
    v_cache = torch.full(shape, poison, dtype=dtype)
    tables, full_q, full_k, full_v = [], [], [], []
    next_page = 0
    for seq_len, n in zip(seq_lens, pages_per_seq, strict=True):
        table = order[next_page : next_page + n].tolist()
        next_page += n
        tables.append(table)
        full_q.append(torch.randn(seq_len, num_heads, head_dim, generator=gen).to(dtype))
        full_k.append(torch.randn(seq_len, num_kv_heads, head_dim, generator=gen).to(dtype))
        full_v.append(torch.randn(seq_len, num_kv_heads, head_dim, generator=gen).to(dtype))
        positions = torch.arange(seq_len)
        pages = torch.tensor(table)[positions // page_size]
        k_cache[pages, positions % page_size] = full_k[-1]
        v_cache[pages, positions % page_size] = full_v[-1]
    meta = AttentionMetadata.build(
        block_tables=tables, seq_lens=seq_lens, query_lens=query_lens, page_size=page_size
    )
    query = torch.cat([q[len(q) - n :] for q, n in zip(full_q, query_lens, strict=True)])
    return PagedCase(
        query=query,
        k_cache=k_cache,
        v_cache=v_cache,
        meta=meta,
        full_q=full_q,
        full_k=full_k,
        full_v=full_v,
        num_kv_heads=num_kv_heads,
        scale=head_dim**-0.5,
    )


def move_case(case: PagedCase, device: torch.device | str) -> PagedCase:
    """The same case with its query, caches and metadata tensors on `device` (in place)."""
    for name in ("query", "k_cache", "v_cache"):
        setattr(case, name, getattr(case, name).to(device))
    for name in ("slot_mapping", "block_tables", "seq_lens", "query_start_loc"):
        setattr(case.meta, name, getattr(case.meta, name).to(device))
    return case


def attend(case: PagedCase, backend: KernelBackend, out: Tensor | None = None) -> Tensor:
    """`backend`'s paged attention over the case's batch (its scale and KV heads), written into
    `out` when one is given."""
    return backend.paged_attention(case.query, case.k_cache, case.v_cache, case.meta,
                                   scale=case.scale, num_kv_heads=case.num_kv_heads, out=out)


def contiguous_attention(case: PagedCase, window: int = 0) -> Tensor:
    """Expected output: causal SDPA over each whole contiguous sequence, keeping the new rows;
    with a `window` > 0, row p sees positions p - window + 1 .. p only."""
    rows = []
    for q, k, v, n in zip(
        case.full_q, case.full_k, case.full_v, case.meta.query_lens_cpu, strict=True
    ):
        group = q.shape[1] // k.shape[1]
        mask = None
        if window > 0:
            pos = torch.arange(len(q))
            mask = (pos[None, :] <= pos[:, None]) & (pos[None, :] > pos[:, None] - window)
        o = F.scaled_dot_product_attention(
            q.float().transpose(0, 1),
            k.float().repeat_interleave(group, dim=1).transpose(0, 1),
            v.float().repeat_interleave(group, dim=1).transpose(0, 1),
            attn_mask=mask,
            is_causal=mask is None,
            scale=case.scale,
        )
        rows.append(o.transpose(0, 1)[len(q) - n :])
    return torch.cat(rows).to(case.query.dtype)


def write_kv_beside_reference(backend: KernelBackend) -> list[tuple[Tensor, Tensor]]:
    """(backend's cache, the torch reference's) for K and V after the same write_kv of strided
    rows into NaN caches, one slot marked -1 (skipped)."""
    meta = AttentionMetadata.build(
        block_tables=[[3, 0], [1]], seq_lens=[20, 5], query_lens=[20, 1], page_size=16
    )
    slots = meta.slot_mapping.clone()
    slots[4] = -1
    kv = torch.randn(21, 2, 2, 8)
    key, value = kv[:, 0], kv[:, 1]  # strided views, as split from a fused projection
    caches = [torch.full((4, 16, 2, 8), float("nan")) for _ in range(4)]
    backend.write_kv(key, value, caches[0], caches[1], slots)
    get_backend("torch").write_kv(key, value, caches[2], caches[3], slots)
    return [(caches[0], caches[2]), (caches[1], caches[3])]


def run_without_interpreter(script: str) -> subprocess.CompletedProcess[str]:
    """This folder's `script` run in a process of its own with TRITON_INTERPRET=0 (this
    session runs kernels in the interpreter; compiled ones need a process without it)."""
    env = {**os.environ, "TRITON_INTERPRET": "0"}
    path = Path(__file__).with_name(script)
    return subprocess.run([sys.executable, str(path)], env=env, capture_output=True, text=True)


def max_relative_error(actual: Tensor, expected: Tensor) -> float:
    """Largest |actual - expected| over the largest |expected| (NaN anywhere gives NaN)."""
    diff = (actual.float() - expected.float()).abs().max()
    return float(diff / expected.float().abs().max().clamp_min(1e-30))
