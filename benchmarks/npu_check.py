"""Ascend NPU check (gpu_check.py's twin): accuracy, paged decode bandwidth, copy/swap GB/s.

Run on an Atlas machine with CANN, torch_npu and triton-ascend (and, for kvlab's AscendC
kernels, kvkernels/ascendc built with CMake: see its CMakeLists.txt):

    python benchmarks/npu_check.py [--batch 64] [--context 4096] [--page-sizes 128 16]

1. Accuracy in bf16, Llama-3-8B and Qwen2.5-7B head shapes, decode-only and mixed batches, pages
   scattered and in runs of 4: the `npu` backend (torch_npu ops; kvlab's AscendC decode over runs
   when built) and the `ascend` backend (triton-ascend) against the torch reference (max
   relative error < 1e-2); write_kv and copy_pages exact.
2. Decode bandwidth: one decode step, KV bytes read / time, for each backend and page layout,
   against the device-to-device copy bandwidth (bytes read + written / time).
3. Page copy (device, copy-on-write) and swap (device <-> pinned host) in GB/s for each backend.

What it shares with gpu_check.py (flags, the accuracy run, timers, copy and swap) is in
shared.py.

Nothing here has run yet: this machine has no NPU. Exits 0 with a message without one, 1 when
an accuracy check fails.
"""

from __future__ import annotations

import argparse
import importlib.util
import sys
from collections.abc import Callable
from typing import Any

# device_check: what gpu_check and npu_check share; paged_batch: their batches (this
# folder is on sys.path when run)
import device_check as shared
import torch
from paged_batch import attention, make_batch

from kvlab.kernels import KernelBackend, get_backend

# bf16 caches filled on the host and moved (the npu generator is not torch's)
ON_NPU: dict[str, Any] = {"dtype": torch.bfloat16, "device": "npu", "fill_on_host": True}
# copy_pages' pairs: page 5 is read and written, so the copy is staged
NPU_PAIRS = [[5, 1], [0, 4], [7, 6], [1, 5]]


def npu_ms(fn: Callable[[], object], repeats: int = 30) -> float:
    """Median device milliseconds of `fn` between NPU events (after three warm-up calls)."""
    for _ in range(3):
        fn()
    torch.npu.synchronize()  # type: ignore[attr-defined]
    return shared.median_event_ms(fn, torch.npu, repeats)  # type: ignore[attr-defined]


def bench_decode(
    backends: dict[str, KernelBackend], args: argparse.Namespace, copy_bw: float
) -> None:
    """One decode step per backend and page layout; KV bytes read per second vs copy."""
    shape = (args.num_heads, args.num_kv_heads, args.head_dim)
    for page_size in args.page_sizes:
        for run_pages in (1, 16):
            batch = make_batch(
                [args.context] * args.batch,
                [1] * args.batch,
                page_size=page_size,
                shape=shape,
                run_pages=run_pages,
                **ON_NPU,
            )
            kv_bytes = 2 * args.batch * args.context * args.num_kv_heads * args.head_dim * 2
            for label, backend in backends.items():
                ms = npu_ms(lambda b=backend, x=batch: attention(b, x))
                achieved = kv_bytes / (ms * 1e-3)
                print(
                    f"  {label:<7} page {page_size:<4} runs of {run_pages:<2}: {ms:.3f} ms, "
                    f"KV {kv_bytes / 1e9:.2f} GB at {achieved / 1e12:.2f} TB/s = "
                    f"{achieved / copy_bw:.0%} of copy bandwidth"
                )


def _npu() -> Any:
    """torch_npu when an NPU is usable here, else None."""
    if importlib.util.find_spec("torch_npu") is None:
        return None
    import torch_npu

    return torch_npu if torch.npu.is_available() else None  # type: ignore[attr-defined]


def main() -> int:
    """Accuracy first, then the timings; the exit code says whether accuracy held."""
    args = shared.parse_args(__doc__.splitlines()[0], page_sizes=[128, 16])
    if _npu() is None:
        print("npu_check: no Ascend NPU (torch_npu with CANN) found; run it on an Atlas machine")
        return 0
    if shared.interpreted("npu_check"):
        return 1
    from kvlab.kernels.ascendc_ops import library_path

    backends = {"npu": get_backend("npu")}
    if importlib.util.find_spec("triton.backends.ascend") is not None:
        backends["ascend"] = get_backend("ascend")
    built = library_path()
    print(
        f"device: {torch.npu.get_device_name()}; AscendC kernels: "  # type: ignore[attr-defined]
        f"{built or 'not built (npu uses torch_npu ops and torch copies)'}"
    )
    failures = shared.check_accuracy(backends, args.page_sizes, pairs=NPU_PAIRS,
                                     run_pages=(1, 4), **ON_NPU)
    copy_bw = shared.copy_bandwidth("npu", lambda fn: npu_ms(fn, repeats=20))
    print(
        f"decode step, batch {args.batch} x context {args.context}, bf16; device-to-device "
        f"copy {copy_bw / 1e12:.2f} TB/s"
    )
    bench_decode(backends, args, copy_bw)
    print("page copy and swap (K and V bytes moved per second)")
    shared.bench_copy_swap(backends, args.swap_pages, args.page_sizes[0], "npu",
                           lambda fn: npu_ms(fn, repeats=10))
    return shared.accuracy_exit_code(failures)


if __name__ == "__main__":
    sys.exit(main())
