"""The `load_trace` dispatcher, bundled excerpts and dataset-name guessing."""

import pytest

from kvlab.errors import KvlabError
from kvlab.traces import (
    bundled_trace_path,
    bundled_traces,
    guess_dataset_name,
    load_trace,
)


def test_azure_without_a_path_loads_the_bundled_conv_excerpt():
    trace = load_trace("azure")
    assert (trace.name, trace.source) == ("azure-conv excerpt", "bundled:azure_conv_excerpt.csv")


def test_mooncake_without_a_path_loads_the_bundled_excerpt():
    trace = load_trace("mooncake", num_prompts=10)
    assert trace.source == "bundled:mooncake_excerpt.jsonl"
    assert len(trace) == 10


def test_a_bundled_name_works_as_a_path():
    assert load_trace("azure", "azure-code").name == "azure-code excerpt"


@pytest.mark.parametrize("dataset_name", ["burstgpt", "sharegpt"])
def test_datasets_without_an_excerpt_need_a_path(dataset_name):
    with pytest.raises(KvlabError, match=r"needs a dataset_path"):
        load_trace(dataset_name)


def test_unknown_dataset_name_lists_the_known_ones():
    with pytest.raises(KvlabError, match=r"dataset_name 'foo': expected one of azure, "):
        load_trace("foo")


def test_option_of_another_dataset_is_an_error():
    with pytest.raises(KvlabError, match=r"'random_input_len' does not apply to dataset_name "
                                         r"azure"):
        load_trace("azure", random_input_len=5)


def test_random_takes_no_path():
    with pytest.raises(KvlabError, match=r"reads no file"):
        load_trace("random", "trace.csv")


def test_unknown_path_names_the_bundled_excerpts(tmp_path):
    with pytest.raises(KvlabError, match=r"no such file, nor a bundled excerpt name \(azure-conv"):
        load_trace("azure", tmp_path / "missing.csv")


def test_unknown_bundled_name_is_an_error():
    with pytest.raises(KvlabError, match=r"no bundled trace 'azure-chat'"):
        bundled_trace_path("azure-chat")


def test_bundled_traces_exist_and_stay_small():
    files = bundled_traces()
    assert set(files) == {"azure-conv", "azure-code", "mooncake"}
    assert sum(path.stat().st_size for path in files.values()) < 600_000


@pytest.mark.parametrize("name, first_line, expected", [
    ("a.jsonl", "{}", "mooncake"),
    ("a.json", "[]", "sharegpt"),
    ("a.csv", "TIMESTAMP,ContextTokens,GeneratedTokens", "azure"),
    ("a.csv", "Timestamp,Model,Request tokens,Response tokens,Total tokens,Log Type", "burstgpt"),
])
def test_dataset_name_is_guessed_from_extension_or_header(tmp_path, name, first_line, expected):
    path = tmp_path / name
    path.write_text(first_line + "\n")
    assert guess_dataset_name(path) == expected


def test_unrecognised_header_asks_for_a_dataset_name(tmp_path):
    path = tmp_path / "a.csv"
    path.write_text("when,in,out\n")
    with pytest.raises(KvlabError, match=r"a.csv line 1: cannot tell the dataset"):
        guess_dataset_name(path)


def test_every_loader_reads_the_format_from_the_file_when_not_told(tmp_path, capsys):
    """A Mooncake or BurstGPT file given without its dataset name is read as what it is, by
    the library and by every command that loads a trace (not parsed as Azure)."""
    from kvlab.cli import main

    mooncake = tmp_path / "requests.jsonl"
    mooncake.write_text('{"timestamp": 0, "input_length": 40, "output_length": 5, '
                        '"hash_ids": [1]}\n{"timestamp": 1000, "input_length": 30, '
                        '"output_length": 4, "hash_ids": [1]}\n')
    assert len(load_trace(None, mooncake).requests) == 2
    assert load_trace(None).name == load_trace("azure").name  # (no file: the Azure excerpt)
    assert main(["sim", "--dataset-path", str(mooncake), "--disable-tqdm"]) == 0
    assert "Successful requests:                     2" in capsys.readouterr().out
    burstgpt = tmp_path / "b.csv"
    burstgpt.write_text("Timestamp,Model,Request tokens,Response tokens,Total tokens,"
                        "Log Type\n0,ChatGPT,40,5,45,Conversation log\n")
    assert main(["sim", "--dataset-path", str(burstgpt), "--disable-tqdm"]) == 0
    assert "Successful requests:                     1" in capsys.readouterr().out


@pytest.mark.parametrize(("text", "arrivals"), [
    ("timestamp;input_tokens;output_tokens\n1733400000.5;120;30\n1733400001.25;80;12\n",
     [0.0, 0.75]),  # epoch seconds, semicolons
    ("Time,Prompt_Tokens,Completion_Tokens\n2026-12-06 04:00:00,100,10\n"
     "2026-12-06 04:00:02.5,50,5\n", [0.0, 2.5]),  # date-times, other names, any case
    ("arrival_s\tinput_len\toutput_len\n3\t10\t2\n1\t20\t4\n", [0.0, 2.0]),  # tabs, unsorted
])
def test_a_plain_csv_of_arrivals_and_lengths_is_read_as_users_keep_it(tmp_path, text, arrivals):
    path = tmp_path / "mine.csv"
    path.write_text(text)
    assert guess_dataset_name(path) == "csv"
    trace = load_trace(None, path)
    assert [r.arrival_s for r in trace.requests] == pytest.approx(arrivals)
    assert all(r.input_len > 0 and r.output_len > 0 for r in trace.requests)


def test_a_bad_value_in_a_plain_csv_names_its_line_and_column(tmp_path):
    path = tmp_path / "mine.csv"
    path.write_text("timestamp;input_tokens;output_tokens\n0;120;30\n1;eighty;12\n")
    with pytest.raises(KvlabError, match=r"mine.csv line 3, column input_tokens: 'eighty' is "
                                         "not a whole number"):
        load_trace(None, path)
