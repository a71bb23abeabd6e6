"""The workload and machine every page simulates (`Setup`), and checked trace uploads."""

from __future__ import annotations

import hashlib
import tempfile
from dataclasses import asdict, dataclass, field, fields, replace
from pathlib import Path
from typing import Any

from kvlab.errors import KvlabError
from kvlab.policies import PolicySpec
from kvlab.policies.serving import ServingConfig
from kvlab.sim import SimConfig
from kvlab.specs import DEFAULT_HARDWARE, DEFAULT_MODEL
from kvlab.traces import Trace, guess_dataset_name, load_trace
from kvlab.traces.bundled import bundled_dataset_name

MAX_UPLOAD_BYTES = 50 * 1024 * 1024
UPLOAD_SUFFIXES = (".csv", ".jsonl", ".json", ".yaml", ".yml")
DEFAULT_TRACE = "azure-conv"


@dataclass(slots=True, frozen=True)
class Setup:
    """One workload on one machine: trace (bundled name or upload), arrivals, presets, and the
    serving config's limits and memory sizing (its policy is each page's own).

    `upload` holds the bytes of an uploaded trace file (then `trace` is its file name);
    `dataset_name` is `auto` to guess the format from the file. A `request_rate` resamples
    arrivals as Poisson (inf: all at 0); None divides the trace's timestamps by `time_scale`.
    """

    trace: str = DEFAULT_TRACE
    upload: bytes | None = None
    dataset_name: str = "auto"
    num_prompts: int | None = None  # the whole trace, as `kvlab sim`
    request_rate: float | None = None
    time_scale: float = 1.0
    seed: int = 0
    model: str = DEFAULT_MODEL
    hardware: str = DEFAULT_HARDWARE
    tensor_parallel_size: int = 1
    serving: ServingConfig = field(default_factory=ServingConfig)

    def key(self) -> str:
        """A short stable digest of every field (upload bytes included), for caches."""
        fields = asdict(self)
        upload = fields.pop("upload")
        digest = hashlib.sha256(repr(sorted(fields.items())).encode())
        digest.update(upload or b"")
        return digest.hexdigest()[:16]

    def config(self, policy: PolicySpec | str) -> SimConfig:
        """The simulator config of this machine running `policy` (checked: bad values raise)."""
        serving = replace(self.serving, seed=self.seed).with_policy(policy)
        return SimConfig(model=self.model, hardware=self.hardware, serving=serving,
                         tensor_parallel_size=self.tensor_parallel_size)

    def with_value(self, name: str, value: Any) -> Setup:
        """A copy with one field changed (sweeps), of the setup or of its serving config; a
        request rate replaces the time scale and the other way round, since arrivals take only
        one of them."""
        if name in _SERVING_FIELDS:
            return replace(self, serving=replace(self.serving, **{name: value}))
        changes: dict[str, Any] = {name: value}
        if name == "request_rate":
            changes["time_scale"] = 1.0
        elif name == "time_scale":
            changes["request_rate"] = None
        return replace(self, **changes)


_SERVING_FIELDS = frozenset(f.name for f in fields(ServingConfig)) - {"policy", "seed"}


def load_setup_trace(setup: Setup) -> Trace:
    """The setup's trace with its arrivals applied; an upload is checked and parsed here."""
    options: dict[str, Any] = {
        "num_prompts": setup.num_prompts, "seed": setup.seed,
        "request_rate": setup.request_rate, "time_scale": setup.time_scale,
    }
    if setup.upload is None:
        return load_trace(bundled_dataset_name(setup.trace), setup.trace, **options)
    check_upload(setup.trace, setup.upload)
    with tempfile.TemporaryDirectory(prefix="kvlab-upload-") as folder:
        path = Path(folder) / Path(setup.trace).name
        path.write_bytes(setup.upload)
        try:
            dataset = (guess_dataset_name(path) if setup.dataset_name == "auto"
                       else setup.dataset_name)
            trace = load_trace(dataset, path, **options)
        except KvlabError as err:  # name the upload, not the temporary copy
            raise KvlabError(str(err).replace(str(path), Path(setup.trace).name)) from None
    trace.source = f"upload:{Path(setup.trace).name}"
    return trace


def check_upload(name: str, data: bytes, max_bytes: int = MAX_UPLOAD_BYTES) -> None:
    """Raise a KvlabError naming the problem unless `data` could be a trace file called `name`.

    Checks the size limit, the extension and that the text is UTF-8; the loaders check the
    columns, line by line.
    """
    suffix = Path(name).suffix.lower()
    if suffix not in UPLOAD_SUFFIXES:
        raise KvlabError(f"{name}: expected a trace file ending in {', '.join(UPLOAD_SUFFIXES)} "
                         "(Azure or BurstGPT .csv, Mooncake .jsonl, ShareGPT .json, a workload "
                         "spec .yaml)")
    if len(data) > max_bytes:
        raise KvlabError(f"{name} is {len(data) / 2**20:.1f} MiB; the dashboard takes trace "
                         f"files up to {max_bytes / 2**20:.0f} MiB (cut it, or use kvlab sim)")
    if not data.strip():
        raise KvlabError(f"{name} is empty; expected a trace with a header and requests")
    try:
        data[:65536].decode("utf-8")
    except UnicodeDecodeError as err:
        if err.start < 65536 - 4:  # a multi-byte character cut by the slice is fine
            raise KvlabError(f"{name}: byte {err.start} is not UTF-8 text; expected a "
                             "CSV, JSON Lines or JSON trace file") from None
