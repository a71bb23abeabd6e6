// Batched page copy between two paged caches in device memory (copy-on-write), on the vector
// cores: each core streams its share of (pair, K/V, chunk) items GM -> UB -> GM through a
// double-buffered queue, so one chunk's copy-in overlaps the previous chunk's copy-out.
// UNVERIFIED ON HARDWARE, NOT COMPILED HERE. Tiling: kvlab/kernels/ascendc_tiling.py.
#include "kernel_operator.h"
#include "kvlab_ascendc.h"

namespace {

constexpr int32_t kMaxBufferNum = 2;

template <typename T>
class CopyPages {
public:
    __aicore__ inline void Init(GM_ADDR src_k, GM_ADDR src_v, GM_ADDR dst_k, GM_ADDR dst_v,
                                GM_ADDR src_ids, GM_ADDR dst_ids,
                                const kvlab_ascendc::CopyPagesTiling& tiling)
    {
        tiling_ = tiling;
        src_[0].SetGlobalBuffer((__gm__ T*)src_k);
        src_[1].SetGlobalBuffer((__gm__ T*)src_v);
        dst_[0].SetGlobalBuffer((__gm__ T*)dst_k);
        dst_[1].SetGlobalBuffer((__gm__ T*)dst_v);
        src_ids_.SetGlobalBuffer((__gm__ int64_t*)src_ids, tiling.num_pairs);
        dst_ids_.SetGlobalBuffer((__gm__ int64_t*)dst_ids, tiling.num_pairs);
        pipe_.InitBuffer(queue_, tiling.buffer_num, tiling.tile_elems * sizeof(T));
    }

    __aicore__ inline void Process()
    {
        const int64_t chunks = tiling_.page_elems / tiling_.tile_elems;
        const int64_t items = tiling_.num_pairs * 2 * chunks;
        for (int64_t item = AscendC::GetBlockIdx(); item < items; item += AscendC::GetBlockNum()) {
            const int64_t pair = item / (2 * chunks);
            const int32_t side = static_cast<int32_t>((item / chunks) % 2);  // 0: K, 1: V
            const int64_t chunk = item % chunks;
            const int64_t offset = chunk * tiling_.tile_elems;
            const int64_t src = src_ids_.GetValue(pair) * tiling_.page_elems + offset;
            const int64_t dst = dst_ids_.GetValue(pair) * tiling_.page_elems + offset;
            AscendC::LocalTensor<T> tile = queue_.template AllocTensor<T>();
            AscendC::DataCopy(tile, src_[side][src], tiling_.tile_elems);
            queue_.EnQue(tile);
            tile = queue_.template DeQue<T>();
            AscendC::DataCopy(dst_[side][dst], tile, tiling_.tile_elems);
            queue_.FreeTensor(tile);
        }
    }

private:
    AscendC::TPipe pipe_;
    AscendC::TQueBind<AscendC::QuePosition::VECIN, AscendC::QuePosition::VECOUT, kMaxBufferNum>
        queue_;
    AscendC::GlobalTensor<T> src_[2];
    AscendC::GlobalTensor<T> dst_[2];
    AscendC::GlobalTensor<int64_t> src_ids_;
    AscendC::GlobalTensor<int64_t> dst_ids_;
    kvlab_ascendc::CopyPagesTiling tiling_;
};

}  // namespace

#define KVLAB_COPY_PAGES_KERNEL(TYPE)                                                           \
    extern "C" __global__ __aicore__ void kvlab_copy_pages_##TYPE(                              \
        GM_ADDR src_k, GM_ADDR src_v, GM_ADDR dst_k, GM_ADDR dst_v, GM_ADDR src_ids,             \
        GM_ADDR dst_ids, kvlab_ascendc::CopyPagesTiling tiling)                                 \
    {                                                                                           \
        CopyPages<TYPE> op;                                                                     \
        op.Init(src_k, src_v, dst_k, dst_v, src_ids, dst_ids, tiling);                          \
        op.Process();                                                                           \
    }

KVLAB_COPY_PAGES_KERNEL(half)
KVLAB_COPY_PAGES_KERNEL(bfloat16_t)

namespace kvlab_ascendc {

void copy_pages_impl(DType dtype, void* stream, void* src_k, void* src_v, void* dst_k,
                     void* dst_v, void* src_ids, void* dst_ids, const CopyPagesTiling& tiling)
{
    auto as_gm = [](void* p) { return static_cast<uint8_t*>(p); };
    if (dtype == DType::kFloat16) {
        kvlab_copy_pages_half<<<tiling.block_dim, nullptr, stream>>>(
            as_gm(src_k), as_gm(src_v), as_gm(dst_k), as_gm(dst_v), as_gm(src_ids),
            as_gm(dst_ids), tiling);
    } else {
        kvlab_copy_pages_bfloat16_t<<<tiling.block_dim, nullptr, stream>>>(
            as_gm(src_k), as_gm(src_v), as_gm(dst_k), as_gm(dst_v), as_gm(src_ids),
            as_gm(dst_ids), tiling);
    }
}

}  // namespace kvlab_ascendc
