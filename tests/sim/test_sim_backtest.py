"""Back-test: a fixed-seed excerpt reproduces the stored summaries (tests/data/...)."""

import json
import math

import pytest
from backtest_case import POLICIES, STORED, run_case


@pytest.fixture(scope="module")
def fresh():
    return run_case()


@pytest.fixture(scope="module")
def stored():
    return json.loads(STORED.read_text(encoding="utf-8"))


def test_the_stored_file_holds_every_policy(stored):
    assert sorted(stored) == sorted(POLICIES)


@pytest.mark.parametrize("policy", POLICIES)
def test_the_summary_matches_the_stored_one(fresh, stored, policy):
    now, then = fresh[policy], stored[policy]
    assert sorted(now) == sorted(then)
    for key, expected in then.items():
        actual = now[key]
        if isinstance(expected, float) and isinstance(actual, (int, float)):
            assert math.isclose(actual, expected, rel_tol=1e-9, abs_tol=1e-9), key
        else:
            assert actual == expected, key


def test_the_case_exercises_preemption_and_swapping(stored):
    assert stored["paged"]["num_preemptions"] > 0
    assert stored["paged:preemption=swap"]["num_swaps_out"] > 0
