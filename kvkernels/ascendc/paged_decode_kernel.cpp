// Paged-attention decode over extent tables (runs of contiguous pages), on the vector cores.
// Work item = (sequence, KV head): its `group` query heads attend over the whole context with an
// online softmax in fp32. K and V tiles of `tile_tokens` rows come in through double-buffered
// queues: while one tile is computed on, the next tile's rows are already being copied in.
// A tile never straddles two extents, so each is one strided DMA (blockCount = rows).
//
// A first, Vector-only version: Q.K^T and P.V are per-row Mul/ReduceSum and Axpy, which suits
// decode's few query rows per KV head (group <= 16 fills at most one 16-row Cube fractal);
// moving Q.K^T to the Cube core (L1 -> L0A/L0B -> L0C, as CATLASS's flash-attention example
// tiles it) is the next step once this one has run. UNVERIFIED ON HARDWARE, NOT COMPILED HERE.
// Tiling (UB bytes per buffer, double buffering): kvlab/kernels/ascendc_tiling.py.
#include "kernel_operator.h"
#include "kvlab_ascendc.h"

namespace {

constexpr int32_t kMaxBufferNum = 2;
constexpr int32_t kMaxGroup = 16;

// walks the context tile by tile across the extents of one sequence
struct TileCursor {
    int32_t extent = 0;
    int32_t offset = 0;  // tokens into the current extent
    int32_t done = 0;    // tokens in the extents before it
};

template <typename T>
class PagedDecode {
public:
    __aicore__ inline void Init(GM_ADDR query, GM_ADDR k_cache, GM_ADDR v_cache,
                                GM_ADDR ext_start, GM_ADDR ext_pages, GM_ADDR ext_count,
                                GM_ADDR seq_lens, GM_ADDR out,
                                const kvlab_ascendc::PagedDecodeTiling& tiling)
    {
        t_ = tiling;
        q_gm_.SetGlobalBuffer((__gm__ T*)query);
        k_gm_.SetGlobalBuffer((__gm__ T*)k_cache);
        v_gm_.SetGlobalBuffer((__gm__ T*)v_cache);
        out_gm_.SetGlobalBuffer((__gm__ T*)out);
        ext_start_.SetGlobalBuffer((__gm__ int32_t*)ext_start);
        ext_pages_.SetGlobalBuffer((__gm__ int32_t*)ext_pages);
        ext_count_.SetGlobalBuffer((__gm__ int32_t*)ext_count);
        seq_lens_.SetGlobalBuffer((__gm__ int32_t*)seq_lens);
        const int32_t rows = t_.group * t_.head_dim;
        const int32_t tile = t_.tile_tokens * t_.head_dim;
        pipe_.InitBuffer(q_in_, 1, rows * sizeof(T));
        pipe_.InitBuffer(k_in_, t_.buffer_num, tile * sizeof(T));
        pipe_.InitBuffer(v_in_, t_.buffer_num, tile * sizeof(T));
        pipe_.InitBuffer(out_q_, 1, rows * sizeof(T));
        pipe_.InitBuffer(q_f32_, rows * sizeof(float));
        pipe_.InitBuffer(kv_f32_, tile * sizeof(float));
        pipe_.InitBuffer(scores_, t_.group * t_.tile_tokens * sizeof(float));
        pipe_.InitBuffer(acc_, rows * sizeof(float));
        pipe_.InitBuffer(row_, t_.head_dim * sizeof(float));
        pipe_.InitBuffer(work_, MaxInt(t_.head_dim, t_.tile_tokens) * sizeof(float));
    }

    __aicore__ inline void Process()
    {
        const int32_t items = t_.num_seqs * t_.num_kv_heads;
        for (int32_t item = AscendC::GetBlockIdx(); item < items; item += AscendC::GetBlockNum()) {
            Attend(item / t_.num_kv_heads, item % t_.num_kv_heads);
        }
    }

private:
    __aicore__ static inline int32_t MaxInt(int32_t a, int32_t b) { return a > b ? a : b; }
    __aicore__ static inline int32_t MinInt(int32_t a, int32_t b) { return a < b ? a : b; }

    __aicore__ inline void Attend(int32_t seq, int32_t kv_head)
    {
        seq_len_ = seq_lens_.GetValue(seq);
        seq_ = seq;
        kv_head_ = kv_head;
        const int64_t q_offset =
            (static_cast<int64_t>(seq) * t_.num_kv_heads + kv_head) * t_.group * t_.head_dim;
        LoadQuery(q_offset);
        for (int32_t g = 0; g < t_.group; ++g) {
            m_[g] = -3.0e38f;
            l_[g] = 0.0f;
        }
        AscendC::Duplicate(acc_.Get<float>(), 0.0f, t_.group * t_.head_dim);
        TileCursor cursor;
        int32_t rows = TileRows(cursor);
        if (rows > 0) {
            CopyIn(k_in_, k_gm_, cursor, rows);
            CopyIn(v_in_, v_gm_, cursor, rows);
        }
        while (rows > 0) {
            TileCursor next = cursor;
            Advance(next);
            const int32_t next_rows = TileRows(next);
            AscendC::LocalTensor<T> k = k_in_.template DeQue<T>();
            if (next_rows > 0) {
                CopyIn(k_in_, k_gm_, next, next_rows);  // overlaps this tile's Q.K^T
            }
            Scores(k, rows);
            k_in_.FreeTensor(k);
            AscendC::LocalTensor<T> v = v_in_.template DeQue<T>();
            if (next_rows > 0) {
                CopyIn(v_in_, v_gm_, next, next_rows);  // overlaps this tile's P.V
            }
            Accumulate(v, rows);
            v_in_.FreeTensor(v);
            cursor = next;
            rows = next_rows;
        }
        StoreOutput(q_offset);
    }

    // rows of the tile at `cursor` (0 past the context); skips extents the context has left
    __aicore__ inline int32_t TileRows(TileCursor& cursor)
    {
        const int32_t num_extents = ext_count_.GetValue(seq_);
        while (cursor.extent < num_extents) {
            const int32_t ext_tokens = MinInt(ExtentTokens(cursor.extent), seq_len_ - cursor.done);
            if (cursor.offset < ext_tokens) {
                return MinInt(t_.tile_tokens, ext_tokens - cursor.offset);
            }
            cursor.done += ExtentTokens(cursor.extent);
            cursor.offset = 0;
            ++cursor.extent;
        }
        return 0;
    }

    __aicore__ inline void Advance(TileCursor& cursor) { cursor.offset += t_.tile_tokens; }

    __aicore__ inline int32_t ExtentTokens(int32_t extent)
    {
        return ext_pages_.GetValue(seq_ * t_.max_extents + extent) * t_.page_size;
    }

    __aicore__ inline void CopyIn(AscendC::TQue<AscendC::QuePosition::VECIN, kMaxBufferNum>& queue,
                                  AscendC::GlobalTensor<T>& cache, const TileCursor& cursor,
                                  int32_t rows)
    {
        const int64_t first_page = ext_start_.GetValue(seq_ * t_.max_extents + cursor.extent);
        const int64_t slot = first_page * t_.page_size + cursor.offset;
        const int64_t offset = (slot * t_.num_kv_heads + kv_head_) * t_.head_dim;
        AscendC::LocalTensor<T> tile = queue.template AllocTensor<T>();
        AscendC::DataCopyParams params;
        params.blockCount = static_cast<uint16_t>(rows);  // one row per token
        params.blockLen = static_cast<uint16_t>(t_.head_dim * sizeof(T) / 32);
        params.srcStride = static_cast<uint16_t>((t_.num_kv_heads - 1) * t_.head_dim * sizeof(T) / 32);
        params.dstStride = 0;
        AscendC::DataCopy(tile, cache[offset], params);
        queue.EnQue(tile);
    }

    __aicore__ inline void LoadQuery(int64_t q_offset)
    {
        const int32_t count = t_.group * t_.head_dim;
        AscendC::LocalTensor<T> q = q_in_.template AllocTensor<T>();
        AscendC::DataCopy(q, q_gm_[q_offset], count);
        q_in_.EnQue(q);
        q = q_in_.template DeQue<T>();
        AscendC::Cast(q_f32_.Get<float>(), q, AscendC::RoundMode::CAST_NONE, count);
        q_in_.FreeTensor(q);
    }

    // s[g, r] = scale * q_g . k_r, then the online-softmax update of each head's m, l, acc
    __aicore__ inline void Scores(AscendC::LocalTensor<T>& k, int32_t rows)
    {
        AscendC::LocalTensor<float> kf = kv_f32_.Get<float>();
        AscendC::LocalTensor<float> q = q_f32_.Get<float>();
        AscendC::LocalTensor<float> s = scores_.Get<float>();
        AscendC::LocalTensor<float> row = row_.Get<float>();
        AscendC::LocalTensor<float> work = work_.Get<float>();
        const int32_t d = t_.head_dim;
        AscendC::Cast(kf, k, AscendC::RoundMode::CAST_NONE, rows * d);
        for (int32_t g = 0; g < t_.group; ++g) {
            for (int32_t r = 0; r < rows; ++r) {
                AscendC::Mul(row, kf[r * d], q[g * d], d);
                AscendC::ReduceSum(row, row, work, d);
                VectorToScalar();
                s.SetValue(g * t_.tile_tokens + r, row.GetValue(0) * t_.scale);
            }
        }
        ScalarToVector();
        for (int32_t g = 0; g < t_.group; ++g) {
            AscendC::LocalTensor<float> sg = s[g * t_.tile_tokens];
            AscendC::ReduceMax(row, sg, work, rows);
            VectorToScalar();
            const float tile_max = row.GetValue(0);
            const float m_new = tile_max > m_[g] ? tile_max : m_[g];
            AscendC::Adds(sg, sg, -m_new, rows);
            AscendC::Exp(sg, sg, rows);
            AscendC::ReduceSum(row, sg, work, rows);
            AscendC::Duplicate(work, m_[g] - m_new, 8);
            AscendC::Exp(work, work, 8);
            VectorToScalar();
            const float tile_sum = row.GetValue(0);
            const float alpha = work.GetValue(0);
            l_[g] = l_[g] * alpha + tile_sum;
            m_[g] = m_new;
            AscendC::Muls(acc_.Get<float>()[g * d], acc_.Get<float>()[g * d], alpha, d);
        }
    }

    // acc_g += sum_r p[g, r] * v_r
    __aicore__ inline void Accumulate(AscendC::LocalTensor<T>& v, int32_t rows)
    {
        AscendC::LocalTensor<float> vf = kv_f32_.Get<float>();
        AscendC::LocalTensor<float> s = scores_.Get<float>();
        AscendC::LocalTensor<float> acc = acc_.Get<float>();
        const int32_t d = t_.head_dim;
        AscendC::Cast(vf, v, AscendC::RoundMode::CAST_NONE, rows * d);
        VectorToScalar();
        for (int32_t g = 0; g < t_.group; ++g) {
            for (int32_t r = 0; r < rows; ++r) {
                AscendC::Axpy(acc[g * d], vf[r * d], s.GetValue(g * t_.tile_tokens + r), d);
            }
        }
    }

    __aicore__ inline void StoreOutput(int64_t q_offset)
    {
        AscendC::LocalTensor<float> acc = acc_.Get<float>();
        const int32_t d = t_.head_dim;
        for (int32_t g = 0; g < t_.group; ++g) {
            AscendC::Muls(acc[g * d], acc[g * d], 1.0f / l_[g], d);
        }
        AscendC::LocalTensor<T> o = out_q_.template AllocTensor<T>();
        AscendC::Cast(o, acc, AscendC::RoundMode::CAST_RINT, t_.group * d);
        out_q_.EnQue(o);
        o = out_q_.template DeQue<T>();
        AscendC::DataCopy(out_gm_[q_offset], o, t_.group * d);
        out_q_.FreeTensor(o);
    }

    // a scalar read of a vector result waits for the vector pipe, and the reverse
    __aicore__ inline void VectorToScalar()
    {
        event_t id = static_cast<event_t>(pipe_.FetchEventID(AscendC::HardEvent::V_S));
        AscendC::SetFlag<AscendC::HardEvent::V_S>(id);
        AscendC::WaitFlag<AscendC::HardEvent::V_S>(id);
    }

    __aicore__ inline void ScalarToVector()
    {
        event_t id = static_cast<event_t>(pipe_.FetchEventID(AscendC::HardEvent::S_V));
        AscendC::SetFlag<AscendC::HardEvent::S_V>(id);
        AscendC::WaitFlag<AscendC::HardEvent::S_V>(id);
    }

    AscendC::TPipe pipe_;
    AscendC::TQue<AscendC::QuePosition::VECIN, 1> q_in_;
    AscendC::TQue<AscendC::QuePosition::VECIN, kMaxBufferNum> k_in_;
    AscendC::TQue<AscendC::QuePosition::VECIN, kMaxBufferNum> v_in_;
    AscendC::TQue<AscendC::QuePosition::VECOUT, 1> out_q_;
    AscendC::TBuf<AscendC::TPosition::VECCALC> q_f32_, kv_f32_, scores_, acc_, row_, work_;
    AscendC::GlobalTensor<T> q_gm_, k_gm_, v_gm_, out_gm_;
    AscendC::GlobalTensor<int32_t> ext_start_, ext_pages_, ext_count_, seq_lens_;
    kvlab_ascendc::PagedDecodeTiling t_;
    int32_t seq_ = 0;
    int32_t kv_head_ = 0;
    int32_t seq_len_ = 0;
    float m_[kMaxGroup];
    float l_[kMaxGroup];
};

}  // namespace

#define KVLAB_PAGED_DECODE_KERNEL(TYPE)                                                         \
    extern "C" __global__ __aicore__ void kvlab_paged_decode_##TYPE(                            \
        GM_ADDR query, GM_ADDR k_cache, GM_ADDR v_cache, GM_ADDR ext_start, GM_ADDR ext_pages,   \
        GM_ADDR ext_count, GM_ADDR seq_lens, GM_ADDR out,                                        \
        kvlab_ascendc::PagedDecodeTiling tiling)                                                \
    {                                                                                           \
        PagedDecode<TYPE> op;                                                                   \
        op.Init(query, k_cache, v_cache, ext_start, ext_pages, ext_count, seq_lens, out, tiling); \
        op.Process();                                                                           \
    }

KVLAB_PAGED_DECODE_KERNEL(half)
KVLAB_PAGED_DECODE_KERNEL(bfloat16_t)

namespace kvlab_ascendc {

void paged_decode_impl(DType dtype, void* stream, void* query, void* k_cache, void* v_cache,
                       void* ext_start, void* ext_pages, void* ext_count, void* seq_lens,
                       void* out, const PagedDecodeTiling& tiling)
{
    auto gm = [](void* p) { return static_cast<uint8_t*>(p); };
    if (dtype == DType::kFloat16) {
        kvlab_paged_decode_half<<<tiling.block_dim, nullptr, stream>>>(
            gm(query), gm(k_cache), gm(v_cache), gm(ext_start), gm(ext_pages), gm(ext_count),
            gm(seq_lens), gm(out), tiling);
    } else {
        kvlab_paged_decode_bfloat16_t<<<tiling.block_dim, nullptr, stream>>>(
            gm(query), gm(k_cache), gm(v_cache), gm(ext_start), gm(ext_pages), gm(ext_count),
            gm(seq_lens), gm(out), tiling);
    }
}

}  // namespace kvlab_ascendc
