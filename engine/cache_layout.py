"""Which KV-cache group each layer reads and which cache tensor holds its pages.

A model with sliding-window layers gets vLLM's KV-cache groups (`kvlab.specs.kv_layout`): every
group holds the same number of layers, and layer i of each group shares cache tensor i with the
i-th layer of every other group, so one page id (one group's, at a time) takes one page in each
of `group size` tensors instead of one in every layer's. A model without windows, or with
the hybrid manager off (vLLM's `--disable-hybrid-kv-cache-manager`: every layer keeps every
token, a window read from the whole table), keeps one tensor per layer and one full group.
"""

from __future__ import annotations

from dataclasses import dataclass

from kvlab.engine.models.config import ModelConfig
from kvlab.specs.kv_groups import KVCacheGroup
from kvlab.specs.kv_layout import layer_group_ids


@dataclass(frozen=True, slots=True)
class CacheLayout:
    """The manager's groups (None: one full-attention group), each layer's group (empty: all
    in group 0) and each layer's cache tensor (empty: one tensor per layer)."""

    groups: tuple[KVCacheGroup, ...] | None = None
    layer_groups: tuple[int, ...] = ()
    layer_slots: tuple[int, ...] = ()

    def num_tensors(self, num_layers: int) -> int:
        """Cache tensors (K and V each) the model's `num_layers` layers need."""
        return max(self.layer_slots) + 1 if self.layer_slots else num_layers


def cache_layout(config: ModelConfig, layer_groups: tuple[int, ...] = (),
                 hybrid: bool = True) -> CacheLayout:
    """The layout of `config`'s layers; `layer_groups` named by the caller (a manager of its
    own tables) keeps one tensor per layer and no groups for the manager; `hybrid` False
    keeps one full-attention group (see the module)."""
    windows = config.layer_windows
    if layer_groups or not any(windows) or not hybrid:
        return CacheLayout(None, layer_groups, ())
    groups, ids = layer_group_ids([("sliding_attention", window) if window
                                   else ("full_attention", 0) for window in windows])
    seen = [0] * len(groups)
    slots = []
    for group in ids:
        slots.append(seen[group])
        seen[group] += 1
    return CacheLayout(groups, ids, tuple(slots))
