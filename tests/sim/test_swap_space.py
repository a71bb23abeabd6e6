"""The simulator's host swap space: `--swap-space` (vLLM V0's, per device, in GiB or a size)
bounds the swap pages as the engine's does, the policy's `host_pages` (pages) wins, and a
size given to host_pages is one line naming --swap-space."""

from __future__ import annotations

import pytest

from kvlab.cli import main
from kvlab.errors import KvlabError
from kvlab.policies import parse_policy
from kvlab.policies.serving import GiB, ServingConfig
from kvlab.sim import SimConfig
from kvlab.sim.assembly import build_manager


def _host_pages(policy: str, **serving) -> tuple[int, int, int]:
    config = SimConfig(serving=ServingConfig.create(policy, **serving))
    manager = build_manager(config, config.cost_model)
    return manager.num_host_pages, config.capacity.num_pages, config.page_bytes


def test_swap_space_bounds_the_host_pages_in_page_bytes():
    host, device, page_bytes = _host_pages("paged:preemption=swap", swap_space_bytes=GiB)
    assert host == GiB // page_bytes < device


def test_a_swap_space_larger_than_the_device_gives_the_device_pages():
    host, device, _ = _host_pages("paged:preemption=swap", swap_space_bytes=1024 * GiB)
    assert host == device


def test_host_pages_win_over_the_swap_space_and_recompute_needs_none():
    assert _host_pages("paged:preemption=swap,host_pages=7", swap_space_bytes=GiB)[0] == 7
    assert _host_pages("paged", swap_space_bytes=GiB)[0] == 0


def test_host_pages_given_in_bytes_names_the_swap_space_flag():
    with pytest.raises(KvlabError, match="--swap-space"):
        parse_policy("paged:preemption=swap,host_pages=4GiB")


def test_sim_takes_the_swap_space_flag(capsys):
    assert main(["sim", "--policy", "paged:preemption=swap", "--swap-space", "512MiB",
                 "--num-prompts", "20", "--disable-tqdm"]) == 0
    assert "Successful requests" in capsys.readouterr().out
