"""The kernel backend interface (KernelBackend: the public methods once, each backend's hooks)
and the registry that imports a backend only when it is chosen."""

from __future__ import annotations

import importlib
import importlib.util
from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch
from torch import Tensor

from kvlab.errors import KvlabError
from kvlab.kernels.metadata import AttentionMetadata
from kvlab.specs.kv_dtype import kv_cache_dtype

if TYPE_CHECKING:  # (kv_quant is imported by the backends that store quantized pages)
    from kvlab.kernels.kv_quant import KVQuant


@dataclass(frozen=True, slots=True)
class KVRows:
    """One `write_kv` call's arguments: new K/V rows, the layer's caches, their slots."""

    key: Tensor
    value: Tensor
    k_cache: Tensor
    v_cache: Tensor
    slot_mapping: Tensor
    kv_quant: KVQuant | None

    def stored(self) -> tuple[Tensor, Tensor]:
        """The key and value rows as the pages store them: quantized by `kv_quant`'s torch
        code (the reference's bytes), or as given (None: cast where they are written)."""
        if self.kv_quant is None:
            return self.key, self.value
        return self.kv_quant.quantize(self.key, "k"), self.kv_quant.quantize(self.value, "v")


@dataclass(frozen=True, slots=True)
class AttentionCall:
    """One `paged_attention` call's arguments (KernelBackend.paged_attention says what each
    is); `out` None: the backend allocates the output."""

    query: Tensor
    k_cache: Tensor
    v_cache: Tensor
    meta: AttentionMetadata
    scale: float
    num_kv_heads: int
    out: Tensor | None
    sliding_window: int
    kv_quant: KVQuant | None


class KernelBackend(ABC):
    """Paged attention and cache ops over `[num_pages, page_size, kv_heads, head_dim]` caches.

    `kv_cache_dtypes` names the `--kv-cache-dtype`s the backend stores (`check_kv_cache_dtype`);
    pages of a quantized one come with a `kv_quant` (kvkernels/kv_quant.py: the layer's precision
    and scales; their last dimension is then a stored row's width), float pages without.

    The public methods' signatures and contracts are here, once; a backend implements
    `_write_kv` and `_paged_attention` (the arguments as one KVRows / AttentionCall),
    `copy_pages` and `swap_pages`.
    """

    name: str
    supports_sliding_window: bool
    kv_cache_dtypes: tuple[str, ...]

    def write_kv(
        self,
        key: Tensor,
        value: Tensor,
        k_cache: Tensor,
        v_cache: Tensor,
        slot_mapping: Tensor,
        kv_quant: KVQuant | None = None,
    ) -> None:
        """Store key/value rows `[num_tokens, num_kv_heads, head_dim]` at their slots (-1: skip),
        quantized by `kv_quant` (None: cast to the cache's dtype)."""
        self._write_kv(KVRows(key, value, k_cache, v_cache, slot_mapping, kv_quant))

    def paged_attention(
        self,
        query: Tensor,
        k_cache: Tensor,
        v_cache: Tensor,
        meta: AttentionMetadata,
        *,
        scale: float,
        num_kv_heads: int,
        out: Tensor | None = None,
        sliding_window: int = 0,
        kv_quant: KVQuant | None = None,
    ) -> Tensor:
        """Causal attention of query `[num_tokens, num_heads, head_dim]` over the paged context;
        with `sliding_window` W > 0 a row at position p sees positions p - W + 1 .. p only
        (a KvlabError where `supports_sliding_window` is False). Pages stored by `kv_quant`
        are dequantized as they are read."""
        if not self.supports_sliding_window:
            refuse_sliding_window(self.name, sliding_window)
        assert k_cache.shape[2] == num_kv_heads, "cache layout is [pages, page_size, kv_heads, dim]"
        check_query(query, meta, num_kv_heads)
        return self._paged_attention(AttentionCall(query, k_cache, v_cache, meta, scale,
                                                   num_kv_heads, out, sliding_window, kv_quant))

    @abstractmethod
    def _write_kv(self, rows: KVRows) -> None:
        """write_kv, its arguments as one KVRows."""

    @abstractmethod
    def _paged_attention(self, call: AttentionCall) -> Tensor:
        """paged_attention, its arguments as one AttentionCall (the cache's heads and the
        query's rows checked, a window already refused where the backend has none)."""

    @abstractmethod
    def copy_pages(self, k_cache: Tensor, v_cache: Tensor, pairs: Tensor) -> None:
        """Copy device pages in place: `pairs[n, 2]` of (src, dst), all read before any write."""

    @abstractmethod
    def swap_pages(
        self, src_k: Tensor, src_v: Tensor, dst_k: Tensor, dst_v: Tensor, pairs: Tensor
    ) -> None:
        """Copy pages `pairs[n, 2]` of (src, dst) from one cache to another (device <-> host)."""


def check_query(query: Tensor, meta: AttentionMetadata, num_kv_heads: int) -> None:
    """Assert the query's layout: one `[num_heads, head_dim]` row per new token, whole query
    groups per KV head."""
    assert query.shape[0] == meta.num_tokens, "one query row per new token"
    assert query.shape[1] % num_kv_heads == 0, "num_heads must be a multiple of num_kv_heads"


def refuse_sliding_window(backend: str, sliding_window: int) -> None:
    """A KvlabError when a backend without sliding-window attention is asked for a window."""
    if sliding_window > 0:
        raise KvlabError(
            f"attention_backend {backend} has no sliding-window attention (window "
            f"{sliding_window}); use attention_backend torch or triton",
            parameters=("attention_backend",),
        )


def refuse_unless_c8(backend: str, kv_quant: KVQuant | None) -> None:
    """A KvlabError for pages of a quantized precision other than int8 (C8), the only one the
    Ascend backends (npu, ascend) store, as vLLM-Ascend."""
    if kv_quant is not None and kv_quant.dtype.scales != "per_channel":
        raise KvlabError(
            f"kv_cache_dtype {kv_quant.dtype.name}: attention_backend {backend} stores int8 (C8) "
            "only, as vLLM-Ascend; use attention_backend torch or triton",
            parameters=("kv_cache_dtype", "attention_backend"))


def check_kv_cache_dtype(backend: KernelBackend, name: str, model_dtype: torch.dtype) -> None:
    """A KvlabError naming kv_cache_dtype and attention_backend when `backend` cannot store
    the precision `name` for a model in `model_dtype` (a float precision equal to the model's
    dtype is `auto` under another name, which every backend stores)."""
    dtype = kv_cache_dtype(name)
    if dtype.name in backend.kv_cache_dtypes:
        return
    if not dtype.is_quantized and dtype.storage in ("model", str(model_dtype).removeprefix(
            "torch.")):
        return
    others = [n for n in backend.kv_cache_dtypes if n != "auto"]
    stores = ", ".join(others) if others else "none but auto (the model's dtype)"
    hint = "use attention_backend torch or triton"
    parameters: tuple[str, ...] = ("kv_cache_dtype", "attention_backend")
    if not dtype.is_quantized:
        hint += f", or run the model in {dtype.name} (dtype)"
        parameters += ("dtype",)
    raise KvlabError(
        f"kv_cache_dtype {dtype.name}: attention_backend {backend.name} stores {stores}; "
        f"{hint}", parameters=parameters)


@dataclass(frozen=True, slots=True)
class _BackendEntry:
    module: str
    cls: str
    requires: str  # top-level package the backend needs, checked without importing it
    help: str


_BACKENDS: dict[str, _BackendEntry] = {
    "torch": _BackendEntry(
        "kvlab.kernels.torch_backend", "TorchBackend", "torch", "PyTorch reference (any device)"
    ),
    "triton": _BackendEntry(
        "kvlab.kernels.triton_backend",
        "TritonBackend",
        "triton",
        "Triton kernels (CUDA, or CPU with TRITON_INTERPRET=1)",
    ),
    "npu": _BackendEntry(
        "kvlab.kernels.npu_backend",
        "NpuBackend",
        "torch_npu",
        "torch_npu fused ops (Ascend NPU with CANN)",
    ),
    "ascend": _BackendEntry(
        "kvlab.kernels.ascend_backend",
        "AscendBackend",
        "triton",
        "kvlab's Triton kernels for Ascend (triton-ascend; CPU with TRITON_INTERPRET=1)",
    ),
}


def backend_names() -> list[str]:
    """Every name `get_backend` accepts, whether or not its packages are installed here."""
    return list(_BACKENDS)


def available_backends() -> list[str]:
    """Names of the backends whose required packages are installed on this machine."""
    return [
        name
        for name, entry in _BACKENDS.items()
        if importlib.util.find_spec(entry.requires) is not None
    ]


def get_backend(name: str) -> KernelBackend:
    """The backend called `name`; its module is imported now, and only now.

    Raises KvlabError for an unknown name (listing the valid ones) or a backend whose packages
    are missing on this machine.
    """
    entry = _BACKENDS.get(name)
    if entry is None:
        choices = ", ".join(f"{n} ({e.help})" for n, e in _BACKENDS.items())
        raise KvlabError(f"unknown attention backend {name!r}; choose one of: {choices}")
    module = importlib.import_module(entry.module)
    backend: KernelBackend = getattr(module, entry.cls)()
    return backend
