"""What the engine asks of a device kind (cpu, cuda, npu): memory, synchronisation, streams."""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator
from typing import Any

import torch

from kvlab.errors import KvlabError
from kvlab.specs.host import available_ram_bytes

DEVICE_KINDS = ("cpu", "cuda", "npu")


class Platform:
    """One device kind as the engine sees it; subclasses answer for cpu, cuda and npu.

    `pin_memory` says whether host swap space should be page-locked (only worth it when a device
    copies from it by DMA). Memory figures are bytes.
    """

    name: str = ""
    pin_memory: bool = False

    def __init__(self, device: torch.device) -> None:
        self.device = device

    def total_memory_bytes(self) -> int:
        """The device memory size."""
        raise NotImplementedError

    def free_memory_bytes(self) -> int:
        """Device memory not in use by anyone right now."""
        raise NotImplementedError

    def synchronize(self) -> None:
        """Wait until every queued kernel on the device has finished."""

    def new_stream(self) -> Any:
        """A new stream to queue work on apart from the default one (None where there are none)."""
        return None

    @contextlib.contextmanager
    def stream(self, stream: Any) -> Iterator[None]:
        """Queue the work inside the `with` block on `stream` (no-op where there are no streams)."""
        yield

    def empty_cache(self) -> None:
        """Give cached, unused allocator blocks back to the device."""

    def memory_allocated_bytes(self) -> int:
        """Bytes the torch allocator holds in tensors now (for the profiling forward)."""
        raise NotImplementedError(f"{self.name} has no allocator statistics")

    def peak_memory_allocated_bytes(self) -> int:
        """The most bytes held in tensors since the last `reset_peak_memory_stats()`."""
        raise NotImplementedError(f"{self.name} has no allocator statistics")

    def reset_peak_memory_stats(self) -> None:
        """Start a new peak measurement."""
        raise NotImplementedError(f"{self.name} has no allocator statistics")

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.device})"


class CpuPlatform(Platform):
    """The host CPU: system RAM, no streams, no allocator statistics."""

    name = "cpu"
    pin_memory = False

    def total_memory_bytes(self) -> int:
        """Physical RAM."""
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")

    def free_memory_bytes(self) -> int:
        """RAM available to new allocations (MemAvailable; free pages where /proc is absent)."""
        return available_ram_bytes()


class CudaPlatform(Platform):
    """An NVIDIA GPU through torch.cuda."""

    name = "cuda"
    pin_memory = True

    def total_memory_bytes(self) -> int:
        """Device memory size."""
        return torch.cuda.mem_get_info(self.device)[1]

    def free_memory_bytes(self) -> int:
        """Free device memory as the driver reports it (all processes counted)."""
        return torch.cuda.mem_get_info(self.device)[0]

    def synchronize(self) -> None:
        """Wait for the device."""
        torch.cuda.synchronize(self.device)

    def new_stream(self) -> Any:
        """A new CUDA stream on this device."""
        return torch.cuda.Stream(device=self.device)

    @contextlib.contextmanager
    def stream(self, stream: Any) -> Iterator[None]:
        """Queue work on `stream`."""
        with torch.cuda.stream(stream):
            yield

    def empty_cache(self) -> None:
        """Release the caching allocator's unused blocks."""
        torch.cuda.empty_cache()

    def memory_allocated_bytes(self) -> int:
        """Bytes held in tensors."""
        return torch.cuda.memory_allocated(self.device)

    def peak_memory_allocated_bytes(self) -> int:
        """Peak bytes held in tensors since the last reset."""
        return torch.cuda.max_memory_allocated(self.device)

    def reset_peak_memory_stats(self) -> None:
        """Start a new peak measurement."""
        torch.cuda.reset_peak_memory_stats(self.device)


class NpuPlatform(Platform):
    """An Ascend NPU through torch_npu (torch.npu). Unverified on hardware.

    torch_npu is imported only here, when an npu platform is created; it needs the CANN toolkit.
    """

    name = "npu"
    pin_memory = True

    def __init__(self, device: torch.device) -> None:
        super().__init__(device)
        self._npu = _import_torch_npu()

    def total_memory_bytes(self) -> int:
        """Device memory size."""
        return self._npu.mem_get_info(self.device)[1]

    def free_memory_bytes(self) -> int:
        """Free device memory as the driver reports it."""
        return self._npu.mem_get_info(self.device)[0]

    def synchronize(self) -> None:
        """Wait for the device."""
        self._npu.synchronize(self.device)

    def new_stream(self) -> Any:
        """A new NPU stream on this device."""
        return self._npu.Stream(device=self.device)

    @contextlib.contextmanager
    def stream(self, stream: Any) -> Iterator[None]:
        """Queue work on `stream`."""
        with self._npu.stream(stream):
            yield

    def empty_cache(self) -> None:
        """Release the caching allocator's unused blocks."""
        self._npu.empty_cache()

    def memory_allocated_bytes(self) -> int:
        """Bytes held in tensors."""
        return self._npu.memory_allocated(self.device)

    def peak_memory_allocated_bytes(self) -> int:
        """Peak bytes held in tensors since the last reset."""
        return self._npu.max_memory_allocated(self.device)

    def reset_peak_memory_stats(self) -> None:
        """Start a new peak measurement."""
        self._npu.reset_peak_memory_stats(self.device)


def _import_torch_npu() -> Any:
    """torch.npu, after importing torch_npu; a KvlabError saying what is missing otherwise."""
    try:
        import torch_npu  # noqa: F401  (registers the npu device with torch)
    except (ImportError, OSError, RuntimeError) as exc:  # missing, or CANN libraries missing
        raise KvlabError(
            "device 'npu' needs torch_npu and the Ascend CANN toolkit, which are not installed "
            f"here ({exc}); install the torch_npu build matching torch {torch.__version__} on an "
            "Ascend machine, or choose device cpu or cuda",
            parameters=("device",),
        ) from exc
    # torch.npu exists only once torch_npu is imported
    npu = torch.npu  # type: ignore[attr-defined]
    if not npu.is_available():
        raise KvlabError("device 'npu': torch_npu is installed but sees no Ascend NPU")
    return npu


def get_platform(device: str | torch.device) -> Platform:
    """The platform for a device string: 'cpu', 'cuda', 'cuda:1', 'npu', 'npu:0'."""
    text = str(device)
    kind, _, index = text.partition(":")
    if kind not in DEVICE_KINDS or (index and not index.isdigit()):
        raise KvlabError(
            f"device {text!r}: expected one of {', '.join(DEVICE_KINDS)} "
            "(optionally with an index, e.g. cuda:1)", parameters=("device",)
        )
    if kind == "cpu":
        return CpuPlatform(torch.device("cpu"))
    if kind == "npu":
        _import_torch_npu()
        return NpuPlatform(torch.device(f"npu:{index or 0}"))
    if not torch.cuda.is_available():
        raise KvlabError(
            f"device {text!r}: no CUDA GPU is visible (torch {torch.__version__} "
            f"{'has no CUDA support' if torch.version.cuda is None else 'found no device'}); "
            "choose device cpu",
            parameters=("device",),
        )
    ordinal = int(index or 0)
    if ordinal >= torch.cuda.device_count():
        raise KvlabError(
            f"device {text!r}: only {torch.cuda.device_count()} CUDA device(s) are visible"
        )
    return CudaPlatform(torch.device(f"cuda:{ordinal}"))
