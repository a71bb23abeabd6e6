"""How a run keeps Python's cyclic garbage collector out of its timing (torch-free: the engine,
the server and the simulator share it)."""

from __future__ import annotations

import contextlib
import gc
from collections.abc import Iterator


@contextlib.contextmanager
def frozen_heap() -> Iterator[None]:
    """Keep every object alive on entry out of the cyclic GC until exit (gc.freeze, as vLLM does
    once its engine has started; gc.unfreeze on exit). Reentrant: where objects were frozen
    already on entry (an outer block, or a server thread of the same process), they and the
    block's stay frozen on exit, for the first freezer to thaw.

    What start-up built (imports, model, cache: a few 100k objects) outlives a run; left in the
    GC's oldest generation, each full collection walks all of it, which took 0.15-0.3 s of CPU
    on the 2-core test machine, charged to whatever step it fell in: one or two per 16-request
    run, 5-10% of the run's time. Frozen, it is skipped; a full collection during the run only
    walks what the run created.
    """
    first = not gc.get_freeze_count()
    gc.freeze()
    try:
        yield
    finally:
        if first:
            gc.unfreeze()


@contextlib.contextmanager
def paused_gc() -> Iterator[None]:
    """No cyclic collection until exit (reference counting still frees everything else); the
    collector's state on entry is restored on exit. Reentrant.

    For a simulation: it makes next to no cyclic garbage (14-20 objects in a whole run, found
    by a collection after one with the collector off), so nothing piles up, while collections
    during it walk the structures it builds (prefix-cache queues and tier maps of 100k+
    entries), a cache miss per entry: measured, 3% of a run with a host tier's instructions
    and up to 0.07 s of its 0.6 s.

    On exit, what the block made and kept joins the oldest generation as it is, unless some
    objects are frozen (`frozen_heap`'s would be thawed with them): re-enabled, the collector
    would otherwise walk all of it at the next allocation, a young collection over a whole
    run's objects (11 ms after a Mooncake run with a host tier, 6 ms without).
    """
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was_enabled:
            if not gc.get_freeze_count():
                gc.freeze()  # every generation into the permanent one, then all of it into
                gc.unfreeze()  # the oldest: two list splices, no object visited
            gc.enable()
