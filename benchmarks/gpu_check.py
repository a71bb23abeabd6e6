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

Exits 0 with a message when there is no CUDA device, 1 when an accuracy check fails.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
from collections.abc import Callable

import torch
import torch.nn.functional as F
from paged_batch import attention, check_cache_ops, make_batch, relative_error

from kvlab.kernels import KernelBackend, get_backend

ACCURACY_SHAPES = {"llama3-8b": (32, 8, 128), "qwen2.5-7b": (28, 4, 128)}  # heads, kv heads, dim
TOLERANCE = 1e-2
BANDWIDTH_TARGET = 0.8


def check_accuracy(
    triton_backend: KernelBackend,
    device: torch.device | str,
    dtype: torch.dtype,
    page_sizes: list[int],
    scale: int = 1,
) -> int:
    """Print one line per accuracy case; return the number that failed.

    `scale` divides every length (tiny shapes let the interpreter dry-run this on a CPU).
    """
    reference = get_backend("torch")
    gen = torch.Generator().manual_seed(1)
    ragged = [int(n) for n in torch.randint(1, 5000 // scale + 2, (16,), generator=gen)]
    batches = {
        "decode, ragged 1..5k": (ragged, [1] * len(ragged)),
        "mixed: prefill + chunk after prefix + decodes": (
            [x // scale or 1 for x in (1000, 3512, 4097, 77, 1)],
            [x // scale or 1 for x in (1000, 512, 1, 1, 1)],
        ),
    }
    failures = 0
    for model, shape in ACCURACY_SHAPES.items():
        for page_size in page_sizes:
            for name, (seq_lens, query_lens) in batches.items():
                batch = make_batch(
                    seq_lens,
                    query_lens,
                    page_size=page_size,
                    shape=shape,
                    dtype=dtype,
                    device=device,
                )
                error = relative_error(
                    attention(triton_backend, batch), attention(reference, batch)
                )
                ok = error < TOLERANCE
                failures += not ok
                print(
                    f"  {'ok  ' if ok else 'FAIL'} {model:<11} page {page_size:<4} {name}: "
                    f"rel err {error:.1e}"
                )
    failures += check_cache_ops(triton_backend, reference, device=device, dtype=dtype,
                                pairs=[[5, 1], [0, 4], [7, 6]])
    return failures


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
    times = []
    for _ in range(repeats):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        run()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end))
    return statistics.median(times), how


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


def copy_bandwidth(num_bytes: int = 1 << 30) -> float:
    """Device-to-device copy bandwidth in bytes/s, counting bytes read plus bytes written."""
    src = torch.empty(num_bytes, dtype=torch.uint8, device="cuda")
    dst = torch.empty_like(src)
    ms, _ = cuda_ms(lambda: dst.copy_(src), repeats=20, graph=False)
    return 2 * num_bytes / (ms * 1e-3)


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


def bench_copy_swap(backends: dict[str, KernelBackend], num_pages: int, page_size: int,
                    device: str, time_ms: Callable[[Callable[[], object]], float]) -> None:
    """GB/s of copy_pages on the device and of swap_pages out to pinned host memory and back
    (K and V bytes moved per call; `time_ms`: the device's timer, milliseconds of one call),
    each backend and page layout, then one contiguous host-to-device copy of as many bytes."""
    shape = (2 * num_pages, page_size, 8, 128)
    dev_k = torch.randn(shape).to(torch.bfloat16).to(device)
    dev_v = torch.randn(shape).to(torch.bfloat16).to(device)
    pin = device != "cpu"
    host_k = torch.empty((num_pages, *shape[1:]), dtype=torch.bfloat16, pin_memory=pin)
    host_v = torch.empty_like(host_k, pin_memory=pin)
    moved = 2 * num_pages * dev_k[0].numel() * 2  # K and V bytes per call
    scattered = torch.randperm(num_pages)
    layouts = {
        "scattered": torch.stack([scattered, scattered + num_pages], 1),
        "runs": torch.stack([torch.arange(num_pages), torch.arange(num_pages) + num_pages], 1),
    }
    for label, backend in backends.items():
        for layout, pairs in layouts.items():
            copy_ms = time_ms(lambda b=backend, p=pairs: b.copy_pages(dev_k, dev_v, p))
            out_pairs = torch.stack([pairs[:, 0], torch.arange(num_pages)], 1)
            in_pairs = out_pairs.flip(1)
            out_ms = time_ms(lambda b=backend, p=out_pairs: b.swap_pages(dev_k, dev_v, host_k,
                                                                          host_v, p))
            in_ms = time_ms(lambda b=backend, p=in_pairs: b.swap_pages(host_k, host_v, dev_k,
                                                                        dev_v, p))
            print(
                f"  {label:<7} {layout:<9} {num_pages} pages of {page_size}: copy "
                f"{moved / copy_ms / 1e6:.1f} GB/s, swap out {moved / out_ms / 1e6:.1f} GB/s, "
                f"swap in {moved / in_ms / 1e6:.1f} GB/s"
            )
    source = torch.cat([host_k, host_v]).pin_memory() if pin else torch.cat([host_k, host_v])
    target = torch.empty_like(source, device=device)
    link_ms = time_ms(lambda: target.copy_(source, non_blocking=True))
    print(f"  one contiguous host-to-device copy of the same bytes: "
          f"{moved / link_ms / 1e6:.1f} GB/s")


def main() -> int:
    """Run the accuracy checks, then the timings; the exit code says whether accuracy held."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--context", type=int, default=4096)
    parser.add_argument("--page-sizes", type=int, nargs="+", default=[16, 128])
    parser.add_argument("--num-heads", type=int, default=32)
    parser.add_argument("--num-kv-heads", type=int, default=8)
    parser.add_argument("--head-dim", type=int, default=128)
    parser.add_argument("--swap-pages", type=int, default=256)
    args = parser.parse_args()
    if not torch.cuda.is_available():
        print("gpu_check: no CUDA device found; nothing to check here (run it on a CUDA GPU)")
        return 0
    if os.environ.get("TRITON_INTERPRET") == "1":
        print("gpu_check: TRITON_INTERPRET=1 would time the interpreter; unset it and rerun")
        return 1
    triton_backend = get_backend("triton")
    print(f"device: {torch.cuda.get_device_name()}; accuracy in bf16 (max rel err < {TOLERANCE})")
    failures = check_accuracy(triton_backend, "cuda", torch.bfloat16, args.page_sizes)
    copy_bw = copy_bandwidth()
    print(
        f"decode step, batch {args.batch} x context {args.context}, heads "
        f"{args.num_heads}/{args.num_kv_heads}, head_dim {args.head_dim}, bf16; "
        f"device-to-device copy {copy_bw / 1e12:.2f} TB/s"
    )
    for page_size in args.page_sizes:
        bench_decode(triton_backend, args, page_size, copy_bw)
    print("page copy and swap (K and V bytes moved per second)")
    bench_copy_swap({"triton": triton_backend, "torch": get_backend("torch")}, args.swap_pages,
                    args.page_sizes[0], "cuda",
                    lambda fn: cuda_ms(fn, repeats=10, graph=False)[0])
    print(f"accuracy: {'all passed' if not failures else f'{failures} FAILED'}")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
