"""An independent shadow of device and host memory for checking a KV-cache manager.

It is driven only by what the manager hands out through its public interface (block tables,
`MemOps`, `usage()`, `is_swapped`) and by the tokens its driver writes; it never reads the
manager's internals. It keeps each page's slot contents and which live sequence holds which
pages, carries out every MemOps as an executor would, and fails as soon as

- a page is written while another live sequence holds it (a live page handed out twice, or a
  shared page written without a copy first),
- a computed token's KV is no longer where its block table says (overwritten, lost in a swap),
- a prefix hit hands a sequence pages whose content is not its own tokens,
- a block table changes other than by growing at its end or by a copy-on-write the MemOps name,
- the page or host-page counts of `usage()` disagree with the tables and the host copies.
"""

from __future__ import annotations

from collections.abc import Callable

from kvlab.policies import KVCacheManager, MemOps, Request, Scheduler, SchedulerOutput
from kvlab.policies.kv_events import CLEARED, REMOVED, STORED, KVEventLog

Content = Callable[[Request, int], object]


class PrefixContent:
    """What the KV of token `index` of a sequence is, as far as the manager can know it.

    KV depends on the whole prefix up to the token, not on the token alone: with token ids it
    is (id, position, a digest of every id up to it), so two sequences' slots agree exactly
    when their prefixes do; with trace block ids, the block's size and id (which name the
    prefix up to the block's end) and the position; else something no other sequence shares.
    """

    def __init__(self) -> None:
        self._digests: dict[int, list[int]] = {}  # request id -> prefix digest per position

    def __call__(self, seq: Request, index: int) -> object:
        if seq.prompt_token_ids is not None:
            num_known = seq.prompt_len + len(seq.output_token_ids)
            if index < num_known:
                return self._digest(seq, index)
        elif seq.hash_ids is not None and index < seq.prompt_len:
            block = index // seq.hash_block_size
            if block < len(seq.hash_ids):
                return ("block", seq.hash_block_size, seq.hash_ids[block], index)
        return ("own", seq.request_id, index)

    def _digest(self, seq: Request, index: int) -> tuple[int, int, int]:
        digests = self._digests.setdefault(seq.request_id, [])
        if index >= len(digests):
            ids = seq.token_slice(len(digests), index + 1)
            parent = digests[-1] if digests else 0
            for token in ids:
                parent = hash((parent, token))
                digests.append(parent)
        return (seq.token_slice(index, index + 1)[0], index, digests[index])


class ShadowError(AssertionError):
    """The manager broke one of the promises the shadow checks."""


class ShadowMemory:
    """Device and host slots, the live and swapped sequences, checked after every operation.

    Drivers carry out each decision's MemOps (`execute`) and tell it what the decision was:
    `admitted`, `grew`, `freed`, `swapped_out`, `swapped_in`, `forked`; then `wrote` for the
    tokens computed, and `check()`. `content(seq, i)` gives the logical content of token i
    (a `PrefixContent` unless a test forks sequences).
    """

    def __init__(self, manager: KVCacheManager, content: Content | None = None) -> None:
        self.manager = manager
        self.content = content if content is not None else PrefixContent()
        self.page_size = manager.page_size
        self.device: dict[int, object] = {}  # slot (page * page_size + offset) -> content
        self.host: dict[int, object] = {}
        self.seqs: dict[int, Request] = {}  # live sequences (holding device pages)
        self.tables: dict[int, list[int]] = {}  # each live sequence's table as last seen
        self.written: dict[int, int] = {}  # tokens whose KV each live sequence has written
        self.swapped: dict[int, tuple[Request, list[int], int]] = {}  # host pages, tokens
        # level -> slot -> content, for the memory tiers below the device (level 0 is it)
        self.levels: dict[int, dict[int, object]] = {0: self.device}

    # ------------------------------------------------------------------ decisions
    def num_pages_written(self, seq: Request) -> int:
        """Pages holding the sequence's written tokens (what a swap-out moves)."""
        return -(-self.written[seq.request_id] // self.page_size)

    def admitted(self, seq: Request, num_hit: int) -> None:
        """A new sequence got a block table whose first `num_hit` tokens are prefix hits."""
        rid = seq.request_id
        self._require(rid not in self.seqs and rid not in self.swapped, f"{rid} admitted twice")
        table = list(self.manager.block_table(seq))
        num_hit_pages = num_hit // self.page_size
        self._require(num_hit % self.page_size == 0, f"seq {rid}: hit of {num_hit} tokens")
        self._require(len(table) >= num_hit_pages, f"seq {rid}: fewer pages than hits")
        for index in range(num_hit):
            self._require(
                self._slot(table, index) in self.device
                and self.device[self._slot(table, index)] == self.content(seq, index),
                f"seq {rid}: prefix hit on page {table[index // self.page_size]} at token "
                f"{index} holds {self.device.get(self._slot(table, index))!r}, not its "
                f"{self.content(seq, index)!r}",
            )
        self._check_new_pages(seq, table[num_hit_pages:])
        self.seqs[rid], self.tables[rid], self.written[rid] = seq, table, num_hit

    def grew(self, seq: Request, copies: list[tuple[int, int]],
             table: list[int] | None = None) -> None:
        """A live sequence was allocated more (its table may have grown, and `copies` replaced
        shared pages with private copies); `table`: its table then, where it changed since."""
        rid = seq.request_id
        self._require(rid in self.seqs, f"seq {rid} grew but holds no memory")
        old = self.tables[rid]
        new = list(self.manager.block_table(seq)) if table is None else table
        replaced = dict(copies)
        self._require(len(new) >= len(old), f"seq {rid}: its table shrank")
        fresh = []
        for index, page in enumerate(old):
            if new[index] != page:
                self._require(
                    replaced.get(page) == new[index],
                    f"seq {rid}: page {page} at {index} became {new[index]} with no copy",
                )
                fresh.append(new[index])
        fresh += new[len(old) :]
        self.tables[rid] = new
        self._check_new_pages(seq, fresh)

    def wrote(self, seq: Request, start: int, end: int) -> None:
        """The sequence computed the KV of tokens [start, end) into its table's slots."""
        rid = seq.request_id
        table = self.tables[rid]
        self._require(start == self.written[rid], f"seq {rid}: writes from {start}, not "
                      f"from its {self.written[rid]} written tokens")
        self._require(len(table) * self.page_size >= end, f"seq {rid}: no slot for token {end - 1}")
        for index in range(start, end):
            page = table[index // self.page_size]
            for other, other_table in self.tables.items():
                self._require(
                    other == rid or page not in other_table,
                    f"seq {rid} writes token {index} into page {page}, which seq {other} holds",
                )
            self.device[self._slot(table, index)] = self.content(seq, index)
        self.written[rid] = end

    def freed(self, seq: Request) -> None:
        """The sequence released everything it held."""
        self.seqs.pop(seq.request_id, None)
        self.tables.pop(seq.request_id, None)
        self.written.pop(seq.request_id, None)
        self.swapped.pop(seq.request_id, None)

    def swapped_out(self, seq: Request, swap_outs: list[tuple[int, int]],
                    copies: list[tuple[int, int]] = ()) -> None:
        """The sequence's written tokens go to the host pages `swap_outs` names. `copies`: the
        copies-on-write of the step: swap-outs run before them, so a page of the table that
        one of them fills is read from its source."""
        rid = seq.request_id
        self._require(rid in self.tables, f"seq {rid} was swapped out before its pages held "
                      "its KV (it was given memory in this step)")
        table, num_written = self.tables[rid], self.written[rid]
        host_pages = [host for _, host in swap_outs]
        source = {dst: src for src, dst in copies}
        self._require(
            [page for page, _ in swap_outs]
            == [source.get(page, page) for page in table[: -(-num_written // self.page_size)]],
            f"seq {rid}: swap-outs {swap_outs} are not its written pages of {table} (this "
            f"step's copies: {list(copies)})",
        )
        for other, (_, pages, _) in self.swapped.items():
            self._require(not set(pages) & set(host_pages), f"host pages of {other} reused")
        self.freed(seq)
        self.swapped[rid] = (seq, host_pages, num_written)

    def swapped_in(self, seq: Request, swap_ins: list[tuple[int, int]],
                   table: list[int] | None = None) -> None:
        """The sequence comes back from host memory into the pages `swap_ins` names (`table`:
        its table then, where it changed since)."""
        rid = seq.request_id
        _, host_pages, num_written = self.swapped.pop(rid)
        self._require([host for host, _ in swap_ins] == host_pages,
                      f"seq {rid}: swap-ins {swap_ins} are not its host pages {host_pages}")
        table = list(self.manager.block_table(seq)) if table is None else table
        self._require([dev for _, dev in swap_ins] == table[: len(host_pages)],
                      f"seq {rid}: swapped into {swap_ins}, its table is {table}")
        self._check_new_pages(seq, table)
        self.seqs[rid], self.tables[rid], self.written[rid] = seq, table, num_written

    def forked(self, parent: Request, child: Request, table: list[int] | None = None) -> None:
        """`child` shares the parent's filled pages (`table`: the child's table at the fork,
        where it grew since)."""
        table = list(self.manager.block_table(child)) if table is None else table
        parent_table = self.tables[parent.request_id]
        self._require(table == parent_table[: len(table)], "a fork's table is not its parent's")
        rid = child.request_id
        self.seqs[rid], self.tables[rid] = child, table
        self.written[rid] = self.written[parent.request_id]

    # ------------------------------------------------------------------ checks
    def check(self) -> None:
        """Every written token in place; usage() agrees with the tables and host copies."""
        ps = self.page_size
        held: set[int] = set()
        for rid, seq in self.seqs.items():
            table = self.tables[rid]
            self._require(table == list(self.manager.block_table(seq)),
                          f"seq {rid}: its table changed outside a decision")
            self._require(len(set(table)) == len(table), f"seq {rid}: a page twice in {table}")
            held.update(table)
            for index in range(self.written[rid]):
                self._require(self.device.get(self._slot(table, index)) == self.content(seq, index),
                              f"seq {rid}: token {index} in page {table[index // ps]} is lost")
        for rid, (seq, pages, num_written) in self.swapped.items():
            self._require(self.manager.is_swapped(seq), f"seq {rid} is not swapped out")
            self._require(not self.manager.block_table(seq), f"swapped seq {rid} holds pages")
            for index in range(num_written):
                slot = pages[index // ps] * ps + index % ps
                self._require(self.host.get(slot) == self.content(seq, index),
                              f"swapped seq {rid}: token {index} lost on host")
        usage = self.manager.usage()
        self._require(
            usage.num_used_pages + usage.num_cached_free_pages + usage.num_free_pages
            == usage.num_total_pages,
            f"pages do not add up: {usage}",
        )
        self._require(usage.num_used_pages == len(held),
                      f"{usage.num_used_pages} pages counted used, {len(held)} held by live "
                      "sequences: a held page is counted free (or a free page held)")
        host_held = sum(len(pages) for _, pages, _ in self.swapped.values())
        self._require(usage.num_host_used_pages == host_held,
                      f"{usage.num_host_used_pages} host pages used, {host_held} hold swaps")

    # ------------------------------------------------------------------ internals
    def _check_new_pages(self, seq: Request, pages: list[int]) -> None:
        for page in pages:
            for other, table in self.tables.items():
                self._require(
                    other == seq.request_id or page not in table,
                    f"seq {seq.request_id} was handed page {page}, which seq {other} holds",
                )

    def _slot(self, table: list[int], index: int) -> int:
        return table[index // self.page_size] * self.page_size + index % self.page_size

    def execute(self, ops: MemOps) -> None:
        """Carry out MemOps in the documented order: tier writes, swap-outs, copies, swap-ins,
        tier loads."""
        self._copy_levels(ops.tier_writes)
        for pairs, src, dst in (
            (ops.swap_outs, self.device, self.host),
            (ops.copies, self.device, self.device),
            (ops.swap_ins, self.host, self.device),
        ):
            for src_page, dst_page in pairs:
                self._copy_page(src, src_page, dst, dst_page)
        self._copy_levels(ops.tier_loads)

    def _copy_levels(self, batches: list) -> None:
        levels, ps = self.levels, self.page_size
        for src_level, src_pages, dst_level, dst_pages in batches:
            self._require(src_level != dst_level, f"a tier copy within level {src_level}")
            self._require(len(set(dst_pages)) == len(dst_pages),
                          f"a tier batch writes a page twice: {dst_pages}")
            src, dst = levels.setdefault(src_level, {}), levels.setdefault(dst_level, {})
            # one batch is one gather then one scatter: every source read before any write
            values = [[src.get(page * ps + offset) for offset in range(ps)]
                      for page in src_pages]
            for page, contents in zip(dst_pages, values, strict=True):
                for offset, value in enumerate(contents):
                    if value is None:
                        dst.pop(page * ps + offset, None)
                    else:
                        dst[page * ps + offset] = value

    def _copy_page(self, src: dict[int, object], src_page: int, dst: dict[int, object],
                   dst_page: int) -> None:
        ps = self.page_size
        for offset in range(ps):
            value = src.get(src_page * ps + offset)
            if value is None:
                dst.pop(dst_page * ps + offset, None)
            else:
                dst[dst_page * ps + offset] = value

    @staticmethod
    def _require(condition: bool, message: str) -> None:
        if not condition:
            raise ShadowError(message)


def check_whole_tier_pages(seq: Request, table: list[int], loaded: set[int],
                           manager: KVCacheManager) -> None:
    """A new sequence's hit below the device, taken whole as the lookup found it, ends where a
    tier page does (a tier page is found by its last device page's key and loaded whole):
    `loaded` holds the device pages its loads fill (with others' it does not hold)."""
    unit = manager.tiers[0].block_pages if manager.tiers else 1
    own = [index for index, page in enumerate(table) if page in loaded]
    if own and (own[-1] + 1) % unit:
        raise ShadowError(f"seq {seq.request_id}: its hit below the device ends at device page "
                          f"{own[-1]}, inside a tier page of {unit} device pages")


class CachedKeys:
    """The manager's prefix-cache keys as its KV events tell them, step by step: checks that
    every page a step fills with known tokens is in the cache in that step (vLLM stores a
    block in the step that computes its last token)."""

    def __init__(self, manager: KVCacheManager) -> None:
        self.manager = manager
        self.keys: set = set()  # cached now, by the events so far
        self._present: set = set()  # cached at some time in the last step
        if manager.caching:
            manager.events = KVEventLog()

    def end_step(self) -> None:
        """Take the step's events."""
        present = set(self.keys)
        for event in self.manager.events.take() if self.manager.events is not None else ():
            if event.kind == STORED:
                self.keys.add(event.key)
                present.add(event.key)
            elif event.kind == REMOVED:
                self.keys.discard(event.key)
            elif event.kind == CLEARED:
                self.keys.clear()
        self._present = present

    def check_filled(self, seq: Request, start: int, num_new: int, known: list) -> None:
        """The pages that tokens [start, start + num_new) filled, of those whose prefix keys
        were `known` when the step was decided, were cached in the step (`end_step`)."""
        page_size = self.manager.page_size
        for index in range(start // page_size, min(len(known), (start + num_new) // page_size)):
            if known[index] not in self._present:
                raise ShadowError(
                    f"seq {seq.request_id}: page {index}, filled by tokens {start}.."
                    f"{start + num_new - 1} in this step, is not in the prefix cache (no stored "
                    "event)")


class ShadowExecutor:
    """Carries out a scheduler's steps on a `ShadowMemory`, as the engine does: each step's
    MemOps, then the scheduled tokens' KV into the slots their block tables name; then commits
    the step (with sampled ids for requests whose output ids are known) and checks memory."""

    def __init__(self, scheduler: Scheduler) -> None:
        self.scheduler = scheduler
        self.shadow = ShadowMemory(scheduler.manager)
        self.cached = CachedKeys(scheduler.manager)

    def step(self, now_s: float) -> SchedulerOutput:
        """Schedule, execute and commit one step at clock time `now_s`."""
        scheduler, shadow, manager = self.scheduler, self.shadow, self.scheduler.manager
        swapped_before = list(scheduler.swapped)
        output = scheduler.schedule(now_s)
        self.cached.end_step()
        page_size = manager.page_size
        known = [list(r.page_hashes(page_size)) if manager.caching else []
                 for r in output.requests]
        ops = output.mem_ops
        swap_outs = iter(ops.swap_outs)
        for victim in output.preempted:
            if manager.is_swapped(victim):
                pairs = [next(swap_outs) for _ in range(shadow.num_pages_written(victim))]
                shadow.swapped_out(victim, pairs)
            else:
                shadow.freed(victim)
        shadow.execute(ops)
        swap_ins = iter(ops.swap_ins)
        for request in swapped_before:
            if not manager.is_swapped(request):
                num_pages = len(shadow.swapped[request.request_id][1])
                shadow.swapped_in(request, [next(swap_ins) for _ in range(num_pages)])
        loaded = {page for batch in ops.tier_loads for page in batch.dst_pages}
        for item in output.scheduled:
            request = item.request
            table = manager.block_table(request)
            if request.request_id in shadow.seqs:
                shadow.grew(request, [(s, d) for s, d in ops.copies if d in table])
            else:
                shadow.admitted(request, item.num_computed_tokens)
                if loaded:  # (a request admitted after it may hit the same pages on the device)
                    check_whole_tier_pages(request, table, loaded, manager)
                    loaded -= set(table)
            shadow.wrote(request, item.num_computed_tokens,
                         item.num_computed_tokens + item.num_new_tokens)
        for item, keys in zip(output.scheduled, known, strict=True):
            self.cached.check_filled(item.request, item.num_computed_tokens,
                                     item.num_new_tokens, keys)
        finished = scheduler.update(output, self._samples(output), now_s)
        for request in finished:
            shadow.freed(request)
        shadow.check()
        return output

    @staticmethod
    def _samples(output: SchedulerOutput) -> list[int | None]:
        """A sampled id for each request that completes a token and has known output ids: a
        few distinct ids, so that outputs repeat prompts and one another."""
        samples: list[int | None] = []
        for request, new, done in zip(output.requests, output.num_new_tokens,
                                      output.num_computed_tokens, strict=True):
            completes = done + new == request.num_tokens
            known = request.output_ids_known and request.prompt_token_ids is not None
            samples.append((request.num_output_tokens + done) % 3 if completes and known else None)
        return samples
