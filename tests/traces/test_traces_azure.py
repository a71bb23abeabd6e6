"""The Azure CSV loader: parsing, ordering, the bundled excerpts and its error messages."""

import pytest

from kvlab.errors import KvlabError
from kvlab.traces import bundled_trace_path, load_azure

HEADER = "TIMESTAMP,ContextTokens,GeneratedTokens"


def write(tmp_path, *rows, name="trace.csv", header=HEADER, newline="\n"):
    path = tmp_path / name
    path.write_text(newline.join([header, *rows]) + newline, newline="")
    return path


def test_arrivals_are_seconds_since_the_first_row(tmp_path):
    path = write(tmp_path, "2023-11-16 18:15:46.6805900,374,44",
                 "2023-11-16 18:15:50.9951690,396,109", "2023-11-16 18:16:46.6805901,10,1")
    trace = load_azure(path)
    assert [r.arrival_s for r in trace.requests] == pytest.approx([0.0, 4.314579, 60.0000001],
                                                                  abs=1e-9)
    assert [(r.input_len, r.output_len) for r in trace.requests] == [(374, 44), (396, 109),
                                                                     (10, 1)]
    assert [r.request_id for r in trace.requests] == [0, 1, 2]
    assert (trace.dataset_name, trace.name, trace.source) == ("azure", "trace.csv", str(path))


def test_rows_out_of_time_order_are_sorted_stably(tmp_path):
    path = write(tmp_path, "2023-11-16 18:00:05.0,1,1", "2023-11-16 18:00:01.0,2,2",
                 "2023-11-16 18:00:05.0,3,3")
    trace = load_azure(path)
    assert [r.input_len for r in trace.requests] == [2, 1, 3]
    assert [r.arrival_s for r in trace.requests] == [0.0, 4.0, 4.0]


def test_num_prompts_keeps_the_first_requests_in_arrival_order(tmp_path):
    path = write(tmp_path, "2023-11-16 18:00:05.0,1,1", "2023-11-16 18:00:01.0,2,2",
                 "2023-11-16 18:00:03.0,3,3")
    trace = load_azure(path, num_prompts=2)
    assert [r.input_len for r in trace.requests] == [2, 3]


def test_blank_lines_and_crlf_endings_are_accepted(tmp_path):
    path = write(tmp_path, "2023-11-16 18:00:00.0,1,1", "", "2023-11-16 18:00:01.0,2,2", "",
                 newline="\r\n")
    assert [r.input_len for r in load_azure(path).requests] == [1, 2]


def test_bundled_conv_excerpt_is_a_ten_minute_window():
    trace = load_azure(bundled_trace_path("azure-conv"))
    assert len(trace) == 2867
    assert 599 < trace.requests[-1].arrival_s < 600
    assert (trace.name, trace.source) == ("azure-conv excerpt", "bundled:azure_conv_excerpt.csv")


def test_bundled_code_excerpt_loads():
    trace = load_azure(bundled_trace_path("azure-code"))
    assert len(trace) == 1482
    assert trace.requests[-1].arrival_s < 600


def test_word_in_a_length_column_names_file_line_column_and_value(tmp_path):
    path = write(tmp_path, *["2023-11-16 18:00:00.0,1,1"] * 5, "2023-11-16 18:00:01.0,twelve,2")
    with pytest.raises(KvlabError) as err:
        load_azure(path)
    assert str(err.value) == f"{path} line 7, column ContextTokens: 'twelve' is not a whole number"


def test_line_numbers_count_blank_lines(tmp_path):
    path = write(tmp_path, "2023-11-16 18:00:00.0,1,1", "", "  ", "2023-11-16 18:00:01.0,1,2.5")
    with pytest.raises(KvlabError, match=r"line 5, column GeneratedTokens: '2.5' is not a whole"):
        load_azure(path)


@pytest.mark.parametrize("value", ["0", "-3"])
def test_zero_or_negative_length_is_an_error(tmp_path, value):
    path = write(tmp_path, "2023-11-16 18:00:00.0,1,1", f"2023-11-16 18:00:01.0,5,{value}")
    with pytest.raises(KvlabError) as err:
        load_azure(path)
    assert str(err.value) == (f"{path} line 3, column GeneratedTokens: '{value}' is too small: "
                              "expected a whole number >= 1")


def test_the_earliest_bad_row_is_reported_whatever_its_column(tmp_path):
    path = write(tmp_path, "2023-11-16 18:00:00.0,1,x", "2023-11-16 18:00:01.0,y,2")
    with pytest.raises(KvlabError, match=r"line 2, column GeneratedTokens: 'x'"):
        load_azure(path)


def test_bad_timestamp_is_an_error(tmp_path):
    path = write(tmp_path, "2023-11-16 18:00:00.0,1,1", "yesterday,1,1")
    with pytest.raises(KvlabError) as err:
        load_azure(path)
    assert str(err.value) == (f"{path} line 3, column TIMESTAMP: 'yesterday' is not a timestamp "
                              "like 2023-11-16 18:15:46.6805900")


def test_missing_column_is_an_error(tmp_path):
    path = write(tmp_path, "2023-11-16 18:00:00.0,1", header="TIMESTAMP,ContextTokens")
    with pytest.raises(KvlabError, match=r"trace.csv line 1: missing column GeneratedTokens"):
        load_azure(path)


@pytest.mark.parametrize("row, count", [("2023-11-16 18:00:01.0,1,1,1", 4),
                                        ("2023-11-16 18:00:01.0,1", 2)])
def test_row_with_wrong_field_count_is_an_error(tmp_path, row, count):
    path = write(tmp_path, "2023-11-16 18:00:00.0,1,1", row)
    with pytest.raises(KvlabError) as err:
        load_azure(path)
    assert str(err.value) == f"{path} line 3: {count} fields, expected 3 ({HEADER})"


def test_missing_file_is_an_error(tmp_path):
    with pytest.raises(KvlabError, match=r"nope.csv: no such file"):
        load_azure(tmp_path / "nope.csv")


def test_header_only_file_is_an_error(tmp_path):
    with pytest.raises(KvlabError, match=r"no requests, only a header"):
        load_azure(write(tmp_path))
