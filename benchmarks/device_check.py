"""What gpu_check.py and npu_check.py share beyond the paged batches (paged_batch.py): their
flags, the accuracy run over model head shapes, batch kinds and page layouts, a median of a
device's event timings, the device-to-device copy bandwidth, page copy and swap GB/s, and the
exit code.

Imported by name (`from device_check import ...`): a script's own folder is on sys.path.
"""

from __future__ import annotations

import argparse
import os
import statistics
from collections.abc import Callable, Sequence
from typing import Any

import torch
from paged_batch import attention, check_cache_ops, make_batch, relative_error

from kvlab.kernels import KernelBackend, get_backend

ACCURACY_SHAPES = {"llama3-8b": (32, 8, 128), "qwen2.5-7b": (28, 4, 128)}  # heads, kv heads, dim
TOLERANCE = 1e-2


def parse_args(description: str, page_sizes: list[int]) -> argparse.Namespace:
    """The checks' flags: the decode batch, the page sizes (`page_sizes` by default; the
    first also sizes the swap check), the head shape and the pages swapped."""
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--context", type=int, default=4096)
    parser.add_argument("--page-sizes", type=int, nargs="+", default=page_sizes)
    parser.add_argument("--num-heads", type=int, default=32)
    parser.add_argument("--num-kv-heads", type=int, default=8)
    parser.add_argument("--head-dim", type=int, default=128)
    parser.add_argument("--swap-pages", type=int, default=256)
    return parser.parse_args()


def interpreted(script: str) -> bool:
    """True, after saying so, under TRITON_INTERPRET=1 (the timings would be the
    interpreter's)."""
    if os.environ.get("TRITON_INTERPRET") != "1":
        return False
    print(f"{script}: TRITON_INTERPRET=1 would time the interpreter; unset it and rerun")
    return True


def check_accuracy(backends: dict[str, KernelBackend], page_sizes: list[int], *,
                   device: torch.device | str, dtype: torch.dtype, pairs: list[list[int]],
                   run_pages: Sequence[int] = (1,), fill_on_host: bool = False,
                   scale: int = 1) -> int:
    """Print one line per backend and case (model head shape, page size, pages in runs of
    `run_pages`, decode-only or mixed batch) against the torch reference, then whether each
    backend's write_kv and copy_pages (of `pairs`) are exact; return the number that failed.

    `scale` divides every length (tiny shapes let the interpreter dry-run this on a CPU).
    """
    reference = get_backend("torch")
    gen = torch.Generator().manual_seed(1)
    ragged = [int(n) for n in torch.randint(1, 5000 // scale + 2, (16,), generator=gen)]
    cases = {
        "decode, ragged 1..5k": (ragged, [1] * len(ragged)),
        "mixed: prefill + chunk after prefix + decodes": (
            [x // scale or 1 for x in (1000, 3512, 4097, 77, 1)],
            [x // scale or 1 for x in (1000, 512, 1, 1, 1)],
        ),
    }
    failures = 0
    for model, shape in ACCURACY_SHAPES.items():
        for page_size in page_sizes:
            for runs in run_pages:
                for name, (seq_lens, query_lens) in cases.items():
                    batch = make_batch(seq_lens, query_lens, page_size=page_size, shape=shape,
                                       dtype=dtype, device=device, run_pages=runs,
                                       fill_on_host=fill_on_host)
                    expected = attention(reference, batch)
                    for label, backend in backends.items():
                        error = relative_error(attention(backend, batch), expected)
                        ok = error < TOLERANCE
                        failures += not ok
                        print(f"  {'ok  ' if ok else 'FAIL'} {label:<7} {model:<11} page "
                              f"{page_size:<4} runs {runs} {name}: rel err {error:.1e}")
    for label, backend in backends.items():
        failures += check_cache_ops(backend, reference, device=device, dtype=dtype, pairs=pairs,
                                    label=label, fill_on_host=fill_on_host)
    return failures


def median_event_ms(run: Callable[[], object], events: Any, repeats: int) -> float:
    """Median milliseconds of `run` between two timing events of the device module `events`
    (torch.cuda, torch.npu), each call waited for."""
    times = []
    for _ in range(repeats):
        start, end = events.Event(enable_timing=True), events.Event(enable_timing=True)
        start.record()
        run()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end))
    return float(statistics.median(times))


def copy_bandwidth(device: str, time_ms: Callable[[Callable[[], object]], float],
                   num_bytes: int = 1 << 30) -> float:
    """Device-to-device copy bandwidth in bytes/s, counting bytes read plus bytes written
    (`time_ms`: the device's timer, milliseconds of one call)."""
    src = torch.empty(num_bytes, dtype=torch.uint8, device=device)
    dst = torch.empty_like(src)
    return 2 * num_bytes / (time_ms(lambda: dst.copy_(src)) * 1e-3)


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


def accuracy_exit_code(failures: int) -> int:
    """Say whether every accuracy check passed; the script's exit code (1 when one failed)."""
    print(f"accuracy: {'all passed' if not failures else f'{failures} FAILED'}")
    return 1 if failures else 0
