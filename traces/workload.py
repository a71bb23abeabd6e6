"""Workload specs: a YAML file of request classes, each with its share of the traffic (its own
arrival rate), length distributions, priority and SLOs, as ServeGen-style specs describe
clients. `kvlab sim --dataset-name workload --dataset-path spec.yaml`.

```yaml
num_prompts: 1000            # total requests (the --num-prompts flag wins)
classes:
  - name: chat               # the SLO class its latencies are reported in
    rate: 4.0                # requests/s of this class (Poisson; burstiness: gamma shape);
                             # or `share: 0.8` of a top-level `request_rate: 5.0`
    priority: 0              # lower first under --scheduling-policy priority (default 0)
    input_len: {mean: 512, range_ratio: 0.5}   # uniform in mean*(1 +- r); or a whole number,
    output_len: {lognormal: {mean: 128, sigma: 0.5}}  # or {lognormal: {mean, sigma}}
    prefix_len: 256          # tokens every request of the class starts with ...
    num_prefix_groups: 4     # ... one of this many shared prefixes (default 1)
    slo: {ttft: 500, tpot: 50}   # milliseconds; the class's goodput counts requests within
```

Each class's arrivals are a renewal process of its own (gaps drawn from a gamma distribution
of shape `burstiness`, mean 1/rate: exponential at 1, vLLM's convention); the classes are
merged in time and the first `num_prompts` requests kept. Prefixes show in `hash_ids` over
16-token blocks, as the `random` dataset's. Everything is drawn from `default_rng(seed)`.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import numpy as np

from kvlab.errors import KvlabError
from kvlab.traces.build import RequestLabels, check_num_prompts, make_requests, num_hash_blocks
from kvlab.traces.types import Trace

HASH_BLOCK_SIZE = 16
DEFAULT_NUM_PROMPTS = 1000
_CLASS_KEYS = ("name", "rate", "share", "burstiness", "priority", "input_len", "output_len",
               "prefix_len", "num_prefix_groups", "slo")
_SLO_KEYS = ("ttft", "tpot", "e2el")


def load_workload(path: str | Path, *, num_prompts: int | None = None, seed: int = 0) -> Trace:
    """The trace a workload spec describes (`num_prompts` overrides the spec's count)."""
    path = Path(path)
    spec = _read(path)
    check_num_prompts(num_prompts)
    where = str(path)
    unknown = sorted(set(spec) - {"num_prompts", "request_rate", "classes"})
    if unknown:
        raise KvlabError(f"{where}: unknown key {unknown[0]!r}; a workload spec has "
                         "num_prompts, request_rate and classes")
    if num_prompts is None:
        num_prompts = spec.get("num_prompts", DEFAULT_NUM_PROMPTS)
        if isinstance(num_prompts, bool) or not isinstance(num_prompts, int) or num_prompts < 1:
            raise KvlabError(f"{where}, num_prompts: {num_prompts!r} is not a whole number >= 1")
    classes = spec.get("classes")
    if not isinstance(classes, list) or not classes:
        raise KvlabError(f"{where}: expected `classes:`, a list of at least one request class")
    parsed = [_parse_class(where, index, item) for index, item in enumerate(classes)]
    _rates_from_shares(where, spec.get("request_rate"), parsed)
    names = [c["name"] for c in parsed]
    if len(set(names)) != len(names):
        raise KvlabError(f"{where}: class names repeat ({', '.join(names)}); each names one class")
    rng = np.random.default_rng(seed)
    columns = _draw(parsed, int(num_prompts), rng)
    order = np.argsort(columns["arrival_s"], kind="stable")[:num_prompts]
    cls = columns["class"][order]
    input_lens, output_lens = columns["input_len"][order], columns["output_len"][order]
    hash_ids = _hash_ids(parsed, cls, columns["group"][order], input_lens)
    arrival = columns["arrival_s"][order]
    labels = RequestLabels([parsed[c]["priority"] for c in cls.tolist()],
                           [parsed[c]["name"] for c in cls.tolist()])
    requests = make_requests(arrival - arrival[0], input_lens, output_lens, hash_ids=hash_ids,
                             hash_block_size=HASH_BLOCK_SIZE, labels=labels)
    slos = {c["name"]: c["slo"] for c in parsed if c["slo"]}
    metadata: dict[str, Any] = {"seed": seed, **({"slo_classes": slos} if slos else {})}
    return Trace(path.name, "workload", str(path), requests, metadata)


def _read(path: Path) -> dict[str, Any]:
    import yaml  # (only a workload spec needs it: kept out of every trace load's imports)

    if not path.is_file():
        raise KvlabError(f"{path}: no such file; expected a workload spec (YAML)")
    try:
        spec = yaml.safe_load(path.read_text(encoding="utf-8"))
    except (yaml.YAMLError, UnicodeDecodeError) as err:
        mark = getattr(err, "problem_mark", None)
        line = f" line {mark.line + 1}" if mark is not None else ""
        raise KvlabError(f"{path}{line}: not a YAML workload spec ({err})") from None
    if not isinstance(spec, dict):
        raise KvlabError(f"{path}: expected a YAML mapping with `classes:`")
    return spec


def _parse_class(where: str, index: int, item: Any) -> dict[str, Any]:
    """One class, checked, with its defaults filled in."""
    at = f"{where}, classes[{index}]"
    if not isinstance(item, dict):
        raise KvlabError(f"{at}: expected a mapping with name, rate, input_len, output_len")
    unknown = sorted(set(item) - set(_CLASS_KEYS))
    if unknown:
        raise KvlabError(f"{at}: unknown key {unknown[0]!r}; keys: {', '.join(_CLASS_KEYS)}")
    for key in ("name", "input_len", "output_len"):
        if key not in item:
            raise KvlabError(f"{at}: missing key {key!r}")
    name = item["name"]
    if not isinstance(name, str) or not name.strip():
        raise KvlabError(f"{at}, name: {name!r} is not a class name")
    at = f"{where}, class {name}"
    if ("rate" in item) == ("share" in item):
        raise KvlabError(f"{at}: give its rate (requests/s) or its share (of the spec's "
                         "request_rate), one of the two")
    rate = _number(at, "rate", item["rate"], positive=True) if "rate" in item else None
    share = _number(at, "share", item["share"], positive=True) if "share" in item else None
    burstiness = _number(at, "burstiness", item.get("burstiness", 1.0), positive=True)
    priority = item.get("priority", 0)
    if isinstance(priority, bool) or not isinstance(priority, int):
        raise KvlabError(f"{at}, priority: {priority!r} is not a whole number")
    prefix_len = _whole(at, "prefix_len", item.get("prefix_len", 0), 0)
    groups = _whole(at, "num_prefix_groups", item.get("num_prefix_groups", 1), 1)
    slo = item.get("slo") or {}
    if not isinstance(slo, dict) or not set(slo) <= set(_SLO_KEYS):
        raise KvlabError(f"{at}, slo: {slo!r}; expected milliseconds keyed "
                         f"{', '.join(_SLO_KEYS)}, e.g. {{ttft: 500, tpot: 50}}")
    slo = {key: _number(at, f"slo.{key}", value, positive=False) for key, value in slo.items()}
    return {"name": name.strip(), "rate": rate, "share": share, "burstiness": burstiness,
            "priority": priority,
            "input_len": _lengths(at, "input_len", item["input_len"]),
            "output_len": _lengths(at, "output_len", item["output_len"]),
            "prefix_len": prefix_len, "num_prefix_groups": groups, "slo": slo}


def _rates_from_shares(where: str, request_rate: Any, classes: list[dict[str, Any]]) -> None:
    """Each class given a `share` gets that share of `request_rate` (shares normalised to
    sum to 1); a spec mixes no shares with rates."""
    shares = [c["share"] for c in classes if c["share"] is not None]
    if not shares:
        if request_rate is not None:
            raise KvlabError(f"{where}: request_rate applies to classes given by share; these "
                             "give their own rate")
        return
    if len(shares) != len(classes):
        raise KvlabError(f"{where}: some classes give a rate, others a share; give every "
                         "class a share (of request_rate) or every class a rate")
    if request_rate is None:
        raise KvlabError(f"{where}: classes given by share need a top-level request_rate "
                         "(requests/s of all classes)")
    total = _number(where, "request_rate", request_rate, positive=True)
    for cls in classes:
        cls["rate"] = total * cls["share"] / sum(shares)


def _lengths(at: str, key: str, value: Any) -> tuple[str, float, float]:
    """A length distribution: ("constant", n, 0), ("uniform", mean, range_ratio) or
    ("lognormal", mean, sigma)."""
    if isinstance(value, int) and not isinstance(value, bool):
        return ("constant", float(_whole(at, key, value, 1)), 0.0)
    if isinstance(value, dict) and set(value) <= {"mean", "range_ratio"} and "mean" in value:
        mean = _number(at, f"{key}.mean", value["mean"], positive=True)
        ratio = _number(at, f"{key}.range_ratio", value.get("range_ratio", 0.0), positive=False)
        if ratio >= 1:
            raise KvlabError(f"{at}, {key}.range_ratio: {ratio!r} must be in [0, 1)")
        return ("uniform", mean, ratio)
    if isinstance(value, dict) and set(value) == {"lognormal"} and isinstance(
            value["lognormal"], dict) and set(value["lognormal"]) == {"mean", "sigma"}:
        params = value["lognormal"]
        return ("lognormal", _number(at, f"{key}.lognormal.mean", params["mean"], positive=True),
                _number(at, f"{key}.lognormal.sigma", params["sigma"], positive=False))
    raise KvlabError(f"{at}, {key}: {value!r}; expected a whole number, {{mean: M, "
                     "range_ratio: R}} or {lognormal: {mean: M, sigma: S}}")


def _number(at: str, key: str, value: Any, *, positive: bool) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) \
            or value < 0 or (positive and value == 0):
        raise KvlabError(f"{at}, {key}: {value!r} is not a number {'> 0' if positive else '>= 0'}")
    return float(value)


def _whole(at: str, key: str, value: Any, low: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < low:
        raise KvlabError(f"{at}, {key}: {value!r} is not a whole number >= {low}")
    return value


def _draw(classes: list[dict[str, Any]], num: int, rng: np.random.Generator
          ) -> dict[str, np.ndarray]:
    """Up to `num` requests of every class (enough for any merge's first `num`): arrival,
    class index, lengths, prefix group."""
    parts: dict[str, list[np.ndarray]] = {k: [] for k in
                                          ("arrival_s", "class", "input_len", "output_len",
                                           "group")}
    for index, cls in enumerate(classes):
        shape = cls["burstiness"]
        gaps = rng.gamma(shape, 1.0 / (cls["rate"] * shape), size=num)
        parts["arrival_s"].append(np.cumsum(gaps))
        parts["class"].append(np.full(num, index))
        parts["input_len"].append(cls["prefix_len"] + _sample(cls["input_len"], num, rng))
        parts["output_len"].append(_sample(cls["output_len"], num, rng))
        parts["group"].append(np.arange(num) % cls["num_prefix_groups"])
    return {key: np.concatenate(values) for key, values in parts.items()}


def _sample(dist: tuple[str, float, float], num: int, rng: np.random.Generator) -> np.ndarray:
    """`num` lengths >= 1 from a distribution of `_lengths`."""
    kind, mean, spread = dist
    if kind == "constant":
        values = np.full(num, mean)
    elif kind == "uniform":
        values = rng.integers(math.floor(mean * (1 - spread)), math.ceil(mean * (1 + spread)) + 1,
                              size=num)
    else:  # lognormal with the given mean: mu = ln(mean) - sigma^2 / 2
        values = np.rint(rng.lognormal(math.log(mean) - spread**2 / 2, spread, size=num))
    return np.maximum(values, 1).astype(np.int64)


def _hash_ids(classes: list[dict[str, Any]], cls: np.ndarray, group: np.ndarray,
              input_lens: np.ndarray) -> list[tuple[int, ...]]:
    """Per request: its class group's ids on the prefix's full blocks, then fresh ids (ids
    below the first fresh one name shared prefix blocks, distinct across classes)."""
    first_shared, next_id = [], 0
    for c in classes:
        first_shared.append(next_id)
        next_id += c["num_prefix_groups"] * (c["prefix_len"] // HASH_BLOCK_SIZE)
    hash_ids = []
    for c, g, input_len in zip(cls.tolist(), group.tolist(), input_lens.tolist(), strict=True):
        num_shared = classes[c]["prefix_len"] // HASH_BLOCK_SIZE
        start = first_shared[c] + g * num_shared
        num_own = num_hash_blocks(input_len, HASH_BLOCK_SIZE) - num_shared
        hash_ids.append((*range(start, start + num_shared), *range(next_id, next_id + num_own)))
        next_id += num_own
    return hash_ids
