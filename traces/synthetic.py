"""vLLM-style synthetic `random` workload, with optional shared-prefix groups.

Like vLLM's random dataset: the non-prefix part of each prompt is uniform in
[floor(L*(1-r)), ceil(L*(1+r))] for L = random_input_len and r = random_range_ratio, the output in
[max(1, floor(O*(1-r))), ceil(O*(1+r))], drawn (inputs first) from numpy's default_rng(seed);
every prompt starts with random_prefix_len prefix tokens. kvlab adds prefix groups: request i
belongs to group i % num_prefix_groups, and requests of one group share their prefix. The prefix
shows in `hash_ids` over 16-token blocks: the prefix's full blocks carry the group's ids, every
other block an id of its own. All requests arrive at 0 unless `load_trace` resamples arrivals.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass

import numpy as np

from kvlab.errors import KvlabError
from kvlab.traces.build import check_num_prompts, make_requests, num_hash_blocks
from kvlab.traces.types import Trace

HASH_BLOCK_SIZE = 16
DEFAULT_NUM_PROMPTS = 1000


@dataclass(slots=True, frozen=True)
class RandomOptions:
    """The synthetic workload's knobs, named like vLLM's `--random-*` flags."""

    random_input_len: int = 1024
    random_output_len: int = 128
    random_range_ratio: float = 0.0
    random_prefix_len: int = 0
    num_prefix_groups: int | None = None  # default 1 when random_prefix_len > 0

    def check(self) -> None:
        """Raise a KvlabError naming the flag of the first bad value."""
        _check_int("random_input_len", self.random_input_len, 0)
        _check_int("random_output_len", self.random_output_len, 1)
        _check_int("random_prefix_len", self.random_prefix_len, 0)
        ratio = self.random_range_ratio
        if not isinstance(ratio, (int, float)) or not 0.0 <= ratio < 1.0:
            raise KvlabError(
                f"random_range_ratio {ratio!r}: expected a number in [0, 1)",
                parameters=("random_range_ratio",),
            )
        if self.num_prefix_groups is not None:
            _check_int("num_prefix_groups", self.num_prefix_groups, 1)
            if self.random_prefix_len == 0:
                raise KvlabError(f"num_prefix_groups {self.num_prefix_groups}: prefix groups "
                                 "need random_prefix_len > 0",
                                 parameters=("num_prefix_groups", "random_prefix_len"))
        low, _ = self.input_bounds()
        if self.random_prefix_len + low < 1:
            raise KvlabError(f"random_input_len {self.random_input_len}: the shortest prompt "
                             f"would have {self.random_prefix_len + low} tokens; expected >= 1",
                             parameters=("random_input_len",))

    def input_bounds(self) -> tuple[int, int]:
        """Inclusive bounds of the non-prefix prompt length."""
        r = self.random_range_ratio
        return (math.floor(self.random_input_len * (1 - r)),
                math.ceil(self.random_input_len * (1 + r)))

    def output_bounds(self) -> tuple[int, int]:
        """Inclusive bounds of the output length (at least 1)."""
        r = self.random_range_ratio
        return (max(1, math.floor(self.random_output_len * (1 - r))),
                max(1, math.ceil(self.random_output_len * (1 + r))))


def load_random(
    *, num_prompts: int | None = None, seed: int = 0, **options: int | float | None
) -> Trace:
    """A synthetic trace of num_prompts (default 1000) requests, all arriving at 0."""
    check_num_prompts(num_prompts)
    opts = RandomOptions(**options)  # type: ignore[arg-type]
    opts.check()
    num = DEFAULT_NUM_PROMPTS if num_prompts is None else int(num_prompts)
    rng = np.random.default_rng(seed)
    in_low, in_high = opts.input_bounds()
    out_low, out_high = opts.output_bounds()
    input_lens = opts.random_prefix_len + rng.integers(in_low, in_high + 1, size=num)
    output_lens = rng.integers(out_low, out_high + 1, size=num)
    hash_ids = _prefix_hash_ids(input_lens, opts) if opts.random_prefix_len > 0 else None
    requests = make_requests(np.zeros(num), input_lens, output_lens, hash_ids=hash_ids,
                             hash_block_size=HASH_BLOCK_SIZE)
    metadata = {"seed": seed, **{k: v for k, v in asdict(opts).items() if v is not None}}
    return Trace(_name(opts), "random", "synthetic", requests, metadata)


def _prefix_hash_ids(input_lens: np.ndarray, opts: RandomOptions) -> list[tuple[int, ...]]:
    """Per request: its group's ids on the prefix's full blocks, then fresh ids."""
    num_groups = opts.num_prefix_groups or 1
    num_shared = opts.random_prefix_len // HASH_BLOCK_SIZE
    next_id = num_groups * num_shared  # ids below this name shared prefix blocks
    hash_ids = []
    for i, input_len in enumerate(input_lens.tolist()):
        first = (i % num_groups) * num_shared
        num_own = num_hash_blocks(input_len, HASH_BLOCK_SIZE) - num_shared
        hash_ids.append((*range(first, first + num_shared), *range(next_id, next_id + num_own)))
        next_id += num_own
    return hash_ids


def _name(opts: RandomOptions) -> str:
    name = f"random in={opts.random_input_len} out={opts.random_output_len}"
    if opts.random_range_ratio:
        name += f" range={opts.random_range_ratio:g}"
    if opts.random_prefix_len:
        name += f" prefix={opts.random_prefix_len}x{opts.num_prefix_groups or 1}"
    return name


def _check_int(name: str, value: object, min_value: int) -> None:
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < min_value:
        raise KvlabError(f"{name} {value!r}: expected a whole number >= {min_value}",
                         parameters=(name,))
