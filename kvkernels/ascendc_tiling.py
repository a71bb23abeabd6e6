"""The tiling plan of kvlab's AscendC kernels (kvkernels/ascendc/), as a model the tests check.

The AscendC kernels cannot be compiled here (no CANN on the package index): they are unverified
on hardware. Their tiling is decided here, in Python, and passed to them as launch arguments,
so what the tests check is exactly what the kernels get:
- every buffer a kernel places in a vector core's Unified Buffer, rounded up to the 32-byte
  UB alignment, times its queue depth, adds up to at most the 910B's 192 KiB;
- K/V and copy tiles are double-buffered (queue depth 2): the DMA of the next tile overlaps
  the computation on (or the copy-out of) the current one;
- the Cube/Vector split: the decode kernel is Vector-only (decode has at most 16 query rows
  per KV head, one Cube fractal; see paged_decode_kernel.cpp), the copy kernel moves bytes only;
- host <-> device swaps are one batch of runs (aclrtMemcpyBatchAsync), consecutive pages on
  both sides coalesced into one run.
"""

from __future__ import annotations

from dataclasses import dataclass

UB_BYTES = 192 * 1024  # per vector core on Ascend 910B (bishengir's Ascend910B3 UB_SIZE)
UB_ALIGN_BYTES = 32  # InitBuffer rounds every buffer up to 32 bytes; DataCopy moves 32-byte blocks
BUFFER_NUM = 2  # double buffering
ASCEND910B3_VECTOR_CORES = 40
MAX_DECODE_GROUP = 16  # query heads per KV head the Vector-only decode takes (m, l in registers)
MAX_TILE_TOKENS = 128
MAX_COPY_TILE_BYTES = 64 * 1024  # per buffer: two of them use 128 KiB of the UB
FP32_BYTES = 4


def align_up(num_bytes: int, alignment: int = UB_ALIGN_BYTES) -> int:
    """`num_bytes` rounded up to a multiple of `alignment`."""
    return -(-num_bytes // alignment) * alignment


@dataclass(frozen=True, slots=True)
class UbBuffer:
    """One buffer in the Unified Buffer: its size (32-byte aligned) and queue depth."""

    name: str
    bytes_each: int
    depth: int = 1

    @property
    def total_bytes(self) -> int:
        """UB bytes it takes: aligned size times queue depth."""
        return align_up(self.bytes_each) * self.depth


@dataclass(frozen=True, slots=True)
class TilePlan:
    """What one AscendC kernel is launched with and the UB it will use."""

    kernel: str
    buffers: tuple[UbBuffer, ...]
    launch: dict[str, int]  # the op's tiling arguments, by their schema names
    cube_vector: str  # which cores compute, and why

    @property
    def ub_bytes(self) -> int:
        """UB bytes of all buffers together."""
        return sum(buffer.total_bytes for buffer in self.buffers)

    @property
    def fits(self) -> bool:
        """True when the buffers fit one vector core's UB."""
        return self.ub_bytes <= UB_BYTES


def copy_pages_plan(
    page_elems: int,
    element_bytes: int,
    num_pairs: int,
    vector_cores: int = ASCEND910B3_VECTOR_CORES,
) -> TilePlan:
    """The copy kernel's plan: pages moved GM -> UB -> GM in tiles that divide the page."""
    assert page_elems > 0 and page_elems * element_bytes % UB_ALIGN_BYTES == 0, (
        "pages are whole 32-byte blocks (page sizes are multiples of 16)"
    )
    tile = page_elems & -page_elems  # the largest power of two dividing the page
    while tile * element_bytes > MAX_COPY_TILE_BYTES:
        tile //= 2
    items = num_pairs * 2 * (page_elems // tile)  # (pair, K or V, chunk)
    return TilePlan(
        kernel="copy_pages",
        buffers=(UbBuffer("page tile", tile * element_bytes, BUFFER_NUM),),
        launch={
            "tile_elems": tile,
            "buffer_num": BUFFER_NUM,
            "block_dim": max(1, min(items, vector_cores)),
        },
        cube_vector="Vector cores only: DMA in and out, no arithmetic",
    )


def decode_supported(group: int, head_dim: int) -> bool:
    """True when the Vector-only AscendC decode takes this head shape."""
    return 1 <= group <= MAX_DECODE_GROUP and head_dim % 16 == 0 and head_dim > 0


def paged_decode_plan(
    page_size: int,
    head_dim: int,
    group: int,
    element_bytes: int,
    num_items: int,
    vector_cores: int = ASCEND910B3_VECTOR_CORES,
) -> TilePlan:
    """The decode kernel's plan: the largest K/V tile (<= 128 tokens, dividing the page) whose
    buffers fit the UB with K and V double-buffered."""
    assert decode_supported(group, head_dim), "decode_supported() first"
    tile = min(page_size & -page_size, MAX_TILE_TOKENS)
    while tile > 1 and not _decode_plan(tile, head_dim, group, element_bytes, 1).fits:
        tile //= 2
    return _decode_plan(tile, head_dim, group, element_bytes, max(1, min(num_items, vector_cores)))


def _decode_plan(
    tile: int, head_dim: int, group: int, element_bytes: int, block_dim: int
) -> TilePlan:
    rows = group * head_dim
    return TilePlan(
        kernel="paged_decode",
        buffers=(
            UbBuffer("query in", rows * element_bytes),
            UbBuffer("K tile in", tile * head_dim * element_bytes, BUFFER_NUM),
            UbBuffer("V tile in", tile * head_dim * element_bytes, BUFFER_NUM),
            UbBuffer("output out", rows * element_bytes),
            UbBuffer("query fp32", rows * FP32_BYTES),
            UbBuffer("K/V tile fp32", tile * head_dim * FP32_BYTES),
            UbBuffer("scores fp32", group * tile * FP32_BYTES),
            UbBuffer("accumulator fp32", rows * FP32_BYTES),
            UbBuffer("row product fp32", head_dim * FP32_BYTES),
            UbBuffer("reduce work fp32", max(head_dim, tile) * FP32_BYTES),
        ),
        launch={"tile_tokens": tile, "buffer_num": BUFFER_NUM, "block_dim": block_dim},
        cube_vector=(
            "Vector cores only: Q.K^T and P.V as row products, online softmax in fp32; "
            f"{group} query rows per KV head would fill at most one 16-row Cube fractal"
        ),
    )


def swap_runs(pairs: list[tuple[int, int]], page_bytes: int) -> list[tuple[int, int, int]]:
    """(src byte offset, dst byte offset, bytes) runs for page `pairs`, in order; a pair that
    continues the previous one on both sides (src + 1, dst + 1) extends its run."""
    runs: list[tuple[int, int, int]] = []
    previous: tuple[int, int] | None = None
    for src, dst in pairs:
        if previous is not None and src == previous[0] + 1 and dst == previous[1] + 1:
            start_src, start_dst, size = runs[-1]
            runs[-1] = (start_src, start_dst, size + page_bytes)
        else:
            runs.append((src * page_bytes, dst * page_bytes, page_bytes))
        previous = (src, dst)
    return runs
