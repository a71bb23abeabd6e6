"""A sweep worker keeps the traces it read (`kvlab.sweep.trace_cache`): the same trace for the
same settings at any rate or time scale, a file read again once it changed, and the loading's
warnings given on every use."""

import warnings

import pytest

from kvlab.errors import KvlabWarning
from kvlab.sweep.runner import load_settings_trace
from kvlab.sweep.trace_cache import forget_traces
from kvlab.traces import load_trace

HEADER = "TIMESTAMP,ContextTokens,GeneratedTokens"


@pytest.fixture(autouse=True)
def _fresh():
    forget_traces()
    yield
    forget_traces()


def _write(path, rows):
    path.write_text("\n".join([HEADER, *rows]) + "\n")
    return path


@pytest.mark.parametrize("arrivals", [{}, {"time_scale": 4.0}, {"request_rate": 3.0, "seed": 2},
                                      {"request_rate": 5.0, "burstiness": 0.5}])
def test_a_kept_trace_gives_what_load_trace_gives(arrivals):
    settings = {"dataset_name": "azure", "dataset_path": "azure-conv", "num_prompts": 50}
    load_settings_trace(settings)  # kept, without arrivals
    got = load_settings_trace({**settings, **arrivals})
    expected = load_trace("azure", "azure-conv", num_prompts=50, **arrivals)
    assert got.requests == expected.requests
    assert got.metadata == expected.metadata


def test_a_changed_file_is_read_again(tmp_path):
    path = _write(tmp_path / "t.csv", ["2023-11-16 18:00:01.0,2,2", "2023-11-16 18:00:02.0,3,3"])
    settings = {"dataset_name": "azure", "dataset_path": str(path)}
    assert [r.input_len for r in load_settings_trace(settings).requests] == [2, 3]
    _write(path, ["2023-11-16 18:00:01.0,7,2", "2023-11-16 18:00:02.0,3,3",
                  "2023-11-16 18:00:03.0,1,1"])
    assert [r.input_len for r in load_settings_trace(settings).requests] == [7, 3, 1]


def test_warnings_are_given_on_every_use(tmp_path):
    path = _write(tmp_path / "t.csv", ["2023-11-16 18:00:01.0,2,2"])
    settings = {"dataset_name": "azure", "dataset_path": str(path), "num_prompts": 5}
    for _ in range(2):
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            load_settings_trace(settings)
        assert [w.category for w in caught] == [KvlabWarning]
        assert "num_prompts 5 but the trace holds only 1" in str(caught[0].message)
