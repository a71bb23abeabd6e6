"""kvlab's eviction policies inside vLLM: a vLLM general plugin (entry point group
`vllm.general_plugins`, name `kvlab`), loaded by vLLM in each of its processes, never by kvlab.

Set `KVLAB_VLLM_EVICTION=arc` (any registered kvlab eviction policy, in kvlab's spec grammar:
`slru:protected_share=0.5`) and vLLM's device prefix cache evicts by that kvlab policy object;
unset, the plugin does nothing but say so. On a vLLM it does not support, or a bad value, it
stops vLLM at start with one line. The offloading connector's CPU tier takes kvlab's policies
through `kvlab.integrations.vllm.offload` (its `cache_policy_module_path`).

Set `KVLAB_VLLM_STEP_LOG=PATH` and vLLM's scheduler logs its arrivals, steps and preemptions to
`PATH.<pid>` (`step_log.py`), which `kvlab validate --lockstep --kv-events ... --step-log PATH`
replays kvlab's manager on: vLLM's own step boundaries instead of the client's view of them.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable

from kvlab.errors import KvlabError
from kvlab.integrations.vllm.setting import VARIABLE, eviction_from_env
from kvlab.integrations.vllm.step_log import STEP_LOG_VARIABLE
from kvlab.policies.interfaces import Eviction

logger = logging.getLogger("vllm.kvlab")


def register() -> None:
    """The entry point vLLM calls in each process. Raises SystemExit with one line when the
    variable asks for something the plugin cannot do."""
    try:
        step_log = os.environ.get(STEP_LOG_VARIABLE, "").strip()
        if step_log:
            _log_steps(step_log)
        choice = eviction_from_env(os.environ)
        if choice is None:
            logger.info("kvlab: %s is not set: vLLM's device prefix cache evicts by vLLM's own "
                        "LRU (kvlab plugin idle)", VARIABLE)
            return
        _activate(choice.spec, choice.factory())
    except KvlabError as error:
        raise SystemExit(f"kvlab plugin: {error}") from None


def _activate(spec: str, policy: Callable[[], Eviction]) -> None:
    """Check this vLLM, patch its block pool and export the policy."""
    import vllm

    from kvlab.integrations.vllm.export import export_policy
    from kvlab.integrations.vllm.install import install
    from kvlab.integrations.vllm.support import check_internals, check_version

    check_version(vllm.__version__)
    try:
        from vllm.distributed.kv_events import MEDIUM_GPU
        from vllm.v1.core.block_pool import BlockPool
        from vllm.v1.core.kv_cache_utils import FreeKVCacheBlockQueue
    except ImportError as error:  # a vLLM whose modules moved
        raise KvlabError(f"this vLLM lacks {error.name or error}, which kvlab's eviction "
                         f"plugin relies on; unset {VARIABLE} to run vLLM's own LRU") from None
    check_internals(BlockPool, FreeKVCacheBlockQueue)
    install(BlockPool, policy, spec, MEDIUM_GPU)
    export_policy(spec)
    logger.info("kvlab: %s=%s: vLLM %s's device prefix cache evicts by kvlab's %s",
                VARIABLE, os.environ.get(VARIABLE), vllm.__version__, spec)


def _log_steps(stem: str) -> None:
    """Check this vLLM and wrap its scheduler (`step_log.py`)."""
    import vllm

    from kvlab.integrations.vllm.step_log import (
        SCHEDULER_METHODS,
        StepLogWriter,
        install_step_log,
    )
    from kvlab.integrations.vllm.support import check_scheduler, check_version

    unset = f"unset {STEP_LOG_VARIABLE}"
    check_version(vllm.__version__, unset)
    try:
        from vllm.v1.core.sched.scheduler import Scheduler
    except ImportError as error:
        raise KvlabError(f"this vLLM lacks {error.name or error}, which kvlab's step log "
                         f"wraps; {unset}") from None
    check_scheduler(Scheduler, SCHEDULER_METHODS, unset)
    folder = os.path.dirname(os.path.abspath(stem))
    if not os.path.isdir(folder):
        raise KvlabError(f"{STEP_LOG_VARIABLE}={stem!r}: no folder {folder} to write the log in")
    install_step_log(Scheduler, StepLogWriter(stem))
    logger.info("kvlab: %s=%s: vLLM's scheduler logs its steps to %s.<pid>", STEP_LOG_VARIABLE,
                stem, stem)
