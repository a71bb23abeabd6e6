"""`kvlab accuracy` (issue 46, part 4): a KV precision's logit KL, top-1 agreement, perplexity
and greedy agreement against the full-precision cache, through the real engine. The figures
here are on a random tiny model (mechanics only: random weights change under any rounding);
the trained stdlib-llama's are in docs/kv_precision.md."""

from __future__ import annotations

import json
import math
import random

import pytest

from kvlab.cli import main
from kvlab.errors import KvlabError
from kvlab.fidelity.accuracy import AccuracyConfig, measure_accuracy
from tests.engine.engine_hf_models import WORDS, save_hf_model, save_tokenizer, tiny_llama_config

TINY = dict(window=48, chunk=16, num_tokens=96, num_prompts=3, prompt_len=12, output_len=6)


@pytest.fixture(scope="module")
def token_ids():
    rng = random.Random(0)
    return [rng.randrange(3, 2048) for _ in range(600)]


def test_a_precision_equal_to_the_reference_costs_nothing(token_ids):
    """The tiny preset is fp32: an fp32 run against itself agrees everywhere."""
    (same,) = measure_accuracy(AccuracyConfig(model="tiny-llama", kv_cache_dtypes=("auto",),
                                              **TINY), token_ids)
    assert same.kl_mean == same.kl_p99 == 0.0
    assert same.top1_agreement == 1.0 and same.perplexity_change == 0.0
    assert same.greedy_identical == same.num_prompts == 3
    assert same.num_tokens == 96  # two whole windows of 48


def test_fewer_bits_cost_more(token_ids):
    config = AccuracyConfig(model="tiny-llama",
                            kv_cache_dtypes=("int8_per_token_head", "fp8", "int4_per_token_head"),
                            **TINY)
    int8, fp8, int4 = measure_accuracy(config, token_ids)
    assert fp8.kv_cache_dtype == "fp8_e4m3"
    for result in (int8, fp8, int4):
        assert result.kl_mean > 0 and result.kl_p99 >= result.kl_mean * 0.5
        assert 0 <= result.top1_agreement <= 1 and 0 <= result.greedy_prefix_share <= 1
        assert math.isclose(result.reference_perplexity, int8.reference_perplexity)
    # 8 bits with a scale per token and head beat 4; fp8's 3 mantissa bits sit between
    assert int8.kl_mean < fp8.kl_mean < int4.kl_mean


def test_bad_settings_name_their_flag(token_ids):
    with pytest.raises(KvlabError, match="window is 0"):
        AccuracyConfig(model="tiny-llama", kv_cache_dtypes=("fp8",), window=0)
    with pytest.raises(KvlabError, match="not one kvlab models"):
        AccuracyConfig(model="tiny-llama", kv_cache_dtypes=("nvfp4",))
    with pytest.raises(KvlabError, match="fewer than one window"):
        measure_accuracy(AccuracyConfig(model="tiny-llama", kv_cache_dtypes=("fp8",),
                                        window=4096), token_ids)


def test_the_command_reads_a_text_corpus_with_the_models_tokenizer(tmp_path, capsys):
    folder = save_hf_model(tmp_path / "model", tiny_llama_config(), seed=1)
    save_tokenizer(folder, vocab_size=2048)
    words = WORDS.split()
    rng = random.Random(1)
    corpus = tmp_path / "corpus.txt"
    corpus.write_text(" ".join(rng.choice(words) for _ in range(400)), encoding="utf-8")
    args = ["accuracy", str(folder), "--kv-cache-dtype", "fp8", "int8", "--corpus", str(corpus),
            "--window", "48", "--chunk", "16", "--num-tokens", "96", "--num-prompts", "2",
            "--prompt-len", "8", "--output-len", "4"]
    assert main([*args, "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert [r["kv_cache_dtype"] for r in report["results"]] == ["fp8_e4m3", "int8"]
    assert report["corpus"] == str(corpus)
    assert main(args) == 0
    out = capsys.readouterr().out
    assert "KL mean" in out and "fp8_e4m3" in out and "int8" in out


def test_a_model_without_a_tokenizer_or_a_missing_corpus_is_one_line(tmp_path, capsys):
    assert main(["accuracy", "tiny-llama"]) == 2
    assert "has no tokenizer" in capsys.readouterr().err
    folder = save_hf_model(tmp_path / "model", tiny_llama_config(), seed=1)
    save_tokenizer(folder, vocab_size=2048)
    assert main(["accuracy", str(folder), "--corpus", str(tmp_path / "nope.txt")]) == 2
    assert "--corpus" in capsys.readouterr().err


def test_on_the_trained_model_fewer_bits_cost_more_and_per_head_scales_pay(capsys):
    """stdlib-llama (trained on real text): the ranking docs/kv_precision.md reports, on a
    slice of its held-out text."""
    assert main(["accuracy", "stdlib-llama", "--kv-cache-dtype", "int8_per_token_head",
                 "fp8_e4m3", "int4_per_token_head", "--num-tokens", "512", "--window", "256",
                 "--num-prompts", "2", "--output-len", "4", "--json"]) == 0
    per_head, fp8, int4 = json.loads(capsys.readouterr().out)["results"]
    assert per_head["kl_mean"] < fp8["kl_mean"] < int4["kl_mean"]
    assert per_head["top1_agreement"] > 0.97 and abs(per_head["perplexity_change"]) < 0.1
    assert per_head["reference_perplexity"] < 100  # against 2,048 for a uniform guess


def test_demotion_with_recent_past_every_window_and_prompt_costs_nothing(token_ids):
    config = AccuracyConfig(model="tiny-llama", kv_cache_dtypes=(),
                            precisions=("age:recent=64,depth=2", "age:recent=8,depth=2"), **TINY)
    untouched, demoted = measure_accuracy(config, token_ids)
    assert (untouched.kv_cache_dtype, untouched.precision) == ("auto", "age:recent=64,depth=2")
    assert untouched.kl_mean == 0.0 and untouched.greedy_identical == 3
    assert demoted.kl_mean > 0 and demoted.kl_p99 > 0


def test_a_bad_precision_is_one_line_naming_the_flag(capsys):
    for bad, words in (("age:recent=0", "(recent=0): recent must be >= 1"),
                       ("age:recent=x", "recent='x' is not a whole number"),
                       ("none", "a policy that demotes"),
                       ("fifo", "unknown policy; valid: age, none"),
                       ("lru:x=1", "unknown policy 'lru'; valid: age, none")):
        assert main(["accuracy", "stdlib-llama", "--precision", bad]) == 2
        err = capsys.readouterr().err.strip()
        assert len(err.splitlines()) == 1 and "--precision" in err and words in err
        assert err.count(repr(bad)) == 1  # (the spec named once, not again by the parser)


def test_on_the_trained_model_demotion_costs_more_the_fewer_tokens_it_keeps(capsys):
    """stdlib-llama (trained on real text): pages demoted by age cost less than a cache all
    at fp8, and more the smaller R; the JSON names each row's precision policy."""
    assert main(["accuracy", "stdlib-llama", "--kv-cache-dtype", "fp8_e4m3", "--precision",
                 "age:recent=16,depth=2", "age:recent=128,depth=2", "--num-tokens", "512",
                 "--window", "256", "--num-prompts", "2", "--output-len", "4", "--json"]) == 0
    fp8, short, long = json.loads(capsys.readouterr().out)["results"]
    assert [r["precision"] for r in (fp8, short, long)] == [
        "none", "age:recent=16,depth=2", "age:recent=128,depth=2"]
    assert fp8["kl_mean"] > short["kl_mean"] > long["kl_mean"] > 0
