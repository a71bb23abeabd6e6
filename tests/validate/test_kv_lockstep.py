"""KV lockstep against a server: the server's events keyed by content, the alignment and its
causes, and end to end against a live kvlab serve, which publishes the events of the very
manager kvlab replays, so that every block change must match in order."""

from __future__ import annotations

import json
import re
from types import SimpleNamespace

import pytest

from kvlab.bench import BenchRequest, ClientConfig, bench_serve, resolve_model
from kvlab.bench.kv_event_stream import EventBatch, KVEventStream
from kvlab.cli import main
from kvlab.engine.config import EngineConfig
from kvlab.fidelity import server_sim_config
from kvlab.fidelity.kv_alignment import compare_changes
from kvlab.fidelity.kv_changes import Change, server_changes
from kvlab.fidelity.kv_lockstep import format_kv_lockstep, kv_lockstep
from kvlab.fidelity.kv_replay import SEND_ORDER_SLACK_S, replay_trace
from kvlab.policies.request import hash_page
from kvlab.policies.serving import ServingConfig
from kvlab.server.kv_event_publisher import KVEventsConfig
from kvlab.traces import load_trace
from tests.live_server import free_port, start_live_server


def _stored(hashes, parent, tokens, block_size=2):
    return {"type": "BlockStored", "block_hashes": hashes, "parent_block_hash": parent,
            "token_ids": tokens, "block_size": block_size}


def _stream(*batches: list[dict]) -> KVEventStream:
    return KVEventStream("tcp://x:1", 0.0,
                         [EventBatch(0.1 * i, i, 0.0, list(b)) for i, b in enumerate(batches)])


def test_server_blocks_are_keyed_by_content():
    stream = _stream([_stored(["a", "b"], None, [1, 2, 3, 4])],
                     [_stored(["c"], "b", [5, 6]), {"type": "BlockRemoved", "block_hashes": ["a"]}],
                     [_stored(["z"], "unseen", [7, 8])])
    changes = server_changes(stream)
    first = hash_page(0, [1, 2])
    second = hash_page(first, [3, 4])
    assert [(c.kind, c.key, c.step) for c in changes] == [
        ("stored", first, 0), ("stored", second, 0), ("stored", hash_page(second, [5, 6]), 1),
        ("removed", first, 1), ("stored", None, 2)]


def test_a_second_copy_is_flagged_duplicate():
    stream = _stream([_stored(["a"], None, [1, 2]), _stored(["a2"], None, [1, 2]),
                      {"type": "BlockRemoved", "block_hashes": ["a2"]},
                      {"type": "BlockRemoved", "block_hashes": ["a"]}])
    assert [c.duplicate for c in server_changes(stream)] == [False, True, True, False]


def test_server_blocks_are_keyed_per_group():
    # vLLM 0.32 names each block's KV-cache group (group_idx); a block's hash is the same in
    # every group, so a parent stored by another group still keys its child
    stream = _stream([{**_stored(["a"], None, [1, 2]), "group_idx": 1},
                      {**_stored(["a"], None, [1, 2]), "group_idx": 0},
                      {**_stored(["b"], "a", [3, 4]), "group_idx": 0}],
                     [{"type": "BlockRemoved", "block_hashes": ["a"], "group_idx": 1}])
    first = hash_page(0, [1, 2])
    assert [(c.kind, c.group, c.key, c.duplicate) for c in server_changes(stream)] == [
        ("stored", 1, first, False), ("stored", 0, first, False),
        ("stored", 0, hash_page(first, [3, 4]), False), ("removed", 1, first, False)]


def test_blocks_of_different_groups_do_not_match():
    server = [Change("stored", 5, 0, 0.0, group=0), Change("stored", 5, 0, 0.0, group=1)]
    kvlab = [Change("stored", 5, 0, 0.0, group=1)]
    report = compare_changes(server, kvlab)
    assert report.num_matched == 1 and report.unmatched == {"server-only": 1}
    assert "in group 1" not in format_kv_lockstep(report)  # the divergence is group 0's


def test_sparsely_cached_runs_are_left_unkeyed_and_say_why():
    # vLLM's prefix_cache_retention_interval (default 0) masks blocks out of a BlockStored's
    # hashes but not its tokens: which block holds which tokens is unknown
    stream = _stream([_stored(["c"], None, [1, 2, 3, 4, 5, 6])],
                     [{"type": "BlockRemoved", "block_hashes": ["c"]}])
    changes = server_changes(stream)
    assert [(c.kind, c.key, c.sparse) for c in changes] == [
        ("stored", None, True), ("removed", None, True)]
    report = compare_changes(changes, [])
    assert report.unmatched == {"sparse": 2}
    assert "--prefix-cache-retention-interval None" in format_kv_lockstep(report)


def _changes(*items: tuple[str, int]) -> list[Change]:
    return [Change(kind, key, i, float(i)) for i, (kind, key) in enumerate(items)]


def test_alignment_counts_and_causes():
    server = _changes(("stored", 1), ("stored", 2), ("removed", 1), ("stored", 3), ("stored", 9))
    kvlab = _changes(("stored", 1), ("removed", 1), ("stored", 2), ("stored", 3), ("stored", 4))
    report = compare_changes(server, kvlab)
    assert (report.num_server, report.num_kvlab, report.num_matched) == (5, 5, 3)
    assert report.match_rate == pytest.approx(0.6)
    assert report.unmatched == {"moved": 2, "server-only": 1, "kvlab-only": 1}
    assert report.first_divergence["server_index"] == 1
    assert report.moved_median_s == pytest.approx(1.0)
    text = format_kv_lockstep(report)
    assert "Match rate (%):                          60.00" in text
    assert "First divergence at server change 1" in text
    assert compare_changes(server, server).identical


def _answered(request_id: int, sent_s: float, first_token_s: float) -> BenchRequest:
    record = BenchRequest(request_id, 4, 1, sent_s)
    record.arrival_s, record.chunk_times_s, record.chunk_tokens = sent_s, [first_token_s], [1]
    record.output_token_ids = [7]
    return record


def test_replay_keeps_the_order_requests_were_sent_in():
    # C's blocks are stored in step 1 (received at 0.2); B, sent after A, shares C's first
    # block, which reads as its own admission in step 1; A's first token says step 3. The
    # server serves them first come, first served, so B must not start before A.
    c_first_block = hash_page(0, [1, 2])
    stored_at = {c_first_block: [0.2], hash_page(c_first_block, [3, 4]): [0.2]}
    result = SimpleNamespace(
        requests=[_answered(0, 0.0, 0.21), _answered(1, 0.12, 0.41), _answered(2, 0.15, 0.45)],
        prompt_token_ids=[[1, 2, 3, 4], [5, 6, 7, 8], [1, 2, 9, 9]])
    trace = replay_trace(result, [0.1, 0.2, 0.3, 0.4], budget=100, page_size=2,
                         stored_at=stored_at)
    assert [(r.request_id, r.arrival_s) for r in trace.requests] == [(0, 0.1), (1, 0.3),
                                                                     (2, 0.3)]


def test_replay_lets_requests_sent_a_moment_apart_start_in_either_order():
    # 1 is sent 5 ms after 0 (within SEND_ORDER_SLACK_S: the server's API may hand them on
    # in either order) and its first token comes two steps before 0's
    result = SimpleNamespace(requests=[_answered(0, 0.1, 0.41), _answered(1, 0.105, 0.21)],
                             prompt_token_ids=[[5, 6, 7, 8], [1, 2, 9, 9]])
    trace = replay_trace(result, [0.1, 0.2, 0.3, 0.4], budget=100, page_size=2, stored_at={})
    assert SEND_ORDER_SLACK_S > 0.005
    assert [(r.request_id, r.arrival_s) for r in trace.requests] == [(1, 0.105), (0, 0.3)]


POLICY = "paged:block_size=4,eviction=lru,watermark=0"


@pytest.fixture(scope="module")
def live_with_events():
    port = free_port()
    engine = EngineConfig(model="tiny-llama", serving=ServingConfig.create(
        POLICY, num_gpu_blocks_override=48, max_model_len=128, max_num_seqs=3))
    server = start_live_server(engine, kv_events=KVEventsConfig(f"tcp://127.0.0.1:{port}"))
    yield server, f"tcp://127.0.0.1:{port}"
    server.stop()


def _prefix_heavy(num_prompts=40):
    """Prompts sharing 24-token prefixes in 3 groups, at a rate that keeps several in flight,
    on a cache that must evict."""
    return load_trace("random", None, num_prompts=num_prompts, seed=5, random_input_len=16,
                      random_output_len=12, random_prefix_len=24, num_prefix_groups=3,
                      request_rate=40.0)


def _lockstep(server, endpoint, max_concurrency):
    card = resolve_model(server.base_url, None, None)
    client = ClientConfig(base_url=server.base_url, model=str(card["id"]), ignore_eos=True,
                          max_concurrency=max_concurrency)
    result = bench_serve(_prefix_heavy(), client, card=card, vocab_size=256, seed=1,
                         kv_events=endpoint, reset_cache=True)
    config = server_sim_config(result.server, "tiny-llama", preset="kvlab")
    report = kv_lockstep(result, config)
    assert report.kvlab_counts.get("removed", 0) > 10, "the workload must evict"
    return report


def test_kvlab_serve_matches_block_for_block(live_with_events):
    """One request at a time, the client sees every admission exactly: kvlab serve's manager
    and the replay's must make the same changes in the same order."""
    report = _lockstep(*live_with_events, max_concurrency=1)
    assert report.num_server == report.num_kvlab > 50
    assert report.identical, format_kv_lockstep(report)


def test_kvlab_serve_matches_with_many_in_flight(live_with_events):
    """kvlab serve publishes a batch every step, so the replay steps on the server's own step
    ends and admits each request in the step that stored its first blocks: identical with
    several requests in flight too, however loaded the machine."""
    report = _lockstep(*live_with_events, max_concurrency=None)
    assert report.num_server_batches >= report.num_replay_steps > 0
    assert report.identical, format_kv_lockstep(report)


def test_validate_lockstep_command(live_with_events, capsys, tmp_path):
    server, endpoint = live_with_events
    code = main(["validate", "--base-url", server.base_url, "--kv-events", endpoint,
                 "--lockstep", "--reset-prefix-cache", "--dataset-name", "random",
                 "--random-input-len", "16", "--random-output-len", "12",
                 "--random-prefix-len", "24", "--num-prefix-groups", "3", "--num-prompts", "24",
                 "--request-rate", "40", "--max-concurrency", "1", "--vocab-size", "256",
                 "--save-result",
                 "--result-dir", str(tmp_path), "--result-filename", "kv.json"])
    out = capsys.readouterr().out
    assert code == 0, out
    assert "Every block change matched, in order." in out
    report = json.loads((tmp_path / "kv.json").read_text())["kv_lockstep"]
    # the run itself is saved beside the report, and --from-bench reads it again
    saved = tmp_path / "kv.bench.json"
    assert (tmp_path / "kv.bench.kv_events.jsonl").is_file()
    code = main(["validate", "--lockstep", "--from-bench", str(saved), "--save-result",
                 "--result-dir", str(tmp_path), "--result-filename", "again.json"])
    assert code == 0, capsys.readouterr().out
    again = json.loads((tmp_path / "again.json").read_text())["kv_lockstep"]
    assert again == report
    # the run records the request ids it was sent with (X-Request-Id: validate-<hex>-<id>),
    # which a vLLM scheduler's log (--step-log) names them by
    document = json.loads(saved.read_text())
    assert re.fullmatch(r"validate-[0-9a-f]{8}-", document["request_id_prefix"])
    steps = tmp_path / "steps"
    assert main(["validate", "--lockstep", "--from-bench", str(saved), "--step-log",
                 str(steps)]) != 0
    assert f"--step-log {steps}: no log {steps}.<pid>" in capsys.readouterr().err
    del document["request_id_prefix"]
    saved.write_text(json.dumps(document))
    assert main(["validate", "--lockstep", "--from-bench", str(saved), "--step-log",
                 str(steps)]) != 0
    assert "records no request-id prefix" in capsys.readouterr().err


def test_from_bench_errors_name_the_file(tmp_path, capsys):
    missing = tmp_path / "nope.json"
    assert main(["validate", "--lockstep", "--from-bench", str(missing)]) != 0
    assert f"{missing}: no such file" in capsys.readouterr().err
    assert main(["validate", "--from-bench", str(missing)]) != 0
    assert "--from-bench: with --lockstep" in capsys.readouterr().err
    assert main(["validate", "--from-bench", str(missing), "--step-log", "steps"]) != 0
    assert "--step-log: only with --lockstep" in capsys.readouterr().err


@pytest.mark.parametrize("flags, problem", [
    (["--lockstep"], "give --kv-events ENDPOINT"),
    (["--kv-events", "tcp://127.0.0.1:1"], "only with --lockstep"),
    (["--lockstep", "--kv-events", "tcp://*:1"], "bind address"),
    (["--lockstep", "--step-log", "steps"], "give --kv-events ENDPOINT"),
    (["--kv-events", "tcp://127.0.0.1:1", "--step-log", "steps"],
     "--step-log: only with --lockstep"),
])
def test_validate_flag_errors(live_with_events, capsys, flags, problem):
    server, _ = live_with_events
    assert main(["validate", "--base-url", server.base_url, *flags]) != 0
    assert problem in capsys.readouterr().err


def test_bytes_hashes_key_as_ints_do(tmp_path):
    """vLLM publishes bytes hashes unless VLLM_KV_EVENTS_USE_INT_BLOCK_HASHES is on; saved and
    loaded again they are hex strings: the content keys stay the same either way."""
    from kvlab.bench.kv_event_stream import load_stream, save_stream

    as_ints = _stream([_stored([1, 2], None, [1, 2, 3, 4])],
                      [{"type": "BlockRemoved", "block_hashes": [2]}])
    as_bytes = _stream([_stored([b"\x01", b"\x02"], None, [1, 2, 3, 4])],
                       [{"type": "BlockRemoved", "block_hashes": [b"\x02"]}])
    saved = load_stream(save_stream(as_bytes, tmp_path / "s.kv_events.jsonl"))
    keys = [[(c.kind, c.key) for c in server_changes(s)] for s in (as_ints, as_bytes, saved)]
    assert keys[0] == keys[1] == keys[2]
    assert None not in [key for _, key in keys[0]]
