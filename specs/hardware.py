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

    Memory tiers below the device (policies/tiers/) use: `host_memory_bytes`, the box's host
    DRAM per device (a bound on the host tier; None: unknown), the host link for the host
    tier, `ssd_*` for a local NVMe tier (one device's share of the box's drives) and
    `remote_*` for a pool on other nodes over RDMA (one device's share of the box's NICs).
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
    host_memory_bytes: int | None = None
    # One PCIe Gen4 NVMe drive per device: ~7 GB/s reads, ~5 GB/s writes, ~100 us a request
    # [estimate: data sheets of current enterprise drives].
    ssd_read_bandwidth: float = 7e9
    ssd_write_bandwidth: float = 5e9
    ssd_latency_s: float = 100e-6
    # Mooncake's transfer engine: 190 GB/s over 8x400 Gbps RoCE per box, so ~23.75 GB/s per
    # device with one 400 Gbps NIC each (FACTS.md); latency [estimate].
    remote_bandwidth: float = 23.75e9
    remote_latency_s: float = 20e-6

    def tier_link(self, kind: str) -> tuple[float, float, float]:
        """(read bytes/s, write bytes/s, seconds per transfer) of a tier of `kind` here."""
        if kind == "host":
            return self.host_link_bandwidth, self.host_link_bandwidth, self.host_link_latency_s
        if kind == "ssd":
            return self.ssd_read_bandwidth, self.ssd_write_bandwidth, self.ssd_latency_s
        if kind == "remote":
            return self.remote_bandwidth, self.remote_bandwidth, self.remote_latency_s
        raise KvlabError(f"tier kind {kind!r}: expected host, ssd or remote",
                         parameters=("kv_tiers",))

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
