"""Ctrl-C on a long simulation: `simulate(partial_on_interrupt=True)` returns the requests
finished by then (and says where it stopped); `kvlab sim` prints the partial report, says what
it covers on stderr and exits 130; without the flag the interrupt propagates."""

from __future__ import annotations

import re

import pytest

from kvlab.cli import main
from kvlab.sim.instance import SimInstance

STOP_AFTER = 40  # requests finished before the (simulated) Ctrl-C


@pytest.fixture
def ctrl_c_after_some_requests(monkeypatch):
    """Raise KeyboardInterrupt inside the event loop once STOP_AFTER requests have finished,
    where a real Ctrl-C lands (between two steps of the instance)."""
    original = SimInstance.__init__

    def init(self, *args, **kwargs):
        original(self, *args, **kwargs)
        finished = []

        def on_finished(ended):
            finished.extend(ended)
            if len(finished) >= STOP_AFTER:
                raise KeyboardInterrupt

        self.on_finished = on_finished

    monkeypatch.setattr(SimInstance, "__init__", init)


@pytest.mark.usefixtures("ctrl_c_after_some_requests")
def test_sim_prints_the_partial_report_and_exits_130(capsys):
    code = main(["sim", "--num-prompts", "300", "--disable-tqdm"])
    captured = capsys.readouterr()
    assert code == 130
    assert "Serving Benchmark Result" in captured.out
    successful = next(line for line in captured.out.splitlines()
                      if line.startswith("Successful requests:"))
    finished = re.search(r"the (\d+) of 300 requests finished by then", captured.err)
    assert finished is not None, captured.err
    # finished counts the failed ones (over the model length) too; the report, successes
    assert STOP_AFTER <= int(finished.group(1)) < 300
    assert 0 < int(successful.split()[-1]) <= int(finished.group(1))

@pytest.mark.usefixtures("ctrl_c_after_some_requests")
def test_simulate_keeps_the_finished_requests_and_says_where_it_stopped():
    from kvlab.sim import SimConfig, simulate
    from kvlab.traces import load_trace

    trace = load_trace(None, num_prompts=200)
    result = simulate(trace, SimConfig(), partial_on_interrupt=True)
    assert all(r.status.is_finished for r in result.requests)
    assert len(result.requests) + result.metadata["num_unfinished_requests"] == 200
    assert result.metadata["interrupted_at_s"] > 0
    with pytest.raises(KeyboardInterrupt):
        simulate(trace, SimConfig())
