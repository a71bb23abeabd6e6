"""A cost model fitted to an engine's measured per-step profile (`kvlab calibrate` writes it,
`kvlab sim --cost-model FILE` and `kvlab validate` read it).

A step costs a fixed overhead plus a linear term in each of the step's counts:

    step_s = overhead + prefill_token x num_prefill_tokens + decode_token x num_decode_tokens
             + context_token x num_context_tokens + attention_pair x num_attention_pairs
             + seq x num_seqs + padded_context_token x num_padded_context_tokens
             + first_decode_token x min(num_decode_tokens, first_decodes)

(`num_padded_context_tokens`: the decodes times the longest decode context, what a backend that
pads its decode batch reads; the fit gives it 0 where attention does not pad. The last term
bends the decode cost: a step's first `first_decodes` decodes cost `first_decode_token` more
each, as the steps of a CPU server grow fast over their first decodes and slower after; 0
where the steps are a line.)

(plus `demoted_context_token` x the context tokens a precision policy's demoted pages spare,
on top of the context they leave: `demoted_read_time_s`, and `requantize_page` x the pages its
requantizations read and write, halved) and its memory work (executed before
the forward pass, on the same stream) costs `swap_transfer_s` per separate copy plus
`swap_page_s` per page moved either way, and `copy_page_s` per page copied on the device.
`api_latency_s` and `api_latency_per_request_s` are a server's: the time its API adds between a
client's send and the scheduler, and how much more for each request in flight (see the fields).
All coefficients are seconds and non-negative, but `host_steal_slowdown`: how much slower the
server's steps ran per share of its host's CPU that the hypervisor withheld (steal time,
`under_steal`).
Torch-free: the file is plain JSON.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable
from dataclasses import dataclass, field, fields, replace
from pathlib import Path
from typing import Any

from kvlab.errors import KvlabError, write_text_file
from kvlab.sim.cost_model import StepShapeLike, prefill_shape

FORMAT = "kvlab-calibrated-cost-model"
# 2: padded_context_token_s (a version-1 file lacks it: refit from the profile, see from_json)
FORMAT_VERSION = 2
# Written only when nonzero (`to_json`): added to version 2 without a new version.
OPTIONAL_COEFFICIENTS = ("api_latency_per_request_s", "host_steal_slowdown",
                         "first_decode_token_s", "first_decodes", "demoted_context_token_s",
                         "requantize_page_s")
# What a server's API adds, the steal sensitivity and a count of decodes: not scaled by
# `under_steal`.
UNSCALED_COEFFICIENTS = ("api_latency_s", "api_latency_per_request_s", "host_steal_slowdown",
                         "first_decodes")


@dataclass(slots=True, frozen=True)
class CalibratedCostModel:
    """Step, swap, copy and recompute times from coefficients fitted to measured steps.

    `fit` holds how the coefficients were obtained (profiles, number of steps, R^2, MAPE); it
    is saved with them and never changes a time.
    """

    step_overhead_s: float = 0.0
    prefill_token_s: float = 0.0
    decode_token_s: float = 0.0
    context_token_s: float = 0.0
    attention_pair_s: float = 0.0
    seq_s: float = 0.0
    padded_context_token_s: float = 0.0
    swap_transfer_s: float = 0.0
    swap_page_s: float = 0.0
    copy_page_s: float = 0.0
    # What a server's API adds to every request's TTFT and E2EL as its client measures them
    # (the request in, its tokens out): fitted from a benchmark (`calibrate --from-bench`), 0
    # for an engine's own profile. The simulator delays each arrival by it, plus
    # `api_latency_per_request_s` for every request in flight at the send (a busy API streams
    # every running request's tokens: kvlab.sim.api_latency).
    api_latency_s: float = 0.0
    api_latency_per_request_s: float = 0.0
    # The coefficients above are a host's own (a dedicated machine's). On a virtual machine the
    # hypervisor withholds some of the CPU (steal time: its other guests, its own work) and a
    # server there runs slower: on the team's machine 2.5-4x the steal share
    # (docs/validation.md). `calibrate --from-bench` fits this sensitivity where its runs
    # recorded the client host's steal time; `under_steal` applies it.
    host_steal_slowdown: float = 0.0
    # The bent decode term (module docstring): seconds more for each of a step's first
    # `first_decodes` decodes (a count, not seconds; `calibrate --from-bench` picks it).
    first_decode_token_s: float = 0.0
    first_decodes: float = 0.0
    # A step whose batch reads demoted pages (a precision policy): seconds per context token
    # (at the cache's dtype) they spare, on top of the context left (`demoted_read_time_s`);
    # fitted where the profile has `num_saved_context_tokens`. 0 on a device whose kernels
    # read demoted pages as fast as their bytes; a CPU engine's dequantization costs more.
    demoted_context_token_s: float = 0.0
    # A requantization (`requantize_time_s`): seconds per page at the cache's dtype read and
    # written, halved (the step column `num_requantized_pages`); fitted where a profile has it,
    # else (0) a page copy's time stands in.
    requantize_page_s: float = 0.0
    fit: dict[str, Any] = field(default_factory=dict, compare=False)

    def step_time_s(self, shape: StepShapeLike) -> float:
        """One engine step's forward pass; the overhead is paid even by a step that only
        preempts or swaps (the engine still schedules and launches it)."""
        return (
            self.step_overhead_s
            + self.prefill_token_s * shape.num_prefill_tokens
            + self.decode_token_s * shape.num_decode_tokens
            + self.context_token_s * shape.num_context_tokens
            + self.attention_pair_s * shape.num_attention_pairs
            + self.seq_s * shape.num_seqs
            + self.padded_context_token_s * shape.num_padded_context_tokens
            + self.first_decode_token_s * min(shape.num_decode_tokens, self.first_decodes)
        )

    def decode_step_time(self, num_seqs: int) -> Callable[[int, int], float]:
        """`step_time_s` of a step of `num_seqs` decodes and nothing else, as a function of
        its context and padded context tokens: the same sum in the same order (the zero
        terms too), so the same durations (`kvlab.sim.cost_model.decode_step_timer`)."""
        batch_s = (self.step_overhead_s + self.prefill_token_s * 0
                   + self.decode_token_s * num_seqs)
        context_s, no_pairs_s = self.context_token_s, self.attention_pair_s * 0
        seqs_s, padded_s = self.seq_s * num_seqs, self.padded_context_token_s
        first_s = self.first_decode_token_s * min(num_seqs, self.first_decodes)

        def time_s(num_context: int, num_padded: int) -> float:
            return (batch_s + context_s * num_context + no_pairs_s + seqs_s
                    + padded_s * num_padded + first_s)

        return time_s

    def swap_time_s(self, num_pages: int, num_transfers: int) -> float:
        """Moving num_pages pages in num_transfers separate copies, one way."""
        return num_transfers * self.swap_transfer_s + num_pages * self.swap_page_s

    def copy_time_s(self, num_pages: int) -> float:
        """Copying num_pages pages on the device."""
        return num_pages * self.copy_page_s

    def demoted_read_time_s(self, num_saved_tokens: float) -> float:
        """`demoted_context_token_s` per context token the demoted pages spare: what their
        reads cost beyond the context left (a CPU engine dequantizes them apart)."""
        return self.demoted_context_token_s * num_saved_tokens

    def requantize_time_s(self, num_pages: float) -> float:
        """`requantize_page_s` per page (`requantize_page`); a page copy's where the fit saw no
        requantization (0)."""
        return self.requantize_page(self.requantize_page_s, self.copy_page_s) * num_pages

    @staticmethod
    def requantize_page(requantize_page_s: float, copy_page_s: float) -> float:
        """What one page's requantization costs: `requantize_page_s`, fitted on a profile
        that requantized; a page copy's time (`copy_page_s`) stands in where it is 0."""
        return requantize_page_s or copy_page_s

    def recompute_time_s(self, num_tokens: int) -> float:
        """One sequence's prefill of num_tokens tokens from scratch, causal attention."""
        return self.step_time_s(prefill_shape(num_tokens)) if num_tokens > 0 else 0.0

    def under_steal(self, steal_share: float) -> CalibratedCostModel:
        """This model on a host whose hypervisor withheld `steal_share` (0..1) of its CPU:
        every step, swap and copy time times 1 + host_steal_slowdown x steal_share (the API
        latency, measured per run, as it is)."""
        return self.scaled(1.0 + self.host_steal_slowdown * steal_share)

    def scaled(self, factor: float) -> CalibratedCostModel:
        """This model with every step, swap and copy time times `factor` (a slower or faster
        machine); the API latency and the steal sensitivity as they are."""
        if factor == 1.0:
            return self
        slowed: dict[str, Any] = {name: value * factor
                                  for name, value in self.coefficients().items()
                                  if name not in UNSCALED_COEFFICIENTS}
        return replace(self, **slowed)

    def coefficients(self) -> dict[str, float]:
        """The coefficients by name, in seconds but `first_decodes` (everything but `fit`)."""
        return {f.name: getattr(self, f.name) for f in fields(self) if f.name != "fit"}

    def to_json(self) -> dict[str, Any]:
        """The JSON document `save` writes and `from_json` reads. The terms added since the
        format's version 2 (OPTIONAL_COEFFICIENTS) are left out when 0 (a file without them
        reads as 0), so that a kvlab from before them, which refuses coefficients it does not
        know, still reads a model that does not use them."""
        coefficients = self.coefficients()
        for name in OPTIONAL_COEFFICIENTS:
            if not coefficients[name]:
                del coefficients[name]
        return {
            "format": FORMAT,
            "version": FORMAT_VERSION,
            "coefficients": coefficients,
            "fit": self.fit,
        }

    @classmethod
    def from_json(cls, data: Any, where: str = "cost model") -> CalibratedCostModel:
        """Parse `to_json`'s document; raises KvlabError naming `where` when it is not one."""
        if not isinstance(data, dict) or data.get("format") != FORMAT:
            raise KvlabError(
                f"{where}: not a calibrated cost model (expected a JSON object with "
                f'"format": "{FORMAT}", as `kvlab calibrate -o FILE` writes)'
            )
        version = data.get("version")
        if version != FORMAT_VERSION:
            raise KvlabError(
                f"{where}: cost-model format version {version!r}, this kvlab reads version "
                f"{FORMAT_VERSION} (its step model has other terms); fit it again from the "
                "step profile: kvlab calibrate PROFILE.steps.csv -o FILE"
            )
        coefficients = data.get("coefficients")
        names = {f.name for f in fields(cls)} - {"fit"}
        if not isinstance(coefficients, dict):
            raise KvlabError(f'{where}: "coefficients" is missing or not an object')
        unknown = sorted(set(coefficients) - names)
        if unknown:
            raise KvlabError(
                f"{where}: unknown coefficient {unknown[0]!r}; expected {', '.join(sorted(names))}"
            )
        values = {}
        for name, value in coefficients.items():
            if isinstance(value, bool) or not isinstance(value, int | float):
                raise KvlabError(f"{where}: coefficient {name} is {value!r}, expected a number")
            if not math.isfinite(value) or value < 0:
                raise KvlabError(
                    f"{where}: coefficient {name} is {value}, expected a finite number >= 0"
                )
            values[name] = float(value)
        fit = data.get("fit", {})
        return cls(**values, fit=fit if isinstance(fit, dict) else {})

    def save(self, path: str | Path) -> Path:
        """Write the model as JSON to `path` (parents created); raises KvlabError on failure."""
        return write_text_file(Path(path), json.dumps(self.to_json(), indent=2) + "\n",
                               "cost model")


def load_cost_model(path: str | Path) -> CalibratedCostModel:
    """Read a cost model `kvlab calibrate` wrote; a missing or malformed file is a KvlabError."""
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise KvlabError(
            f"cost_model {path}: cannot read it ({exc.strerror or exc})",
            parameters=("cost_model",),
        ) from exc
    except UnicodeDecodeError:
        raise KvlabError(
            f"cost_model {path}: not a text file; expected the JSON `kvlab calibrate -o` writes",
            parameters=("cost_model",),
        ) from None
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        raise KvlabError(
            f"cost_model {path}: line {exc.lineno}, column {exc.colno}: not valid JSON "
            f"({exc.msg})",
            parameters=("cost_model",),
        ) from exc
    return CalibratedCostModel.from_json(data, where=f"cost model {path}")
