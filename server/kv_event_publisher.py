"""kvlab serve's KV events: the manager's prefix-cache changes published over ZMQ in vLLM's
wire format (`--kv-events-config`, the same JSON vLLM takes), so that any consumer of vLLM's
events (a router, `kvlab bench serve --kv-events`) reads kvlab serve's too.

Each step's changes go out as one message, every step, an empty one too (so that a consumer
sees the server's steps: KV lockstep replays on them), stamped with the step's end: topic, an
8-byte big-endian sequence number, and the msgpack array [ts, events, data_parallel_rank]; a
stored run of one request's chained blocks is one BlockStored (block_hashes,
parent_block_hash, token_ids, block_size, ...), each removed block one BlockRemoved, both
naming their KV-cache group (`group_idx`, as vLLM 0.32). Block hashes are kvlab's page hashes
(content hashes).
"""

from __future__ import annotations

import json
import logging
import queue
import threading
import time
from dataclasses import dataclass
from typing import Any

from kvlab.errors import KvlabError
from kvlab.policies.kv_events import REMOVED, STORED, BlockEvent

log = logging.getLogger("kvlab.server")
MEDIUM = "GPU"  # vLLM's name for the device tier
CONFIG_KEYS = {"enable_kv_cache_events", "publisher", "endpoint", "topic", "replay_endpoint",
               "buffer_steps", "hwm", "max_queue_size"}


@dataclass(slots=True, frozen=True)
class KVEventsConfig:
    """Where to publish: a ZMQ bind address (vLLM's default tcp://*:5557) and a topic."""

    endpoint: str = "tcp://*:5557"
    topic: str = ""
    hwm: int = 100_000


def parse_kv_events_config(text: str) -> KVEventsConfig | None:
    """vLLM's --kv-events-config JSON: a config when events are on with the zmq publisher,
    None when they are off; a KvlabError naming the flag for bad JSON or keys."""
    try:
        data = json.loads(text)
    except ValueError as exc:
        raise KvlabError(f"--kv-events-config: not JSON ({exc})") from None
    if not isinstance(data, dict):
        raise KvlabError("--kv-events-config: expected a JSON object, e.g. "
                         '{"enable_kv_cache_events": true, "endpoint": "tcp://*:5557"}')
    unknown = sorted(set(data) - CONFIG_KEYS)
    if unknown:
        raise KvlabError(f"--kv-events-config: unknown key {unknown[0]!r} (expected "
                         f"{', '.join(sorted(CONFIG_KEYS))})")
    if not data.get("enable_kv_cache_events"):
        return None
    publisher = data.get("publisher", "zmq")
    if publisher == "null":
        return None
    if publisher != "zmq":
        raise KvlabError(f"--kv-events-config: publisher {publisher!r}: expected zmq or null")
    if "replay_endpoint" in data:
        log.warning("--kv-events-config: replay_endpoint is not supported; ignored")
    endpoint = data.get("endpoint", "tcp://*:5557")
    if not isinstance(endpoint, str) or "://" not in endpoint:
        raise KvlabError(f"--kv-events-config: endpoint {endpoint!r}: expected tcp://HOST:PORT")
    return KVEventsConfig(endpoint, str(data.get("topic", "")), int(data.get("hwm", 100_000)))


def to_vllm_events(events: list[BlockEvent], block_size: int) -> list[dict[str, Any]]:
    """The changes as vLLM's event maps: consecutive stored blocks of one request, each the
    child of the one before, as one BlockStored run."""
    out: list[dict[str, Any]] = []
    run_request: int | None = None
    for event in events:
        if event.kind == STORED:
            last = out[-1] if out and run_request == event.request_id else None
            if last is not None and last["type"] == "BlockStored" and (
                last["block_hashes"][-1] == event.parent and last["group_idx"] == event.group
            ):
                last["block_hashes"].append(event.key)
                last["token_ids"].extend(event.token_ids or ())
                continue
            out.append({"type": "BlockStored", "block_hashes": [event.key],
                        "parent_block_hash": event.parent,
                        "token_ids": list(event.token_ids or ()), "block_size": block_size,
                        "lora_id": None, "medium": MEDIUM, "lora_name": None,
                        "group_idx": event.group})
            run_request = event.request_id
        elif event.kind == REMOVED:
            out.append({"type": "BlockRemoved", "block_hashes": [event.key], "medium": MEDIUM,
                        "group_idx": event.group})
            run_request = None
        else:
            out.append({"type": "AllBlocksCleared"})
            run_request = None
    return out


class KVEventPublisher:
    """A ZMQ PUB socket on a thread of its own (ZMQ sockets are not thread-safe): `publish`
    queues a step's changes from the engine thread, the thread encodes and sends them."""

    def __init__(self, config: KVEventsConfig, block_size: int) -> None:
        try:
            import msgpack
            import zmq
        except ImportError:
            raise KvlabError("--kv-events-config needs pyzmq and msgpack: pip install "
                             "'kvlab[serve]'") from None
        self._msgpack = msgpack
        self._socket: Any = zmq.Context.instance().socket(zmq.PUB)
        self._socket.setsockopt(zmq.SNDHWM, config.hwm)
        self._socket.setsockopt(zmq.LINGER, 1000)
        try:
            self._socket.bind(config.endpoint)
        except zmq.ZMQError as exc:
            self._socket.close()
            raise KvlabError(f"--kv-events-config: cannot bind {config.endpoint} ({exc})") \
                from None
        self._topic = config.topic.encode()
        self._block_size = block_size
        self._queue: queue.SimpleQueue[tuple[list[BlockEvent], float] | None] = (
            queue.SimpleQueue())
        self._seq = 0
        self._thread = threading.Thread(target=self._send_all, name="kv-events", daemon=True)
        self._thread.start()
        log.info("publishing KV events on %s", config.endpoint)

    def publish(self, events: list[BlockEvent], ts: float | None = None) -> None:
        """Queue one step's changes (engine thread), stamped `ts` (epoch seconds; default:
        when they are sent): the step's end. A step without changes is published too, as an
        empty batch (vLLM skips those): a consumer then sees every step's end."""
        self._queue.put((events, time.time() if ts is None else ts))

    def close(self) -> None:
        """Send what is queued, then close the socket."""
        self._queue.put(None)
        self._thread.join()

    def _send_all(self) -> None:
        while (item := self._queue.get()) is not None:
            events, ts = item
            payload = [ts, to_vllm_events(events, self._block_size), 0]
            frames = (self._topic, self._seq.to_bytes(8, "big"),
                      self._msgpack.packb(payload, use_bin_type=True))
            self._socket.send_multipart(frames)
            self._seq += 1
        self._socket.close()
