"""`vllm bench serve --save-result --save-detailed` results read as kvlab's own: the requests
as vLLM's client saw them, what the file cannot tell said once, and `calibrate --from-bench`
fitting a cost model from one with the page flags it then needs."""

from __future__ import annotations

import json

import pytest

from kvlab.bench import load_bench_result
from kvlab.bench.vllm_result import VLLM_BENCH_LIMITS
from kvlab.cli import main
from kvlab.errors import KvlabError
from kvlab.policies import RequestStatus
from kvlab.sim.calibrated import load_cost_model

STEP_S = 0.01  # the imagined server's step


def vllm_document(num: int = 24) -> dict:
    """A result as vLLM 0.32's client writes it: requests sent every 30 ms from a perf_counter
    origin, first tokens on step boundaries, one token a step, the last request failed."""
    starts, ttfts, itls, latencies, outputs, errors = [], [], [], [], [], []
    for i in range(num):
        start = 1000.0 + 0.03 * i
        output = 4 + i % 5
        ttft = 2 * STEP_S + 0.001 * (i % 3)
        failed = i == num - 1
        starts.append(start)
        ttfts.append(0.0 if failed else ttft)
        itls.append([] if failed else [STEP_S] * (output - 1))
        latencies.append(0.0 if failed else ttft + STEP_S * (output - 1))
        outputs.append(0 if failed else output)
        errors.append("HTTP 500" if failed else "")
    return {"date": "20261206-080000", "backend": "vllm", "endpoint_type": "vllm",
            "model_id": "tiny-llama", "tokenizer_id": "tiny-llama", "num_prompts": num,
            "request_rate": "inf", "burstiness": 1.0, "max_concurrency": None,
            "duration": starts[-1] - starts[0] + 0.2, "completed": num - 1, "failed": 1,
            "input_lens": [20 + 3 * i for i in range(num)], "output_lens": outputs,
            "ttfts": ttfts, "itls": itls, "latencies": latencies, "start_times": starts,
            "generated_texts": ["x"] * num, "errors": errors}


@pytest.fixture
def vllm_result_file(tmp_path):
    path = tmp_path / "vllm-bench.json"
    path.write_text(json.dumps(vllm_document()))
    return path


def test_a_vllm_result_reads_as_the_requests_its_client_saw(vllm_result_file):
    result = load_bench_result(vllm_result_file)
    records = result.requests
    assert len(records) == 24 and records[0].arrival_s == 0.0
    assert records[1].arrival_s == pytest.approx(0.03)
    first = records[2]
    assert first.ttft_s == pytest.approx(2 * STEP_S + 0.002)
    assert sum(first.chunk_tokens) == first.num_output_tokens == 6
    assert first.itls_s() == pytest.approx([STEP_S] * 5)
    assert first.latency_s == pytest.approx(2 * STEP_S + 0.002 + 5 * STEP_S)
    assert records[-1].status is RequestStatus.FINISHED_ERROR and not records[-1].completed
    assert result.server.model == "tiny-llama" and result.server.block_size is None
    assert result.series == {} and VLLM_BENCH_LIMITS in result.metrics_errors
    summary = result.summary()
    assert summary["completed"] == 23


def test_a_vllm_result_without_the_detailed_arrays_names_the_flag(tmp_path):
    document = vllm_document()
    for key in ("ttfts", "itls", "start_times"):
        del document[key]
    path = tmp_path / "plain.json"
    path.write_text(json.dumps(document))
    with pytest.raises(KvlabError, match=r"plain\.json.*--save-detailed"):
        load_bench_result(path)


def test_neither_kind_of_result_is_refused_by_name(tmp_path):
    path = tmp_path / "other.json"
    path.write_text(json.dumps({"rows": []}))
    with pytest.raises(KvlabError, match=r"other\.json: neither"):
        load_bench_result(path)


def test_calibrate_asks_for_the_page_flags_a_vllm_result_cannot_give(vllm_result_file,
                                                                       tmp_path, capsys):
    assert main(["calibrate", "--from-bench", str(vllm_result_file), "--no-refine",
                 "-o", str(tmp_path / "cm.json")]) == 2
    err = capsys.readouterr().err
    assert "--block-size" in err and err.count("\n") <= 3


def test_calibrate_fits_a_vllm_result_and_says_what_it_lacks(vllm_result_file, tmp_path,
                                                             capsys):
    out = tmp_path / "cm.json"
    assert main(["calibrate", "--from-bench", str(vllm_result_file), "--no-refine",
                 "--block-size", "16", "--num-gpu-blocks-override", "400",
                 "-o", str(out)]) == 0
    captured = capsys.readouterr()
    assert "no /metrics scrapes" in captured.err and "Saved" in captured.out
    model = load_cost_model(out)
    assert model.fit["num_runs"] == 1 and model.step_overhead_s >= 0
