// kvlab's AscendC kernels: launchers the torch ops call (host side) and the tiling they take.
// UNVERIFIED ON HARDWARE, NOT COMPILED HERE (no CANN on this project's machines).
// Every tiling field comes from kvlab/kernels/ascendc_tiling.py, whose tests check that the
// buffers fit a 910B vector core's 192 KiB Unified Buffer; the kernels trust it.
#pragma once
#include <cstdint>

namespace kvlab_ascendc {

enum class DType : int32_t { kFloat16 = 0, kBFloat16 = 1 };

// copy_pages: item = (pair, K or V, chunk of tile_elems elements); page_elems % tile_elems == 0
struct CopyPagesTiling {
    int64_t num_pairs;
    int64_t page_elems;  // elements of one page of one cache
    int32_t tile_elems;  // elements per UB tile, a multiple of 16 (32 bytes of fp16/bf16)
    int32_t buffer_num;  // 2: the next tile's copy-in overlaps this tile's copy-out
    int32_t block_dim;   // vector cores used
};

// paged decode over extent tables: item = (sequence, KV head), all `group` query heads
struct PagedDecodeTiling {
    int32_t num_seqs;
    int32_t num_kv_heads;
    int32_t group;        // query heads per KV head, at most 16
    int32_t head_dim;     // a multiple of 16
    int32_t page_size;
    int32_t tile_tokens;  // context tokens per K/V tile; divides page_size
    int32_t max_extents;  // row stride of the extent tables
    int32_t buffer_num;   // 2: K/V tiles double-buffered
    int32_t block_dim;    // vector cores used
    float scale;
};

void copy_pages_impl(DType dtype, void* stream, void* src_k, void* src_v, void* dst_k,
                     void* dst_v, void* src_ids, void* dst_ids, const CopyPagesTiling& tiling);

void paged_decode_impl(DType dtype, void* stream, void* query, void* k_cache, void* v_cache,
                       void* ext_start, void* ext_pages, void* ext_count, void* seq_lens,
                       void* out, const PagedDecodeTiling& tiling);

}  // namespace kvlab_ascendc
