"""GPU check of the Triton backend: accuracy, paged decode speed and achieved KV bandwidth.

1. Accuracy: Triton vs the torch reference on the same paged caches, in bf16, at Llama-3-8B and
   Qwen2.5-7B head shapes, decode-only and mixed (prefill chunks + decodes) batches, page sizes
   16 and 128: max relative error must stay below 1e-2. write_kv and copy_pages must be exact.
2. Speed: one decode step at batch 64, context 4096 (defaults), Triton paged attention vs torch
   scaled_dot_product_attention over contiguous K/V holding the same tokens.
3. Bandwidth: KV bytes read / Triton decode time, against a measured device-to-device copy
   bandwidth (bytes read + written / time); the target is >= 80%.
4. Page copy (device, copy-on-write) and swap (device <-> pinned host: preemption by swap and
   the host tier's writes and loads) in GB/s, pages scattered and in runs, against one
   contiguous copy of the same bytes over the host link.

    python benchmarks/gpu_check.py [--batch 64] [--context 4096] [--page-sizes 16 128]

What it shares with npu_check.py (flags, the accuracy run, timers, copy and swap) is in
device_check.py. Exits 0 with a message when there is no CUDA device, 1 when an accuracy check
fails.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable

# device_check: what gpu_check and npu_check share; paged_batch: their batches (this
# folder is on sys.path when run)
import device_check as shared
import torch
import torch.nn.functional as F
from paged_batch import attention, make_batch

from kvlab.kernels import KernelBackend, get_backend

BANDWIDTH_TARGET = 0.8


def cuda_ms(
    fn: Callable[[], object], repeats: int = 50, graph: bool = True
) -> tuple[float, str]:
    """Median device milliseconds of `fn`, replayed from a CUDA graph when `graph` and it can be
    captured.

    A graph strips the Python launch overhead, so the time is the kernels' own. Left out for a
    plain copy (a graph's memcpy node may run on a copy engine, slower than the copy kernel an
    eager copy launches) and for code that waits on the device (its capture fails).
    """
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        for _ in range(3):  # compiles and autotunes outside the capture
            fn()
    torch.cuda.current_stream().wait_stream(stream)
    torch.cuda.synchronize()
    run, how = _captured(fn) if graph else (fn, "eager")
    return shared.median_event_ms(run, torch.cuda, repeats), how


def _captured(fn: Callable[[], object]) -> tuple[Callable[[], object], str]:
    """`fn` captured into a CUDA graph (its replay), or `fn` itself where capture fails."""
    try:
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            fn()
        return graph.replay, "cuda graph"
    except RuntimeError as err:
        torch.cuda.synchronize()
        return fn, f"eager (graph capture failed: {str(err).splitlines()[0][:60]})"


def bench_decode(
    triton_backend: KernelBackend, args: argparse.Namespace, page_size: int, copy_bw: float
) -> None:
    """Time one decode step paged (Triton, reference) and contiguous (SDPA); print bandwidths."""
    heads, kv_heads, dim = args.num_heads, args.num_kv_heads, args.head_dim
    batch = make_batch(
        [args.context] * args.batch,
        [1] * args.batch,
        page_size=page_size,
        shape=(heads, kv_heads, dim),
        dtype=torch.bfloat16,
        device="cuda",
    )
    q = batch.query.unsqueeze(2)  # [batch, heads, 1, dim]
    k = torch.randn(args.batch, kv_heads, args.context, dim, device="cuda", dtype=torch.bfloat16)
    v = torch.randn_like(k)
    kv_bytes = 2 * args.batch * args.context * kv_heads * dim * batch.k_cache.element_size()
    reference = get_backend("torch")
    triton_ms, how = cuda_ms(lambda: attention(triton_backend, batch))
    sdpa_ms, sdpa_how = cuda_ms(
        lambda: F.scaled_dot_product_attention(q, k, v, enable_gqa=heads != kv_heads)
    )
    reference_ms, _ = cuda_ms(lambda: attention(reference, batch), repeats=5, graph=False)
    achieved = kv_bytes / (triton_ms * 1e-3)
    verdict = "meets" if achieved >= BANDWIDTH_TARGET * copy_bw else "BELOW"
    print(
        f"  page {page_size}: triton paged {triton_ms:.3f} ms ({how}), contiguous SDPA "
        f"{sdpa_ms:.3f} ms ({sdpa_how}), torch reference paged {reference_ms:.3f} ms (eager)"
    )
    print(
        f"    paging overhead vs SDPA {triton_ms / sdpa_ms - 1:+.0%}; KV read "
        f"{kv_bytes / 1e9:.2f} GB at {achieved / 1e12:.2f} TB/s = "
        f"{achieved / copy_bw:.0%} of copy bandwidth ({verdict} the "
        f"{BANDWIDTH_TARGET:.0%} target); SDPA reaches "
        f"{kv_bytes / (sdpa_ms * 1e-3) / copy_bw:.0%}"
    )


def main() -> int:
    """Run the accuracy checks, then the timings; the exit code says whether accuracy held."""
    args = shared.parse_args(__doc__.splitlines()[0], page_sizes=[16, 128])
    if not torch.cuda.is_available():
        print("gpu_check: no CUDA device found; nothing to check here (run it on a CUDA GPU)")
        return 0
    if shared.interpreted("gpu_check"):
        return 1
    triton_backend = get_backend("triton")
    print(f"device: {torch.cuda.get_device_name()}; accuracy in bf16 (max rel err < "
          f"{shared.TOLERANCE})")
    failures = shared.check_accuracy({"triton": triton_backend}, args.page_sizes, device="cuda",
                                     dtype=torch.bfloat16, pairs=[[5, 1], [0, 4], [7, 6]])
    copy_bw = shared.copy_bandwidth("cuda", lambda fn: cuda_ms(fn, repeats=20, graph=False)[0])
    print(
        f"decode step, batch {args.batch} x context {args.context}, heads "
        f"{args.num_heads}/{args.num_kv_heads}, head_dim {args.head_dim}, bf16; "
        f"device-to-device copy {copy_bw / 1e12:.2f} TB/s"
    )
    for page_size in args.page_sizes:
        bench_decode(triton_backend, args, page_size, copy_bw)
    print("page copy and swap (K and V bytes moved per second)")
    shared.bench_copy_swap({"triton": triton_backend, "torch": get_backend("torch")},
                           args.swap_pages, args.page_sizes[0], "cuda",
                           lambda fn: cuda_ms(fn, repeats=10, graph=False)[0])
    return shared.accuracy_exit_code(failures)


if __name__ == "__main__":
    sys.exit(main())
