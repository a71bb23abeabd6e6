"""CPU cost of paging: the torch reference paged attention vs contiguous SDPA at equal contexts.

Decode batches (one new token per sequence) read K/V through shuffled block tables; the baseline
runs scaled_dot_product_attention over the same K/V laid out contiguously per sequence. The
ratio paged / contiguous is the paging overhead (the PagedAttention paper reports 20-26% for its
GPU kernel; the CPU reference pays for an explicit gather, so expect more).

    python benchmarks/kernel_bench.py [--batch 16] [--contexts 1024 2048] [--page-sizes 16 128]
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable

import torch
import torch.nn.functional as F

from kvlab.kernels import AttentionMetadata, get_backend


def _paired_times(
    paged: Callable[[], object], contiguous: Callable[[], object], repeats: int
) -> tuple[float, float, float]:
    """Median seconds of each, and the median per-pair ratio, timed alternately after a warm-up.

    Alternating keeps both sides under the same background load on a shared machine.
    """
    paged()
    contiguous()
    paged_times, contiguous_times = [], []
    for _ in range(repeats):
        for fn, times in ((paged, paged_times), (contiguous, contiguous_times)):
            start = time.perf_counter()
            fn()
            times.append(time.perf_counter() - start)
    ratios = [p / c for p, c in zip(paged_times, contiguous_times, strict=True)]
    return (
        statistics.median(paged_times),
        statistics.median(contiguous_times),
        statistics.median(ratios),
    )


def bench_decode(
    batch: int, context: int, page_size: int, args: argparse.Namespace
) -> tuple[float, float, float]:
    """(paged s, contiguous s, median paged/contiguous) for one decode step of equal contexts."""
    gen = torch.Generator().manual_seed(0)
    heads, kv_heads, dim = args.num_heads, args.num_kv_heads, args.head_dim
    pages_per_seq = -(-context // page_size)
    num_pages = batch * pages_per_seq
    k = torch.randn(batch, context, kv_heads, dim, generator=gen)
    v = torch.randn(batch, context, kv_heads, dim, generator=gen)
    q = torch.randn(batch, heads, dim, generator=gen)
    order = torch.randperm(num_pages, generator=gen).view(batch, pages_per_seq)
    k_cache = torch.zeros(num_pages, page_size, kv_heads, dim)
    v_cache = torch.zeros_like(k_cache)
    positions = torch.arange(context)
    for i in range(batch):
        pages = order[i, positions // page_size]
        k_cache[pages, positions % page_size] = k[i]
        v_cache[pages, positions % page_size] = v[i]
    meta = AttentionMetadata.build(
        block_tables=order.tolist(),
        seq_lens=[context] * batch,
        query_lens=[1] * batch,
        page_size=page_size,
    )
    backend = get_backend("torch")
    scale = dim**-0.5
    k_contiguous = k.transpose(1, 2).contiguous()  # [batch, kv_heads, context, dim]
    v_contiguous = v.transpose(1, 2).contiguous()

    def paged() -> object:
        return backend.paged_attention(
            q, k_cache, v_cache, meta, scale=scale, num_kv_heads=kv_heads
        )

    def contiguous() -> object:
        return F.scaled_dot_product_attention(
            q.unsqueeze(2), k_contiguous, v_contiguous, scale=scale, enable_gqa=True
        )

    torch.testing.assert_close(paged(), contiguous().squeeze(2), rtol=1e-4, atol=1e-4)
    return _paired_times(paged, contiguous, args.repeats)


def main() -> None:
    """Print one row per (context, page size): both times and the paging overhead."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batch", type=int, default=16)
    parser.add_argument("--contexts", type=int, nargs="+", default=[1024, 2048])
    parser.add_argument("--page-sizes", type=int, nargs="+", default=[16, 128])
    parser.add_argument("--num-heads", type=int, default=32)
    parser.add_argument("--num-kv-heads", type=int, default=8)
    parser.add_argument("--head-dim", type=int, default=128)
    parser.add_argument("--repeats", type=int, default=20)
    args = parser.parse_args()
    print(
        f"decode, batch {args.batch}, heads {args.num_heads}/{args.num_kv_heads} (q/kv), "
        f"head_dim {args.head_dim}, fp32, {torch.get_num_threads()} threads"
    )
    print(f"{'context':>8} {'page':>5} {'paged ms':>10} {'contig ms':>10} {'overhead':>9}")
    for context in args.contexts:
        for page_size in args.page_sizes:
            paged_s, contiguous_s, ratio = bench_decode(args.batch, context, page_size, args)
            overhead = ratio - 1
            print(
                f"{context:>8} {page_size:>5} {paged_s * 1e3:>10.2f} {contiguous_s * 1e3:>10.2f}"
                f" {overhead:>8.0%}"
            )


if __name__ == "__main__":
    main()
