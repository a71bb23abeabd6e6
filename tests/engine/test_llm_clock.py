"""The engine loop's clocks follow the time rule of docs/architecture.md (arrivals admitted at
step starts, tokens stamped at step ends, idle gaps jumped) — checked on relations, never on
elapsed time."""

from __future__ import annotations

import itertools

import pytest

from kvlab.engine.config import EngineConfig
from kvlab.engine.engine import LLMEngine
from kvlab.engine.sampler import SamplingParams
from kvlab.errors import KvlabError
from kvlab.policies.serving import ServingConfig

pytestmark = pytest.mark.usefixtures("one_torch_thread")


@pytest.fixture(scope="module")
def engine() -> LLMEngine:
    serving = ServingConfig.create(block_size=4, num_gpu_blocks_override=64)
    return LLMEngine(EngineConfig(model="tiny-llama", serving=serving))


def _requests(engine, arrivals: list[float], max_tokens: int = 3):
    params = SamplingParams(temperature=0.0, max_tokens=max_tokens, ignore_eos=True)
    return [
        engine.make_request([5 + i] * (4 + i), params, arrival_s=t) for i, t in enumerate(arrivals)
    ]


def test_an_idle_virtual_clock_jumps_to_the_next_arrival(engine):
    requests = _requests(engine, [0.0, 1000.0])
    run = engine.run(requests, replay="fast")
    late = requests[1]
    assert late.first_scheduled_s == 1000.0  # exactly: the clock jumped, it did not wait
    assert requests[0].finish_s < 1000.0
    starts = run.steps.columns["start_s"]
    assert 1000.0 in starts
    assert run.start_s == 0.0 and run.end_s == late.finish_s


def test_virtual_steps_follow_each_other_by_their_measured_duration(engine):
    run = engine.run(_requests(engine, [0.0, 0.0, 0.0]), replay="fast")
    c = run.steps.columns
    for i in range(len(c["step_id"]) - 1):
        assert c["start_s"][i + 1] == c["start_s"][i] + c["wall_time_s"][i]
        assert c["duration_s"][i] == pytest.approx(c["wall_time_s"][i], rel=1e-9, abs=1e-12)


def test_tokens_are_stamped_with_the_end_of_their_step(engine):
    requests = _requests(engine, [0.0, 0.0])
    run = engine.run(requests, replay="fast")
    c = run.steps.columns
    ends = {s + d for s, d in zip(c["start_s"], c["wall_time_s"], strict=True)}
    for request in requests:
        assert request.first_token_s in ends and request.finish_s in ends
        assert request.arrival_s <= request.first_scheduled_s < request.first_token_s


def test_a_request_is_admitted_only_at_a_step_starting_after_its_arrival(engine):
    requests = _requests(engine, [0.0, 1e-9], max_tokens=4)
    run = engine.run(requests, replay="fast")
    starts = list(run.steps.columns["start_s"])
    assert starts[0] == 0.0 == requests[0].first_scheduled_s
    # it arrived just after the first step began, so it joined the second one
    assert requests[1].first_scheduled_s == starts[1] > 1e-9


def test_trace_ids_are_kept_and_reusable_after_a_run(engine):
    params = SamplingParams(temperature=0.0, max_tokens=2, ignore_eos=True)
    first = engine.make_request([3, 4, 5], params, request_id=0)
    with pytest.raises(KvlabError, match="already in use"):
        engine.make_request([3, 4, 5], params, request_id=0)
    engine.run([first])
    again = engine.make_request([3, 4, 5], params, request_id=0)
    assert again.request_id == 0 and engine.make_request([1], params).request_id >= 1


def test_the_realtime_clock_serves_requests_that_have_arrived(engine):
    requests = _requests(engine, [0.0, 0.0])
    run = engine.run(requests, replay="realtime")
    starts = run.steps.columns["start_s"]
    assert all(b >= a for a, b in itertools.pairwise(starts))
    assert all(r.num_output_tokens == 3 for r in requests)


def test_an_unknown_replay_mode_is_refused(engine):
    with pytest.raises(KvlabError, match="fast, realtime"):
        engine.run([], replay="slow")
