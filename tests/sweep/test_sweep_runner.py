"""One run of a sweep: the same simulation as `kvlab sim` with the same flags, as one flat row;
a failure is a row with its error, never an exception."""

import json

import pytest

from kvlab.cli import main
from kvlab.sweep import check_settings, flatten, run_point
from kvlab.sweep import runner as runner_module

CASES = [
    (["--num-prompts", "40", "--time-scale", "8"], {"num_prompts": 40, "time_scale": 8}),
    (["--num-prompts", "30", "--model", "llama-3.1-8b", "--hardware", "atlas-800t-a2",
      "--policy", "paged:preemption=swap", "--block-size", "128", "--max-num-seqs", "16",
      "--request-rate", "20", "--enable-prefix-caching", "--metric-percentiles", "50,90",
      "--goodput", "ttft:500", "tpot:50", "--num-gpu-blocks-override", "200"],
     {"num_prompts": 30, "model": "llama-3.1-8b", "hardware": "atlas-800t-a2",
      "policy": "paged", "preemption": "swap", "block_size": 128, "max_num_seqs": 16,
      "request_rate": 20, "enable_prefix_caching": True, "metric_percentiles": "50,90",
      "goodput": {"ttft": 500, "tpot": 50}, "num_gpu_blocks_override": 200}),
    (["--dataset-name", "random", "--num-prompts", "25", "--random-input-len", "300",
      "--random-output-len", "40", "--policy", "contiguous:reserve=pow2", "--max-model-len",
      "1024", "--no-enable-chunked-prefill", "--ramp-up-strategy", "linear",
      "--ramp-up-start-rps", "1", "--ramp-up-end-rps", "30", "--seed", "7"],
     {"dataset_name": "random", "num_prompts": 25, "random_input_len": 300,
      "random_output_len": 40, "policy": "contiguous", "reserve": "pow2", "max_model_len": 1024,
      "enable_chunked_prefill": False, "ramp_up_strategy": "linear", "ramp_up_start_rps": 1,
      "ramp_up_end_rps": 30, "seed": 7}),
    (["--dataset-name", "mooncake", "--num-prompts", "30", "--length-scale", "16",
      "--model", "tiny-llama", "--enable-prefix-caching"],
     {"dataset_name": "mooncake", "num_prompts": 30, "length_scale": 16, "model": "tiny-llama",
      "enable_prefix_caching": True}),
    (["--dataset-name", "mooncake", "--num-prompts", "40", "--length-scale", "8",
      "--enable-prefix-caching", "--num-gpu-blocks-override", "400", "--num-instances", "3",
      "--router", "power-of-two", "--router-seed", "2"],
     {"dataset_name": "mooncake", "num_prompts": 40, "length_scale": 8,
      "enable_prefix_caching": True, "num_gpu_blocks_override": 400, "num_instances": 3,
      "router": "power-of-two", "router_seed": 2}),
]


@pytest.mark.parametrize(("flags", "settings"), CASES)
def test_a_row_holds_the_summary_kvlab_sim_saves_for_the_same_flags(tmp_path, flags,
                                                                    settings):
    assert main(["sim", *flags, "--disable-tqdm", "--save-result", "--result-dir",
                 str(tmp_path), "--result-filename", "s.json"]) == 0
    saved = flatten(json.loads((tmp_path / "s.json").read_text()))
    del saved["date"]  # when the file was written
    row = run_point(check_settings(settings))
    assert row["status"] == "ok", row["error"]
    assert {key: row[key] for key in saved} == saved


def test_a_row_has_the_parameters_the_seed_and_the_run_key():
    settings = check_settings({"num_prompts": 20, "eviction": "lru"})
    row = run_point(settings)
    assert row["param.num_prompts"] == 20 and row["param.eviction"] == "lru"
    assert row["seed"] == 0 and row["policy"] == "paged:eviction=lru"
    assert row["policy_json.eviction"] == "lru"  # nested objects become dotted columns
    assert isinstance(json.loads(row["failed_reasons"]), dict)  # bags stay JSON text
    assert len(row["run_key"]) == 32 and row["run_cpu_s"] >= 0


def test_a_setting_combination_that_cannot_run_is_an_error_row():
    row = run_point(check_settings({"num_prompts": 5, "model": "llama-2-7b",
                                    "max_model_len": 100_000}))
    assert row["status"] == "error"
    assert "max_model_len" in row["error"] and "4096" in row["error"]
    assert row["param.max_model_len"] == 100_000 and "output_throughput" not in row


def test_a_bug_in_a_run_is_an_error_row_that_says_where(monkeypatch):
    def broken(settings):
        raise ZeroDivisionError("division by zero")

    monkeypatch.setattr(runner_module, "simulate_settings", broken)
    row = run_point(check_settings({"num_prompts": 5}))
    assert row["status"] == "error"
    assert row["error"].startswith("ZeroDivisionError: division by zero (at test_sweep_runner")


def test_slo_attainment_is_the_share_of_all_requests_meeting_every_slo():
    loose = run_point(check_settings({"num_prompts": 40, "goodput": {"ttft": 1e9}}))
    assert loose["slo_attainment"] == loose["completed"] / (loose["completed"]
                                                            + loose["failed"])
    strict = run_point(check_settings({"num_prompts": 40, "goodput": {"ttft": 0.001}}))
    assert strict["slo_attainment"] == 0.0


def test_a_cluster_row_keeps_each_instance_s_summary_as_json():
    row = run_point(check_settings({"num_prompts": 30, "num_instances": 2,
                                    "router": "least-loaded"}))
    assert row["status"] == "ok", row["error"]
    assert (row["num_instances"], row["router"]) == (2, "least-loaded")
    instances = json.loads(row["instances"])
    assert [s["instance"] for s in instances] == [0, 1]
    assert sum(s["num_prompts"] for s in instances) == 30
