"""The Mooncake JSONL loader: timestamps in ms, chained hash ids, and its error messages."""

import json
import math

import pytest

from kvlab.errors import KvlabError
from kvlab.traces import bundled_trace_path, load_mooncake


def row(timestamp, input_length, output_length=5, hash_ids=None):
    if hash_ids is None:
        hash_ids = list(range(math.ceil(input_length / 512)))
    return json.dumps({"timestamp": timestamp, "input_length": input_length,
                       "output_length": output_length, "hash_ids": hash_ids})


def write(tmp_path, *lines):
    path = tmp_path / "trace.jsonl"
    path.write_text("\n".join(lines) + "\n")
    return path


def test_rows_become_requests_with_hash_ids(tmp_path):
    path = write(tmp_path, row(1000, 600, 7, [3, 4]), row(3500, 512, 2, [3]))
    trace = load_mooncake(path)
    first, second = trace.requests
    assert (first.arrival_s, first.input_len, first.output_len) == (0.0, 600, 7)
    assert (first.hash_ids, first.hash_block_size) == ((3, 4), 512)
    assert (second.arrival_s, second.hash_ids) == (2.5, (3,))
    assert trace.dataset_name == "mooncake"


def test_rows_are_sorted_by_timestamp(tmp_path):
    path = write(tmp_path, row(50, 1, 1, [1]), row(10, 2, 1, [2]), "", row(50, 3, 1, [3]))
    trace = load_mooncake(path, num_prompts=2)
    assert [r.hash_ids for r in trace.requests] == [(2,), (1,)]


def test_bundled_excerpt_is_the_first_600_rows():
    path = bundled_trace_path("mooncake")
    rows = [json.loads(line) for line in path.read_text().splitlines()]
    trace = load_mooncake(path)
    assert len(trace) == len(rows) == 600
    assert [r.hash_ids for r in trace.requests] == [tuple(r["hash_ids"]) for r in rows]


def test_wrong_number_of_hash_ids_names_the_line(tmp_path):
    path = write(tmp_path, row(0, 10), row(5, 1025, 1, [1, 2]))
    with pytest.raises(KvlabError) as err:
        load_mooncake(path)
    assert str(err.value) == (f"{path} line 2, field hash_ids: 2 ids for input_length 1025; "
                              "expected ceil(1025/512) = 3")


def test_a_repeated_hash_id_names_the_line(tmp_path):
    path = write(tmp_path, row(0, 10), row(5, 1025, 1, [7, 8, 7]))
    with pytest.raises(KvlabError, match=r"line 2, field hash_ids: an id repeats"):
        load_mooncake(path)


def test_non_number_length_is_an_error(tmp_path):
    path = write(tmp_path, row(0, 10), row(5, "ten", 1, [1]))
    with pytest.raises(KvlabError) as err:
        load_mooncake(path)
    assert str(err.value) == f'{path} line 2, field input_length: "ten" is not a whole number'


def test_zero_output_length_is_an_error(tmp_path):
    path = write(tmp_path, row(0, 10, 0))
    with pytest.raises(KvlabError, match=r"line 1, field output_length: 0 is too small"):
        load_mooncake(path)


def test_bad_timestamp_is_an_error(tmp_path):
    path = write(tmp_path, row("noon", 10))
    with pytest.raises(KvlabError, match=r'line 1, field timestamp: "noon" is not a number'):
        load_mooncake(path)


def test_missing_field_is_an_error(tmp_path):
    path = write(tmp_path, json.dumps({"timestamp": 0, "input_length": 3, "output_length": 1}))
    with pytest.raises(KvlabError, match=r"line 1: missing field hash_ids"):
        load_mooncake(path)


def test_invalid_json_names_line_and_column(tmp_path):
    path = write(tmp_path, row(0, 10), '{"timestamp": 0,, "input_length": 3}')
    with pytest.raises(KvlabError, match=r"trace.jsonl line 2, column 17: not valid JSON"):
        load_mooncake(path)
