"""The tuning constants of calibrating from a bench run (`fidelity/from_bench.py` and its
rooms), in one place: what stage 2 matches and scales, how streamed chunks are grouped into
steps, the API latency's fit, and the thresholds of the warnings. Each says why its value."""

from __future__ import annotations

from typing import Any

# (summary key, weight) that stage 2 matches; log-ratio errors, so every metric counts alike.
MATCHED_METRICS = (("mean_ttft_ms", 1.0), ("median_ttft_ms", 0.5), ("mean_tpot_ms", 1.0),
                   ("median_tpot_ms", 0.5), ("mean_itl_ms", 0.5), ("mean_e2el_ms", 1.0),
                   ("duration", 1.0))
# Coefficient groups stage 2 scales together.
GROUPS = {
    "step": ("step_overhead_s", "seq_s"),
    "prefill": ("prefill_token_s", "attention_pair_s"),
    "decode": ("decode_token_s", "context_token_s", "padded_context_token_s",
               "first_decode_token_s"),
}
# The step terms stage 1 fits from outside a server: fewer than an engine's own profile allows
# (its features are reconstructed, its times noisier), so that collinear terms (per sequence,
# per decode token, padded context) do not trade places from one run to the next. kvlab serve
# keeps the padded decode context its torch backend reads.
BENCH_TERMS = ("step_overhead_s", "prefill_token_s", "attention_pair_s", "decode_token_s",
               "context_token_s")
BENCH_TERMS_KVLAB = (*BENCH_TERMS, "padded_context_token_s")
GAP_FRACTIONS = (0.05, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.65, 0.8)
# A chunk read up to this many median inter-chunk gaps after its step's first chunk may still
# join that step after the next step's chunks began (`_group`).
LATE_MEMBER_FRACTION = 1.5
# Chunks this many median gaps apart or less came in one read (or one burst of reads).
READ_TOGETHER_FRACTION = 0.05
LATENCY_STEP_S = 0.01  # stage 2 moves the API latency in steps of this size
# Stage 1 is fitted again at most this many times on the steps a request's way in (API plus
# in-server latency, measured on the fit before) cannot have held, until that way grows by
# less than the tolerance. Two: where the TTFT residuals measure it, the first fit's steps
# still hold part of the wait and the way in measured on them comes out short (a test's 50 ms
# delay: 36 ms in one run, 49-51 ms in others); measured on the refit, 52-54 ms.
INTAKE_PASSES = 2
INTAKE_TOLERANCE_S = 0.001
# Stage 2's loss adds, per run, this weight times the sum of the squared log-scale factors of
# the groups: the steps measured in stage 1 stay evidence. Why: free to move, stage 2 fitted
# busy calibration windows by doubling vLLM's step overhead, and every light step with it
# (window 1's TPOT +70-93% in four runs of 2026-12-02; docs/validation.md). Chosen among
# 0.02-8 on those runs: 2 kept stage 2's TTFT and halved the TPOT error.
STEP_PRIOR_WEIGHT = 2.0
# A load term of the API latency is fitted on at least this many scrape intervals, whose mean
# loads span at least this many requests in flight.
MIN_LATENCY_INTERVALS = 6
MIN_LOAD_SPREAD = 4.0
THEIL_SEN_POINTS = 1500  # points of the API-latency line at most (about 1.1M pairs)
POOR_FIT_ERROR = 0.10  # a matched metric further off than this after the fit is a warning
# A run during which the hypervisor withheld more than this share of the client host's CPU
# (steal time) is a warning: a server on that host ran slower for it (docs/validation.md)
STEAL_WARNING_PERC = 5.0
# The steal slowdowns stage 1 tries (`steal_step_fit`), and how far apart the calibration
# runs' steal shares must be for it to tell them apart.
STEAL_SLOWDOWNS = tuple(k / 4 for k in range(17))  # 0 to 4
MIN_STEAL_SPREAD = 0.03
# The knees stage 1 tries for the bent decode term (`bent_step_fit`): a step's first this many
# decodes cost more each. None below 4: there the term is the step overhead's twin (a trial
# that let it choose 2 on kvlab serve moved the overhead into it; docs/validation.md).
FIRST_DECODES = (4, 8, 16, 32)
# ... and keeps one only where it takes the steps' error this much below the line's. Measured:
# 15-30% on kvlab serve's steps (concave), 0-6% on vLLM's, where a knee chosen anyway made a
# fresh 10x run's windows worse (3 -> 2 of 4; docs/validation.md).
MIN_BENT_GAIN = 0.10
SUMMARY_OPTIONS: dict[str, Any] = {"percentile_metrics": ("ttft", "tpot", "itl", "e2el"),
                                   "metric_percentiles": (50, 99)}
