"""Result files: the summary JSON's name and content, and the request and step tables."""

import json
import math
from datetime import datetime

import pandas as pd
import pytest

from kvlab.errors import KvlabError
from kvlab.metrics import (
    STEP_COLUMNS,
    StepRecorder,
    default_result_filename,
    results,
    save_results,
    summarize,
)

METADATA = {
    "policy": "paged:block=16,evict=lru",
    "model": "meta-llama/Llama-3-8B",
    "backend": "engine:cuda",
    "request_rate": 4,
    "seed": 0,
}
NOON = datetime(2025, 1, 2, 12, 0, 5)


@pytest.fixture
def run(make_request, make_failed, make_result, record_step):
    """A small finished run: two completed requests, one failed, two steps; and its summary."""
    steps = StepRecorder()
    record_step(steps, duration_s=0.5, used=3, live=40, internal=8)
    record_step(steps, duration_s=0.5, used=4, live=60, internal=4)
    requests = [
        make_request(0, first_token_s=0.2, finish_s=1.0),
        make_request(1, arrival_s=0.1, first_token_s=0.4, finish_s=0.9, output_len=1),
        make_failed(2, prompt_len=9000),
    ]
    result = make_result(requests, steps=steps, itls_s=[0.2] * 4, metadata=METADATA)
    return summarize(result, percentile_metrics=("ttft", "tpot", "itl", "e2el")), result


def test_default_file_name_follows_vllm():
    name = default_result_filename(
        {"backend": "sim", "request_rate": 4, "model": "org/m"}, now=NOON
    )
    assert name == "sim-4.0qps-m-20250102-120005.json"


def test_default_file_name_is_sanitised():
    summary = {"backend": "engine:cuda", "request_rate": "inf", "model": "Qwen 2.5 (7B)"}
    assert default_result_filename(summary, now=NOON) == (
        "engine_cuda-infqps-Qwen_2.5_7B-20250102-120005.json"
    )


def test_a_replayed_trace_is_named_replay_not_infqps():
    summary = {"backend": "sim", "request_rate": "inf", "model": "m", "dataset_name": "mooncake"}
    assert default_result_filename(summary, now=NOON) == "sim-replay-m-20250102-120005.json"
    random = {**summary, "dataset_name": "random"}  # (all at 0: vLLM's inf)
    assert default_result_filename(random, now=NOON) == "sim-infqps-m-20250102-120005.json"


def test_default_file_name_without_metadata():
    assert default_result_filename({}, now=NOON) == "kvlab-infqps-model-20250102-120005.json"


def test_save_writes_json_and_two_tables_beside_it(run, tmp_path):
    summary, result = run
    paths = save_results(summary, result, result_dir=tmp_path, result_filename="r.json")
    assert paths == [tmp_path / "r.json", tmp_path / "r.requests.csv", tmp_path / "r.steps.csv"]
    assert all(path.is_file() for path in paths)


def test_json_holds_every_summary_key_and_finite_numbers(run, tmp_path):
    summary, result = run
    (json_path, *_) = save_results(summary, result, result_dir=tmp_path)
    saved = json.loads(json_path.read_text())
    assert set(summary) <= set(saved)
    assert saved["date"]
    numbers = [v for v in saved.values() if isinstance(v, (int, float))]
    assert numbers and all(math.isfinite(v) for v in numbers)
    assert json_path.name.startswith("engine_cuda-4.0qps-Llama-3-8B-")


def test_csv_tables_round_trip(run, tmp_path):
    summary, result = run
    _, requests_path, steps_path = save_results(summary, result, result_dir=tmp_path)
    requests = pd.read_csv(requests_path)
    steps = pd.read_csv(steps_path)
    assert requests["request_id"].tolist() == [0, 1, 2]
    assert requests["ttft_ms"].iloc[0] == pytest.approx(200.0)
    assert requests["status"].iloc[2] == "finished_error"
    assert tuple(steps.columns) == STEP_COLUMNS
    assert steps["num_live_token_slots"].tolist() == [40, 60]


def test_parquet_tables_round_trip(run, tmp_path):
    pytest.importorskip("pyarrow")
    summary, result = run
    _, requests_path, steps_path = save_results(
        summary, result, result_dir=tmp_path, result_filename="r.json", table_format="parquet"
    )
    assert requests_path.name == "r.requests.parquet"
    requests = pd.read_parquet(requests_path)
    assert requests["error"].iloc[2].startswith("prompt of 9000")
    assert pd.read_parquet(steps_path)["num_used_pages"].tolist() == [3, 4]


def test_parquet_without_pyarrow_is_a_user_error(run, tmp_path, monkeypatch):
    monkeypatch.setattr(results.importlib.util, "find_spec", lambda name: None)
    with pytest.raises(KvlabError, match="pyarrow"):
        save_results(*run, result_dir=tmp_path, table_format="parquet")
    assert list(tmp_path.iterdir()) == []


def test_unknown_table_format_is_a_user_error(run, tmp_path):
    with pytest.raises(KvlabError, match="'xlsx'"):
        save_results(*run, result_dir=tmp_path, table_format="xlsx")


def test_result_dir_is_created(run, tmp_path):
    paths = save_results(*run, result_dir=tmp_path / "a" / "b")
    assert paths[0].parent == tmp_path / "a" / "b"


def test_unwritable_result_dir_is_a_user_error(run, tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("")
    with pytest.raises(KvlabError, match="cannot write results"):
        save_results(*run, result_dir=blocker / "sub")
