"""The reference backend: plain PyTorch, obviously right, and vectorised where it is easy.

Decodes (one new token per sequence) are gathered into padded batches, sorted by context length
so padding stays small; each prefill chunk gathers its own context and runs one
scaled_dot_product_attention with a causal mask shifted by its cached prefix. Attention is
computed in fp32 and cast back to the query's dtype. Quantized pages (`kv_quant`) are stored by
kvkernels/kv_quant.py's code and dequantized to fp32 as they are gathered.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from functools import partial
from typing import TYPE_CHECKING

import torch
import torch.nn.functional as F
from torch import Tensor

from kvlab.kernels.backend import AttentionCall, KernelBackend, KVRows
from kvlab.kernels.metadata import AttentionMetadata
from kvlab.specs.kv_dtype import KV_CACHE_DTYPES

if TYPE_CHECKING:  # a KVQuant arrives with its pages; `get_backend("torch")` imports no more
    from kvlab.kernels.kv_quant import KVQuant

# Upper bound on gathered context slots per decode group (x num_kv_heads x head_dim x 4 bytes for
# each of K and V): keeps the reference's temporary memory bounded for large batches.
_MAX_DECODE_GROUP_SLOTS = 1 << 16

_MAX_GATHER_RUN = 16  # slots per gathered row

# (shape, like) -> two scratch tensors of that shape, for gathered K and V
_Buffers = Callable[[tuple[int, ...], Tensor], tuple[Tensor, Tensor]]
# (k_cache, v_cache, tables) -> the gathered (and dequantized) K and V: `_gather_pair`
_Gather = Callable[[Tensor, Tensor, Tensor], tuple[Tensor, Tensor]]


class TorchBackend(KernelBackend):
    """Reference kernels on any torch device; every other backend is tested against these.

    Keeps one gather workspace per (device, dtype), as large as the largest gather so far: a
    decode group holds at most _MAX_DECODE_GROUP_SLOTS slots, a prefill chunk its whole context.
    """

    name = "torch"
    supports_sliding_window = True
    kv_cache_dtypes = tuple(KV_CACHE_DTYPES)

    def __init__(self) -> None:
        # reused gather buffers: fresh multi-MB allocations page-fault on every call on CPU
        self._workspace: dict[tuple[torch.device, torch.dtype], Tensor] = {}

    def _write_kv(self, rows: KVRows) -> None:
        """Index copies of the rows kv_quant.py quantized (or cast) into the caches."""
        kv_quant = rows.kv_quant
        keep = rows.slot_mapping >= 0
        slots = rows.slot_mapping[keep].to(torch.int64)
        for new, cache, side in ((rows.key, rows.k_cache, "k"), (rows.value, rows.v_cache, "v")):
            new = new[keep]
            stored = new.to(cache.dtype) if kv_quant is None else kv_quant.quantize(new, side)
            # view (not flatten/reshape) so a non-contiguous cache fails instead of writing a copy
            flat = cache.view(-1, *cache.shape[2:])
            flat.index_copy_(0, slots, stored)

    def _paged_attention(self, call: AttentionCall) -> Tensor:
        """Gathered contexts, attention in float32; pages stored by `kv_quant` are dequantized
        to float32 as they are gathered."""
        query, k_cache, v_cache, meta = call.query, call.k_cache, call.v_cache, call.meta
        scale, sliding_window = call.scale, call.sliding_window
        out = torch.empty_like(query) if call.out is None else call.out
        gather = partial(_gather_pair, buffers=self._buffers, kv_quant=call.kv_quant)
        if sliding_window > 0:
            _windowed_attention(query, k_cache, v_cache, meta, sliding_window, scale, out, gather)
            return out
        decode_ids = [i for i, n in enumerate(meta.query_lens_cpu) if n == 1]
        for group in _decode_groups(decode_ids, meta.seq_lens_cpu, meta.page_size):
            _decode(query, k_cache, v_cache, meta, group, scale, out, gather)
        for seq_id, query_len in enumerate(meta.query_lens_cpu):
            if query_len > 1:
                _prefill(query, k_cache, v_cache, meta, seq_id, scale, out, gather)
        return out

    def _buffers(self, shape: tuple[int, ...], like: Tensor) -> tuple[Tensor, Tensor]:
        """Two scratch tensors of `shape` (for K and V), valid until the next call."""
        key = (like.device, like.dtype)
        numel = math.prod(shape)
        buffer = self._workspace.get(key)
        if buffer is None or buffer.numel() < 2 * numel:
            buffer = torch.empty(2 * numel, dtype=like.dtype, device=like.device)
            self._workspace[key] = buffer
        return buffer[:numel].view(shape), buffer[numel : 2 * numel].view(shape)

    def copy_pages(self, k_cache: Tensor, v_cache: Tensor, pairs: Tensor) -> None:
        """A gather, then a scatter (`copy_pages_by_index`)."""
        copy_pages_by_index(k_cache, v_cache, pairs)

    def swap_pages(
        self, src_k: Tensor, src_v: Tensor, dst_k: Tensor, dst_v: Tensor, pairs: Tensor
    ) -> None:
        """Torch index copies and runs of host pages (`swap_pages_by_index`)."""
        swap_pages_by_index(src_k, src_v, dst_k, dst_v, pairs)


def copy_pages_by_index(k_cache: Tensor, v_cache: Tensor, pairs: Tensor) -> None:
    """Gather every source page, then scatter to the destinations (so chains copy old content)."""
    pairs = pairs.to(k_cache.device, torch.int64)
    for cache in (k_cache, v_cache):
        cache.index_copy_(0, pairs[:, 1], cache.index_select(0, pairs[:, 0]))


def swap_pages_by_index(
    src_k: Tensor, src_v: Tensor, dst_k: Tensor, dst_v: Tensor, pairs: Tensor
) -> None:
    """Copy pages `pairs[n, 2]` of (src, dst) between two caches.

    Between a device and host memory, the device side is gathered (or scattered) there with
    one index op, and the host side is copied as runs of consecutive pages, one transfer each,
    straight from or into the host cache (pinned where a GPU reads it). A gather or scatter on
    the host side (index_select, index_copy_) with a transfer through pageable memory moved
    1-6 GB/s on an H200 whose link takes 53 GB/s, this 30-33 (benchmarks/gpu_check.py); a swap
    or a tier write takes host pages mostly in a row. Within one memory: one gather, one
    scatter.
    """
    src_device, dst_device = src_k.device, dst_k.device
    if dst_device.type == "cpu" and src_device.type != "cpu":
        src_ids = pairs[:, 0].to(src_device, torch.int64)
        runs = host_runs(pairs[:, 1].tolist())
        for src, dst in ((src_k, dst_k), (src_v, dst_v)):
            staged = src.index_select(0, src_ids)
            for host_start, start, count in runs:
                dst[host_start : host_start + count].copy_(staged[start : start + count])
        return
    if src_device.type == "cpu" and dst_device.type != "cpu":
        runs = host_runs(pairs[:, 0].tolist())
        dst_ids = pairs[:, 1].to(dst_device, torch.int64)
        for src, dst in ((src_k, dst_k), (src_v, dst_v)):
            staged = torch.empty((len(pairs), *src.shape[1:]), dtype=src.dtype,
                                 device=dst_device)
            for host_start, start, count in runs:  # asynchronous from pinned memory: the
                # scatter below follows the transfers on the device's stream
                staged[start : start + count].copy_(src[host_start : host_start + count],
                                                    non_blocking=True)
            dst.index_copy_(0, dst_ids, staged)
        return
    src_ids = pairs[:, 0].to(src_device, torch.int64)
    dst_ids = pairs[:, 1].to(dst_device, torch.int64)
    for src, dst in ((src_k, dst_k), (src_v, dst_v)):
        dst.index_copy_(0, dst_ids, src.index_select(0, src_ids).to(dst_device))


def host_runs(host_pages: list[int]) -> list[tuple[int, int, int]]:
    """(first host page, index of its pair, number of pages) of each run of consecutive host
    pages in `host_pages`, in order."""
    # (imported here: `get_backend("torch")` loads no module beyond the backend's own)
    from kvlab.kernels.extents import extents_of

    runs: list[tuple[int, int, int]] = []
    start = 0
    for first, count in extents_of(host_pages, len(host_pages)):
        runs.append((first, start, count))
        start += count
    return runs


def _decode_groups(decode_ids: list[int], seq_lens: list[int], page_size: int) -> list[list[int]]:
    """Decode sequences sorted by context length, cut into groups of bounded padded size."""
    groups: list[list[int]] = []
    group: list[int] = []
    for seq_id in sorted(decode_ids, key=lambda i: seq_lens[i]):
        padded_len = -(-seq_lens[seq_id] // page_size) * page_size
        if group and (len(group) + 1) * padded_len > _MAX_DECODE_GROUP_SLOTS:
            groups.append(group)
            group = []
        group.append(seq_id)
    if group:
        groups.append(group)
    return groups


def _decode(
    query: Tensor,
    k_cache: Tensor,
    v_cache: Tensor,
    meta: AttentionMetadata,
    seq_ids: list[int],
    scale: float,
    out: Tensor,
    gather: _Gather,
) -> None:
    """One-token queries of `seq_ids`, attended over one padded gather of their pages."""
    device = query.device
    starts = meta.query_start_loc_cpu
    rows = torch.tensor([starts[i] for i in seq_ids], device=device)
    ids = torch.tensor(seq_ids, device=device)
    max_len = max(meta.seq_lens_cpu[i] for i in seq_ids)
    num_pages = -(-max_len // meta.page_size)
    tables = meta.block_tables[ids, :num_pages]
    valid = torch.arange(num_pages * meta.page_size, device=device) < meta.seq_lens[ids, None]
    k, v = gather(k_cache, v_cache, tables)
    # slots past a context are masked below, but may hold NaN/inf that 0 * garbage would spread
    for row, seq_id in enumerate(seq_ids):
        if meta.seq_lens_cpu[seq_id] < k.shape[1]:
            k[row, meta.seq_lens_cpu[seq_id] :] = 0
            v[row, meta.seq_lens_cpu[seq_id] :] = 0
    q = query[rows].unsqueeze(2)  # [batch, num_heads, 1, head_dim]
    o = attend(q, k.transpose(1, 2), v.transpose(1, 2), valid[:, None, None, :], scale)
    out[rows] = o.squeeze(2).to(out.dtype)


def _prefill(
    query: Tensor,
    k_cache: Tensor,
    v_cache: Tensor,
    meta: AttentionMetadata,
    seq_id: int,
    scale: float,
    out: Tensor,
    gather: _Gather,
) -> None:
    """The query chunk of one sequence over its whole context, causal from its offset."""
    seq_len = meta.seq_lens_cpu[seq_id]
    query_len = meta.query_lens_cpu[seq_id]
    start = meta.query_start_loc_cpu[seq_id]
    tables = meta.block_tables[seq_id : seq_id + 1, : -(-seq_len // meta.page_size)]
    k, v = gather(k_cache, v_cache, tables)
    k = k[:, :seq_len].transpose(1, 2)  # [1, kv_heads, seq_len, dim]
    v = v[:, :seq_len].transpose(1, 2)
    q = query[start : start + query_len].transpose(0, 1).unsqueeze(0)  # [1, heads, q_len, dim]
    mask = None
    if query_len < seq_len:
        positions = torch.arange(seq_len, device=query.device)
        mask = positions[None, :] <= positions[seq_len - query_len :, None]
    o = attend(q, k, v, mask, scale)
    out[start : start + query_len] = o[0].transpose(0, 1).to(out.dtype)


def _windowed_attention(
    query: Tensor,
    k_cache: Tensor,
    v_cache: Tensor,
    meta: AttentionMetadata,
    window: int,
    scale: float,
    out: Tensor,
    gather: _Gather,
) -> None:
    """Attention over a sliding window of `window` tokens: each sequence's query rows gather
    only the pages from the one holding the first row's first visible key on, so pages wholly
    behind the window (NULL_PAGE entries among them) are never read."""
    page_size = meta.page_size
    # the pages a decode reads: its window's, at most one more than the window fills
    spans = [min(n, window + page_size) for n in meta.seq_lens_cpu]
    decode_ids = [i for i, n in enumerate(meta.query_lens_cpu) if n == 1]
    for group in _decode_groups(decode_ids, spans, page_size):
        _attend_window(query, k_cache, v_cache, meta, group, window, scale, out, gather)
    for seq_id, query_len in enumerate(meta.query_lens_cpu):
        if query_len > 1:
            _attend_window(query, k_cache, v_cache, meta, [seq_id], window, scale, out, gather)


def _attend_window(
    query: Tensor,
    k_cache: Tensor,
    v_cache: Tensor,
    meta: AttentionMetadata,
    seq_ids: list[int],
    window: int,
    scale: float,
    out: Tensor,
    gather: _Gather,
) -> None:
    """Sequences of equal query length (one prefill chunk, or a group of decodes) over one
    padded gather of their windows' pages, masked to each row's window."""
    device = query.device
    page_size = meta.page_size
    query_len = meta.query_lens_cpu[seq_ids[0]]
    seq_lens = [meta.seq_lens_cpu[i] for i in seq_ids]
    # first key any row of a sequence sees, and the first page to gather from
    lows = [max(0, n - query_len - window + 1) for n in seq_lens]
    firsts = [low // page_size for low in lows]
    num_pages = max(-(-n // page_size) - f for n, f in zip(seq_lens, firsts, strict=True))
    max_col = meta.block_tables.shape[1] - 1
    cols = torch.tensor(firsts)[:, None] + torch.arange(num_pages)
    ids = torch.tensor(seq_ids)[:, None]
    # columns past a table (padding) and NULL_PAGE entries read page 0; masked below
    tables = meta.block_tables[ids.to(device), cols.clamp(max=max_col).to(device)].clamp(min=0)
    k, v = gather(k_cache, v_cache, tables)
    key_pos = torch.tensor(firsts)[:, None] * page_size + torch.arange(num_pages * page_size)
    seen = (key_pos >= torch.tensor(lows)[:, None]) & (key_pos < torch.tensor(seq_lens)[:, None])
    seen = seen.to(device)
    # masked slots may hold NaN/inf (page 0 stands in for NULL_PAGE) that 0 * garbage spreads
    k.masked_fill_(~seen[:, :, None, None], 0)
    v.masked_fill_(~seen[:, :, None, None], 0)
    query_pos = torch.tensor(seq_lens)[:, None] - query_len + torch.arange(query_len)
    mask = (key_pos[:, None, :] <= query_pos[:, :, None]) & (
        key_pos[:, None, :] > query_pos[:, :, None] - window
    )
    starts = meta.query_start_loc_cpu
    rows = (torch.tensor([starts[i] for i in seq_ids])[:, None] + torch.arange(query_len))
    rows = rows.flatten().to(device)
    q = query[rows].view(len(seq_ids), query_len, *query.shape[1:]).transpose(1, 2)
    o = attend(q, k.transpose(1, 2), v.transpose(1, 2), mask[:, None].to(device), scale)
    out[rows] = o.transpose(1, 2).flatten(0, 1).to(out.dtype)


def _gather_pair(
    k_cache: Tensor,
    v_cache: Tensor,
    tables: Tensor,
    *,
    buffers: _Buffers,
    kv_quant: KVQuant | None,
) -> tuple[Tensor, Tensor]:
    """The pages of each table row, concatenated: `[rows, pages * page_size, kv_heads, dim]`;
    dequantized to float32 (new tensors) where `kv_quant` stored them."""
    page_size, slot_shape = k_cache.shape[1], k_cache.shape[2:]
    # index_select on CPU slows down several-fold once rows grow past a few tens of KiB, so
    # large pages are gathered as runs of at most 16 slots
    run = page_size if page_size <= _MAX_GATHER_RUN else math.gcd(page_size, _MAX_GATHER_RUN)
    runs_per_page = page_size // run
    page_ids = tables.reshape(-1).to(torch.int64)
    run_ids = page_ids[:, None] * runs_per_page + torch.arange(runs_per_page, device=tables.device)
    k, v = buffers((run_ids.numel(), run, *slot_shape), k_cache)
    torch.index_select(k_cache.view(-1, run, *slot_shape), 0, run_ids.flatten(), out=k)
    torch.index_select(v_cache.view(-1, run, *slot_shape), 0, run_ids.flatten(), out=v)
    shape = (tables.shape[0], -1, *slot_shape)
    if kv_quant is not None:
        return kv_quant.dequantize(k.view(shape), "k"), kv_quant.dequantize(v.view(shape), "v")
    return k.view(shape), v.view(shape)


def attend(q: Tensor, k: Tensor, v: Tensor, mask: Tensor | None, scale: float) -> Tensor:
    """Grouped-query attention in fp32; `mask` True where a key may be attended (None: causal)."""
    return F.scaled_dot_product_attention(
        q.float(),
        k.float(),
        v.float(),
        attn_mask=mask,
        is_causal=mask is None,
        scale=scale,
        enable_gqa=q.shape[1] != k.shape[1],
    )
