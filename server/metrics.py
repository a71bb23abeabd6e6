"""`/metrics`: vLLM's Prometheus series where the meaning is the same, plus `kvlab:` series for
the memory that vLLM does not show (pages, host pages, fragmentation, swaps, the policy)."""

from __future__ import annotations

from collections.abc import Sequence

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest

from kvlab.policies import KVCacheManager, MemoryUsage, Request, Scheduler, SchedulerOutput

# vLLM's buckets, so that dashboards built for vLLM read kvlab's histograms alike.
TTFT_BUCKETS = (0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5,
                5.0, 7.5, 10.0, 20.0, 40.0, 80.0, 160.0, 640.0, 2560.0)
ITL_BUCKETS = (0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5, 5.0,
               7.5, 10.0, 20.0, 40.0, 80.0)
LATENCY_BUCKETS = (0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0,
                   60.0, 120.0, 240.0, 480.0, 960.0, 1920.0, 7680.0)
ITERATION_TOKEN_BUCKETS = (1, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096, 8192, 16384)
# vLLM's buckets (1 holds 0 and 1), and 0 so that never-preempted requests count apart
REQUEST_PREEMPTION_BUCKETS = (0, 1, 2, 3, 4, 5, 10, 20)
CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"


class ServerMetrics:
    """The series of one server, in a registry of its own; updated by the engine thread after
    every step and every change of its queues (`observe_state`, `observe_batch`), every
    request's first token (`observe_first_token`) and every finished request
    (`observe_finished`)."""

    def __init__(self, model_name: str, manager: KVCacheManager, config_labels: dict[str, str],
                 policy: str, scheduler_labels: dict[str, str] | None = None) -> None:
        self.registry = registry = CollectorRegistry()
        labels = ["model_name"]
        self._labels = {"model_name": model_name}

        # Children bound to this server's labels once: the engine thread updates them every
        # step, and a labels() lookup takes a lock and a dict probe each time.
        def gauge(name: str, text: str) -> Gauge:
            return Gauge(name, text, labels, registry=registry).labels(**self._labels)

        def counter(name: str, text: str) -> Counter:
            return Counter(name, text, labels, registry=registry).labels(**self._labels)

        def histogram(name: str, text: str, buckets: Sequence[float]) -> Histogram:
            return Histogram(name, text, labels, buckets=buckets,
                             registry=registry).labels(**self._labels)

        self.running = gauge("vllm:num_requests_running", "Requests in the running batch.")
        self.waiting = gauge("vllm:num_requests_waiting", "Requests waiting to be scheduled.")
        self.swapped = gauge("kvlab:num_requests_swapped", "Requests swapped out to host.")
        self.kv_usage = gauge("vllm:kv_cache_usage_perc", "KV-cache usage, 1 is 100 percent.")
        self.used_pages = gauge("kvlab:kv_pages_used", "KV pages held by requests.")
        self.cached_pages = gauge("kvlab:kv_pages_cached_free",
                                  "KV pages without an owner that keep a cached prefix.")
        self.free_pages = gauge("kvlab:kv_pages_free", "KV pages free.")
        self.host_pages = gauge("kvlab:host_pages_used", "Host swap pages holding swapped KV.")
        self.internal_frag = gauge(
            "kvlab:internal_fragmentation_perc",
            "Share of the token slots of used pages that hold no token (0..1).")
        self.external_frag = gauge("kvlab:external_fragmentation_pages",
                                   "Free pages the allocator cannot hand out as the runs it needs.")
        self.preemptions = counter("vllm:num_preemptions", "Preemptions (recompute or swap).")
        self.swaps_out = counter("kvlab:swaps_out", "Requests swapped out to host memory.")
        self.swaps_in = counter("kvlab:swaps_in", "Requests swapped back in.")
        self.prefix_queries = counter("vllm:prefix_cache_queries",
                                      "Prompt tokens looked up in the prefix cache.")
        self.prefix_hits = counter("vllm:prefix_cache_hits", "Prompt tokens found cached.")
        self.prompt_tokens = counter("vllm:prompt_tokens", "Prompt tokens of finished requests.")
        self.generation_tokens = counter("vllm:generation_tokens", "Tokens generated.")
        self.request_success = Counter("vllm:request_success", "Requests finished.",
                                       [*labels, "finished_reason"], registry=registry)
        self.ttft = histogram("vllm:time_to_first_token_seconds", "Time to first token.",
                              TTFT_BUCKETS)
        self.itl = histogram("vllm:inter_token_latency_seconds", "Time between two tokens.",
                             ITL_BUCKETS)
        self.e2e = histogram("vllm:e2e_request_latency_seconds", "Arrival to finish.",
                             LATENCY_BUCKETS)
        self.queue_time = histogram("vllm:request_queue_time_seconds",
                                    "Taken in by the engine to first scheduled.", LATENCY_BUCKETS)
        self.prefill_time = histogram("vllm:request_prefill_time_seconds",
                                      "First scheduled to first token.", LATENCY_BUCKETS)
        self.request_preemptions = histogram(
            "vllm:request_num_preemptions", "Histogram of the number of times a request was "
            "preempted.", REQUEST_PREEMPTION_BUCKETS)
        self.iteration_tokens = histogram("vllm:iteration_tokens_total",
                                          "Tokens computed per engine step.",
                                          ITERATION_TOKEN_BUCKETS)
        info = Gauge("vllm:cache_config_info", "The KV cache's configuration.",
                     sorted(config_labels), registry=registry)
        info.labels(**config_labels).set(1)
        Gauge("kvlab:policy_info", "The memory policy served.", ["model_name", "policy"],
              registry=registry).labels(model_name=model_name, policy=policy).set(1)
        if scheduler_labels:
            # What a benchmark client needs to simulate this server (vLLM exports none).
            scheduler = {"model_name": model_name, **scheduler_labels}
            Gauge("kvlab:scheduler_config_info", "The scheduler's limits.", sorted(scheduler),
                  registry=registry).labels(**scheduler).set(1)
        self._manager = manager
        self._seen = {"preemptions": 0, "swaps_out": 0, "swaps_in": 0, "queries": 0, "hits": 0,
                      "itls": 0}
        self._precision_series(registry, model_name)

    def _precision_series(self, registry: CollectorRegistry, model_name: str) -> None:
        """With a precision policy: pages at each level and pages demoted into each, a label
        per level and its dtype (policies/precision/mix.py)."""
        self.precision_pages: list[Gauge] = []
        self.precision_demotions: list[Counter] = []
        precision = self._manager.precision
        if precision is None:
            return
        labels = ["model_name", "level", "dtype"]
        pages = Gauge("kvlab:kv_pages_at_precision", "KV pages held or cached at each precision "
                      "level (0: the cache's dtype), at the last step's start.", labels,
                      registry=registry)
        demoted = Counter("kvlab:kv_page_demotions", "KV pages demoted into each precision "
                          "level.", labels, registry=registry)
        for level, dtype in enumerate(precision.ledger.ladder.names):
            self.precision_pages.append(pages.labels(model_name, str(level), dtype))
            if level:
                self.precision_demotions.append(demoted.labels(model_name, str(level), dtype))
                self._seen[f"demotions_{level}"] = 0

    def observe_state(self, scheduler: Scheduler) -> None:
        """Queues, memory and counters as they are now (engine thread)."""
        manager, seen = self._manager, self._seen
        usage = manager.usage()
        self.running.set(len(scheduler.running))
        self.waiting.set(len(scheduler.waiting))
        self.swapped.set(len(scheduler.swapped))
        self.kv_usage.set(_kv_usage(manager, usage))
        self.used_pages.set(usage.num_used_pages)
        self.cached_pages.set(usage.num_cached_free_pages)
        self.free_pages.set(usage.num_free_pages)
        self.host_pages.set(usage.num_host_used_pages)
        slots = usage.num_used_pages * usage.page_size
        self.internal_frag.set(usage.num_internal_frag_slots / slots if slots else 0.0)
        self.external_frag.set(usage.num_external_frag_pages)
        page_size, precision = manager.page_size, manager.precision
        demoted = precision.ledger.demotions if precision is not None else []
        for name, counter, total in (
            ("preemptions", self.preemptions, scheduler.num_preemptions),
            ("swaps_out", self.swaps_out, scheduler.num_swaps_out),
            ("swaps_in", self.swaps_in, scheduler.num_swaps_in),
            ("queries", self.prefix_queries, usage.num_prefix_queries * page_size),
            ("hits", self.prefix_hits, usage.num_prefix_hits * page_size),
            *((f"demotions_{level}", counter, demoted[level])  # (a precision policy's)
              for level, counter in enumerate(self.precision_demotions, 1)),
        ):
            if total > seen[name]:
                counter.inc(total - seen[name])
                seen[name] = total
        itls = scheduler.itls_s
        for gap in itls[seen["itls"]:]:
            self.itl.observe(gap)
        seen["itls"] = len(itls)
        if precision is not None and len(precision.mix):  # (pages at each level, last step)
            for gauge, pages in zip(self.precision_pages, precision.mix.pages_at_level,
                                    strict=True):
                gauge.set(pages[-1])

    def itls_dropped(self) -> None:
        """The scheduler's inter-token gaps were emptied after `observe_state` read them all
        (a server keeping no history): read the next ones from the start."""
        self._seen["itls"] = 0

    def observe_batch(self, output: SchedulerOutput) -> None:
        """The tokens a step computed (engine thread)."""
        if output.requests:
            self.iteration_tokens.observe(output.num_batched_tokens)

    def observe_first_token(self, request: Request) -> None:
        """A request's first token goes out (engine thread): its TTFT, counted then as vLLM
        counts it, so that a scrape during a run sees the requests served so far (a
        benchmark's API-latency fit pairs each scrape interval's with its client's)."""
        if request.first_token_s is not None:
            self.ttft.observe(request.first_token_s - request.arrival_s)

    def observe_finished(self, request: Request, finished_reason: str,
                         queued_s: float) -> None:
        """A request ended (engine thread): its latencies and token counts. Its queue time
        counts from `queued_s`, when the engine took it in, as vLLM's counts from when its
        engine core queued it, at a step's boundary: a server's TTFT less its queue and
        prefill times is then what it spends outside its engine's queue and steps
        (`calibrate --from-bench` reads it)."""
        self.request_success.labels(finished_reason=finished_reason, **self._labels).inc()
        self.prompt_tokens.inc(request.prompt_len)
        self.generation_tokens.inc(request.num_output_tokens)
        if request.first_scheduled_s is not None:
            self.queue_time.observe(max(0.0, request.first_scheduled_s - queued_s))
            if request.first_token_s is not None:
                self.prefill_time.observe(request.first_token_s - request.first_scheduled_s)
        if request.finish_s is not None:
            self.e2e.observe(request.finish_s - request.arrival_s)
        self.request_preemptions.observe(request.num_preemptions)

    def exposition(self) -> bytes:
        """The Prometheus text format of every series."""
        return generate_latest(self.registry)


def _kv_usage(manager: KVCacheManager, usage: MemoryUsage) -> float:
    """The share of the device's KV bytes that held pages fill: demoted pages fill less than
    a page (`PrecisionLedger.num_spared_pages`), and a precision policy's pool holds more
    page ids than the device has pages of the cache's dtype."""
    precision = manager.precision
    if precision is None:
        return usage.num_used_pages / usage.num_total_pages
    return (usage.num_used_pages - precision.ledger.num_spared_pages) / manager.num_total_pages
