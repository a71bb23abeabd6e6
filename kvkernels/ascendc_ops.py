"""kvlab's AscendC kernels as the npu backend calls them: loaded when built, planned in Python.

`load_ascendc_ops()` loads `libkvlab_ascendc.so` (built on an Atlas machine by CMake from
kvkernels/ascendc/, or named by $KVLAB_ASCENDC_LIB) and returns an `AscendcOps`, or None when no
library is there. UNVERIFIED ON HARDWARE, NOT COMPILED HERE: the library has never been built;
the npu backend's tests run this code against an emulation of the three ops' contracts
(tests/kernels/npu_emulation.py), and `pytest -m npu` runs it on an Atlas machine.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import torch
from torch import Tensor

from kvlab.errors import KvlabError
from kvlab.kernels.ascendc_tiling import (
    copy_pages_plan,
    decode_supported,
    paged_decode_plan,
    swap_runs,
)
from kvlab.kernels.extents import ExtentTable

LIBRARY_ENV = "KVLAB_ASCENDC_LIB"
DEFAULT_LIBRARY = Path(__file__).parent / "ascendc" / "build" / "libkvlab_ascendc.so"


def library_path() -> Path | None:
    """The AscendC library to load: $KVLAB_ASCENDC_LIB, else the CMake build's, if it exists."""
    named = os.environ.get(LIBRARY_ENV)
    if named:
        if not Path(named).is_file():
            raise KvlabError(f"{LIBRARY_ENV}={named}: no such file (build kvkernels/ascendc first)")
        return Path(named)
    return DEFAULT_LIBRARY if DEFAULT_LIBRARY.is_file() else None


def load_ascendc_ops() -> AscendcOps | None:
    """kvlab's AscendC ops, or None when the library has not been built here."""
    path = library_path()
    if path is None:
        return None
    try:
        torch.ops.load_library(str(path))
    except (OSError, RuntimeError) as err:
        raise KvlabError(f"loading kvlab's AscendC kernels from {path} failed: {err}") from err
    return AscendcOps(torch.ops.kvlab_ascendc)


class AscendcOps:
    """The `kvlab_ascendc` torch ops with their tiling planned by kvkernels/ascendc_tiling.py."""

    def __init__(self, ops: Any) -> None:
        self._ops = ops

    def copy_pages(
        self, k_cache: Tensor, v_cache: Tensor, src_ids: Tensor, dst_ids: Tensor
    ) -> None:
        """Pages src_ids[i] -> dst_ids[i] within one device cache (disjoint sources and
        destinations: the caller stages overlapping pairs)."""
        self.move_pages((k_cache, v_cache), (k_cache, v_cache), src_ids, dst_ids)

    def move_pages(
        self,
        src: tuple[Tensor, Tensor],
        dst: tuple[Tensor, Tensor],
        src_ids: Tensor,
        dst_ids: Tensor,
    ) -> None:
        """Page src_ids[i] of the src K/V caches -> page dst_ids[i] of the dst ones, on device."""
        plan = copy_pages_plan(src[0][0].numel(), src[0].element_size(), src_ids.numel())
        self._ops.copy_pages(
            dst[0],
            dst[1],
            src[0],
            src[1],
            src_ids.to(torch.int64).contiguous(),
            dst_ids.to(torch.int64).contiguous(),
            **plan.launch,
        )

    def swap_pages(
        self, src_k: Tensor, src_v: Tensor, dst_k: Tensor, dst_v: Tensor, pairs: Tensor
    ) -> None:
        """Pages between a host cache and a device cache as one batch of coalesced runs."""
        page_bytes = src_k[0].numel() * src_k.element_size()
        runs = swap_runs([tuple(p) for p in pairs.tolist()], page_bytes)
        table = torch.tensor(runs, dtype=torch.int64).reshape(-1, 3)
        self._ops.swap_pages(
            src_k,
            src_v,
            dst_k,
            dst_v,
            table[:, 0].contiguous(),
            table[:, 1].contiguous(),
            table[:, 2].contiguous(),
        )

    def can_decode(self, num_heads: int, num_kv_heads: int, head_dim: int) -> bool:
        """True when the AscendC decode takes this head shape."""
        return decode_supported(num_heads // num_kv_heads, head_dim)

    def paged_decode(
        self,
        query: Tensor,
        k_cache: Tensor,
        v_cache: Tensor,
        extents: ExtentTable,
        seq_lens: Tensor,
        scale: float,
        out: Tensor,
    ) -> None:
        """One new token per sequence (query row i is sequence i) over its extents, into out."""
        num_seqs, num_heads, head_dim = query.shape
        num_kv_heads = k_cache.shape[2]
        plan = paged_decode_plan(
            k_cache.shape[1],
            head_dim,
            num_heads // num_kv_heads,
            k_cache.element_size(),
            num_seqs * num_kv_heads,
        )
        self._ops.paged_decode(
            out,
            query,
            k_cache,
            v_cache,
            extents.start_pages,
            extents.num_pages,
            extents.num_extents,
            seq_lens.to(torch.int32).contiguous(),
            scale,
            **plan.launch,
        )
