"""The static Ascend910B3 check as a table: each ascend kernel at each page size, pass/fail and
the on-chip bytes bishengir-compile's memory plan gives it (UB of 192 KiB, L1 of 512 KiB).

    make ascend-static-check    # in the `make ascend-env` venv (triton-ascend, ascendnpu-ir)

Exits 1 when any kernel overflows or stops before bishengir's last (CANN-only) step.
"""

from __future__ import annotations

import sys

from kvlab.kernels.ascend_compile import (
    L1_BYTES,
    LLAMA3_8B,
    LLAMA3_8B_C8,
    STATIC_CHECK_PAGE_SIZES,
    UB_BYTES,
    HeadShape,
    static_check,
)

SHAPES = {
    "Llama-3-8B bf16 (32/8 heads, dim 128)": LLAMA3_8B,
    "Qwen2.5-7B fp16 (28/4 heads, dim 128)": HeadShape(28, 4, 128, "fp16"),
    "Llama-3-8B bf16, int8 KV cache (C8)": LLAMA3_8B_C8,
}


def main() -> int:
    """Print one table per head shape; the exit code says whether every kernel passed."""
    failures = 0
    for title, shape in SHAPES.items():
        print(f"{title}: target Ascend910B3, UB {UB_BYTES} B, L1 {L1_BYTES} B")
        print(
            f"  {'kernel':<18} {'page':>5} {'cores':>5} {'tile':>24} {'UB bytes':>9} "
            f"{'L1 bytes':>9}  result"
        )
        for row in static_check(STATIC_CHECK_PAGE_SIZES, shape):
            r = row.result
            tile = ", ".join(f"{k}={v}" for k, v in row.constants.items() if k.startswith("BLOCK"))
            verdict = "pass" if r.passed else ("UB OVERFLOW" if r.ub_overflow else "FAIL")
            failures += not r.passed
            print(
                f"  {r.kernel:<18} {row.page_size:>5} {r.mix_mode:>5} {tile:>24} "
                f"{r.ub_bytes:>9} {r.l1_bytes:>9}  {verdict}"
            )
    print("all kernels pass" if not failures else f"{failures} FAILED")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
