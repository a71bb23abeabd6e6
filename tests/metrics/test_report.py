"""The printed report's vLLM layout and the side-by-side policy comparison."""

import pytest

from kvlab.cli.report import format_comparison, format_report
from kvlab.metrics import summarize


@pytest.fixture(scope="module")
def summary(make_request, make_result):
    """A summary of two requests with every latency metric, p50/p99.9 and a goodput SLO."""
    requests = [
        make_request(0, arrival_s=0.0, first_token_s=0.1, finish_s=1.1, output_len=11),
        make_request(1, arrival_s=0.5, first_token_s=0.7, finish_s=1.7, output_len=11),
    ]
    result = make_result(
        requests, itls_s=[0.1] * 20, duration_s=2.0, metadata={"policy": "paged:lru"}
    )
    return summarize(
        result,
        percentile_metrics=("ttft", "tpot", "itl", "e2el"),
        metric_percentiles=(50, 99.9),
        goodput_slos={"ttft": 150.0},
    )


def _line(report: str, label: str) -> str:
    (line,) = [line for line in report.splitlines() if line.startswith(label)]
    return line


def test_title_is_centred_in_50_equals(summary):
    first = format_report(summary).splitlines()[0]
    assert first == "============ Serving Benchmark Result ============"


def test_report_ends_with_50_equals(summary):
    assert format_report(summary).splitlines()[-1] == "=" * 50


def test_float_rows_are_padded_to_40_then_10_with_two_decimals(summary):
    line = _line(format_report(summary), "Mean TTFT (ms):")
    assert line == "Mean TTFT (ms):".ljust(40) + " " + "150.00".ljust(10)


def test_integer_rows_have_no_decimals(summary):
    line = _line(format_report(summary), "Successful requests:")
    assert line == "Successful requests:".ljust(40) + " " + "2".ljust(10)


def test_throughput_rows_use_vllm_labels(summary):
    report = format_report(summary)
    assert _line(report, "Request throughput (req/s):").split()[-1] == "1.00"
    assert _line(report, "Request goodput (req/s):").split()[-1] == "0.50"
    assert _line(report, "Total generated tokens:").split()[-1] == "22"
    assert "Total Token throughput (tok/s):" in report


def test_metric_sections_have_centred_dash_headers(summary):
    lines = format_report(summary).splitlines()
    assert "---------------Time to First Token----------------" in lines
    assert "-----Time per Output Token (excl. 1st token)------" in lines
    assert "---------------Inter-token Latency----------------" in lines


def test_percentile_rows_follow_mean_and_median(summary):
    lines = format_report(summary).splitlines()
    start = lines.index("---------------Inter-token Latency----------------")
    labels = [line[:40].strip() for line in lines[start + 1 : start + 5]]
    assert labels == ["Mean ITL (ms):", "Median ITL (ms):", "P50 ITL (ms):", "P99.9 ITL (ms):"]


def test_kv_cache_section_lists_memory_metrics(summary):
    report = format_report(summary)
    assert "---------------------KV Cache---------------------" in report.splitlines()
    assert _line(report, "KV cache size (tokens):").split()[-1] == "1600"
    assert _line(report, "Preemptions:").split()[-1] == "0"


def test_goodput_row_is_left_out_without_slos(make_request, make_result):
    report = format_report(summarize(make_result([make_request(0)])))
    assert "goodput" not in report


def test_configured_rate_row_only_when_finite(make_request, make_result):
    finite = summarize(make_result([make_request(0)], metadata={"request_rate": 4}))
    unbounded = summarize(make_result([make_request(0)], metadata={"request_rate": float("inf")}))
    assert _line(format_report(finite), "Request rate configured (RPS):").split()[-1] == "4.00"
    assert "Request rate configured" not in format_report(unbounded)


def test_run_section_shows_the_policy(summary):
    assert _line(format_report(summary), "Policy:").split()[-1] == "paged:lru"


def test_custom_title(summary):
    assert format_report(summary, title="Sim").splitlines()[0].strip("=") == " Sim "


def test_comparison_puts_runs_side_by_side(summary):
    slower = dict(summary, mean_ttft_ms=1234.5)
    table = format_comparison([summary, slower], ["lru", "fifo"])
    header = _line(table, "Metric")
    assert header.split() == ["Metric", "lru", "fifo"]
    assert _line(table, "Mean TTFT (ms):").split()[-2:] == ["150.00", "1234.50"]


def test_comparison_columns_are_right_aligned(summary):
    lines = format_comparison([summary, summary], ["a", "b"]).splitlines()
    rows = [lines[1], *lines[3:-1]]  # the header and the metric rows, between the rules
    assert len({len(line) for line in rows}) == 1
    assert all(not line.endswith(" ") for line in rows)


def test_comparison_abbreviates_long_labels_with_a_legend(summary):
    labels = ["paged:block=16,evict=lru,preempt=swap", "contiguous:reserve=max"]
    lines = format_comparison([summary, summary], labels).splitlines()
    assert _line("\n".join(lines), "Metric").split() == ["Metric", "[1]", "[2]"]
    assert lines[-2:] == [f"[1] {labels[0]}", f"[2] {labels[1]}"]


def test_comparison_shows_a_dash_for_missing_metrics(summary):
    without_goodput = {k: v for k, v in summary.items() if k != "request_goodput"}
    table = format_comparison([summary, without_goodput], ["with", "without"])
    assert _line(table, "Request goodput (req/s):").split()[-2:] == ["0.50", "-"]


def test_comparison_shows_a_precision_policys_mix_beside_a_plain_run(summary):
    demoting = dict(summary, precision_levels="auto/fp8_e4m3", precision_demotions_per_s=12.5,
                    precision_share_0_auto=0.25, precision_share_1_fp8_e4m3=0.75,
                    precision_demotions_1_fp8_e4m3=40, precision_max_debt_pages=0)
    table = format_comparison([summary, demoting], ["plain", "age"])
    assert _line(table, "Share at fp8_e4m3:").split()[-2:] == ["-", "0.75"]
    # (the level of the model's own dtype, `auto` in keys, says so)
    assert _line(table, "Share at auto (model dtype):").split()[-2:] == ["-", "0.25"]
    assert _line(table, "Pages demoted to fp8_e4m3:").split()[-2:] == ["-", "40"]
    assert "levels" not in table


def test_comparison_needs_one_label_per_summary(summary):
    with pytest.raises(ValueError):
        format_comparison([summary], ["a", "b"])


def test_a_long_value_widens_the_frame_around_it(summary):
    spec = "paged:eviction=slru:protected_share=0.5,preemption=swap,victim=longest"
    lines = format_report({**summary, "policy": spec}).splitlines()
    width = max(len(line) for line in lines)
    assert width > 50 and any(spec in line for line in lines)
    frames = [line for line in lines if set(line) <= {"=", "-"} or line.strip("=-") != line]
    assert frames and all(len(line) == width for line in frames)
    assert lines[0].strip("=") == " Serving Benchmark Result " and lines[-1] == "=" * width


def test_instances_show_demotions_per_second_only_where_pages_were_demoted(summary):
    from kvlab.cli.report import format_instances

    plain = [dict(summary, instance=i, role="mixed") for i in range(2)]
    assert "demotions/s" not in format_instances(plain)
    demoting = [dict(s, precision_demotions_per_s=12.5 * (1 + s["instance"])) for s in plain]
    lines = format_instances(demoting).splitlines()
    assert lines[1].split()[-1] == "demotions/s"
    assert [line.split()[-1] for line in lines[3:5]] == ["12.50", "25.00"]
