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

Nothing here has run yet: this machine has no NPU. Exits 0 with a message without one, 1 when
an accuracy check fails.
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import statistics
import sys
from collections.abc import Callable
from typing import Any

import torch

# the twin's copy and swap timing, on the npu's timer, and the paged batches both check (this
# folder is on sys.path when run)
from gpu_check import bench_copy_swap
from paged_batch import attention, check_cache_ops, make_batch, relative_error

from kvlab.kernels import KernelBackend, get_backend

SHAPES = {"llama3-8b": (32, 8, 128), "qwen2.5-7b": (28, 4, 128)}  # heads, kv heads, head_dim
TOLERANCE = 1e-2
# bf16 caches filled on the host and moved (the npu generator is not torch's)
ON_NPU: dict[str, Any] = {"dtype": torch.bfloat16, "device": "npu", "fill_on_host": True}
# copy_pages' pairs: page 5 is read and written, so the copy is staged
NPU_PAIRS = [[5, 1], [0, 4], [7, 6], [1, 5]]


def npu_ms(fn: Callable[[], object], repeats: int = 30) -> float:
    """Median device milliseconds of `fn` between NPU events (after three warm-up calls)."""
    for _ in range(3):
        fn()
    torch.npu.synchronize()  # type: ignore[attr-defined]
    times = []
    for _ in range(repeats):
        start = torch.npu.Event(enable_timing=True)  # type: ignore[attr-defined]
        end = torch.npu.Event(enable_timing=True)  # type: ignore[attr-defined]
        start.record()
        fn()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end))
    return statistics.median(times)


def check_accuracy(backends: dict[str, KernelBackend], page_sizes: list[int]) -> int:
    """Print one line per backend and case; return the number of failures."""
    reference = get_backend("torch")
    gen = torch.Generator().manual_seed(1)
    ragged = [int(n) for n in torch.randint(1, 5000, (16,), generator=gen)]
    cases = {
        "decode, ragged 1..5k": (ragged, [1] * len(ragged)),
        "mixed: prefill + chunk after prefix + decodes": (
            [1000, 3512, 4097, 77, 1],
            [1000, 512, 1, 1, 1],
        ),
    }
    failures = 0
    for model, shape in SHAPES.items():
        for page_size in page_sizes:
            for run_pages in (1, 4):
                for name, (seq_lens, query_lens) in cases.items():
                    batch = make_batch(seq_lens, query_lens, page_size=page_size, shape=shape,
                                       run_pages=run_pages, **ON_NPU)
                    expected = attention(reference, batch)
                    for label, backend in backends.items():
                        error = relative_error(attention(backend, batch), expected)
                        ok = error < TOLERANCE
                        failures += not ok
                        print(
                            f"  {'ok  ' if ok else 'FAIL'} {label:<7} {model:<11} page "
                            f"{page_size:<4} runs {run_pages} {name}: rel err {error:.1e}"
                        )
    for label, backend in backends.items():
        failures += check_cache_ops(backend, reference, device="npu", dtype=torch.bfloat16,
                                    pairs=NPU_PAIRS, label=label, fill_on_host=True)
    return failures


def copy_bandwidth(num_bytes: int = 1 << 30) -> float:
    """Device-to-device copy bandwidth in bytes/s, counting bytes read plus bytes written."""
    src = torch.empty(num_bytes, dtype=torch.uint8, device="npu")
    dst = torch.empty_like(src)
    return 2 * num_bytes / (npu_ms(lambda: dst.copy_(src), repeats=20) * 1e-3)


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
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--context", type=int, default=4096)
    parser.add_argument("--page-sizes", type=int, nargs="+", default=[128, 16])
    parser.add_argument("--num-heads", type=int, default=32)
    parser.add_argument("--num-kv-heads", type=int, default=8)
    parser.add_argument("--head-dim", type=int, default=128)
    parser.add_argument("--swap-pages", type=int, default=256)
    args = parser.parse_args()
    if _npu() is None:
        print("npu_check: no Ascend NPU (torch_npu with CANN) found; run it on an Atlas machine")
        return 0
    if os.environ.get("TRITON_INTERPRET") == "1":
        print("npu_check: TRITON_INTERPRET=1 would time the interpreter; unset it and rerun")
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
    failures = check_accuracy(backends, args.page_sizes)
    copy_bw = copy_bandwidth()
    print(
        f"decode step, batch {args.batch} x context {args.context}, bf16; device-to-device "
        f"copy {copy_bw / 1e12:.2f} TB/s"
    )
    bench_decode(backends, args, copy_bw)
    print("page copy and swap (K and V bytes moved per second)")
    bench_copy_swap(backends, args.swap_pages, args.page_sizes[0], "npu",
                    lambda fn: npu_ms(fn, repeats=10))
    print(f"accuracy: {'all passed' if not failures else f'{failures} FAILED'}")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
