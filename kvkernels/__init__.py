"""Paged-attention and KV-cache kernels behind one API, with backends chosen by name.

Cache layout, per layer (the vllm-ascend layout): K and V each
`[num_pages, page_size, num_kv_heads, head_dim]`, contiguous. A slot is
`page_id * page_size + offset`; a sequence's block table lists its page ids in token order.

    AttentionMetadata.build(*, block_tables, seq_lens, query_lens, page_size, device)
        one mixed batch: sequence i has seq_lens[i] tokens of context after this step, of which
        the last query_lens[i] are new (query rows query_start_loc[i]:query_start_loc[i+1]);
        fields slot_mapping [num_tokens] int64 (-1 = don't write), block_tables
        [num_seqs, max_pages] int32 padded with 0, seq_lens [num_seqs] int32, query_start_loc
        [num_seqs + 1] int32, host lists seq_lens_cpu / query_lens_cpu, max_seq_len,
        max_query_len, page_size. A block table entry may be NULL_PAGE (-1, kernels.metadata):
        a page given back behind a sliding window, never read. meta.with_block_tables(tables)
        is the same batch over another KV-cache group's tables.

    get_backend(name) -> KernelBackend          "torch" | "triton" | "npu" | "ascend"; an unknown
                                                 name, or npu without torch_npu -> KvlabError
    backend_names() -> list[str]                 every name get_backend accepts
    available_backends() -> list[str]            those whose packages are installed here

    torch   reference: plain PyTorch on any device, attention in fp32 (kvkernels/torch_backend.py)
    triton  Triton kernels: flash-decoding with a partition reduce, prefill chunks over block
            tables; CUDA in fp16/bf16/fp32, or CPU tensors with TRITON_INTERPRET=1 set before
            import (kvkernels/triton_backend.py); over mixed-precision pages (issue 48) one
            kernel that reads each page at its level (kvkernels/triton_mixed.py, behind
            mixed_attention.MixedBackend; unverified on a GPU); both take their tile loop,
            K/V loads and partition reduce from kvkernels/triton_tiles.py
    npu     torch_npu's npu_scatter_pa_kv_cache, _npu_paged_attention (decode-only batches) and
            npu_fused_infer_attention_score (TND, sparse_mode=3); fp16/bf16 caches, page size a
            multiple of 16 up to 512, 128 recommended (kvkernels/npu_backend.py); not yet run on
            Ascend hardware, tested against an emulation of the documented ops; with kvlab's
            AscendC kernels built (kvkernels/ascendc/, kvkernels/ascendc_ops.py), page copy, the
            batched host<->device swap and decodes over runs of pages use them
    ascend  kvlab's Triton kernels for triton-ascend (kvkernels/ascend_backend.py): reshape-and-
            cache, decode and prefill over extent tables (kvkernels/extents.py: runs of contiguous
            pages, read as one DMA each), page copy and swap; fp16/bf16/fp32, page sizes 16..512
            in multiples of 16; CPU tensors under TRITON_INTERPRET=1; compiled for Ascend910B3
            up to bishengir's CANN-only last step by `make test-ascend`, not yet run on an NPU

    KernelBackend (each backend's module is imported only when get_backend selects it; a base
    class holding the public methods, their checks and argument plumbing once, each backend
    implementing _write_kv(KVRows), _paged_attention(AttentionCall), copy_pages, swap_pages):
        name: str
        kv_cache_dtypes: tuple[str, ...]   the --kv-cache-dtypes it stores (torch and triton:
            all; ascend: auto, or bfloat16/float16 where the model runs in it; npu: those and
            int8, vLLM-Ascend's C8, unverified on hardware):
            backend.check_kv_cache_dtype(backend, name, model_dtype) -> KvlabError otherwise
        write_kv(key, value, k_cache, v_cache, slot_mapping, kv_quant=None) -> None
            key/value [num_tokens, num_kv_heads, head_dim] stored at their slots; -1 skipped.
            Quantized pages come with the layer's `kv_quant` (kvkernels/kv_quant.py: KVQuant,
            the precision and its static scales), which stores the rows in the page format
            (`page_format`: fp8 as uint8 bits, int8, per-token-head rows with their fp32 scale).
        paged_attention(query, k_cache, v_cache, meta, *, scale, num_kv_heads, out=None,
                        sliding_window=0, kv_quant=None) -> Tensor
            query [num_tokens, num_heads, head_dim] -> same shape (written into `out` if given);
            quantized pages dequantized as read (in-kernel for triton).
            Causal within each sequence: query row j of sequence i sits at position
            seq_len_i - query_len_i + j and attends to positions <= its own; with a
            sliding_window W > 0, only to the W positions ending at its own (torch and triton;
            npu and ascend raise a KvlabError, supports_sliding_window False). Grouped-query
            attention: num_heads is a multiple of num_kv_heads, query head h reads KV head
            h // (num_heads // num_kv_heads).
        copy_pages(k_cache, v_cache, pairs) -> None
            pairs [n, 2] of (src, dst) pages within one cache, in place; every source is read
            before any destination is written (a page may be both).
        swap_pages(src_k, src_v, dst_k, dst_v, pairs) -> None
            pairs [n, 2] of (src page in src_*, dst page in dst_*), either direction between a
            device cache and a host cache of the same page shape.
"""

from kvlab.kernels.backend import KernelBackend, available_backends, backend_names, get_backend
from kvlab.kernels.metadata import AttentionMetadata

__all__ = [
    "AttentionMetadata",
    "KernelBackend",
    "available_backends",
    "backend_names",
    "get_backend",
]
