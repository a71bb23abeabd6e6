"""split_windows: consecutive validated and calibration excerpts of one trace."""

from __future__ import annotations

import pytest

from kvlab.errors import KvlabError
from kvlab.traces import load_trace, split_windows


def test_windows_take_consecutive_requests_and_start_where_the_trace_does():
    trace = load_trace("azure", num_prompts=20)
    pairs = split_windows(trace, 3, 2, 4)
    ids = [r.request_id for pair in pairs for part in pair for r in part.requests]
    assert ids == [r.request_id for r in trace.requests]
    assert [len(part) for pair in pairs for part in pair] == [3, 2] * 4
    origin = trace.requests[0].arrival_s
    for validated, calibration in pairs:
        assert validated.requests[0].arrival_s == pytest.approx(origin)
        assert calibration.requests[0].arrival_s == pytest.approx(0.0)
    # Shifted as a whole: the gaps between arrivals are the trace's.
    original = [r.arrival_s for r in trace.requests[5:8]]
    shifted = [r.arrival_s for r in pairs[1][0].requests]
    assert shifted == pytest.approx([t - original[0] + origin for t in original])
    assert pairs[1][0].name.endswith("(window 2)")
    assert pairs[1][1].name.endswith("(calibration window 2)")


def test_one_window_keeps_the_trace_name_and_arrivals():
    trace = load_trace("azure", num_prompts=5)
    (validated, calibration), = split_windows(trace, 3, 2, 1)
    assert validated.name == trace.name
    assert [r.arrival_s for r in validated.requests] == [r.arrival_s for r in trace.requests[:3]]
    assert calibration.name == f"{trace.name} (calibration window)"


def test_too_few_requests_name_what_the_windows_need():
    trace = load_trace("azure", num_prompts=9)
    with pytest.raises(KvlabError, match=r"9 requests.*need 10"):
        split_windows(trace, 3, 2, 2)
