"""Sampling parameters (vLLM's names), the sampler, and the stop decision."""

from __future__ import annotations

import math
from collections.abc import Collection, Sequence
from dataclasses import dataclass

import torch

from kvlab.errors import KvlabError
from kvlab.policies.request import RequestStatus

SAMPLING_EPS = 1e-5  # temperatures below this sample greedily (vLLM's threshold)


@dataclass(slots=True)
class SamplingParams:
    """How one request samples and when it stops; defaults and names as in vLLM.

    `top_k` 0 or -1 turns top-k off; `top_p` 1.0 turns top-p off; `temperature` 0 is greedy.
    `seed` makes a request's samples reproducible whatever else shares its batch.
    """

    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0
    max_tokens: int = 16
    seed: int | None = None
    ignore_eos: bool = False
    stop_token_ids: tuple[int, ...] = ()

    def __post_init__(self) -> None:
        self.stop_token_ids = tuple(self.stop_token_ids)
        if not (
            isinstance(self.temperature, (int, float))
            and math.isfinite(self.temperature)
            and self.temperature >= 0
        ):
            raise KvlabError(f"temperature must be a number >= 0, got {self.temperature!r}")
        if not (isinstance(self.top_p, (int, float)) and 0 < self.top_p <= 1):
            raise KvlabError(f"top_p must be in (0, 1], got {self.top_p!r}")
        if not _is_int(self.top_k) or self.top_k < -1:
            raise KvlabError(
                f"top_k must be a whole number >= 1, or 0 or -1 for off; got {self.top_k!r}"
            )
        if not _is_int(self.max_tokens) or self.max_tokens < 1:
            raise KvlabError(f"max_tokens must be a whole number >= 1, got {self.max_tokens!r}")
        if self.seed is not None and not _is_int(self.seed):
            raise KvlabError(f"seed must be a whole number or None, got {self.seed!r}")
        bad = [t for t in self.stop_token_ids if not _is_int(t) or t < 0]
        if bad:
            raise KvlabError(f"stop_token_ids must be token ids >= 0, got {bad[0]!r}")

    @property
    def is_greedy(self) -> bool:
        """True when this request takes the most likely token."""
        return self.temperature < SAMPLING_EPS


def _is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def apply_top_k_top_p(
    logits: torch.Tensor, top_k: torch.Tensor, top_p: torch.Tensor
) -> torch.Tensor:
    """Logits [N, V] with tokens outside each row's top-k and top-p set to -inf.

    `top_k` [N] int (<= 0 or >= V: off), `top_p` [N] float (1.0: off). Ties at the k-th value
    are kept; top-p keeps the smallest set of most likely tokens whose probability reaches p.
    """
    vocab_size = logits.shape[-1]
    sorted_logits, sorted_idx = logits.sort(dim=-1, descending=True)
    k = torch.where((top_k <= 0) | (top_k > vocab_size), vocab_size, top_k)
    kth = sorted_logits.gather(-1, (k - 1).long().unsqueeze(-1))
    drop_sorted = sorted_logits < kth
    sorted_logits = sorted_logits.masked_fill(drop_sorted, -math.inf)
    probs = sorted_logits.softmax(dim=-1)
    # Mass strictly before each token: a token stays while what precedes it is still short of p.
    mass_before = probs.cumsum(dim=-1) - probs
    # Rows with top_p 1.0 skip this: rounding in the cumsum must not drop their rarest tokens.
    drop_sorted |= (mass_before >= top_p.unsqueeze(-1)) & (top_p < 1.0).unsqueeze(-1)
    drop_sorted[:, 0] = False
    drop = torch.zeros_like(drop_sorted).scatter(-1, sorted_idx, drop_sorted)
    return logits.masked_fill(drop, -math.inf)


class Sampler:
    """Picks each row's next token: greedy, or temperature / top-k / top-p sampling.

    A request with a seed draws from its own torch.Generator, created at its first sample and
    kept until `free(request_id)`, so its tokens do not depend on what else is in the batch.
    """

    def __init__(self) -> None:
        self._generators: dict[int, torch.Generator] = {}

    def __call__(
        self,
        logits: torch.Tensor,
        params: Sequence[SamplingParams],
        request_ids: Sequence[int],
    ) -> list[int]:
        """One token id per row of logits [N, V]; row i belongs to request_ids[i]."""
        logits = logits.float()
        device = logits.device
        greedy = torch.tensor([p.is_greedy for p in params], device=device)
        if bool(greedy.all()):
            return logits.argmax(dim=-1).tolist()
        temperature = torch.tensor(
            [1.0 if p.is_greedy else p.temperature for p in params], device=device
        )
        top_k = torch.tensor([p.top_k for p in params], device=device)
        top_p = torch.tensor([p.top_p for p in params], device=device)
        scaled = apply_top_k_top_p(logits / temperature.unsqueeze(-1), top_k, top_p)
        probs = scaled.softmax(dim=-1)
        # Exponential race: argmax(p / E) with E ~ Exp(1) draws from p, one noise row per request.
        noise = torch.empty_like(probs).exponential_()
        for row, (p, request_id) in enumerate(zip(params, request_ids, strict=True)):
            if p.seed is not None and not p.is_greedy:
                noise[row].exponential_(generator=self._generator(request_id, p.seed, device))
        sampled = (probs / noise).argmax(dim=-1)
        return torch.where(greedy, logits.argmax(dim=-1), sampled).tolist()

    def free(self, request_id: int) -> None:
        """Forget a finished request's generator."""
        self._generators.pop(request_id, None)

    def _generator(self, request_id: int, seed: int, device: torch.device) -> torch.Generator:
        generator = self._generators.get(request_id)
        if generator is None:
            generator = torch.Generator(device=device).manual_seed(seed)
            self._generators[request_id] = generator
        return generator


def check_stop(
    params: SamplingParams,
    output_token_ids: Sequence[int],
    eos_token_ids: Collection[int],
) -> RequestStatus | None:
    """Why a request stops after its latest token, or None to go on.

    FINISHED_LENGTH when it has max_tokens outputs (checked first, as vLLM does), FINISHED_STOPPED
    when the latest token is an eos (unless ignore_eos) or one of stop_token_ids.
    """
    if len(output_token_ids) >= params.max_tokens:
        return RequestStatus.FINISHED_LENGTH
    if not output_token_ids:
        return None
    last = output_token_ids[-1]
    if not params.ignore_eos and last in eos_token_ids:
        return RequestStatus.FINISHED_STOPPED
    if last in params.stop_token_ids:
        return RequestStatus.FINISHED_STOPPED
    return None
