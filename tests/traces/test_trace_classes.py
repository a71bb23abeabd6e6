"""Priorities and SLO classes from traces: the optional trace fields and columns, and workload
specs of request classes; every mistake names the file, the line or class, and the key."""

from __future__ import annotations

import collections
import json
import re
import textwrap

import pytest

from kvlab.errors import KvlabError
from kvlab.traces import load_trace

SPEC = """\
num_prompts: 400
classes:
  - name: chat
    rate: 4.0
    priority: 0
    input_len: {mean: 200, range_ratio: 0.5}
    output_len: {lognormal: {mean: 50, sigma: 0.5}}
    prefix_len: 64
    num_prefix_groups: 2
    slo: {ttft: 500, tpot: 50}
  - name: batch
    rate: 1.0
    priority: 1
    burstiness: 0.5
    input_len: 1000
    output_len: {mean: 100}
"""


def _spec(tmp_path, text=SPEC):
    path = tmp_path / "spec.yaml"
    path.write_text(textwrap.dedent(text))
    return path


def test_a_workload_spec_draws_its_classes_at_their_rates(tmp_path):
    trace = load_trace("workload", _spec(tmp_path), seed=3)
    assert len(trace) == 400 and trace.dataset_name == "workload"
    counts = collections.Counter(r.slo_class for r in trace.requests)
    assert 0.7 < counts["chat"] / 400 < 0.9  # 4 of 5 requests per second
    chat = [r for r in trace.requests if r.slo_class == "chat"]
    batch = [r for r in trace.requests if r.slo_class == "batch"]
    assert {r.priority for r in chat} == {0} and {r.priority for r in batch} == {1}
    assert all(164 <= r.input_len <= 364 for r in chat)  # 64 prefix + uniform 100..300
    assert {r.input_len for r in batch} == {1000}
    assert all(r.hash_ids[:4] in ((0, 1, 2, 3), (4, 5, 6, 7)) for r in chat)
    arrivals = [r.arrival_s for r in trace.requests]
    assert arrivals == sorted(arrivals) and arrivals[0] == 0.0
    assert trace.result_metadata()["slo_classes"] == {"chat": {"ttft": 500.0, "tpot": 50.0}}
    assert load_trace("workload", _spec(tmp_path), seed=3).requests == trace.requests
    assert len(load_trace("workload", _spec(tmp_path), num_prompts=10)) == 10


@pytest.mark.parametrize("change, words", [
    (("rate: 4.0", "rate: -1"), "class chat, rate: -1 is not a number > 0"),
    (("priority: 0", "priority: high"), "class chat, priority: 'high' is not a whole number"),
    (("slo: {ttft: 500, tpot: 50}", "slo: {ttfb: 5}"), "class chat, slo:"),
    (("input_len: 1000", "input_len: {median: 3}"), "class batch, input_len:"),
    (("  - name: batch", "  - name: chat"), "class names repeat"),
    (("    burstiness: 0.5\n", "    burst: 0.5\n"), "classes[1]: unknown key 'burst'"),
    (("num_prompts: 400", "num_prompts: 0"), "num_prompts: 0 is not a whole number >= 1"),
])
def test_a_bad_spec_names_its_class_and_key(tmp_path, change, words):
    with pytest.raises(KvlabError) as err:
        load_trace("workload", _spec(tmp_path, SPEC.replace(*change)))
    assert words in str(err.value)
    assert str(tmp_path / "spec.yaml") in str(err.value)


def test_a_spec_that_is_not_yaml_names_its_line(tmp_path):
    with pytest.raises(KvlabError, match=r"spec.yaml line 3: not a YAML workload spec"):
        load_trace("workload", _spec(tmp_path, "classes:\n  - name: a\n  - : : [\n"))


def test_mooncake_and_azure_rows_carry_their_priority_and_class(tmp_path):
    rows = [{"timestamp": 0, "input_length": 10, "output_length": 2, "hash_ids": [1],
             "priority": 2, "slo_class": "batch"},
            {"timestamp": 5, "input_length": 10, "output_length": 2, "hash_ids": [2]}]
    path = tmp_path / "t.jsonl"
    path.write_text("\n".join(json.dumps(row) for row in rows) + "\n")
    trace = load_trace("mooncake", path)
    assert [(r.priority, r.slo_class) for r in trace.requests] == [(2, "batch"), (0, None)]
    csv = tmp_path / "t.csv"
    csv.write_text("TIMESTAMP,ContextTokens,GeneratedTokens,priority\n"
                   "2023-11-16 18:15:46.6805900,10,2,-1\n2023-11-16 18:15:47.0,10,2,3\n")
    assert [r.priority for r in load_trace("azure", csv).requests] == [-1, 3]


def test_a_bad_priority_names_the_line(tmp_path):
    path = tmp_path / "t.jsonl"
    path.write_text(json.dumps({"timestamp": 0, "input_length": 10, "output_length": 2,
                                "hash_ids": [1], "priority": 1.5}) + "\n")
    with pytest.raises(KvlabError, match=r"t.jsonl line 1, field priority: 1.5 is not a whole"):
        load_trace("mooncake", path)
    csv = tmp_path / "t.csv"
    csv.write_text("TIMESTAMP,ContextTokens,GeneratedTokens,priority\n"
                   "2023-11-16 18:15:46.6805900,10,2,urgent\n")
    with pytest.raises(KvlabError, match=r"t.csv line 2, column priority: 'urgent'"):
        load_trace("azure", csv)


def test_classes_may_take_shares_of_one_request_rate(tmp_path):
    shared = SPEC.replace("num_prompts: 400\n", "num_prompts: 400\nrequest_rate: 5.0\n") \
        .replace("rate: 4.0", "share: 0.8").replace("rate: 1.0", "share: 0.2")
    by_share = load_trace("workload", _spec(tmp_path, shared), seed=3)
    by_rate = load_trace("workload", _spec(tmp_path), seed=3)
    assert by_share.requests == by_rate.requests  # 0.8 and 0.2 of 5 req/s: 4 and 1


@pytest.mark.parametrize("change, words", [
    (("rate: 4.0", "share: 0.8"), "some classes give a rate, others a share"),
    (("rate: 4.0", "rate: 4.0\n    share: 0.5"), "give its rate (requests/s) or its share"),
    (("num_prompts: 400", "num_prompts: 400\nrequest_rate: 3"), "request_rate applies to "),
])
def test_a_spec_mixing_rates_and_shares_is_refused(tmp_path, change, words):
    with pytest.raises(KvlabError, match=re.escape(words)):
        load_trace("workload", _spec(tmp_path, SPEC.replace(*change)))


def test_traces_info_counts_each_class(tmp_path):
    from kvlab.traces.stats import format_info

    info = load_trace("workload", _spec(tmp_path), seed=3).info()
    assert set(info.classes) == {"chat", "batch"}
    assert sum(count for count, _, _ in info.classes.values()) == 400
    assert info.classes["batch"][1] == 1000.0  # every batch prompt is 1,000 tokens
    assert "Class             requests   mean in  mean out" in format_info(info)
    assert load_trace("azure").info().classes == {}
