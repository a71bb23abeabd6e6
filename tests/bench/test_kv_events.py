"""The KV event stream: kvlab serve's publisher and bench's subscriber speak vLLM's wire
format to each other; malformed messages, bad endpoints and bad files are one clear error."""

from __future__ import annotations

import json
import time

import msgpack
import pytest
import zmq

from kvlab.bench.client import reset_prefix_cache
from kvlab.bench.kv_event_stream import (
    KVEventSubscriber,
    decode_message,
    load_stream,
    normalize_endpoint,
    save_stream,
    stream_path,
)
from kvlab.errors import KvlabError
from kvlab.policies.kv_events import BlockEvent
from kvlab.server.kv_event_publisher import (
    KVEventPublisher,
    KVEventsConfig,
    parse_kv_events_config,
    to_vllm_events,
)
from tests.bench.metrics_server import serve_http
from tests.live_server import free_port


def _vllm_message(seq: int, events: list[dict]) -> list[bytes]:
    """A message as vLLM 0.32 publishes it (measured: topic, 8-byte seq, [ts, events, rank])."""
    return [b"", seq.to_bytes(8, "big"), msgpack.packb([1.5, events, 0])]


STORED = {"type": "BlockStored", "block_hashes": [7, 8], "parent_block_hash": None,
          "token_ids": list(range(8)), "block_size": 4, "lora_id": None, "medium": "GPU",
          "lora_name": None, "extra_keys": [None, None], "group_idx": 0,
          "kv_cache_spec_kind": "full_attention"}


def test_decodes_vllm_messages():
    seq, (ts, events) = decode_message(_vllm_message(3, [STORED]), msgpack)
    assert (seq, ts, events) == (3, 1.5, [STORED])


@pytest.mark.parametrize("frames, problem", [
    ([b"", b"\0" * 8], "expected 3 frames"),
    ([b"", b"\0" * 8, b"\xc1"], "not msgpack"),
    ([b"", b"\0" * 8, msgpack.packb({"ts": 1})], "not \\[ts, events"),
    ([b"", b"\0" * 8, msgpack.packb([1.0, [{"type": "Nope"}]])], "unknown event"),
])
def test_malformed_messages_say_what_is_wrong(frames, problem):
    with pytest.raises(ValueError, match=problem):
        decode_message(frames, msgpack)


@pytest.mark.parametrize("given, expected", [
    ("127.0.0.1:5557", "tcp://127.0.0.1:5557"),
    ("tcp://localhost:6000", "tcp://localhost:6000"),
    ("ipc:///tmp/kv", "ipc:///tmp/kv"),
])
def test_endpoints(given, expected):
    assert normalize_endpoint(given) == expected


@pytest.mark.parametrize("given, problem", [
    ("tcp://*:5557", "bind address"),
    ("localhost", "expected tcp://HOST:PORT"),
    ("http://x:1", "expected tcp://HOST:PORT"),
])
def test_bad_endpoints_name_the_flag(given, problem):
    with pytest.raises(KvlabError, match=f"--kv-events.*{problem}"):
        normalize_endpoint(given)


def test_publisher_to_subscriber_round_trip(tmp_path):
    port = free_port()
    publisher = KVEventPublisher(KVEventsConfig(f"tcp://127.0.0.1:{port}"), block_size=2)
    subscriber = KVEventSubscriber(f"127.0.0.1:{port}").start()
    started = time.time()
    run = [BlockEvent("stored", 11, 5, None, (1, 2)), BlockEvent("stored", 12, 5, 11, (3, 4)),
           BlockEvent("stored", 13, 6, None, (9, 9)), BlockEvent("removed", 11)]
    publisher.publish(run)
    publisher.publish([])  # a step without changes: an empty batch (a consumer sees the step)
    publisher.publish([BlockEvent("cleared", 0)])
    stream = subscriber.stop(started)
    publisher.close()
    assert [b.seq for b in stream.batches] == [0, 1, 2] and not stream.missing_seqs
    first = stream.batches[0].events
    assert [e["type"] for e in first] == ["BlockStored", "BlockStored", "BlockRemoved"]
    assert first[0]["block_hashes"] == [11, 12] and first[0]["token_ids"] == [1, 2, 3, 4]
    assert first[1]["parent_block_hash"] is None and first[1]["block_hashes"] == [13]
    assert stream.batches[1].events == []
    assert stream.batches[2].events == [{"type": "AllBlocksCleared"}]
    assert 0 <= stream.batches[0].recv_s < 5
    path = save_stream(stream, stream_path(tmp_path / "run.json"))
    assert path.name == "run.kv_events.jsonl"
    again = load_stream(path)
    assert [b.events for b in again.batches] == [b.events for b in stream.batches]


def test_a_malformed_stream_is_an_error_not_a_crash():
    port = free_port()
    pub = zmq.Context.instance().socket(zmq.PUB)
    pub.bind(f"tcp://127.0.0.1:{port}")
    subscriber = KVEventSubscriber(f"tcp://127.0.0.1:{port}").start()
    pub.send_multipart([b"", b"\0" * 8, b"garbage"])
    pub.send_multipart(_vllm_message(1, [STORED]))
    with pytest.raises(KvlabError, match="1 message\\(s\\) are not KV event batches"):
        subscriber.stop(time.time())
    pub.close()


def test_lost_batches_are_counted():
    port = free_port()
    pub = zmq.Context.instance().socket(zmq.PUB)
    pub.bind(f"tcp://127.0.0.1:{port}")
    subscriber = KVEventSubscriber(f"tcp://127.0.0.1:{port}").start()
    for seq in (4, 5, 8):
        pub.send_multipart(_vllm_message(seq, [STORED]))
    stream = subscriber.stop(time.time())
    pub.close()
    assert stream.missing_seqs == [6, 7]


def test_bad_stream_files_name_file_and_line(tmp_path):
    path = tmp_path / "x.kv_events.jsonl"
    with pytest.raises(KvlabError, match="no such file"):
        load_stream(path)
    path.write_text("{}\n")
    with pytest.raises(KvlabError, match=r"x\.kv_events\.jsonl:1: not a KV event stream"):
        load_stream(path)
    path.write_text(json.dumps({"format": "kvlab-kv-events-1"}) + "\n{\"seq\": 1}\n")
    with pytest.raises(KvlabError, match=r"x\.kv_events\.jsonl:2: not a batch"):
        load_stream(path)


@pytest.mark.parametrize("text, problem", [
    ("{", "not JSON"),
    ("[]", "expected a JSON object"),
    ('{"enable_kv_cache_events": true, "bogus": 1}', "unknown key 'bogus'"),
    ('{"enable_kv_cache_events": true, "publisher": "kafka"}', "expected zmq or null"),
])
def test_bad_kv_events_config(text, problem):
    with pytest.raises(KvlabError, match=f"--kv-events-config: .*{problem}"):
        parse_kv_events_config(text)


def test_kv_events_config_as_vllm_takes_it():
    assert parse_kv_events_config('{"enable_kv_cache_events": false}') is None
    assert parse_kv_events_config('{"enable_kv_cache_events": true, "publisher": "null"}') is None
    config = parse_kv_events_config('{"enable_kv_cache_events": true, "publisher": "zmq", '
                                    '"endpoint": "tcp://*:6001", "topic": "kv"}')
    assert config == KVEventsConfig("tcp://*:6001", "kv")


def test_runs_split_where_the_chain_breaks():
    events = [BlockEvent("stored", 1, 0, None, (1,)), BlockEvent("stored", 2, 0, 1, (2,)),
              BlockEvent("stored", 3, 0, 9, (3,)), BlockEvent("stored", 4, 1, 3, (4,))]
    out = to_vllm_events(events, 1)
    assert [e["block_hashes"] for e in out] == [[1, 2], [3], [4]]
    assert [e["parent_block_hash"] for e in out] == [None, 9, 3]


def test_runs_split_between_groups_and_name_theirs():
    events = [BlockEvent("stored", 1, 0, None, (1,), 1), BlockEvent("stored", 2, 0, 1, (2,), 1),
              BlockEvent("stored", 1, 0, None, (1,), 0), BlockEvent("stored", 2, 0, 1, (2,), 0),
              BlockEvent("removed", 1, group=1)]
    out = to_vllm_events(events, 1)
    assert [(e["type"], e["group_idx"], e["block_hashes"]) for e in out] == [
        ("BlockStored", 1, [1, 2]), ("BlockStored", 0, [1, 2]), ("BlockRemoved", 1, [1])]


@pytest.mark.parametrize("status, hint", [(404, "VLLM_SERVER_DEV_MODE=1"),
                                          (409, "refuses while requests run")])
def test_reset_prefix_cache_errors_say_why(status, hint):
    url, stop = serve_http(lambda method, path: (status, "application/json", b'{"x": 1}'))
    try:
        with pytest.raises(KvlabError, match=f"--reset-prefix-cache: .*HTTP {status}.*{hint}"):
            reset_prefix_cache(url)
    finally:
        stop()


def test_reset_prefix_cache_posts(tmp_path):
    seen = []

    def respond(method, path):
        seen.append((method, path))
        return 200, "application/json", b'{"success": true}'

    url, stop = serve_http(respond)
    try:
        reset_prefix_cache(url)
    finally:
        stop()
    assert seen == [("POST", "/reset_prefix_cache")]


def test_serve_flag_error_is_one_line(capsys):
    from kvlab.cli import main

    assert main(["serve", "tiny-llama", "--kv-events-config", "{nope"]) != 0
    err = capsys.readouterr().err
    assert "--kv-events-config: not JSON" in err and "Traceback" not in err
