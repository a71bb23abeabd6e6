"""`Trace.info()`: duration, rate, length percentiles and prefix-sharing potential."""

import math

import pytest

from kvlab.traces import Trace, TraceRequest, format_info


def make_trace(*requests):
    return Trace("t", "mooncake", "synthetic", list(requests))


def test_rate_is_requests_over_the_arrival_span():
    info = make_trace(TraceRequest(0, 0.0, 10, 1), TraceRequest(1, 1.0, 20, 2),
                      TraceRequest(2, 4.0, 30, 3)).info()
    assert (info.num_requests, info.duration_s, info.request_rate) == (3, 4.0, 0.75)


def test_simultaneous_arrivals_have_an_infinite_rate():
    info = make_trace(TraceRequest(0, 0.0, 10, 1), TraceRequest(1, 0.0, 20, 2)).info()
    assert math.isinf(info.request_rate)


def test_length_statistics_use_linear_percentiles():
    requests = [TraceRequest(i, float(i), i + 1, 2 * (i + 1)) for i in range(101)]
    info = make_trace(*requests).info()
    assert (info.input_len.mean, info.input_len.p50, info.input_len.p90) == (51, 51, 91)
    assert (info.input_len.p99, info.input_len.max) == (100, 101)
    assert info.output_len.max == 202


def test_prefix_share_counts_blocks_seen_before():
    info = make_trace(TraceRequest(0, 0.0, 1500, 1, (1, 2, 3)),
                      TraceRequest(1, 1.0, 1100, 1, (1, 2, 4)),
                      TraceRequest(2, 2.0, 10, 1, (5,))).info()
    assert info.prefix_share == pytest.approx(2 / 7)
    assert info.hash_block_size == 512


def test_no_hash_ids_means_no_prefix_share():
    assert make_trace(TraceRequest(0, 0.0, 1, 1)).info().prefix_share is None


def test_table_aligns_values_in_one_column():
    text = format_info(make_trace(TraceRequest(0, 0.0, 1500, 1, (1, 2, 3)),
                                  TraceRequest(1, 2.0, 1100, 1, (1, 2, 4))).info())
    lines = [line for line in text.splitlines() if ":" in line]
    assert all(line.index(":") < 39 and line[39] == " " != line[40] for line in lines)
    assert "Prefix sharing (512-token blocks):" in text
