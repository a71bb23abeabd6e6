"""The model's linear layers, whose small CPU matmuls may run on a oneDNN-packed weight.

On CPU, oneDNN's matmul on a weight reordered once into its blocked layout
(`torch.ops.mkldnn._reorder_linear_weight`) beats `F.linear` (MKL) at decode sizes on this
project's machines, most of all for the LM head (32000 x 512 at 16 rows: 10.5 against 17.5 ms),
and is no faster, sometimes slower, at prefill sizes: so a packed layer takes oneDNN's path
for at most ONEDNN_MAX_ROWS rows and `F.linear` above. vLLM's CPU backend runs its linears on
oneDNN too. The two paths agree to about 1e-5, not bit for bit. A packed weight is a second
copy of the weight (the plain one stays for checkpoints and larger batches).
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from kvlab.errors import KvlabError

CPU_GEMMS = ("onednn", "torch")
ONEDNN_MAX_ROWS = 128  # rows up to which a packed layer runs oneDNN (decode-sized batches)


class Linear(nn.Linear):
    """nn.Linear whose matmul runs through `packed`, a oneDNN-packed copy of its weight, when
    one is set and the input has at most ONEDNN_MAX_ROWS rows."""

    packed: torch.Tensor | None = None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """x @ weight.T + bias."""
        return linear(x, self.weight, self.bias, self.packed)


def new_linear(in_features: int, out_features: int, bias: bool, **factory: Any) -> Linear:
    """An uninitialised Linear (its weights come from a checkpoint or a preset's generator)."""
    return nn.utils.skip_init(Linear, in_features, out_features, bias=bias, **factory)


def linear(
    x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, packed: torch.Tensor | None
) -> torch.Tensor:
    """x @ weight.T + bias, through oneDNN on `packed` (weight's packed copy) for small x."""
    if packed is not None and x.dim() == 2 and x.shape[0] <= ONEDNN_MAX_ROWS:
        return torch.ops.mkldnn._linear_pointwise(x, packed, bias, "none", [], "")
    return F.linear(x, weight, bias)


def check_cpu_gemm(name: str) -> str:
    """`name` if it is a known CPU matmul path; KvlabError otherwise."""
    if name not in CPU_GEMMS:
        raise KvlabError(f"cpu_gemm {name!r} is not supported; expected one of {list(CPU_GEMMS)}")
    return name


def onednn_packs(weight: torch.Tensor) -> bool:
    """Whether a oneDNN-packed copy of `weight` can be made: a CPU float32 matrix in a torch
    built with oneDNN, or bfloat16 where the CPU has oneDNN's bfloat16 instructions."""
    if weight.device.type != "cpu" or weight.dim() != 2 or not torch.backends.mkldnn.is_available():
        return False
    if weight.dtype == torch.bfloat16:
        return bool(torch.ops.mkldnn._is_mkldnn_bf16_supported())
    return weight.dtype == torch.float32


def pack_weight(weight: torch.Tensor) -> torch.Tensor | None:
    """A oneDNN-packed copy of `weight`, or None where `onednn_packs` says no."""
    if not onednn_packs(weight):
        return None
    return torch.ops.mkldnn._reorder_linear_weight(weight.detach())
