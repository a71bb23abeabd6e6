"""A server's KV events during a benchmark: subscribe to the ZMQ stream that vLLM publishes
with `--kv-events-config '{"enable_kv_cache_events": true, "publisher": "zmq", ...}'` (and
vLLM-Ascend, SGLang and kvlab serve alike), keep every batch with its receive time, save and
load the stream beside the result.

On the wire each message is three frames: topic, an 8-byte big-endian sequence number and a
msgpack `KVEventBatch`, the array [ts, events, data_parallel_rank] whose events are maps
tagged by "type" (BlockStored: block_hashes, parent_block_hash, token_ids, block_size, ...;
BlockRemoved: block_hashes; AllBlocksCleared).
"""

from __future__ import annotations

import json
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from kvlab.errors import KvlabError, write_text_file
from kvlab.metrics.results import result_stem

STREAM_FORMAT = "kvlab-kv-events-1"
EVENT_TYPES = ("BlockStored", "BlockRemoved", "AllBlocksCleared")
POLL_S = 0.05
# After the run, events of its last steps may still be on their way.
DRAIN_S = 0.5
# Subscriptions propagate to the publisher asynchronously (ZMQ's "slow joiner"): wait this
# long after connecting before the run sends anything.
JOIN_S = 0.3


@dataclass(slots=True)
class EventBatch:
    """One published batch: when it arrived (seconds since the run began), the publisher's
    sequence number and timestamp (epoch seconds) and its events (maps, hashes as given)."""

    recv_s: float
    seq: int
    ts: float
    events: list[dict[str, Any]]


@dataclass(slots=True)
class KVEventStream:
    """The events a server published during a run, in arrival order. `missing_seqs` lists
    sequence numbers that never arrived (dropped by the publisher or the network)."""

    endpoint: str
    started_at: float
    batches: list[EventBatch] = field(default_factory=list)
    missing_seqs: list[int] = field(default_factory=list)

    @property
    def num_events(self) -> int:
        """Events over all batches."""
        return sum(len(batch.events) for batch in self.batches)


def normalize_endpoint(endpoint: str) -> str:
    """`tcp://HOST:PORT` from ENDPOINT or HOST:PORT; a KvlabError naming --kv-events for a
    bind address (`*`) or a missing port."""
    text = endpoint.strip()
    if "://" not in text:
        text = "tcp://" + text
    scheme, _, rest = text.partition("://")
    if scheme == "ipc":
        return text
    host, sep, port = rest.rpartition(":")
    if scheme != "tcp" or not sep or not port.isdigit() or not host:
        raise KvlabError(f"--kv-events {endpoint!r}: expected tcp://HOST:PORT (or HOST:PORT, "
                         "or ipc://PATH)")
    if host == "*":
        raise KvlabError(f"--kv-events {endpoint!r}: `*` is the server's bind address; give "
                         "the host to connect to, e.g. tcp://127.0.0.1:" + port)
    return text


class KVEventSubscriber:
    """A background ZMQ SUB socket that keeps every batch until `stop` (bounded: it stops with
    the run). Malformed messages are counted, and `stop` raises on them."""

    def __init__(self, endpoint: str, *, topic: str = "") -> None:
        self.endpoint = normalize_endpoint(endpoint)
        self.topic = topic
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._errors: list[str] = []
        self._stream = KVEventStream(self.endpoint, 0.0)

    def start(self) -> KVEventSubscriber:
        """Connect and start receiving (returns once the subscription had time to join)."""
        try:
            import zmq
        except ImportError:
            raise KvlabError("--kv-events needs pyzmq and msgpack: pip install "
                             "'kvlab[bench]'") from None
        socket: Any = zmq.Context.instance().socket(zmq.SUB)
        socket.setsockopt(zmq.LINGER, 0)
        try:
            socket.connect(self.endpoint)
        except zmq.ZMQError as exc:
            socket.close()
            raise KvlabError(f"--kv-events {self.endpoint}: cannot connect ({exc})") from None
        socket.setsockopt(zmq.SUBSCRIBE, self.topic.encode())
        self._thread = threading.Thread(target=self._receive, args=(socket,), daemon=True,
                                        name="kv-events")
        self._thread.start()
        time.sleep(JOIN_S)
        return self

    def stop(self, started_at: float) -> KVEventStream:
        """Drain, stop the thread and return the stream on the run's clock (`started_at`:
        when the run began, epoch seconds); a KvlabError when the stream held a message that
        is not a KV event batch."""
        time.sleep(DRAIN_S)
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
        self._stream.started_at = started_at
        for batch in self._stream.batches:  # received on the epoch clock
            batch.recv_s -= started_at
        if self._errors:
            raise KvlabError(f"--kv-events {self.endpoint}: {len(self._errors)} message(s) are "
                             f"not KV event batches; first: {self._errors[0]}")
        return self._stream

    def _receive(self, socket: Any) -> None:
        import msgpack

        expected: int | None = None
        stream = self._stream
        try:
            while not self._stop.is_set():
                if not socket.poll(int(POLL_S * 1000)):
                    continue
                frames = socket.recv_multipart()
                received = time.time()
                try:
                    seq, batch = decode_message(frames, msgpack)
                except ValueError as exc:
                    self._errors.append(str(exc))
                    continue
                if expected is not None and seq > expected:
                    stream.missing_seqs.extend(range(expected, seq))
                expected = seq + 1
                stream.batches.append(EventBatch(received, seq, *batch))
        finally:
            socket.close()


def decode_message(frames: list[bytes], msgpack: Any) -> tuple[int, tuple[float, list[dict]]]:
    """(sequence number, (ts, events)) of one published message; ValueError when it is not
    one (the frames' count, the payload's shape, an unknown event type)."""
    if len(frames) != 3 or len(frames[1]) != 8:
        raise ValueError(f"expected 3 frames (topic, 8-byte sequence, payload), got "
                         f"{len(frames)}")
    seq = int.from_bytes(frames[1], "big")
    try:
        payload = msgpack.unpackb(frames[2], raw=False, strict_map_key=False)
    except Exception as exc:  # msgpack raises several types for bad bytes
        raise ValueError(f"sequence {seq}: payload is not msgpack ({exc})") from None
    if not (isinstance(payload, list | tuple) and len(payload) >= 2
            and isinstance(payload[0], int | float) and isinstance(payload[1], list)):
        raise ValueError(f"sequence {seq}: payload is not [ts, events, ...]")
    events = []
    for event in payload[1]:
        kind = event.get("type") if isinstance(event, dict) else None
        if kind not in EVENT_TYPES:
            raise ValueError(f"sequence {seq}: unknown event {str(event)[:80]}")
        events.append(event)
    return seq, (float(payload[0]), events)


def save_stream(stream: KVEventStream, path: Path) -> Path:
    """Write the stream as JSON lines: a header, then one batch per line (bytes hashes as
    hex). A KvlabError naming the path when it cannot be written."""
    header = {"format": STREAM_FORMAT, "endpoint": stream.endpoint,
              "started_at": stream.started_at, "num_batches": len(stream.batches),
              "num_events": stream.num_events, "missing_seqs": stream.missing_seqs}
    lines = [json.dumps(header)]
    for batch in stream.batches:
        lines.append(json.dumps({"recv_s": batch.recv_s, "seq": batch.seq, "ts": batch.ts,
                                 "events": batch.events}, default=_hex))
    return write_text_file(path, "\n".join(lines) + "\n")


def load_stream(path: str | Path) -> KVEventStream:
    """Read a stream `save_stream` wrote; a KvlabError naming the file and line otherwise."""
    path = Path(path)
    try:
        lines = path.read_text(encoding="utf-8").splitlines()
    except FileNotFoundError:
        raise KvlabError(f"{path}: no such file (save the bench run with --kv-events)") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise KvlabError(f"{path}: cannot read ({exc})") from None
    try:
        header = json.loads(lines[0]) if lines else {}
    except ValueError:
        header = {}
    if not isinstance(header, dict) or header.get("format") != STREAM_FORMAT:
        raise KvlabError(f"{path}:1: not a KV event stream (no format {STREAM_FORMAT!r})")
    stream = KVEventStream(str(header.get("endpoint")), float(header.get("started_at", 0.0)),
                           missing_seqs=list(header.get("missing_seqs") or []))
    for number, line in enumerate(lines[1:], start=2):
        try:
            row = json.loads(line)
            stream.batches.append(EventBatch(float(row["recv_s"]), int(row["seq"]),
                                             float(row["ts"]), list(row["events"])))
        except (ValueError, KeyError, TypeError) as exc:
            raise KvlabError(f"{path}:{number}: not a batch ({type(exc).__name__}: {exc})") \
                from None
    return stream


def stream_path(result_path: Path) -> Path:
    """Where the stream of the result at `result_path` lives: `<stem>.kv_events.jsonl`."""
    return result_path.with_name(f"{result_stem(result_path)}.kv_events.jsonl")


def _hex(value: Any) -> Any:
    if isinstance(value, bytes):
        return value.hex()
    raise TypeError(f"{type(value).__name__} is not JSON serializable")
