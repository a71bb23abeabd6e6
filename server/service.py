"""The engine behind the HTTP server: one background thread runs the step loop on the wall
clock; handlers submit requests and read their tokens through a `Stream` each.

All engine and scheduler state is touched by that one thread only. Handlers talk to it through
an inbox (submit, abort) and are woken through their stream (`loop.call_soon_threadsafe`), so
new requests join the running batch between two steps, as offline (continuous batching), and
an abort frees the request's pages and host pages before the next step.
"""

from __future__ import annotations

import asyncio
import logging
import queue
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass, field

from kvlab.engine.clock import WallClock
from kvlab.engine.engine import LLMEngine
from kvlab.engine.outputs import FINISH_REASONS
from kvlab.engine.sampler import SamplingParams
from kvlab.heap import frozen_heap
from kvlab.metrics import StepRecorder
from kvlab.policies import Request, StepLoop
from kvlab.policies.kv_events import KVEventLog
from kvlab.server.kv_event_publisher import KVEventPublisher
from kvlab.server.metrics import ServerMetrics

log = logging.getLogger("kvlab.server")
IDLE_WAIT_S = 0.5  # an idle engine thread wakes this often to notice a stop
# Steps of history (profile rows, inter-token gaps, precision mix) a server keeps at most when
# no profile is asked for: nothing it serves reads them, and a server runs for days.
HISTORY_STEPS = 4096


class Overloaded(Exception):
    """More requests are queued than the server takes (`max_queue`)."""


@dataclass(slots=True)
class Event:
    """New output of one request: token ids produced since the last event, and, on the last
    event, why it ended (`finish_reason`: stop, length, abort or error) and any error text."""

    token_ids: list[int]
    finish_reason: str | None = None
    error: str | None = None


class Stream:
    """One request's events, put by the engine thread and read by its handler."""

    __slots__ = ("_events", "_loop", "each_token", "first_token_counted", "num_sent",
                 "queued_s", "request")

    def __init__(self, request: Request, loop: asyncio.AbstractEventLoop,
                 each_token: bool = True) -> None:
        self.request = request
        # False: only the last event (every token at once): a whole response needs no more,
        # and each event costs the event loop a wake-up.
        self.each_token = each_token
        self.num_sent = 0  # output tokens already put on the stream (engine thread)
        self.first_token_counted = False  # its TTFT observed (engine thread)
        self.queued_s = request.arrival_s  # when the engine thread took it in (set then)
        self._loop = loop
        self._events: asyncio.Queue[Event] = asyncio.Queue()

    def put(self, event: Event) -> None:
        """Hand an event to the handler's event loop (engine thread)."""
        self._loop.call_soon_threadsafe(self._events.put_nowait, event)

    @staticmethod
    def put_all(events: Sequence[tuple[Stream, Event]]) -> None:
        """Hand a step's events to their handlers' event loops, one wake-up per loop (engine
        thread): a wake-up is a write to the loop's socket, and one per stream and step cost
        the engine thread about 3% of a busy server's time."""
        by_loop: dict[asyncio.AbstractEventLoop, list[tuple[asyncio.Queue, Event]]] = {}
        for stream, event in events:
            by_loop.setdefault(stream._loop, []).append((stream._events, event))
        for loop, items in by_loop.items():
            loop.call_soon_threadsafe(_put_each, items)

    async def get(self) -> Event:
        """The next event (handler)."""
        return await self._events.get()


def _put_each(items: list[tuple[asyncio.Queue, Event]]) -> None:
    for events, event in items:
        events.put_nowait(event)


@dataclass(slots=True)
class _Submit:
    stream: Stream


@dataclass(slots=True)
class _Abort:
    request_id: int


@dataclass(slots=True)
class _Reset:
    done: threading.Event = field(default_factory=threading.Event)
    success: bool = False


@dataclass(slots=True)
class EngineService:
    """An LLMEngine served by a background thread.

    `submit` queues a request and returns its stream; `abort` stops one; `stop` lets running
    requests finish for up to a timeout, aborts the rest and joins the thread. `max_queue`
    bounds the requests not yet running (waiting or just submitted): past it, `submit` raises
    Overloaded. `metrics` is updated after every step; with a `publisher`, the manager's
    prefix-cache changes are published after every step (vLLM's KV events). With `keep_steps`
    (`kvlab serve --profile-path`) every step's profile row is kept for the service's life;
    otherwise the rows, the inter-token gaps and a precision policy's mix are dropped every
    `history_steps` steps, so that memory does not grow with the steps served.
    """

    engine: LLMEngine
    metrics: ServerMetrics
    max_queue: int = 1024
    publisher: KVEventPublisher | None = None
    keep_steps: bool = False
    history_steps: int = HISTORY_STEPS
    _inbox: queue.SimpleQueue = field(default_factory=queue.SimpleQueue)
    _wake: threading.Event = field(default_factory=threading.Event)
    _streams: dict[int, Stream] = field(default_factory=dict)
    _thread: threading.Thread | None = None
    _stopping: bool = False
    _draining_until: float | None = None
    _lock: threading.Lock = field(default_factory=threading.Lock)
    _num_queued: int = 0  # submitted, not yet running (shared with handlers: under _lock)
    _loop: StepLoop | None = None
    _clock: WallClock = field(default_factory=WallClock)

    @property
    def steps(self) -> StepRecorder:
        """Every step's profile row so far (the same columns as an offline run's); without
        `keep_steps`, those since the history was last dropped."""
        assert self._loop is not None, "start the service first"
        return self._loop.steps

    def start(self) -> None:
        """Start the engine thread."""
        self._loop = StepLoop(self.engine.scheduler, [])
        if self.publisher is not None:
            self.engine.manager.events = KVEventLog.for_manager(self.engine.manager)
        self._thread = threading.Thread(target=self._run, name="kvlab-engine", daemon=True)
        self._thread.start()

    def submit(
        self, prompt_token_ids: Sequence[int], params: SamplingParams,
        loop: asyncio.AbstractEventLoop, *, each_token: bool = True, priority: int = 0,
    ) -> Stream:
        """Queue a request and return its stream (called on the server's event loop, the only
        caller of `make_request`): an event per step with new tokens, or with `each_token`
        False only the last; `priority` orders it under priority scheduling (vLLM's request
        field: lower first). Raises KvlabError for a prompt outside the vocabulary, and
        Overloaded while shutting down or when `max_queue` requests are already waiting."""
        with self._lock:
            if self._stopping:
                raise Overloaded("the server is shutting down")
            if self._num_queued >= self.max_queue:
                raise Overloaded(f"{self._num_queued} requests are waiting (max_queue)")
            # It arrives now, as vLLM's front end stamps a request it takes in: its TTFT,
            # queue time and latency count the wait for the running step to end, as vLLM's
            # histograms do (stamped when the engine took it, they left that wait to the API
            # latency that `calibrate --from-bench` measures, and the simulator counted it
            # twice). In the inbox under the lock: arrivals reach the engine in their order.
            request = self.engine.make_request(list(prompt_token_ids), params,
                                               arrival_s=self._clock.now(), priority=priority)
            self._num_queued += 1
            stream = Stream(request, loop, each_token)
            self._inbox.put(_Submit(stream))
        self._wake.set()
        return stream

    def abort(self, request_id: int) -> None:
        """Stop a request (a client went away, or a stop string matched)."""
        self._inbox.put(_Abort(request_id))
        self._wake.set()

    def reset_prefix_cache(self, timeout_s: float = 10.0) -> bool:
        """Empty the prefix cache between two steps (vLLM's dev endpoint); False while any
        request runs or waits, or when the engine thread does not answer within `timeout_s`."""
        command = _Reset()
        self._inbox.put(command)
        self._wake.set()
        return command.done.wait(timeout_s) and command.success

    def begin_stop(self, timeout_s: float) -> None:
        """Take no new requests; let running ones finish for `timeout_s`, then abort the rest
        (their streams end with finish_reason "abort"). Returns at once."""
        with self._lock:
            if self._stopping and self._draining_until is not None:
                return
            self._stopping = True
        self._draining_until = self._clock.now() + timeout_s
        self._wake.set()

    def stop(self, timeout_s: float) -> None:
        """`begin_stop`, then join the engine thread; logs any page still held at the end (a
        leak)."""
        self.begin_stop(timeout_s)
        if self._thread is not None:
            self._thread.join()
        if self.publisher is not None:
            self.publisher.close()
        usage = self.engine.manager.usage()
        if usage.num_used_pages or usage.num_host_used_pages:
            log.error("pages still held at exit: %d device, %d host", usage.num_used_pages,
                      usage.num_host_used_pages)
        else:
            log.info("engine stopped; every page and host page came back")

    # ----------------------------------------------------------------------------- engine thread

    def _run(self) -> None:
        try:
            with frozen_heap():
                self._serve()
        except Exception:  # a bug: fail every open request rather than hang their clients
            log.exception("the engine thread failed")
            with self._lock:
                self._stopping = True  # new requests get 503, not a stream nobody serves
            for stream in self._streams.values():
                stream.put(Event([], "error", "internal error in the engine"))
            self._streams.clear()

    def _serve(self) -> None:
        loop, clock, engine = self._loop, self._clock, self.engine
        assert loop is not None
        while True:
            if self._drain(loop, clock.now()):
                self.metrics.observe_state(loop.scheduler)
            if self._stopping and self._drained(clock.now()):
                self.metrics.observe_state(loop.scheduler)
                return
            if not loop.scheduler.has_unfinished():
                self._wake.wait(IDLE_WAIT_S)
                self._wake.clear()
                continue
            now = clock.now()
            output, finished = engine.step(loop, now, clock)
            ended = time.time()  # before its tokens go out: no client sees them earlier
            # The step's counters and KV events before its tokens: a client that saw its last
            # token and scrapes /metrics at once sees that step's demotions, preemptions and
            # hits, and a batch of events for each step counted.
            self.metrics.observe_state(loop.scheduler)
            self.metrics.observe_batch(output)
            events = engine.manager.events
            if self.publisher is not None and events is not None:
                self.publisher.publish(events.take(), ended)
            self._emit(output.requests, finished, output.failed)
            if not self.keep_steps and len(loop.steps) >= self.history_steps:
                self._forget_history(loop)

    def _forget_history(self, loop: StepLoop) -> None:
        """Drop the steps' rows, the inter-token gaps and the precision mix (no profile; the
        metrics observed every gap already)."""
        loop.steps.clear()
        del loop.scheduler.itls_s[:]
        self.metrics.itls_dropped()
        precision = self.engine.manager.precision
        if precision is not None:
            precision.mix.clear()

    def _drain(self, loop: StepLoop, now_s: float) -> bool:
        """Take in new requests (arrived by now) and carry out aborts, in that order, so that a
        request aborted as soon as it was submitted is in the scheduler to be aborted; True
        when there was any."""
        aborts, num_submitted = [], 0
        while True:
            try:
                command = self._inbox.get_nowait()
            except queue.Empty:
                break
            if isinstance(command, _Reset):
                idle = not loop.scheduler.has_unfinished() and not num_submitted
                command.success = idle and self.engine.manager.reset_prefix_cache()
                command.done.set()
            elif isinstance(command, _Submit):
                num_submitted += 1
                stream = command.stream
                stream.queued_s = max(now_s, stream.request.arrival_s)
                self._streams[stream.request.request_id] = stream
                loop.submit(stream.request)
            else:
                aborts.append(command.request_id)
        loop.admit(max(now_s, self._clock.now()))  # one submitted since `now_s` is in too
        with self._lock:
            self._num_queued = len(loop.scheduler.waiting) + self._inbox.qsize()
        for request_id in aborts:
            if request_id in self._streams:  # else it ended already
                stream = self._streams.pop(request_id)
                self.engine.abort(stream.request, now_s)
                self._finish(stream)
        return bool(aborts or num_submitted)

    def _drained(self, now_s: float) -> bool:
        """While stopping: True once nothing is left; past the deadline everything is aborted."""
        if not self._streams:
            return True
        if self._draining_until is not None and now_s >= self._draining_until:
            for stream in list(self._streams.values()):
                self.engine.abort(stream.request, now_s)
                self._finish(stream)
            self._streams.clear()
            return True
        return False

    def _emit(self, requests: Sequence[Request], finished: Sequence[Request],
              failed: Sequence[Request]) -> None:
        streams, out = self._streams, []
        for request in requests:
            stream = streams.get(request.request_id)
            if stream is None or request.is_finished:
                continue
            if not stream.each_token:  # sent whole at the end; its TTFT counts now, as vLLM's
                self._count_first_token(stream)
                continue
            new = self._take_unsent(stream)
            if new:
                out.append((stream, Event(new)))
        for request in (*finished, *failed):
            stream = streams.pop(request.request_id, None)
            if stream is not None:
                out.append((stream, self._last_event(stream)))
        Stream.put_all(out)

    def _finish(self, stream: Stream) -> None:
        """Send the last event of a finished, failed or aborted request."""
        stream.put(self._last_event(stream))

    def _last_event(self, stream: Stream) -> Event:
        """The last event of a finished, failed or aborted request (its end counted)."""
        request = stream.request
        reason = FINISH_REASONS.get(request.status, "abort")
        event = Event(self._take_unsent(stream), reason, request.error)
        self.metrics.observe_finished(request, reason, stream.queued_s)
        return event

    def _take_unsent(self, stream: Stream) -> list[int]:
        """The stream's tokens not sent yet, now counted as sent (and the TTFT with the first)."""
        new = stream.request.output_token_ids[stream.num_sent:]
        if new:
            self._count_first_token(stream)
        stream.num_sent += len(new)
        return new  # (a slice: a list of its own)

    def _count_first_token(self, stream: Stream) -> None:
        """Observe the request's TTFT once, as soon as it has a token (sent or not)."""
        if not stream.first_token_counted and stream.request.output_token_ids:
            stream.first_token_counted = True
            self.metrics.observe_first_token(stream.request)
