"""Reading a server's Prometheus `/metrics`: the values of every series, summed over labels."""

from __future__ import annotations

import re
import time
import urllib.error
import urllib.request
from dataclasses import dataclass, field

from kvlab.errors import KvlabError

# Histograms whose buckets a sample keeps (the others' sums and counts suffice).
KEPT_BUCKETS = frozenset({"vllm:request_num_preemptions_bucket"})
# Series a sample also keeps by some of their labels (summed over the others), in this order:
# name{level="1",dtype="fp8_e4m3"} (kvlab serve's precision mix and demotions)
KEPT_LABELS = {"kvlab:kv_pages_at_precision": ("level", "dtype"),
               "kvlab:kv_page_demotions_total": ("level", "dtype")}
# A kept key of kvlab serve's pages at each precision level: (level, dtype)
PRECISION_PAGES = re.compile(r'kvlab:kv_pages_at_precision\{level="(\d+)",dtype="([^"]+)"\}')


@dataclass(slots=True)
class MetricsSample:
    """One scrape: when (seconds since the epoch) and each sample's value by name.

    Names are the exposition's sample names (`vllm:num_preemptions_total`,
    `vllm:time_to_first_token_seconds_sum`, ...); a name with several label sets (one per model
    or engine) holds their sum, and those of `KEPT_LABELS` are also kept by their label
    (`kvlab:kv_pages_at_precision{dtype="fp8_e4m3"}`). Histogram buckets are left out. `info`
    holds the labels of each `*_info` series (vLLM's `vllm:cache_config_info`: block_size,
    num_gpu_blocks, ...), the first label set where there are several.
    """

    time_s: float
    values: dict[str, float] = field(default_factory=dict)
    info: dict[str, dict[str, str]] = field(default_factory=dict)

    def get(self, name: str, default: float = 0.0) -> float:
        """A sample's value, or `default` when the server does not export it."""
        return self.values.get(name, default)


def parse_metrics(text: str, time_s: float | None = None) -> MetricsSample:
    """A Prometheus text exposition as a MetricsSample; a KvlabError when it is not one."""
    # prometheus_client is the bench extra's: `kvlab sim` (the base install) imports this
    # module through kvlab.fidelity without reading any page
    from prometheus_client.parser import text_string_to_metric_families

    values: dict[str, float] = {}
    info: dict[str, dict[str, str]] = {}
    try:
        for family in text_string_to_metric_families(text):
            for sample in family.samples:
                if sample.name.endswith("_bucket"):
                    if sample.name in KEPT_BUCKETS:  # by its bound: name{le="2.0"}
                        key = f'{sample.name}{{le="{float(sample.labels["le"]):g}"}}'
                        values[key] = values.get(key, 0.0) + float(sample.value)
                    continue
                values[sample.name] = values.get(sample.name, 0.0) + float(sample.value)
                labels = KEPT_LABELS.get(sample.name, ())
                if labels and all(label in sample.labels for label in labels):
                    kept = ",".join(f'{label}="{sample.labels[label]}"' for label in labels)
                    key = f"{sample.name}{{{kept}}}"
                    values[key] = values.get(key, 0.0) + float(sample.value)
                if sample.name.endswith("_info"):
                    info.setdefault(sample.name, dict(sample.labels))
    except ValueError as exc:
        raise KvlabError(f"not a Prometheus metrics page: {exc}") from None
    return MetricsSample(time.time() if time_s is None else time_s, values, info)


def scrape_metrics(url: str, timeout_s: float = 5.0) -> MetricsSample:
    """GET `url` (a server's /metrics) and parse it; a KvlabError naming the URL on failure."""
    if not url.startswith(("http://", "https://")):
        raise KvlabError(f"{url!r}: expected an http:// or https:// URL of a /metrics page")
    try:
        with urllib.request.urlopen(url, timeout=timeout_s) as response:
            text = response.read().decode("utf-8", errors="replace")
    except (urllib.error.URLError, OSError, ValueError) as exc:
        reason = getattr(exc, "reason", exc)
        raise KvlabError(f"cannot read {url}: {reason}") from None
    try:
        return parse_metrics(text)
    except KvlabError as exc:
        raise KvlabError(f"{url}: {exc}") from None
