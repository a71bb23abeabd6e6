"""The ascend backend's Triton kernels compiled by triton-ascend on an NPU, against the torch
reference in bf16 (run by test_kernels_ascendc_npu.py without TRITON_INTERPRET). Exit 1 on a
mismatch. Unverified: never run here (no NPU)."""

import sys

import torch
import torch_npu  # noqa: F401  (registers the npu device)
from kernel_cases import make_case, max_relative_error, move_case

from kvlab.kernels import get_backend


def main() -> int:
    """Mixed batches at page sizes 16 and 128, with runs of pages; print each error."""
    failures = 0
    for page_size in (16, 128):
        for run_pages in (1, 4):
            case = move_case(
                make_case(
                    [2000, 513, 1, 300],
                    [1, 200, 1, 1],
                    page_size=page_size,
                    num_heads=32,
                    num_kv_heads=8,
                    head_dim=128,
                    run_pages=run_pages,
                    dtype=torch.bfloat16,
                ),
                "npu",
            )
            args = (case.query, case.k_cache, case.v_cache, case.meta)
            kwargs = dict(scale=case.scale, num_kv_heads=case.num_kv_heads)
            out = get_backend("ascend").paged_attention(*args, **kwargs)
            expected = get_backend("torch").paged_attention(*args, **kwargs)
            error = max_relative_error(out.cpu(), expected.cpu())
            failures += not error < 1e-2
            print(f"page {page_size} runs of {run_pages}: rel err {error:.1e}")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
