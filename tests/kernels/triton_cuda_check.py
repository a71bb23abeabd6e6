"""Compiled Triton kernels on a CUDA GPU against the torch reference; run by a `cuda` test.

A separate script because the test session runs Triton in its interpreter, and triton.jit fixes
that choice for the whole process. Exits 1 (printing each failure) when a check fails.
"""

import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).parent))
from kernel_cases import make_case, max_relative_error, move_case

from kvlab.kernels import get_backend

CASES = [  # (seq_lens, query_lens, page_size, num_heads, num_kv_heads, head_dim)
    ([1000, 37, 2100, 1, 513], [1, 1, 1, 1, 1], 16, 32, 8, 128),
    ([700, 150, 4097, 33], [700, 40, 1, 1], 128, 32, 8, 128),
    ([300, 90], [120, 1], 64, 28, 4, 64),
]
TOLERANCE = {torch.float32: 1e-5, torch.float16: 5e-3, torch.bfloat16: 1e-2}


def main() -> int:
    """Run every case in every dtype; return the number of failures."""
    triton_backend, reference = get_backend("triton"), get_backend("torch")
    failures = 0
    for dtype, tolerance in TOLERANCE.items():
        for seq_lens, query_lens, page_size, heads, kv_heads, head_dim in CASES:
            case = move_case(
                make_case(
                    seq_lens,
                    query_lens,
                    page_size=page_size,
                    num_heads=heads,
                    num_kv_heads=kv_heads,
                    head_dim=head_dim,
                    dtype=dtype,
                ),
                "cuda",
            )
            args = (case.query, case.k_cache, case.v_cache, case.meta)
            kwargs = dict(scale=case.scale, num_kv_heads=kv_heads)
            out = torch.full_like(case.query, float("nan"))
            triton_backend.paged_attention(*args, **kwargs, out=out)
            error = max_relative_error(out, reference.paged_attention(*args, **kwargs))
            ok = error < tolerance
            failures += not ok
            print(
                f"{'ok  ' if ok else 'FAIL'} {dtype} page {page_size} lens {seq_lens}: {error:.2e}"
            )
    return failures


if __name__ == "__main__":
    sys.exit(1 if main() else 0)
