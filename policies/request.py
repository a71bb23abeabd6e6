"""A request and its state as the scheduler and the KV-cache manager see it (torch-free)."""

from __future__ import annotations

import enum
from array import array
from dataclasses import dataclass, field

import xxhash

# A trace block id's multiplier in a page key: odd and larger than any prompt, so (id, page
# index) maps to id * _ID_SPREAD + index one to one, and blocks with neighbouring ids land far
# apart in a dict's table (a plain shift, id << 20, left every key with one offset in one slot).
_ID_SPREAD = 0x9E3779B1
_xxh3_64 = xxhash.xxh3_64_intdigest


def hash_page(parent: int, token_ids: list[int] | tuple[int, ...]) -> int:
    """The prefix key of a page of token ids: xxh3-64 of the ids (int64) seeded with the key of
    the page before it (0 for a first page). The key names the whole prefix ending at the page,
    so two pages share it exactly when their prefixes are equal (a KV event's content key)."""
    return xxhash.xxh3_64_intdigest(array("q", token_ids).tobytes(), seed=parent)


class RequestStatus(enum.Enum):
    """Where a request is in its life; the FINISHED_* values are terminal."""

    WAITING = "waiting"
    RUNNING = "running"
    SWAPPED = "swapped"
    FINISHED_STOPPED = "finished_stopped"  # eos or a stop token
    FINISHED_LENGTH = "finished_length"  # reached its output budget
    FINISHED_ABORTED = "finished_aborted"
    FINISHED_ERROR = "finished_error"  # could never run (too long for the model or the memory)

    @property
    def is_finished(self) -> bool:
        """True for every terminal status."""
        return self.value.startswith("finished")


@dataclass(slots=True, eq=False)
class Request:
    """One inference request: what it asks for, and its progress through the engine.

    Prompt content is known in one of two ways: `prompt_token_ids` (the engine, or a tokenized
    trace), or `hash_ids` naming chained blocks of `hash_block_size` prompt tokens (a trace such as
    Mooncake, where `hash_ids[i]` stands for block i together with everything before it). Either
    gives per-page prefix hashes for any page size; with neither, the prompt is never shared.
    `max_output_tokens` is the output budget; in the simulator it is also the real output length.
    `priority` orders requests under priority scheduling (lower first); `slo_class` names the
    class its latencies are reported in.
    """

    request_id: int
    prompt_len: int
    max_output_tokens: int
    arrival_s: float = 0.0
    prompt_token_ids: list[int] | None = None
    hash_ids: tuple[int, ...] | None = None
    hash_block_size: int = 512
    # Who goes first under `--scheduling-policy priority` (lower first, as vLLM; 0 default),
    # and the SLO class whose metrics the request counts in (None: no class).
    priority: int = 0
    slo_class: str | None = None
    # Appended by the engine as it samples. The simulator only counts, but a replayed run may
    # carry its recorded outputs here from the start (see `output_ids_known`).
    output_token_ids: list[int] = field(default_factory=list)
    # True when the id of every output token is in `output_token_ids` by the time its KV is
    # computed (the engine; a replay of recorded outputs): full output pages then get prefix
    # hashes too, so the manager caches pages filled during decode as vLLM does.
    output_ids_known: bool = False
    status: RequestStatus = RequestStatus.WAITING
    num_computed_tokens: int = 0
    num_output_tokens: int = 0
    num_preemptions: int = 0
    num_cached_tokens: int = 0  # prompt tokens served from the prefix cache at the first schedule
    num_swaps_out: int = 0
    # Tokens whose KV arrives from another instance when this one admits the request (a
    # prefill instance's work under prefill/decode disaggregation); 0 once it is recomputed.
    kv_transfer_tokens: int = 0
    error: str | None = None
    first_scheduled_s: float | None = None
    first_token_s: float | None = None
    last_token_s: float | None = None
    finish_s: float | None = None
    # Cached per-page prefix hashes for one page size: (page_size, hashes).
    _page_hashes: tuple[int, list] | None = None

    def __post_init__(self) -> None:
        if self.prompt_token_ids is not None and len(self.prompt_token_ids) != self.prompt_len:
            raise ValueError(
                f"request {self.request_id}: prompt_len {self.prompt_len} but "
                f"{len(self.prompt_token_ids)} prompt token ids"
            )
        if self.hash_ids is not None:
            if self.hash_block_size < 1:
                raise ValueError(
                    f"request {self.request_id}: hash_block_size {self.hash_block_size}: "
                    "expected 1 or more tokens"
                )
            if self.prompt_len >= _ID_SPREAD:
                raise ValueError(
                    f"request {self.request_id}: prompt_len {self.prompt_len}: expected below "
                    f"{_ID_SPREAD} tokens with hash_ids"
                )
            if len(set(self.hash_ids)) != len(self.hash_ids):  # each names a distinct prefix
                raise ValueError(f"request {self.request_id}: hash_ids repeat an id")

    @property
    def num_tokens(self) -> int:
        """Prompt plus generated tokens so far."""
        return self.prompt_len + self.num_output_tokens

    @property
    def total_len(self) -> int:
        """The most tokens this request can ever hold: prompt plus output budget."""
        return self.prompt_len + self.max_output_tokens

    @property
    def is_finished(self) -> bool:
        """True once the request has a terminal status."""
        return self.status.is_finished

    def token_ids(self) -> list[int]:
        """All token ids (prompt then output); only for requests with known prompt ids."""
        assert self.prompt_token_ids is not None
        return self.prompt_token_ids + self.output_token_ids

    def token_slice(self, start: int, end: int) -> list[int]:
        """Token ids `[start, end)` of prompt-then-output, without building the whole list."""
        prompt = self.prompt_token_ids
        assert prompt is not None, "only requests with prompt token ids have token content"
        num_prompt = len(prompt)
        if end <= num_prompt:
            return prompt[start:end]
        outputs = self.output_token_ids
        if start >= num_prompt:
            return outputs[start - num_prompt : end - num_prompt]
        return prompt[start:] + outputs[: end - num_prompt]

    def page_hashes(self, page_size: int) -> list:
        """Chained prefix hashes of the full pages of the known content, in order.

        With token ids: hash(parent hash, the page's ids), over the prompt and, where
        `output_ids_known`, the output tokens produced so far (the list grows in place as they
        are, so a holder of it sees new pages). With trace hash ids: the key of the prefix
        ending at the page's last token, made of the id of the block holding that token and the
        page's index, which is equal for two requests exactly when their prefixes are (ids are
        compared as names of prefixes of one block size: requests sharing ids share their
        `hash_block_size`, as every trace's requests do). So a
        prefix key names one page index in every block table (the manager relies on it), even
        where a trace gives one id at two positions: KV computed at another position differs.
        Trace outputs have no content and are never hashed.
        """
        cached = self._page_hashes
        if cached is None or cached[0] != page_size:
            cached = self._page_hashes = (page_size, self._prompt_page_hashes(page_size))
        hashes = cached[1]
        if self.output_ids_known and self.prompt_token_ids is not None:
            num_known = self.prompt_len + min(len(self.output_token_ids), self.num_output_tokens)
            if len(hashes) < num_known // page_size:
                self._hash_pages(page_size, hashes, num_known // page_size)
        return hashes

    def _hash_pages(self, page_size: int, hashes: list, num_pages: int) -> None:
        """Append the token-id hashes of pages `len(hashes)` to `num_pages - 1`."""
        first = len(hashes)
        if first >= num_pages:
            return
        # The pages' ids as int64 bytes once, each page's hash over its slice of them: the
        # bytes `hash_page` hashes, without a list and an array per page.
        data = memoryview(array("q", self.token_slice(first * page_size,
                                                      num_pages * page_size)).tobytes())
        parent, width, digest = hashes[-1] if hashes else 0, 8 * page_size, _xxh3_64
        for offset in range(0, len(data), width):
            parent = digest(data[offset : offset + width], seed=parent)
            hashes.append(parent)

    def _prompt_page_hashes(self, page_size: int) -> list:
        """The prompt's full-page hashes (token ids or trace block ids; empty with neither)."""
        num_full_pages = self.prompt_len // page_size
        hashes: list = []
        if self.prompt_token_ids is not None:
            self._hash_pages(page_size, hashes, num_full_pages)
        elif self.hash_ids is not None:
            # Key of page `index` (tokens up to (index + 1) * page_size): (block id, index)
            # packed in one int, negative for ids >= 0, so millions of cached keys stay out
            # of the GC's way and never equal a token-id hash (xxh3, >= 0).
            # Within one block the keys of successive pages are successive ints, built as a
            # range (one C call per block). Why successive: a dict places them in neighbouring
            # slots of its table, so registering, looking up and evicting a block's pages
            # touches a few cache lines, not one per page; with keys 16 apart that cost 2-3x
            # more on a 400k-page cache.
            block, block_ids = self.hash_block_size, self.hash_ids
            last_end = min(num_full_pages, len(block_ids) * block // page_size) * page_size
            for index, block_id in enumerate(block_ids):
                start = index * block
                if start >= last_end:
                    break
                first = start // page_size  # the first page ending in this block
                stop = min(start + block, last_end) // page_size  # one past the last
                # key(index) = -(id * _ID_SPREAD + index) - 1 = top - index
                top = -1 - block_id * _ID_SPREAD
                hashes.extend(range(top - first, top - stop, -1))
        return hashes
