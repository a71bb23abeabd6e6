"""Uploaded traces are checked and parsed; a bad file raises a KvlabError naming the problem."""


import pytest
from dashboard_cases import small_setup

from kvlab.dashboard.workload import MAX_UPLOAD_BYTES, Setup, check_upload, load_setup_trace
from kvlab.errors import KvlabError

AZURE = b"TIMESTAMP,ContextTokens,GeneratedTokens\n" \
        b"2023-11-16 18:15:46.6805900,100,10\n2023-11-16 18:15:47.0000000,200,20\n"


@pytest.fixture(autouse=True)
def _quiet_short_traces(recwarn):
    """Uploads here hold fewer requests than the setup's 120: the loader warns, as it should."""


def upload(name: str, data: bytes, **changes) -> Setup:
    return small_setup(trace=name, upload=data, **changes)


def test_an_azure_upload_loads_with_its_format_guessed():
    trace = load_setup_trace(upload("mine.csv", AZURE))
    assert [(r.input_len, r.output_len) for r in trace.requests] == [(100, 10), (200, 20)]
    assert trace.dataset_name == "azure" and trace.source == "upload:mine.csv"


def test_a_mooncake_upload_loads_from_jsonl():
    data = b'{"timestamp": 0, "input_length": 600, "output_length": 5, "hash_ids": [1, 2]}\n'
    trace = load_setup_trace(upload("m.jsonl", data))
    assert trace.requests[0].hash_ids == (1, 2)


def test_a_bad_column_names_the_upload_line_and_column():
    data = AZURE.replace(b",200,", b",lots,")
    with pytest.raises(KvlabError) as err:
        load_setup_trace(upload("mine.csv", data))
    message = str(err.value)
    assert "mine.csv" in message and "line 3" in message and "ContextTokens" in message
    assert "kvlab-upload" not in message  # the temporary copy stays out of sight


def test_a_csv_with_an_unknown_header_asks_for_the_format():
    with pytest.raises(KvlabError, match="cannot tell the dataset"):
        load_setup_trace(upload("x.csv", b"a,b\n1,2\n"))


def test_a_forced_format_that_does_not_match_names_the_missing_columns():
    with pytest.raises(KvlabError, match=r"x\.csv"):
        load_setup_trace(upload("x.csv", AZURE, dataset_name="burstgpt"))


def test_too_large_an_upload_is_refused_with_the_limit():
    with pytest.raises(KvlabError, match="up to 1 MiB"):
        check_upload("big.csv", b"x" * (2**20 + 1), max_bytes=2**20)
    assert MAX_UPLOAD_BYTES >= 2**20


@pytest.mark.parametrize(("name", "data", "problem"), [
    ("trace.parquet", b"PAR1", "ending in .csv"),
    ("empty.csv", b"  \n", "empty"),
    ("binary.csv", b"\xff\xfe\x00garbage", "not UTF-8"),
])
def test_unreadable_uploads_are_named(name, data, problem):
    with pytest.raises(KvlabError, match=problem):
        check_upload(name, data)


def test_the_setup_key_changes_with_the_upload_bytes():
    assert upload("a.csv", AZURE).key() != upload("a.csv", AZURE + b"\n").key()
    assert upload("a.csv", AZURE).key() == upload("a.csv", AZURE).key()


def test_a_request_rate_replaces_the_time_scale_and_back():
    rated = small_setup(request_rate=2.0)
    assert rated.time_scale == 1.0
    assert load_setup_trace(rated).metadata["request_rate"] == 2.0
    scaled = rated.with_value("time_scale", 3.0)
    assert scaled.request_rate is None  # replay the timestamps, faster
    assert load_setup_trace(scaled).metadata["time_scale"] == 3.0


def test_a_bad_machine_setting_is_a_user_error():
    with pytest.raises(KvlabError):
        small_setup(tensor_parallel_size=3).config("paged")


def test_the_default_setup_simulates_the_whole_excerpt_as_the_cli_does():
    from kvlab.traces import load_trace

    assert len(load_setup_trace(Setup())) == len(load_trace("azure"))
