"""Engines stepped in turn (`run_engines`, how `kvlab validate` runs its calibration alongside
the validated run): each run is the run it would have been alone, and they really alternate."""

from __future__ import annotations

import dataclasses
import itertools
import json

from kvlab.cli import main
from kvlab.engine import interleave
from kvlab.engine.config import EngineConfig
from kvlab.engine.engine import LLMEngine
from kvlab.engine.interleave import run_engine, run_engines
from kvlab.fidelity import lockstep, sim_config_for
from kvlab.policies.serving import ServingConfig
from kvlab.traces import Trace, TraceRequest


def burst(first_id: int, num: int) -> Trace:
    """`num` requests all arriving at 0: their schedule does not depend on measured times."""
    requests = [TraceRequest(first_id + i, 0.0, 9 + 5 * i, 6 + i) for i in range(num)]
    return Trace("burst", "random", "synthetic", requests, {})


CONFIG = EngineConfig(
    model="tiny-llama",
    serving=ServingConfig.create(
        "paged:block_size=4", num_gpu_blocks_override=16, max_model_len=64
    ),
)


def outcome(result):
    columns = result.steps.columns
    return (
        list(columns["num_seqs"]),
        list(columns["num_preempted"]),
        list(columns["num_free_pages"]),
        [r.output_token_ids for r in result.requests],
    )


def test_interleaved_runs_make_the_decisions_and_tokens_of_runs_alone():
    traces = [burst(0, 4), burst(100, 6)]
    together = run_engines(CONFIG, traces)
    for trace, (result, _, _) in zip(traces, together, strict=True):
        alone, _, _ = run_engine(CONFIG, trace)
        assert outcome(result) == outcome(alone)


def _step_order(monkeypatch, turn_s: float) -> list[int]:
    """Which of two engines ran each step (0 or 1), with turns of `turn_s` CPU seconds."""
    order = []
    step = LLMEngine.step

    def spy(self, loop, now_s, clock):
        order.append(id(self))
        return step(self, loop, now_s, clock)

    monkeypatch.setattr(LLMEngine, "step", spy)
    monkeypatch.setattr(interleave, "TURN_S", turn_s)
    (_, first, _), _ = run_engines(CONFIG, [burst(0, 3), burst(100, 3)])
    return [0 if engine == id(first) else 1 for engine in order]


def test_interleaved_runs_alternate_from_the_first_step(monkeypatch):
    order = _step_order(monkeypatch, turn_s=0.0)  # a step per turn
    assert order[:2] == [0, 1]
    # Neither ran to its end before the other got past its first step.
    last_first = max(i for i, engine in enumerate(order) if engine == 0)
    last_second = max(i for i, engine in enumerate(order) if engine == 1)
    assert order.index(1, 2) < last_first and order.index(0, 2) < last_second


def test_an_engine_keeps_its_turn_for_turn_s_of_cpu_time(monkeypatch):
    order = _step_order(monkeypatch, turn_s=1e9)  # longer than either run
    switches = sum(a != b for a, b in itertools.pairwise(order))
    assert order[0] == 0 and switches == 1


def test_an_interleaved_run_is_identical_in_lockstep():
    trace = dataclasses.replace(burst(0, 5), requests=[
        dataclasses.replace(r, arrival_s=0.002 * r.request_id) for r in burst(0, 5).requests
    ])
    (_, _, _), (result, engine, ran) = run_engines(CONFIG, [burst(100, 5), trace])
    report = lockstep(result, ran, sim_config_for(engine), engine.preemption_costs)
    assert report.identical, report.describe()


SMALL = [
    "--dataset-name", "random", "--random-input-len", "24", "--random-output-len", "6",
    "--num-prompts", "4", "--num-gpu-blocks-override", "16", "--block-size", "4",
    "--max-model-len", "64", "--disable-tqdm", "--save-result",
]


def test_validate_interleaves_its_calibration_run_on_cpu_unless_told_before(tmp_path):
    for flags, name, expected in (
        ([], "i.json", "separate run, interleaved"),
        (["--calibration-run", "before"], "b.json", "separate run, before"),
    ):
        args = [*SMALL, "--result-dir", str(tmp_path), "--result-filename", name, *flags]
        assert main(["validate", *args]) == 0
        assert json.loads((tmp_path / name).read_text())["calibration"].startswith(expected)


def test_on_step_hears_every_request_of_every_run_end():
    ended = []
    run_engines(CONFIG, [burst(0, 3), burst(100, 4)], on_step=ended.append)
    assert sum(ended) == 7 and len(ended) > 2
