"""A run's precision mix as flat summary keys, from its pages at each precision level and its
demotions step by step: the step-table columns a precision policy adds
(kvlab.policies.precision.mix), or the same figures kept by a manager."""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from typing import Any

from kvlab.metrics.records import StepRecorder

PAGES_AT_LEVEL = "num_pages_at_level_"  # + level: held and cached pages at it, per step
DEMOTIONS_TO_LEVEL = "num_demotions_to_level_"  # + level (>= 1): pages demoted into it
# whole pages at the cache's dtype that the held demoted pages no longer need, per step
SPARED_PAGES = "num_spared_pages"
# the context tokens at the cache's dtype that the batch's demoted pages spare its attention,
# per step (what the simulator takes off the step's context; a calibration's feature)
SAVED_CONTEXT = "num_saved_context_tokens"
# the step's requantizations, in pages at the cache's dtype read and written (halved: a page
# copy's worth), per step (what the simulator charges; a calibration's feature)
REQUANTIZED_PAGES = "num_requantized_pages"
DEMOTIONS_KEY = re.compile(r"precision_demotions_(\d+)_(.+)")  # a summary's, per level


def level_label(name: str) -> str:
    """A level's dtype as a report or figure shows it: `auto` (vLLM's name for the model's own
    dtype, kept in keys and labels) says what it is."""
    return "auto (model dtype)" if name == "auto" else name


def mix_summary(names: Sequence[str], pages_at_level: Sequence[Sequence[int]],
                demotions_to_level: Sequence[Sequence[int]], duration_s: float,
                max_debt_pages: int) -> dict[str, Any]:
    """Flat keys for a run's summary: the levels' `names` (the cache's dtype first), the mean
    share of held and cached pages at each (over steps: `pages_at_level[k]`, a value per
    step), the pages demoted into each level below the cache's dtype (`demotions_to_level[k -
    1]`, per step) and per second of `duration_s`, and the most ballast a ledger owed."""
    sums = [sum(pages) for pages in pages_at_level]
    demotions = [0, *(sum(steps) for steps in demotions_to_level)]
    total = sum(sums) or 1
    out: dict[str, Any] = {"precision_levels": "/".join(names)}
    out["precision_demotions_per_s"] = sum(demotions) / duration_s if duration_s > 0 else 0.0
    for level, name in enumerate(names):
        out[f"precision_share_{level}_{name}"] = sums[level] / total
        if level:
            out[f"precision_demotions_{level}_{name}"] = demotions[level]
    out["precision_max_debt_pages"] = max_debt_pages
    return out


def mix_rows(summary: Mapping[str, Any]) -> list[tuple[str, str]]:
    """(label, key) of the mix keys a run's summary has (`mix_summary`), in reading order:
    each level's share of the pages, the pages demoted into each level below the cache's
    dtype, the demotions per second, the most ballast owed; none for a run without. A
    summary without `precision_levels` (a benchmark of a demoting server: its demotions
    only) names its levels by its demotion keys."""
    names = dict(enumerate(str(summary.get("precision_levels") or "").split("/")))
    if len(names) < 2:
        names = {int(found[1]): found[2] for key in summary
                 if (found := DEMOTIONS_KEY.fullmatch(key))}
        if not names:
            return []
    rows = [(f"Share at {level_label(name)}", f"precision_share_{level}_{name}")
            for level, name in sorted(names.items())]
    rows += [(f"Pages demoted to {name}", f"precision_demotions_{level}_{name}")
             for level, name in sorted(names.items()) if level]
    rows += [("Demotions per second", "precision_demotions_per_s"),
             ("Max debt pages", "precision_max_debt_pages")]
    return [(label, key) for label, key in rows if key in summary]


def steps_mix_summary(steps: StepRecorder, metadata: Sequence[Mapping[str, Any]],
                      duration_s: float) -> dict[str, Any]:
    """`mix_summary` of runs merged into `steps` (several runs' rows, `metadata` each run's),
    from its precision columns, the levels named as the first run names them, the most ballast
    any run owed; none where the step table has no precision columns (a run without)."""
    names = str(metadata[0].get("precision_levels") or "").split("/") if metadata else []
    columns = steps.columns
    levels = [f"{PAGES_AT_LEVEL}{level}" for level in range(len(names))]
    if len(names) < 2 or not all(name in columns for name in levels):
        return {}
    demotions = [columns[f"{DEMOTIONS_TO_LEVEL}{level}"] for level in range(1, len(names))]
    debt = max(int(meta.get("precision_max_debt_pages", 0)) for meta in metadata)
    return mix_summary(names, [columns[name] for name in levels], demotions, duration_s, debt)


def used_pages_in_bytes(columns: Mapping[str, Any]) -> Any:
    """Each step's used pages as the device's pages of bytes they fill: `num_used_pages`
    less the pages demotion spared them (`SPARED_PAGES`, where a precision policy recorded
    it; a used page at a lower precision fills part of a page). A numpy array where the
    columns are."""
    used = columns["num_used_pages"]
    spared = columns.get(SPARED_PAGES)
    return used if spared is None else used - spared
