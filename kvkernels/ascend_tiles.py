"""Tile sizes the `ascend` backend's Triton kernels use, chosen per page size and head shape.

Ascend rules behind them (triton-ascend's programming guide; the 910B's figures as bishengir's
target description for Ascend910B3 states them):
- a program's live tiles must fit the 192 KiB Unified Buffer (UB) of a vector core, half of it
  when the compiler double-buffers loads; `make test-ascend` compiles every kernel for every
  page size through bishengir-compile and fails on a UB overflow, so these numbers are checked,
  not hoped;
- a context tile never straddles two extents, so its K/V rows are one strided DMA: the tile
  length divides the page size (runs are whole pages) and is at most 128 tokens, the block size
  vLLM-Ascend and CANN's attention use;
- `tl.dot` runs on the Cube core, whose fractal is 16 x 16: the query-group and head-dim tiles
  are padded to at least 16 rows/columns;
- a launch has at most one program per core (20 AI cores, 40 vector cores on a 910B3), each
  looping over its share of the work, and never more than 65,535 programs.

int8 pages (kv_cache_dtype int8, C8) take the same tiles. They are read as int8 but cast to
the query's dtype on chip, so their UB footprint is larger than float pages', not smaller: the
static check compiles the C8 kernels too (`make ascend-static-check`, 2026-12-06: Llama-3-8B
bf16 at page 128, prefill 191,360 of 196,608 UB bytes against 181,280 for bf16 pages; decode
159,872 against 38,016).
"""

from __future__ import annotations

from dataclasses import dataclass

MAX_TILE_TOKENS = 128  # context tokens per K/V tile
PREFILL_QUERY_ROWS = 64  # query rows per prefill tile
COPY_TILE_ELEMENTS = 8192  # elements per copy chunk: 16 KiB in fp16/bf16, 32 KiB in fp32
CUBE_FRACTAL = 16
MAX_PROGRAMS = 65535
ASCEND910B3_AI_CORES = 20  # Cube + 2 Vector cores each
ASCEND910B3_VECTOR_CORES = 40
MIN_PAGE_SIZE = 16
MAX_PAGE_SIZE = 512
# CANN's attention takes int8 pages of a multiple of 32 tokens; these kernels need only 16
CANN_INT8_PAGE_SIZE_MULTIPLE = 32


def next_power_of_2(n: int) -> int:
    """The smallest power of two >= n (1 for n <= 1)."""
    return 1 << max(n - 1, 0).bit_length()


@dataclass(frozen=True, slots=True)
class AttentionTiles:
    """Tile shape of one attention launch (all constexpr in the kernel)."""

    tile_tokens: int  # BLOCK_N: context tokens per K/V tile
    group_rows: int  # BLOCK_G: query heads of one KV head, padded (decode)
    query_rows: int  # BLOCK_M: query rows per program (prefill)
    head_cols: int  # BLOCK_D: head_dim padded to a power of two


def context_tile(page_size: int) -> int:
    """Tokens per K/V tile: the largest power of two that divides the page size, at most 128."""
    assert page_size > 0, "page size must be positive"
    return min(page_size & -page_size, MAX_TILE_TOKENS)


def attention_tiles(page_size: int, head_dim: int, group: int) -> AttentionTiles:
    """The tiles the backend launches attention with for this page size and head shape."""
    return AttentionTiles(
        tile_tokens=context_tile(page_size),
        group_rows=max(CUBE_FRACTAL, next_power_of_2(group)),
        query_rows=PREFILL_QUERY_ROWS,
        head_cols=max(CUBE_FRACTAL, next_power_of_2(head_dim)),
    )


def copy_tile(page_numel: int) -> int:
    """Elements per copy chunk: a whole page when it is small, else COPY_TILE_ELEMENTS."""
    return min(next_power_of_2(page_numel), COPY_TILE_ELEMENTS)


def num_programs(num_items: int, num_cores: int) -> int:
    """Programs to launch for `num_items` work items: one per core at most, and at least one."""
    return max(1, min(num_items, num_cores, MAX_PROGRAMS))


def write_kv_constants(num_kv_heads: int, head_dim: int) -> dict[str, int]:
    """Constexprs of write_kv_kernel: one token's [heads, dim] rows as one tile."""
    return {
        "NUM_KV_HEADS": num_kv_heads,
        "HEAD_DIM": head_dim,
        "BLOCK_H": next_power_of_2(num_kv_heads),
        "BLOCK_D": next_power_of_2(head_dim),
    }


def decode_constants(
    page_size: int, num_heads: int, num_kv_heads: int, head_dim: int, c8: bool = False
) -> dict[str, int]:
    """Constexprs of decode_kernel for this page size and head shape (`c8`: int8 pages)."""
    tiles = attention_tiles(page_size, head_dim, num_heads // num_kv_heads)
    return {
        "GROUP": num_heads // num_kv_heads,
        "NUM_KV_HEADS": num_kv_heads,
        "HEAD_DIM": head_dim,
        "PAGE_SIZE": page_size,
        "BLOCK_G": tiles.group_rows,
        "BLOCK_D": tiles.head_cols,
        "BLOCK_N": tiles.tile_tokens,
        "C8": int(c8),
    }


def prefill_constants(
    page_size: int, num_heads: int, num_kv_heads: int, head_dim: int, c8: bool = False
) -> dict[str, int]:
    """Constexprs of prefill_kernel for this page size and head shape (`c8`: int8 pages)."""
    tiles = attention_tiles(page_size, head_dim, num_heads // num_kv_heads)
    return {
        "GROUP": num_heads // num_kv_heads,
        "NUM_HEADS": num_heads,
        "NUM_KV_HEADS": num_kv_heads,
        "HEAD_DIM": head_dim,
        "PAGE_SIZE": page_size,
        "BLOCK_M": tiles.query_rows,
        "BLOCK_D": tiles.head_cols,
        "BLOCK_N": tiles.tile_tokens,
        "C8": int(c8),
    }


def move_pages_constants(page_numel: int) -> dict[str, int]:
    """Constexprs of move_pages_kernel for pages of `page_numel` elements."""
    block = copy_tile(page_numel)
    return {"NUM_CHUNKS": -(-page_numel // block), "PAGE_NUMEL": page_numel, "BLOCK": block}
