"""KV-cache precisions (issue 46, part 1): vLLM's `--kv-cache-dtype` names size pages in bytes,
scales included, in `capacity`, `sim`, sweeps and the result; the roofline charges what an fp8
cache reads and what quantizing writes; platform rules are warnings."""

from __future__ import annotations

import json

import pytest
from hypothesis import given
from hypothesis import strategies as st

from kvlab.bench.observed import ServerInfo
from kvlab.cli import main
from kvlab.errors import KvlabError
from kvlab.fidelity import server_serving
from kvlab.policies.serving import ServingConfig
from kvlab.sim import SimConfig
from kvlab.sim.cost_model import RooflineCostModel, StepShape
from kvlab.specs import get_hardware, get_model
from kvlab.specs.block_rules import block_size_warnings
from kvlab.specs.capacity import kv_cache_capacity_tokens
from kvlab.specs.kv_dtype import KV_CACHE_DTYPES, kv_cache_dtype, platform_warnings

LLAMA = get_model("llama-3.1-8b")  # 32 layers, 8 KV heads of 128, bf16


def test_vllms_names_and_its_alias():
    assert kv_cache_dtype("fp8").name == "fp8_e4m3"
    assert ServingConfig(kv_cache_dtype="fp8").kv_cache_dtype == "fp8_e4m3"
    with pytest.raises(KvlabError, match="kv_cache_dtype 'nvfp4' is not one kvlab models"):
        ServingConfig(kv_cache_dtype="nvfp4")


@pytest.mark.parametrize(("name", "per_layer_head"), [
    ("auto", 256), ("bfloat16", 256), ("fp8_e4m3", 128), ("fp8_e5m2", 128), ("int8", 128),
    # vLLM's Triton backend packs an fp32 scale after each head's values, per side
    ("int8_per_token_head", 132), ("fp8_per_token_head", 132), ("int4_per_token_head", 68),
])
def test_bytes_per_token_count_values_and_scales(name, per_layer_head):
    spec = LLAMA.with_kv_cache_dtype(name)
    assert spec.kv_bytes_per_token() == 32 * 2 * 8 * per_layer_head
    assert spec.weight_bytes() == LLAMA.weight_bytes()  # the weights stay bf16


def test_an_mla_latent_takes_fp8_but_no_per_head_scales():
    deepseek = get_model("deepseek-v3")
    assert deepseek.with_kv_cache_dtype("fp8").kv_bytes_per_token() * 2 == \
        deepseek.kv_bytes_per_token()
    with pytest.raises(KvlabError, match="MLA latent"):
        deepseek.with_kv_cache_dtype("int8_per_token_head")


@given(st.sampled_from(list(KV_CACHE_DTYPES)), st.integers(1, 1 << 34),
       st.sampled_from([16, 32, 128]))
def test_pages_are_the_budget_over_the_page_bytes(name, budget, block_size):
    model = LLAMA.with_kv_cache_dtype(name)
    page_bytes = block_size * model.kv_bytes_per_token()
    if budget < page_bytes:
        return
    capacity = kv_cache_capacity_tokens(model, get_hardware("h100"), page_size=block_size,
                                        kv_cache_memory_bytes=budget)
    assert capacity.page_bytes == page_bytes
    assert capacity.num_pages == budget // page_bytes


def test_fp8_holds_twice_the_pages_of_bf16_in_the_same_memory():
    hardware = get_hardware("atlas-800t-a2")
    bf16 = kv_cache_capacity_tokens(LLAMA, hardware, page_size=128)
    int8 = kv_cache_capacity_tokens(LLAMA.with_kv_cache_dtype("int8"), hardware, page_size=128)
    assert int8.num_pages in (2 * bf16.num_pages, 2 * bf16.num_pages + 1)


def test_capacity_answers_the_issues_question(capsys):
    ask = ["capacity", "--model", "llama-3.1-8b", "--hardware", "atlas-800t-a2",
           "--kv-cache-dtype", "int8", "--block-size", "128", "--max-model-len", "4096"]
    assert main([*ask, "--json"]) == 0
    answer = json.loads(capsys.readouterr().out)["answers"][0]
    assert answer["kv_cache_dtype"] == "int8" and answer["warnings"] == []
    plain = kv_cache_capacity_tokens(LLAMA, get_hardware("atlas-800t-a2"), page_size=128)
    assert answer["page_bytes"] * 2 == plain.page_bytes
    assert main(ask) == 0
    assert "KV cache int8" in capsys.readouterr().out


def test_a_dtype_the_platform_does_not_serve_is_a_warning(capsys):
    assert platform_warnings(kv_cache_dtype("fp8"), "ascend")
    assert not platform_warnings(kv_cache_dtype("int8"), "ascend")
    assert platform_warnings(kv_cache_dtype("int8"), "cuda")  # C8 is vLLM-Ascend's
    assert not platform_warnings(kv_cache_dtype("fp8_e5m2"), "cpu")
    assert main(["capacity", "--model", "llama-3.1-8b", "--hardware", "atlas-800t-a2",
                 "--kv-cache-dtype", "fp8", "--block-size", "128"]) == 0
    assert "vLLM-Ascend serves auto, bfloat16, float16, int8" in capsys.readouterr().err


def test_cann_wants_pages_of_a_multiple_of_32_for_int8():
    ascend = get_hardware("atlas-800t-a2")
    assert not block_size_warnings(ascend, 128, kv_cache_dtype="int8")
    text = block_size_warnings(ascend, 48, enable_chunked_prefill=False,
                               kv_cache_dtype="int8")
    assert text and "multiple of 32" in text[0]
    assert not block_size_warnings(ascend, 48, enable_chunked_prefill=False)


def test_an_unknown_name_is_one_line_naming_the_flag(capsys):
    with pytest.raises(SystemExit):
        main(["capacity", "--kv-cache-dtype", "fp4"])
    assert "--kv-cache-dtype: invalid choice: 'fp4'" in capsys.readouterr().err


def test_the_roofline_reads_fewer_bytes_and_pays_to_quantize():
    hardware = get_hardware("h100")
    bf16 = RooflineCostModel(LLAMA, hardware, page_size=16)
    fp8 = RooflineCostModel(LLAMA.with_kv_cache_dtype("fp8"), hardware, page_size=16)
    decode = StepShape(0, 64, 64 * 4096, 64, 0, 64 * 4096)  # long contexts: KV reads rule
    assert fp8.step_time_s(decode) < bf16.step_time_s(decode)
    # the decode fast path charges the same as a step of the same shape
    assert fp8.decode_step_time(64)(64 * 4096, 64 * 4096) == fp8.step_time_s(decode)
    # a step writing many new tokens over no context: quantizing reads them in bf16 too
    prefill = StepShape(8192, 0, 0, 1, 0, 0)
    same_bytes = RooflineCostModel(LLAMA.with_kv_cache_dtype("bfloat16"), hardware, page_size=16)
    assert same_bytes.step_time_s(prefill) == bf16.step_time_s(prefill)


def test_sim_sizes_its_pages_and_reports_the_dtype(capsys, tmp_path):
    auto = SimConfig(model="llama-3.1-8b", hardware="h100")
    fp8 = SimConfig(model="llama-3.1-8b", hardware="h100",
                    serving=ServingConfig(kv_cache_dtype="fp8"))
    assert fp8.page_bytes * 2 == auto.page_bytes
    assert fp8.capacity.num_pages >= 2 * auto.capacity.num_pages
    assert main(["sim", "--model", "llama-3.1-8b", "--hardware", "h100", "--num-prompts", "5",
                 "--kv-cache-dtype", "fp8", "--disable-tqdm", "--save-result",
                 "--result-dir", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert "KV cache dtype:                          fp8_e4m3" in out
    saved = json.loads(next(tmp_path.glob("*.json")).read_text(encoding="utf-8"))
    assert saved["kv_cache_dtype"] == "fp8_e4m3"


def test_a_sweep_takes_the_dtype_as_a_grid_key(capsys, tmp_path):
    assert main(["sweep", "--grid", "kv_cache_dtype=auto,fp8", "--num-prompts", "20",
                 "--disable-tqdm", "--output", str(tmp_path / "rows")]) == 0
    out = capsys.readouterr().out
    assert "kv_cache_dtype" in out and "fp8" in out


def test_a_servers_cache_dtype_is_simulated():
    info = ServerInfo(model="m", block_size=16, num_gpu_blocks=100, cache_dtype="fp8")
    assert server_serving(info).kv_cache_dtype == "fp8_e4m3"
    assert server_serving(info, overrides={"kv_cache_dtype": "auto"}).kv_cache_dtype == "auto"
    assert ServerInfo.from_json(info.to_json()) == info
