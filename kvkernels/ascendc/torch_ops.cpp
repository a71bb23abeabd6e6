// torch ops `kvlab_ascendc::*` on PrivateUse1 (torch_npu's device): the host side of kvlab's
// AscendC kernels and the batched host<->device page swap.
// UNVERIFIED ON HARDWARE, NOT COMPILED HERE. Every tiling argument comes from
// kvlab/kernels/ascendc_tiling.py (called by kvlab/kernels/ascendc_ops.py); these functions
// check the tensors they are given, not the plan.
#include <torch/library.h>
#include <torch/torch.h>

#include <utility>
#include <vector>

#include "acl/acl.h"
#include "acl/acl_rt.h"
#include "torch_npu/csrc/core/npu/NPUStream.h"
#include "kvlab_ascendc.h"

namespace kvlab_ascendc {
namespace {

DType dtype_of(const at::Tensor& t)
{
    TORCH_CHECK(t.scalar_type() == at::kHalf || t.scalar_type() == at::kBFloat16,
                "kvlab_ascendc: caches must be float16 or bfloat16, not ", t.scalar_type());
    return t.scalar_type() == at::kHalf ? DType::kFloat16 : DType::kBFloat16;
}

void* stream() { return c10_npu::getCurrentNPUStream().stream(); }

void copy_pages(at::Tensor& dst_k, at::Tensor& dst_v, const at::Tensor& src_k,
                const at::Tensor& src_v, const at::Tensor& src_ids, const at::Tensor& dst_ids,
                int64_t tile_elems, int64_t buffer_num, int64_t block_dim)
{
    TORCH_CHECK(src_k.is_contiguous() && dst_k.is_contiguous(), "caches must be contiguous");
    TORCH_CHECK(src_k.sizes().slice(1) == dst_k.sizes().slice(1), "page shapes differ");
    TORCH_CHECK(src_ids.scalar_type() == at::kLong && dst_ids.scalar_type() == at::kLong,
                "page ids must be int64");
    TORCH_CHECK(src_ids.numel() == dst_ids.numel(), "one destination per source page");
    CopyPagesTiling tiling{};
    tiling.num_pairs = src_ids.numel();
    tiling.page_elems = src_k[0].numel();
    tiling.tile_elems = static_cast<int32_t>(tile_elems);
    tiling.buffer_num = static_cast<int32_t>(buffer_num);
    tiling.block_dim = static_cast<int32_t>(block_dim);
    TORCH_CHECK(tiling.page_elems % tiling.tile_elems == 0, "a page must be whole tiles");
    if (tiling.num_pairs == 0) {
        return;
    }
    copy_pages_impl(dtype_of(src_k), stream(), src_k.data_ptr(), src_v.data_ptr(),
                    dst_k.data_ptr(), dst_v.data_ptr(), src_ids.data_ptr(), dst_ids.data_ptr(),
                    tiling);
}

void paged_decode(at::Tensor& out, const at::Tensor& query, const at::Tensor& k_cache,
                  const at::Tensor& v_cache, const at::Tensor& ext_start,
                  const at::Tensor& ext_pages, const at::Tensor& ext_count,
                  const at::Tensor& seq_lens, double scale, int64_t tile_tokens,
                  int64_t buffer_num, int64_t block_dim)
{
    TORCH_CHECK(query.dim() == 3 && query.is_contiguous(), "query must be [seqs, heads, dim]");
    TORCH_CHECK(k_cache.dim() == 4 && k_cache.is_contiguous(), "caches: [pages, slots, kv, dim]");
    TORCH_CHECK(out.sizes() == query.sizes() && out.is_contiguous(), "out must be like query");
    TORCH_CHECK(query.scalar_type() == k_cache.scalar_type(), "query and caches: one dtype");
    for (const at::Tensor* t : {&ext_start, &ext_pages, &ext_count, &seq_lens}) {
        TORCH_CHECK(t->scalar_type() == at::kInt && t->is_contiguous(), "tables must be int32");
    }
    PagedDecodeTiling tiling{};
    tiling.num_seqs = static_cast<int32_t>(query.size(0));
    tiling.num_kv_heads = static_cast<int32_t>(k_cache.size(2));
    tiling.group = static_cast<int32_t>(query.size(1) / k_cache.size(2));
    tiling.head_dim = static_cast<int32_t>(query.size(2));
    tiling.page_size = static_cast<int32_t>(k_cache.size(1));
    tiling.tile_tokens = static_cast<int32_t>(tile_tokens);
    tiling.max_extents = static_cast<int32_t>(ext_start.size(1));
    tiling.buffer_num = static_cast<int32_t>(buffer_num);
    tiling.block_dim = static_cast<int32_t>(block_dim);
    tiling.scale = static_cast<float>(scale);
    TORCH_CHECK(tiling.group >= 1 && tiling.group <= 16, "at most 16 query heads per KV head");
    TORCH_CHECK(tiling.page_size % tiling.tile_tokens == 0, "a tile must divide the page");
    paged_decode_impl(dtype_of(k_cache), stream(), query.data_ptr(), k_cache.data_ptr(),
                      v_cache.data_ptr(), ext_start.data_ptr(), ext_pages.data_ptr(),
                      ext_count.data_ptr(), seq_lens.data_ptr(), out.data_ptr(), tiling);
}

// Copies runs of bytes between a host cache and a device cache: run i moves sizes[i] bytes from
// src base + src_offsets[i] to dst base + dst_offsets[i]. The runs are coalesced on the Python
// side (consecutive pages on both sides make one run), and go as one batch where CANN has it.
void swap_pages(const at::Tensor& src_k, const at::Tensor& src_v, at::Tensor& dst_k,
                at::Tensor& dst_v, const at::Tensor& src_offsets, const at::Tensor& dst_offsets,
                const at::Tensor& sizes)
{
    TORCH_CHECK(src_offsets.device().is_cpu() && dst_offsets.device().is_cpu() &&
                    sizes.device().is_cpu(), "run tables must be host tensors");
    TORCH_CHECK(src_k.device().is_cpu() != dst_k.device().is_cpu(),
                "swap_pages moves between host and device");
    const bool to_device = src_k.device().is_cpu();
    const int64_t runs = sizes.numel();
    const int64_t* src_off = src_offsets.data_ptr<int64_t>();
    const int64_t* dst_off = dst_offsets.data_ptr<int64_t>();
    const int64_t* size = sizes.data_ptr<int64_t>();
    std::vector<void*> dsts;
    std::vector<void*> srcs;
    std::vector<size_t> lens;
    for (auto [src, dst] : {std::pair{&src_k, &dst_k}, std::pair{&src_v, &dst_v}}) {
        char* s = static_cast<char*>(src->data_ptr());
        char* d = static_cast<char*>(dst->data_ptr());
        for (int64_t i = 0; i < runs; ++i) {
            srcs.push_back(s + src_off[i]);
            dsts.push_back(d + dst_off[i]);
            lens.push_back(static_cast<size_t>(size[i]));
        }
    }
    aclrtStream npu_stream = static_cast<aclrtStream>(stream());
#ifdef KVLAB_HAVE_MEMCPY_BATCH
    int32_t device_id = 0;
    TORCH_CHECK(aclrtGetDevice(&device_id) == ACL_SUCCESS, "aclrtGetDevice failed");
    aclrtMemLocation host{};
    host.type = ACL_MEM_LOCATION_TYPE_HOST;
    aclrtMemLocation device{};
    device.type = ACL_MEM_LOCATION_TYPE_DEVICE;
    device.id = device_id;
    aclrtMemcpyBatchAttr attr{};
    attr.srcLoc = to_device ? host : device;
    attr.dstLoc = to_device ? device : host;
    size_t attr_index = 0;
    size_t failed = 0;
    const aclError status = aclrtMemcpyBatchAsync(
        dsts.data(), lens.data(), srcs.data(), lens.data(), dsts.size(), &attr, &attr_index, 1,
        &failed, npu_stream);
    TORCH_CHECK(status == ACL_SUCCESS, "aclrtMemcpyBatchAsync failed at run ", failed,
                " with error ", status);
#else
    const aclrtMemcpyKind kind = to_device ? ACL_MEMCPY_HOST_TO_DEVICE : ACL_MEMCPY_DEVICE_TO_HOST;
    for (size_t i = 0; i < dsts.size(); ++i) {
        const aclError status =
            aclrtMemcpyAsync(dsts[i], lens[i], srcs[i], lens[i], kind, npu_stream);
        TORCH_CHECK(status == ACL_SUCCESS, "aclrtMemcpyAsync failed at run ", i, ": ", status);
    }
#endif
}

}  // namespace
}  // namespace kvlab_ascendc

TORCH_LIBRARY(kvlab_ascendc, m)
{
    m.def("copy_pages(Tensor(a!) dst_k, Tensor(b!) dst_v, Tensor src_k, Tensor src_v, "
          "Tensor src_ids, Tensor dst_ids, int tile_elems, int buffer_num, int block_dim) -> ()");
    m.def("paged_decode(Tensor(a!) out, Tensor query, Tensor k_cache, Tensor v_cache, "
          "Tensor ext_start, Tensor ext_pages, Tensor ext_count, Tensor seq_lens, float scale, "
          "int tile_tokens, int buffer_num, int block_dim) -> ()");
    m.def("swap_pages(Tensor src_k, Tensor src_v, Tensor(a!) dst_k, Tensor(b!) dst_v, "
          "Tensor src_offsets, Tensor dst_offsets, Tensor sizes) -> ()");
}

TORCH_LIBRARY_IMPL(kvlab_ascendc, PrivateUse1, m)
{
    m.impl("copy_pages", &kvlab_ascendc::copy_pages);
    m.impl("paged_decode", &kvlab_ascendc::paged_decode);
    m.impl("swap_pages", &kvlab_ascendc::swap_pages);
}
