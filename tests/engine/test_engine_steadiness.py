"""What keeps measured step times steady without changing what the engine does (a start-up
warm-up; the start-up heap kept out of the cyclic GC during a run), and `iter_run`: `run` one
step at a time, so that validation can step two engines in turn."""

from __future__ import annotations

import gc

import pytest

from kvlab.engine.config import EngineConfig
from kvlab.engine.engine import LLMEngine
from kvlab.engine.sampler import SamplingParams
from kvlab.metrics import INT_COLUMNS
from kvlab.policies.serving import ServingConfig

pytestmark = pytest.mark.usefixtures("one_torch_thread")


@pytest.fixture(scope="module")
def engine() -> LLMEngine:
    serving = ServingConfig.create(block_size=4, num_gpu_blocks_override=64)
    return LLMEngine(EngineConfig(model="tiny-llama", serving=serving))


def _requests(engine: LLMEngine, num: int = 3):
    params = SamplingParams(temperature=0.0, max_tokens=4, ignore_eos=True)
    return [engine.make_request([7 + i] * (5 + i), params) for i in range(num)]


def test_a_run_steps_with_the_startup_heap_frozen_and_unfreezes_it_after(engine, monkeypatch):
    frozen_during_steps = []
    execute = engine.runner.execute

    def spy(output, params):
        frozen_during_steps.append(gc.get_freeze_count())
        return execute(output, params)

    monkeypatch.setattr(engine.runner, "execute", spy)
    engine.run(_requests(engine))
    assert frozen_during_steps and min(frozen_during_steps) > 0
    assert gc.get_freeze_count() == 0


def test_iter_run_yields_once_per_step_and_returns_the_same_run_as_run(engine):
    first = _requests(engine)
    steps = engine.iter_run(first)
    num_yields = 0
    while True:
        try:
            next(steps)
        except StopIteration as stop:
            stepped = stop.value
            break
        num_yields += 1
    run = engine.run(_requests(engine))
    assert num_yields == len(stepped.steps)
    assert stepped.steps.columns["num_seqs"] == run.steps.columns["num_seqs"]
    assert [r.output_token_ids for r in stepped.requests] == [
        r.output_token_ids for r in run.requests
    ]


def test_the_start_up_warm_up_changes_no_token_and_no_step_record():
    runs = []
    for warmup in (True, False):
        serving = ServingConfig.create(block_size=4, num_gpu_blocks_override=24)
        config = EngineConfig(model="tiny-llama", warmup=warmup, serving=serving)
        engine = LLMEngine(config)
        runs.append(engine.run(_requests(engine, num=6)))
    with_warmup, without = runs
    assert [r.output_token_ids for r in with_warmup.requests] == [
        r.output_token_ids for r in without.requests
    ]
    for name in INT_COLUMNS:
        assert with_warmup.steps.columns[name] == without.steps.columns[name], name


def test_no_warmup_flag_turns_the_warm_up_off():
    import argparse

    from kvlab.cli.commands import run as run_command

    parser = argparse.ArgumentParser()
    run_command.add_arguments(parser)
    assert run_command.engine_config(parser.parse_args([])).warmup is True
    assert run_command.engine_config(parser.parse_args(["--no-warmup"])).warmup is False
