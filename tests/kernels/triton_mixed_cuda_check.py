"""The compiled mixed-precision Triton kernel (kvkernels/triton_mixed.py) on a CUDA GPU against
the torch reference over the pages' dequantized values; run by a `cuda` test.

A separate script because the test session runs Triton in its interpreter, and triton.jit fixes
that choice for the whole process. Exits 1 (printing each failure) when a check fails.
"""

import sys
from dataclasses import replace
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).parent))
from mixed_cases import dense, make_levels

from kvlab.kernels import AttentionMetadata, get_backend
from kvlab.kernels.mixed_attention import LevelPages
from kvlab.kernels.triton_mixed import triton_mixed_attention

CASES = [  # (seq_lens, query_lens, page_size, num_heads, num_kv_heads, head_dim, level names)
    ([1000, 37, 2100, 1, 513], [1, 1, 1, 1, 1], 16, 32, 8, 128,
     ("auto", "fp8_e4m3", "int4_per_token_head")),
    ([700, 150, 1500, 33], [700, 40, 1, 1], 128, 32, 8, 128,
     ("auto", "fp8_e4m3", "int4_per_token_head")),
    ([300, 90], [120, 1], 64, 28, 4, 64, ("int8", "int4_per_token_head")),
]
TOLERANCE = {torch.float32: 1e-5, torch.bfloat16: 1e-2}


def _on_cuda(level: LevelPages) -> LevelPages:
    quant = level.kv_quant
    if quant is not None and quant.k_channel_scale is not None:
        assert quant.v_channel_scale is not None
        quant = replace(quant, k_channel_scale=quant.k_channel_scale.cuda(),
                        v_channel_scale=quant.v_channel_scale.cuda())
    return LevelPages(level.k_cache.cuda(), level.v_cache.cuda(), quant)


def _check(dtype: torch.dtype, case: tuple) -> float:
    """The relative error of the kernel on one case, queries and float pages in `dtype`."""
    seq_lens, query_lens, page_size, heads, kv_heads, head_dim, names = case
    tables, used = [], 0
    for seq_len in seq_lens:
        n = -(-seq_len // page_size)
        tables.append(list(range(used + n - 1, used - 1, -1)))
        used += n
    levels = make_levels(0, used, page_size, kv_heads, head_dim, names, model_dtype=dtype)
    page_levels = torch.randint(0, len(names), (used,), dtype=torch.int8,
                                generator=torch.Generator().manual_seed(1))
    k, v = dense(levels, page_levels)
    meta = AttentionMetadata.build(block_tables=tables, seq_lens=seq_lens, query_lens=query_lens,
                                   page_size=page_size, device="cuda")
    query = torch.randn(meta.num_tokens, heads, head_dim).to(dtype).cuda()
    out = torch.full_like(query, float("nan"))
    triton_mixed_attention(query, [_on_cuda(level) for level in levels], page_levels.cuda(), meta,
                           scale=head_dim**-0.5, num_kv_heads=kv_heads, out=out)
    want = get_backend("torch").paged_attention(query.float(), k.cuda(), v.cuda(), meta,
                                                scale=head_dim**-0.5, num_kv_heads=kv_heads)
    return float((out.float() - want).abs().max() / want.abs().max())


def main() -> int:
    """Run every case in every dtype; return the number of failures."""
    failures = 0
    for dtype, tolerance in TOLERANCE.items():
        for case in CASES:
            error = _check(dtype, case)
            ok = error < tolerance
            failures += not ok
            print(f"{'ok  ' if ok else 'FAIL'} {dtype} page {case[2]} lens {case[0]} "
                  f"levels {'/'.join(case[6])}: {error:.2e}")
    return failures


if __name__ == "__main__":
    sys.exit(1 if main() else 0)
