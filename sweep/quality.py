"""A quality budget for `kvlab tune` (issue 48): what each candidate's KV precision costs the
model, looked up in a `kvlab accuracy --json` file, and the candidates the budget keeps.

A candidate's KV precision is its `kv_cache_dtype` (default auto) and its policy's
`precision=` family (default none); the file's rows are keyed the same way (`kvlab accuracy
MODEL --kv-cache-dtype fp8_e4m3 --precision age:recent=64,depth=2`). `auto` without demotion is
the reference: it costs nothing by definition. The figures are the accuracy run's model's
(stdlib-llama, say), not necessarily the candidates' model: the table says which.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from kvlab.errors import KvlabError
from kvlab.policies import registry
from kvlab.policies.spec import parse_policy
from kvlab.specs.kv_dtype import kv_cache_dtype

# an accuracy row's figures a tune table shows beside each candidate
QUALITY_COLUMNS = ("kl_mean", "top1_agreement", "perplexity_change")
_REFERENCE = {"kl_mean": 0.0, "kl_p99": 0.0, "top1_agreement": 1.0, "perplexity_change": 0.0}


@dataclass(frozen=True, slots=True)
class QualityBudget:
    """Limits on an accuracy row: mean KL (nats), perplexity increase, top-1 agreement (a
    share); None: no limit."""

    max_kl: float | None = None
    max_perplexity_increase: float | None = None
    min_top1: float | None = None

    def __post_init__(self) -> None:
        for name, flag in (("max_kl", "--max-kl"),
                           ("max_perplexity_increase", "--max-perplexity-increase"),
                           ("min_top1", "--min-top1")):
            value = getattr(self, name)
            if value is not None and (not math.isfinite(value) or value < 0):
                raise KvlabError(f"{flag} {value!r}: expected a finite number >= 0",
                                 parameters=(name,))

    @property
    def is_set(self) -> bool:
        """Whether any limit is given."""
        return any(v is not None for v in (self.max_kl, self.max_perplexity_increase,
                                           self.min_top1))

    def over(self, quality: Mapping[str, float]) -> str | None:
        """Why `quality` (an accuracy row's figures) is over budget; None within it."""
        if self.max_kl is not None and quality["kl_mean"] > self.max_kl:
            return f"KL {quality['kl_mean']:.2e} > {self.max_kl:g}"
        if (self.max_perplexity_increase is not None
                and quality["perplexity_change"] > self.max_perplexity_increase):
            return (f"perplexity +{quality['perplexity_change']:.4f} > "
                    f"+{self.max_perplexity_increase:g}")
        if self.min_top1 is not None and quality["top1_agreement"] < self.min_top1:
            return f"top-1 {100 * quality['top1_agreement']:.2f}% < {100 * self.min_top1:g}%"
        return None


@dataclass(frozen=True, slots=True)
class QualityTable:
    """An accuracy JSON's rows by (kv_cache_dtype, precision), and its model and corpus."""

    path: str
    model: str
    corpus: str
    rows: dict[tuple[str, Any], dict[str, float]]  # (dtype, _policy_key(precision))

    @classmethod
    def load(cls, path: str | Path) -> QualityTable:
        """The file `kvlab accuracy --json` wrote; a one-line KvlabError naming --quality."""
        where = f"--quality {path}"
        try:
            data = json.loads(Path(path).read_text(encoding="utf-8"))
            rows = {(kv_cache_dtype(str(r["kv_cache_dtype"])).name,
                     _policy_key(str(r.get("precision", "none")))):
                    {key: float(r[key]) for key in (*QUALITY_COLUMNS, "kl_p99")}
                    for r in data["results"]}
            model, corpus = str(data["model"]), str(data.get("corpus", "?"))
        except OSError as exc:
            raise KvlabError(f"{where}: cannot read it ({exc.strerror})",
                             parameters=("quality",)) from None
        except (ValueError, KeyError, TypeError) as exc:
            raise KvlabError(f"{where}: expected the JSON of kvlab accuracy --json (results "
                             f"with kv_cache_dtype, kl_mean, top1_agreement, perplexity_change;"
                             f" {type(exc).__name__}: {exc})", parameters=("quality",)
                             ) from None
        return cls(str(path), model, corpus, rows)

    def of(self, candidate: Mapping[str, Any]) -> dict[str, float]:
        """The figures of `candidate`'s KV precision; a KvlabError saying what to measure."""
        dtype, precision = candidate_precision(candidate)
        if (dtype, precision) == ("auto", "none"):
            return dict(_REFERENCE)
        row = self.rows.get((dtype, _policy_key(precision)))
        if row is None:
            what = (f"--kv-cache-dtype {dtype}" if precision == "none"
                    else f"--precision {precision}" if dtype == "auto" else None)
            how = (f"; measure it: kvlab accuracy {self.model} {what} --json" if what else
                   "; kvlab accuracy measures demotion at auto only")
            raise KvlabError(f"--quality {self.path} has no row for kv_cache_dtype={dtype}, "
                             f"precision={precision}{how}", parameters=("quality",))
        return dict(row)


def candidate_precision(candidate: Mapping[str, Any]) -> tuple[str, str]:
    """(kv_cache_dtype's canonical name, the policy's precision) of a tune candidate."""
    dtype = kv_cache_dtype(str(candidate.get("kv_cache_dtype") or "auto")).name
    precision = candidate.get("precision")  # the policy key, where the sweep varies it
    return dtype, str(precision or parse_policy(candidate.get("policy") or "paged").precision)


def _policy_key(precision: str) -> Any:
    """The precision family's parameters (any order, defaults filled), or "none"."""
    if precision == "none":
        return precision
    return registry.get("precision", precision).factory()


def judge(candidates: Sequence[Mapping[str, Any]], table: QualityTable,
          budget: QualityBudget) -> tuple[list[dict[str, float]], list[str | None]]:
    """Each candidate's quality figures and why it is over `budget` (None: within)."""
    qualities = [table.of(candidate) for candidate in candidates]
    return ([{key: q[key] for key in QUALITY_COLUMNS} for q in qualities],
            [budget.over(q) for q in qualities])
