"""The precision ladder: the levels a demoted page steps down through, and their bytes."""

from __future__ import annotations

from dataclasses import dataclass

from kvlab.errors import KvlabError
from kvlab.specs.kv_dtype import kv_cache_dtype

# The next lower precision of each 16- and 8-bit dtype (vLLM #49198's bf16 -> fp8 -> 4 bits).
_BELOW = {
    "auto": "fp8_e4m3",
    "bfloat16": "fp8_e4m3",
    "float16": "fp8_e4m3",
    "fp8_e4m3": "int4_per_token_head",
    "fp8_e5m2": "int4_per_token_head",
    "int8": "int4_per_token_head",
    "int8_per_token_head": "int4_per_token_head",
    "fp8_per_token_head": "int4_per_token_head",
}


@dataclass(slots=True, frozen=True)
class PrecisionLadder:
    """Level 0 is the cache's dtype, level k its k-th step down; `row_bytes[k]` is one token's
    K (or V) row of one head at level k, scales included (what a page of level k holds per slot,
    up to the same factor for every level)."""

    names: tuple[str, ...]
    row_bytes: tuple[int, ...]

    @property
    def depth(self) -> int:
        """Levels below the cache's dtype."""
        return len(self.names) - 1

    def ratio(self, level: int) -> float:
        """A page's bytes at `level` over its bytes at the cache's dtype."""
        return self.row_bytes[level] / self.row_bytes[0]


def build_ladder(cache_dtype: str, depth: int, head_dim: int,
                 model_dtype_bytes: int) -> PrecisionLadder:
    """The cache's dtype and `depth` levels below it. Raises KvlabError (naming
    kv_cache_dtype and precision) where the ladder has fewer levels below the dtype."""
    names = [kv_cache_dtype(cache_dtype).name]
    while len(names) <= depth:
        below = _BELOW.get(names[-1])
        if below is None:
            raise KvlabError(
                f"precision: depth={depth} steps below kv_cache_dtype {cache_dtype!r}, but the "
                f"ladder {' -> '.join(names)} ends there; use a smaller depth or a wider cache",
                parameters=("kv_cache_dtype",))
        names.append(below)
    row = tuple(kv_cache_dtype(n).head_token_bytes(head_dim, model_dtype_bytes) for n in names)
    return PrecisionLadder(tuple(names), row)
