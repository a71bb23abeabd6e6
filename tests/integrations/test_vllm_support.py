"""The vLLM plugin's start-up checks: the vLLM version and the internals it relies on."""

from __future__ import annotations

import pytest

from kvlab.errors import KvlabError
from kvlab.integrations.vllm.free_queue import PolicyFreeBlockQueue
from kvlab.integrations.vllm.step_log import SCHEDULER_METHODS
from kvlab.integrations.vllm.support import check_internals, check_scheduler, check_version


@pytest.mark.parametrize("version", ["0.32.0", "0.32.1+cpu", "0.32.0rc1"])
def test_vllm_0_32_is_supported(version):
    check_version(version)


@pytest.mark.parametrize("version", ["0.33.0", "0.31.2", "1.0.0", "dev"])
def test_another_vllm_is_refused_in_one_line(version):
    with pytest.raises(KvlabError) as error:
        check_version(version)
    message = str(error.value)
    assert f"vLLM {version} is not one" in message and "0.32.x" in message
    assert "\n" not in message


def test_a_vllm_whose_internals_moved_is_refused():
    class BlockPool:  # a BlockPool without touch (as a future vLLM might be)
        def free_blocks(self): ...
        def get_new_blocks(self): ...
        def reset_prefix_cache(self): ...
        def get_num_free_blocks(self): ...

    with pytest.raises(KvlabError, match=r"lacks BlockPool\.touch"):
        check_internals(BlockPool, PolicyFreeBlockQueue)


def test_a_vllm_whose_scheduler_moved_is_refused_by_the_step_log():
    class Scheduler:  # without _preempt_request
        def add_request(self): ...
        def schedule(self): ...

    with pytest.raises(KvlabError, match=r"Scheduler lacks _preempt_request, which kvlab's "
                                         r"step log wraps; unset KVLAB_VLLM_STEP_LOG"):
        check_scheduler(Scheduler, SCHEDULER_METHODS, "unset KVLAB_VLLM_STEP_LOG")
    check_scheduler(_Full, SCHEDULER_METHODS, "unset KVLAB_VLLM_STEP_LOG")


class _Full:
    def add_request(self): ...
    def schedule(self): ...
    def _preempt_request(self): ...
