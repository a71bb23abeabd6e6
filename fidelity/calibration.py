"""Fit the simulator's cost model to the per-step profiles `kvlab run --save-result` writes.

Two least-squares fits with non-negative coefficients (a negative cost per token is noise, not
physics, and would make the simulator's clock run backwards on some shapes):

1. the forward pass, on the steps with no memory work: measured `wall_time_s` against a constant
   (the fixed per-step overhead), prefill tokens, decode tokens, context tokens read by attention,
   the prefill chunks' (query, key) pairs, the batch size, and the decode context padded to the
   longest decode (what the torch backend's batched decode attention reads), and, where a
   precision policy demoted pages, the context tokens they spared (the context left charged as
   context: `step_features`) and the pages it requantized;
2. the memory work, on the steps that swapped or copied pages: what fit 1 does not explain of
   their measured time, against swap transfers, swapped pages and copied pages.

Fitting the swap part apart keeps a handful of swap steps from bending the forward-pass
coefficients. Non-negativity comes from `nnls`, a small Lawson-Hanson active-set solver over
numpy's lstsq (scipy is not a dependency). Torch-free: numpy and pandas only.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from kvlab.errors import KvlabError
from kvlab.metrics.precision_mix import REQUANTIZED_PAGES, SAVED_CONTEXT
from kvlab.sim.calibrated import CalibratedCostModel

STEP_FEATURES = (
    "num_prefill_tokens",
    "num_decode_tokens",
    "num_context_tokens",
    "num_attention_pairs",
    "num_seqs",
    "num_padded_context_tokens",
)
STEP_COEFFICIENTS = (
    "step_overhead_s",
    "prefill_token_s",
    "decode_token_s",
    "context_token_s",
    "attention_pair_s",
    "seq_s",
    "padded_context_token_s",
    "demoted_context_token_s",
    "requantize_page_s",
)
MEMORY_COEFFICIENTS = ("swap_transfer_s", "swap_page_s", "copy_page_s")
MEMORY_COLUMNS = (
    "num_swap_out_pages",
    "num_swap_in_pages",
    "num_swap_out_transfers",
    "num_swap_in_transfers",
    "num_copied_pages",
)
TIME_COLUMN = "wall_time_s"
MAX_STEP_S = 3600.0  # a step longer than an hour is a corrupt row, not a measurement
REQUIRED_COLUMNS = (TIME_COLUMN, *STEP_FEATURES, *MEMORY_COLUMNS)


@dataclass(slots=True, frozen=True)
class FitQuality:
    """How well a cost model reproduces measured steps.

    `r2`: 1 - residual / total sum of squares of step times; `mape_perc`: mean of
    |predicted - measured| / measured over steps, in percent; `total_error_perc`: (sum of
    predicted - sum of measured) / sum of measured, in percent, the error a run's duration
    and throughput inherit.
    """

    num_steps: int
    r2: float
    mape_perc: float
    total_error_perc: float


def nnls(a: np.ndarray, b: np.ndarray, *, max_iter: int | None = None) -> np.ndarray:
    """x >= 0 minimising ||a x - b||_2 (Lawson and Hanson's active-set method).

    Each outer step frees the variable with the largest gradient; the inner loop solves the
    unconstrained least squares on the free set with lstsq and steps back to the boundary
    whenever a free variable would turn negative.
    """
    a = np.asarray(a, dtype=np.float64)
    b = np.asarray(b, dtype=np.float64)
    num_vars = a.shape[1]
    x = np.zeros(num_vars)
    free = np.zeros(num_vars, dtype=bool)
    tolerance = 10 * np.finfo(np.float64).eps * np.linalg.norm(a, 1) * max(a.shape)
    for _ in range(max_iter or 3 * num_vars):
        gradient = a.T @ (b - a @ x)
        candidates = ~free & (gradient > tolerance)
        if not candidates.any():
            break
        free[np.argmax(np.where(candidates, gradient, -np.inf))] = True
        while True:
            z = np.zeros(num_vars)
            z[free] = np.linalg.lstsq(a[:, free], b, rcond=None)[0]
            if (z[free] > 0).all():
                x = z
                break
            # Step from x towards z as far as feasibility allows, then fix the zeros.
            blocking = free & (z <= 0)
            alpha = np.min(x[blocking] / (x[blocking] - z[blocking]))
            x = x + alpha * (z - x)
            free &= x > tolerance
            x[~free] = 0.0
    return x


def _scaled_nnls(features: np.ndarray, target: np.ndarray) -> np.ndarray:
    """nnls on columns scaled to unit maximum (token counts and attention pairs differ by
    orders of magnitude); all-zero columns get a zero coefficient."""
    scale = np.abs(features).max(axis=0) if features.size else np.zeros(features.shape[1])
    used = scale > 0
    coefficients = np.zeros(features.shape[1])
    if used.any() and target.size:
        scaled = features[:, used] / scale[used]
        coefficients[used] = nnls(scaled, target) / scale[used]
    return coefficients


def step_features(profile: pd.DataFrame) -> np.ndarray:
    """The forward-pass design matrix: a column of ones, then STEP_FEATURES, then a precision
    policy's two (0 where the profile has none): the context tokens its demoted pages spared
    (`num_saved_context_tokens`) and the pages it requantized (`num_requantized_pages`). Where
    they spared any, the step's context and padded context are what the simulator charges
    (sim/precision_costs.py): less in proportion."""
    ones = np.ones((len(profile), 1))
    features = profile[list(STEP_FEATURES)].to_numpy(dtype=np.float64, copy=True)
    requantized = (profile[REQUANTIZED_PAGES].to_numpy(dtype=np.float64)
                   if REQUANTIZED_PAGES in profile else np.zeros(len(profile)))[:, None]
    if SAVED_CONTEXT not in profile:
        return np.hstack([ones, features, np.zeros((len(profile), 1)), requantized])
    saved = profile[SAVED_CONTEXT].to_numpy(dtype=np.float64)
    context = features[:, STEP_FEATURES.index("num_context_tokens")]
    spared = (saved > 0) & (context > 0)
    keep = np.maximum(0.0, 1.0 - saved[spared] / context[spared])
    for name in ("num_context_tokens", "num_padded_context_tokens"):
        column = STEP_FEATURES.index(name)
        features[spared, column] = np.round(features[spared, column] * keep)
    return np.hstack([ones, features, np.where(spared, saved, 0.0)[:, None], requantized])


def memory_features(profile: pd.DataFrame) -> np.ndarray:
    """The memory-work design matrix: swap transfers, swapped pages, copied pages."""
    transfers = profile["num_swap_out_transfers"] + profile["num_swap_in_transfers"]
    pages = profile["num_swap_out_pages"] + profile["num_swap_in_pages"]
    return np.column_stack([transfers, pages, profile["num_copied_pages"]]).astype(np.float64)


def predict(model: CalibratedCostModel, profile: pd.DataFrame) -> np.ndarray:
    """The model's time for every step of a profile, memory work included (as the simulator
    charges it: swap out and in over the link, copies, then the forward pass)."""
    c = model.coefficients()
    c["requantize_page_s"] = model.requantize_page(c["requantize_page_s"], c["copy_page_s"])
    step = step_features(profile) @ np.array([c[name] for name in STEP_COEFFICIENTS])
    memory = memory_features(profile) @ np.array([c[name] for name in MEMORY_COEFFICIENTS])
    return step + memory + c["first_decode_token_s"] * first_decodes_column(
        profile, c["first_decodes"])


def first_decodes_column(profile: pd.DataFrame, first_decodes: float) -> np.ndarray:
    """Each step's decodes up to `first_decodes`: the bent decode term's feature."""
    return np.minimum(profile["num_decode_tokens"].to_numpy(dtype=np.float64), first_decodes)


def fit_quality(model: CalibratedCostModel, profile: pd.DataFrame) -> FitQuality:
    """R^2, per-step MAPE and total-time error of `model` on a profile's measured steps."""
    measured = profile[TIME_COLUMN].to_numpy(dtype=np.float64)
    predicted = predict(model, profile)
    if measured.size == 0:
        return FitQuality(0, float("nan"), float("nan"), float("nan"))
    residual = float(np.sum((measured - predicted) ** 2))
    spread = float(np.sum((measured - measured.mean()) ** 2))
    positive = measured > 0
    mape = float(np.mean(np.abs(predicted - measured)[positive] / measured[positive]))
    total = float(measured.sum())
    return FitQuality(
        num_steps=int(measured.size),
        r2=1.0 - residual / spread if spread > 0 else float("nan"),
        mape_perc=100.0 * mape,
        total_error_perc=100.0 * (float(predicted.sum()) - total) / total if total else 0.0,
    )


def fit_cost_model(
    profile: pd.DataFrame, *, sources: Sequence[str] = (), skip_first_steps: int = 0
) -> CalibratedCostModel:
    """Fit a CalibratedCostModel to a step profile (see the module docstring).

    `skip_first_steps` drops that many leading rows of each source profile before fitting (a
    fresh engine's first forward pays one-off allocations); rows are told apart by a `source`
    column when `load_profiles` added one. Raises KvlabError when no step without memory work
    is left to fit.
    """
    where = ", ".join(sources) or "profile"
    _check_columns(profile, where)
    if skip_first_steps:
        groups = profile.groupby("source", sort=False) if "source" in profile else [(None, profile)]
        profile = pd.concat([rows.iloc[skip_first_steps:] for _, rows in groups])
    memory = memory_features(profile)
    has_memory_work = memory.sum(axis=1) > 0
    plain = profile[~has_memory_work]
    if plain.empty:
        raise KvlabError(
            f"{where}: no step without swaps or page copies is left to fit the forward pass on "
            f"(after skip_first_steps {skip_first_steps}); calibrate on a run with more steps",
            parameters=("skip_first_steps",),
        )
    measured = profile[TIME_COLUMN].to_numpy(dtype=np.float64)
    step = _scaled_nnls(step_features(plain), measured[~has_memory_work])
    # What the forward pass does not explain of a swapping step is its memory work.
    leftover = measured[has_memory_work] - step_features(profile[has_memory_work]) @ step
    mem = _scaled_nnls(memory[has_memory_work], leftover)
    coefficients = dict(zip(STEP_COEFFICIENTS, step.tolist(), strict=True))
    coefficients.update(zip(MEMORY_COEFFICIENTS, mem.tolist(), strict=True))
    model = CalibratedCostModel(**coefficients)
    quality = fit_quality(model, profile)
    fit = {
        "sources": list(sources),
        "num_steps": quality.num_steps,
        "num_memory_steps": int(has_memory_work.sum()),
        "skip_first_steps": skip_first_steps,
        "r2": finite_or_none(quality.r2),
        "mape_perc": finite_or_none(quality.mape_perc),
        "total_error_perc": finite_or_none(quality.total_error_perc),
    }
    return CalibratedCostModel(**coefficients, fit=fit)


def robust_step_fit(
    profile: pd.DataFrame, terms: Sequence[str], *, iterations: int = 5, huber_k: float = 1.5,
    first_decodes: float = 0.0,
) -> CalibratedCostModel:
    """A forward-pass fit on `terms` only (names of STEP_COEFFICIENTS; the others 0), robust to
    outlying steps: iteratively reweighted nnls with Huber weights (a step whose residual is
    past `huber_k` robust standard deviations counts in proportion). For step times measured
    from outside a server, where a loaded client or host stalls some steps. `first_decodes`
    > 0 fits the bent decode term too (`first_decode_token_s` for a step's first that many
    decodes; CalibratedCostModel)."""
    unknown = [t for t in terms if t not in STEP_COEFFICIENTS]
    if unknown:
        raise ValueError(f"unknown step terms {unknown}")
    columns = [STEP_COEFFICIENTS.index(t) for t in terms]
    features = step_features(profile)[:, columns]
    if first_decodes > 0:
        features = np.column_stack([features, first_decodes_column(profile, first_decodes)])
    measured = profile[TIME_COLUMN].to_numpy(dtype=np.float64)
    weights = np.ones_like(measured)
    coefficients = np.zeros(features.shape[1])
    for _ in range(iterations):
        root = np.sqrt(weights)
        coefficients = _scaled_nnls(features * root[:, None], measured * root)
        residual = measured - features @ coefficients
        spread = 1.4826 * float(np.median(np.abs(residual - np.median(residual))))
        if spread <= 0:
            break
        weights = np.minimum(1.0, huber_k * spread / np.maximum(np.abs(residual), 1e-12))
    values = coefficients.tolist()
    fitted: dict[str, Any] = dict(zip(terms, values[:len(terms)], strict=True))
    if first_decodes > 0 and values[-1] > 0:
        fitted.update(first_decode_token_s=values[-1], first_decodes=float(first_decodes))
    return CalibratedCostModel(**fitted)


def finite_or_none(value: float) -> float | None:
    """JSON has no NaN: an undefined figure (one step, constant times) is saved as null."""
    return value if np.isfinite(value) else None


def load_profiles(paths: Sequence[str | Path]) -> pd.DataFrame:
    """Concatenate step profiles (`<stem>.steps.csv` or `.parquet` from `kvlab run`), with a
    `source` column naming each row's file. Raises KvlabError naming a bad file."""
    if not paths:
        raise KvlabError("give at least one step profile (a <stem>.steps.csv from kvlab run)")
    frames = []
    for path in map(Path, paths):
        frame = _read_profile(path)
        _check_columns(frame, str(path))
        frames.append(frame.assign(source=str(path)))
    return pd.concat(frames, ignore_index=True)


def _read_profile(path: Path) -> pd.DataFrame:
    if path.name.endswith(".json"):
        raise KvlabError(
            f"{path}: a summary file; give its step profile instead "
            f"({path.name[: -len('.json')]}.steps.csv or .parquet beside it)"
        )
    try:
        if path.suffix == ".parquet":
            return pd.read_parquet(path)
        return pd.read_csv(path)
    except FileNotFoundError:
        raise KvlabError(f"{path}: no such step profile") from None
    except (OSError, ValueError, ImportError) as exc:
        raise KvlabError(f"{path}: cannot read it as a step profile ({exc})") from exc


def _check_columns(frame: pd.DataFrame, where: str) -> None:
    missing = [name for name in REQUIRED_COLUMNS if name not in frame.columns]
    if missing:
        raise KvlabError(
            f"{where}: missing column(s) {', '.join(missing)}; expected a per-step profile "
            "as `kvlab run --save-result` writes (<stem>.steps.csv; a profile from an older "
            "kvlab lacks num_padded_context_tokens: run it again)"
        )
    bad = [name for name in REQUIRED_COLUMNS if not pd.api.types.is_numeric_dtype(frame[name])]
    if bad:
        raise KvlabError(f"{where}: column {bad[0]} holds non-numbers; expected numbers")
    for name in REQUIRED_COLUMNS:
        values = frame[name].to_numpy(dtype=np.float64)
        limit = MAX_STEP_S if name == TIME_COLUMN else np.inf
        wrong = ~np.isfinite(values) | (values < 0) | (values > limit)
        if wrong.any():
            row = int(wrong.argmax())
            expected = (f"seconds between 0 and {MAX_STEP_S:g}" if name == TIME_COLUMN
                        else "a count >= 0")
            raise KvlabError(f"{where} line {row + 2}, column {name}: {float(values[row])!r}; "
                             f"expected {expected}")


# A step fit this poor explains little of the step times: `kvlab calibrate` warns.
POOR_R2 = 0.5
POOR_MAPE_PERC = 50.0


def fit_warnings(model: CalibratedCostModel) -> list[str]:
    """What to beware of in a step fit: a low R^2 or a high per-step error."""
    fit, out = model.fit or {}, []
    r2, mape = fit.get("r2"), fit.get("mape_perc")
    if r2 is not None and r2 < POOR_R2:
        out.append(f"poor fit: R^2 {r2:.2f} (below {POOR_R2}): the terms explain little of the "
                   "step times; profile a longer or steadier run (--num-threads 1)")
    if mape is not None and mape > POOR_MAPE_PERC:
        out.append(f"poor fit: per-step MAPE {mape:.0f}% (over {POOR_MAPE_PERC:.0f}%): single "
                   "steps are predicted far off, whatever the total")
    return out


def mismatch_warning(model: CalibratedCostModel, model_name: str, where: str) -> str | None:
    """A warning when the cost model was fitted for another model than the one it times."""
    fitted = (model.fit or {}).get("model")
    if fitted and str(fitted) != model_name:
        return (f"{where} was fitted on {fitted}; simulating {model_name} with it times that "
                "model's steps, not this one's")
    return None


def format_fit(model: CalibratedCostModel) -> str:
    """The coefficients and fit quality as printed by `kvlab calibrate`."""
    units = {"attention_pair_s": 1e9}
    lines = ["Cost-model coefficients"]
    for name, value in model.coefficients().items():
        if name == "host_steal_slowdown":
            lines.append(f"{'host_steal_slowdown (x steal share):':<40}{value:<10.4f}")
            continue
        if name in ("first_decode_token_s", "first_decodes") and not model.first_decode_token_s:
            continue  # no bent decode term
        if name in ("demoted_context_token_s", "requantize_page_s") and not value:
            continue  # (a precision policy's terms: a profile without one, or none fitted)
        if name == "first_decodes":
            lines.append(f"{'  for this many decodes of a step:':<40}{value:g}")
            continue
        scale, unit = (1e9, "ns") if name in units else (1e6, "us")
        label = name.removesuffix("_s") + f" ({unit}):"
        lines.append(f"{label:<40}{value * scale:<10.4f}")
        if name == "api_latency_s" and model.fit.get("in_server_latency_s"):
            # (the part a bench fit added for the server's own path; `in_server_latency`)
            inside = 1e6 * model.fit["in_server_latency_s"]
            source = model.fit.get("in_server_latency_from")
            notes = [f"from its {source}"] if source else []
            if inside < 0:  # (the API latency itself stays >= 0)
                notes.append("negative: the simulator waits longer for the running step")
            lines.append(f"{'  of it inside the server (us):':<40}{inside:<10.4f}"
                         + (f" ({'; '.join(notes)})" if notes else ""))
    fit = model.fit
    if fit:
        lines.append("Fit quality")
        lines.append(f"{'Steps (with swaps/copies):':<40}{fit['num_steps']} "
                     f"({fit['num_memory_steps']})")
        if fit.get("intake_s"):  # (a bench fit: the steps a request's way in may hold, out)
            lines.append(f"{'  left out: steps after an arrival (ms):':<40}"
                         f"{1e3 * fit['intake_s']:.4f}")
        for label, key in (
            ("R^2:", "r2"),
            ("Per-step MAPE (%):", "mape_perc"),
            ("Total-time error (%):", "total_error_perc"),
        ):
            value = fit[key]
            lines.append(f"{label:<40}{'n/a' if value is None else f'{value:.4f}':<10}")
    return "\n".join(lines)
