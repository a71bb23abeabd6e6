"""The BurstGPT CSV loader: failed requests are skipped and counted."""

import pytest

from kvlab.errors import KvlabError
from kvlab.traces import load_burstgpt

HEADER = "Timestamp,Model,Request tokens,Response tokens,Total tokens,Log Type"


def write(tmp_path, *rows):
    path = tmp_path / "burst.csv"
    path.write_text("\n".join([HEADER, *rows]) + "\n")
    return path


def test_rows_become_requests_relative_to_the_first_timestamp(tmp_path):
    path = write(tmp_path, "5,ChatGPT,472,18,490,Conversation log",
                 "45.5,GPT-4,1087,230,1317,API log")
    trace = load_burstgpt(path)
    assert [(r.arrival_s, r.input_len, r.output_len) for r in trace.requests] == [
        (0.0, 472, 18), (40.5, 1087, 230)]
    assert trace.dataset_name == "burstgpt"
    assert trace.metadata["num_failed_skipped"] == 0


def test_failed_requests_are_skipped_counted_and_warned(tmp_path):
    path = write(tmp_path, "1,ChatGPT,10,0,10,Conversation log", "2,ChatGPT,20,3,23,API log",
                 "3,ChatGPT,30,0,30,API log")
    with pytest.warns(UserWarning, match=r"skipped 2 failed requests"):
        trace = load_burstgpt(path)
    assert [r.input_len for r in trace.requests] == [20]
    assert trace.requests[0].arrival_s == 0.0
    assert trace.metadata["num_failed_skipped"] == 2


def test_only_the_three_used_columns_are_required(tmp_path):
    path = tmp_path / "burst.csv"
    path.write_text("Timestamp, Request tokens, Response tokens\n1, 10, 2\n")
    assert load_burstgpt(path).requests[0].input_len == 10


def test_bad_timestamp_is_an_error(tmp_path):
    path = write(tmp_path, "1,ChatGPT,10,1,11,API log", "soon,ChatGPT,10,1,11,API log")
    with pytest.raises(KvlabError) as err:
        load_burstgpt(path)
    assert str(err.value) == f"{path} line 3, column Timestamp: 'soon' is not a number of seconds"


def test_negative_response_tokens_is_an_error(tmp_path):
    path = write(tmp_path, "1,ChatGPT,10,-1,9,API log")
    with pytest.raises(KvlabError, match=r"line 2, column Response tokens: '-1' is too small"):
        load_burstgpt(path)


def test_a_trace_of_only_failures_is_an_error(tmp_path):
    path = write(tmp_path, "1,ChatGPT,10,0,10,API log")
    with pytest.warns(UserWarning), pytest.raises(KvlabError, match=r"every request failed"):
        load_burstgpt(path)


def test_the_cli_prints_a_skip_as_one_warning_line(tmp_path, capsys):
    from kvlab.cli import main

    path = tmp_path / "burst.csv"
    path.write_text("Timestamp,Model,Request tokens,Response tokens,Total tokens,Log Type\n"
                    "5,ChatGPT,10,5,15,Conversation log\n6,ChatGPT,10,0,10,Conversation log\n")
    assert main(["sim", "--dataset-name", "burstgpt", "--dataset-path", str(path),
                 "--disable-tqdm"]) == 0
    err = capsys.readouterr().err
    assert err == f"kvlab sim: warning: {path}: skipped 1 failed requests (0 response tokens)\n"
