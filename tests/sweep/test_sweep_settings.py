"""Sweep settings: every `kvlab sim` flag is one, each value is read and checked the library's
way, and a run's key does not depend on the order its settings were given in."""

import argparse
import re

import pytest
from hypothesis import given
from hypothesis import strategies as st

from kvlab.cli.commands import sim
from kvlab.errors import KvlabError
from kvlab.sweep import SETTINGS, check_settings, run_key, setting_value

# `kvlab sim` flags that are about its own output, not about the run
NOT_RUN_SETTINGS = {"compare", "save_result", "result_dir", "result_filename", "table_format",
                    "disable_tqdm", "help", "plot"}


def test_every_sim_flag_is_a_sweep_setting():
    parser = argparse.ArgumentParser()
    sim.add_arguments(parser)
    dests = {action.dest for action in parser._actions} - NOT_RUN_SETTINGS
    assert dests - set(SETTINGS) == set()


def test_the_other_settings_are_the_policy_keys_and_the_slo_class():
    parser = argparse.ArgumentParser()
    sim.add_arguments(parser)
    extra = set(SETTINGS) - {action.dest for action in parser._actions}
    # (slo_class: the class whose goodput `kvlab tune --slo-class` ranks by)
    assert extra == {"reserve", "block_sizing", "eviction", "preemption", "victim",
                     "watermark", "host_pages", "precision", "slo_class"}


@pytest.mark.parametrize(("name", "text", "value"), [
    ("max_num_seqs", "64", 64),
    ("request_rate", "inf", float("inf")),
    ("request_rate", "none", None),
    ("time_scale", 2, 2.0),
    ("enable_prefix_caching", "yes", True),
    ("max_model_len", "null", None),
    ("swap_space_bytes", "512MiB", 512 * 2**20),
    ("swap_space_bytes", 4, 4 * 2**30),
    ("kv_cache_memory_bytes", "2GiB", 2 * 2**30),
    ("kv_cache_memory_bytes", "none", None),
    ("goodput", {"ttft": 500}, {"ttft": 500.0}),
    ("goodput", "ttft:500 tpot:50", {"ttft": 500.0, "tpot": 50.0}),
    ("metric_percentiles", [50, 99], "50,99"),
])
def test_values_are_read_as_their_setting(name, text, value):
    assert setting_value(name, text) == value


@pytest.mark.parametrize(("name", "value", "problem"), [
    ("max_num_seqs", "many", "max_num_seqs 'many': expected a whole number"),
    ("max_num_seqs", 0, "max_num_seqs is 0; expected a whole number >= 1"),
    ("max_num_seqs", 2.5, "expected a whole number"),
    ("eviction", "sometimes", "eviction='sometimes'; valid:"),
    ("policy", "pagd", "unknown kind 'pagd'"),
    ("model", "llama-9", "llama-9"),
    ("dataset_name", "azur", "dataset_name 'azur': expected one of"),
    ("request_rate", -1, "request_rate -1.0: expected requests per second > 0"),
    ("gpu_memory_utilization", 1.5, "expected a fraction in (0, 1]"),
    ("enable_chunked_prefill", "maybe", "expected true or false"),
    ("kv_cache_memory_bytes", "lots", "kv_cache_memory_bytes 'lots': expected a size"),
    ("colour", "red", "unknown setting 'colour'"),
    ("num_instances", 0, "num_instances is 0; expected a whole number >= 1"),
    ("router", "random", "router is 'random'; expected one of round-robin"),
])
def test_a_bad_value_names_the_setting_and_the_problem(name, value, problem):
    with pytest.raises(KvlabError, match=re.escape(problem)):
        setting_value(name, value)


settings_strategy = st.dictionaries(
    st.sampled_from(["max_num_seqs", "max_num_batched_tokens", "num_prompts", "seed"]),
    st.integers(1, 10_000), min_size=1)


@given(settings_strategy, st.randoms())
def test_the_run_key_does_not_depend_on_the_settings_order(settings, rng):
    names = list(settings)
    rng.shuffle(names)
    shuffled = {name: settings[name] for name in names}
    assert run_key(check_settings(shuffled)) == run_key(check_settings(settings))


@given(settings_strategy, settings_strategy)
def test_different_settings_have_different_keys(one, other):
    if check_settings(one) != check_settings(other):
        assert run_key(check_settings(one)) != run_key(check_settings(other))


def test_the_same_value_written_two_ways_is_one_run():
    assert run_key(check_settings({"time_scale": 2})) == run_key(check_settings(
        {"time_scale": "2.0"}))


def _parser(command) -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser()
    command.add_arguments(parser)
    return parser


def test_every_flag_of_the_table_is_a_command_flag_with_the_table_default():
    """The one table makes the flags: a declared flag is some command's, with its default."""
    from kvlab.cli.commands import run

    actions = {}
    for command in (run, sim):  # (sim last: kvlab run has a --model of its own)
        actions |= {a.dest: a for a in _parser(command)._actions}
    for setting in SETTINGS.values():
        if setting.flag is None or setting.name in ("num_prompts", "seed"):  # (each command's)
            continue
        action = actions[setting.name]
        assert setting.flag in action.option_strings
        if setting.action != "off":
            assert action.default == setting.default, setting.name


def test_a_flag_reads_its_text_as_the_sweep_setting_does():
    args = _parser(sim).parse_args(["--max-num-seqs", "64", "--kv-cache-memory", "2GiB",
                                    "--prefix-cache-retention-interval", "none",
                                    "--no-enable-chunked-prefill"])
    assert args.max_num_seqs == setting_value("max_num_seqs", "64")
    assert args.prefix_cache_retention_interval is setting_value(
        "prefix_cache_retention_interval", "none")
    assert args.enable_chunked_prefill is setting_value("enable_chunked_prefill", "false")
    assert setting_value("kv_cache_memory_bytes", args.kv_cache_memory_bytes) == 2 * 2**30
