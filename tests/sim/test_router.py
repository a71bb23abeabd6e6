"""Each router's rule on hand-made instance states: loads and cached prefixes as given."""

from __future__ import annotations

from dataclasses import dataclass

import pytest

from kvlab.errors import KvlabError
from kvlab.policies import Request
from kvlab.sim.router import make_router, router_names


@dataclass
class FakeInstance:
    """An instance as a router sees it: `load` requests held, `cached` prefix tokens."""

    load: int = 0
    cached: int = 0

    def num_requests(self) -> int:
        return self.load

    def num_cached_prefix_tokens(self, request: Request) -> int:
        return self.cached


def request(request_id: int = 0) -> Request:
    return Request(request_id=request_id, prompt_len=64, max_output_tokens=4)


def states(*pairs: tuple[int, int]) -> list[FakeInstance]:
    return [FakeInstance(load, cached) for load, cached in pairs]


def test_the_four_routers_are_registered_in_order():
    assert router_names() == ["round-robin", "least-loaded", "prefix-aware", "power-of-two"]


def test_round_robin_takes_each_instance_in_turn_whatever_the_load():
    router = make_router("round-robin")
    instances = states((9, 0), (0, 0), (0, 99))
    assert [router.choose(request(i), instances) for i in range(7)] == [0, 1, 2, 0, 1, 2, 0]


def test_least_loaded_takes_the_fewest_requests():
    router = make_router("least-loaded")
    assert router.choose(request(), states((3, 0), (1, 0), (2, 0))) == 1


def test_least_loaded_breaks_ties_by_index():
    router = make_router("least-loaded")
    assert router.choose(request(), states((3, 0), (1, 0), (1, 0), (1, 0))) == 1


def test_prefix_aware_takes_the_longest_cached_prefix_even_when_busier():
    router = make_router("prefix-aware")
    assert router.choose(request(), states((0, 16), (5, 48), (1, 32))) == 1


def test_prefix_aware_breaks_ties_by_load_then_index():
    router = make_router("prefix-aware")
    assert router.choose(request(), states((4, 32), (2, 32), (2, 32), (0, 16))) == 1


def test_prefix_aware_without_hits_is_least_loaded():
    router = make_router("prefix-aware")
    assert router.choose(request(), states((2, 0), (1, 0), (3, 0))) == 1


def test_power_of_two_with_two_instances_is_least_loaded():
    router = make_router("power-of-two", seed=3)
    instances = states((5, 0), (2, 0))
    assert {router.choose(request(i), instances) for i in range(50)} == {1}


def test_power_of_two_picks_the_less_loaded_of_two_draws():
    """Never the most loaded of four (it loses every pair it is in), and not always the least
    loaded (which a pair without it cannot choose)."""
    router = make_router("power-of-two", seed=0)
    instances = states((0, 0), (1, 0), (2, 0), (3, 0))
    choices = [router.choose(request(i), instances) for i in range(200)]
    assert 3 not in choices
    assert set(choices) == {0, 1, 2}


def test_power_of_two_ties_go_to_the_lower_index():
    router = make_router("power-of-two", seed=1)
    instances = states((1, 0), (1, 0), (1, 0))
    choices = [router.choose(request(i), instances) for i in range(100)]
    assert set(choices) == {0, 1}  # 2 only ever ties with a lower index


def test_power_of_two_repeats_its_draws_for_a_seed():
    instances = states((0, 0), (0, 0), (0, 0), (0, 0), (0, 0))

    def draws(seed: int) -> list[int]:
        router = make_router("power-of-two", seed=seed)
        return [router.choose(request(i), instances) for i in range(40)]

    assert draws(7) == draws(7)
    assert draws(7) != draws(8)


def test_one_instance_is_always_chosen_by_every_router():
    for name in router_names():
        assert make_router(name).choose(request(), states((3, 5))) == 0


def test_an_unknown_router_lists_the_valid_ones():
    with pytest.raises(KvlabError) as info:
        make_router("random")
    message = str(info.value)
    assert "'random'" in message
    for name in router_names():
        assert name in message
    assert info.value.parameters == ("router",)
