"""An accelerator (or CPU) as the KV-cache memory and the cost model see it."""

from __future__ import annotations

from dataclasses import dataclass

from kvlab.errors import KvlabError
from kvlab.specs.model import ModelSpec, check_positive_tp


@dataclass(slots=True, frozen=True, kw_only=True)
class HardwareSpec:
    """One device's memory, bandwidth and compute, its host link, and the box it sits in.

    Units: bytes, bytes/s, FLOP/s, seconds. `peak_flops` is dense fp16/bf16. `host_link_*` is one
    direction of the device-host link (PCIe) that swaps use; `interconnect_*` is one direction of
    a device's link to its peers (NVLink, HCCS) that tensor-parallel all-reduces use, None meaning
    the peers talk over the host link. `step_overhead_s` is the eager per-step cost that does not
    overlap the device's work (kernel launches, input preparation, sampling).
    """

    name: str
    hbm_bytes: int
    hbm_bandwidth: float
    peak_flops: float
    host_link_bandwidth: float
    host_link_latency_s: float
    num_devices: int
    step_overhead_s: float
    interconnect_bandwidth: float | None = None
    interconnect_latency_s: float | None = None

    @property
    def peer_bandwidth(self) -> float:
        """Bytes/s one direction between two devices of the box."""
        return self.interconnect_bandwidth or self.host_link_bandwidth

    @property
    def peer_latency_s(self) -> float:
        """Fixed cost of one collective between devices of the box."""
        if self.interconnect_latency_s is None:
            return self.host_link_latency_s
        return self.interconnect_latency_s


def check_tensor_parallel(
    model: ModelSpec, hardware: HardwareSpec, tensor_parallel_size: int
) -> None:
    """Reject a tensor-parallel size the box cannot hold or the model's heads cannot split into."""
    check_positive_tp(tensor_parallel_size)
    if tensor_parallel_size > hardware.num_devices:
        raise KvlabError(
            f"tensor_parallel_size {tensor_parallel_size} exceeds the {hardware.num_devices} "
            f"device(s) of hardware {hardware.name!r}; use at most {hardware.num_devices} or a "
            "multi-device preset (e.g. atlas-800t-a2 for 8 Ascend 910B)",
            parameters=("tensor_parallel_size",),
        )
    if model.num_heads % tensor_parallel_size:
        raise KvlabError(
            f"tensor_parallel_size {tensor_parallel_size} does not divide the {model.num_heads} "
            f"attention heads of model {model.name!r}; choose a divisor of {model.num_heads}",
            parameters=("tensor_parallel_size",),
        )
