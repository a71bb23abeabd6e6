"""Memory tiers below device pages: the prefix cache spilled to host DRAM, local SSD or a
remote pool, each tier a bounded, content-addressed store of pages with its own eviction.

A tier holds copies of cached prefix pages, keyed by the same page hashes as the device's
prefix cache (`Request.page_hashes`). The manager's side (policies/tier_link.py) decides what
moves: a page evicted from the device is written to the first tier (write-back; with
write-through every page is written as soon as its KV is computed), a page a tier evicts moves
down to the next tier, and a prefix lookup that runs out of device pages goes on through the
tiers, so a hit below the device becomes a load into a fresh device page before the request's
prefill. Tiers are inclusive: a page loaded back stays in its tier. A tier page is one device
page (the same token slots and bytes), or several (`TiersConfig.block_size`: vLLM's offloaded
block size, LMCache's chunk), so a tier's capacity in bytes is a number of device pages
(`TierSpec.num_pages`), in whole tier pages (`TierSpec.num_blocks`).

The rooms: `spec.py` (what the tiers are: `TierSpec`, `TiersConfig`, the `--kv-tiers`
grammar), `store.py` (a tier's key -> page map and eviction order), `prefix_tier.py` (a tier at
run time, and building an instance's tiers), `chain.py` (a lookup through the tiers),
`stats.py` (counters and summary keys), `units.py` (tier pages of several device pages: flags
and slots per unit, and `DeviceUnits`, which writes a unit back whole).
"""

from kvlab.policies.tiers.chain import TierRuns, chain_head, chain_length, tier_chain
from kvlab.policies.tiers.prefix_tier import PrefixTier, build_tier, build_tiers
from kvlab.policies.tiers.spec import (
    AUTO_BLOCK,
    OVERLAP_MODES,
    TIER_KINDS,
    WRITE_POLICIES,
    TiersConfig,
    TierSpec,
    parse_tier,
    parse_tiers,
)
from kvlab.policies.tiers.stats import TierStats, tier_summary
from kvlab.policies.tiers.store import TierStore

__all__ = [
    "AUTO_BLOCK",
    "OVERLAP_MODES",
    "TIER_KINDS",
    "WRITE_POLICIES",
    "PrefixTier",
    "TierRuns",
    "TierSpec",
    "TierStats",
    "TierStore",
    "TiersConfig",
    "build_tier",
    "build_tiers",
    "chain_head",
    "chain_length",
    "parse_tier",
    "parse_tiers",
    "tier_chain",
    "tier_summary",
]
