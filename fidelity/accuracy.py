"""What a KV-cache precision costs a model: its next-token distributions over a text corpus and
its greedy outputs, with the full-precision cache and with the precision asked.

For each KV configuration (`--kv-cache-dtype` names) and the reference (`auto`), a real engine
(`kvlab.engine.LLMEngine`) reads the corpus in windows of `window` tokens, each prefilled in
chunks of `chunk` tokens through its paged cache, so that every position reads the keys and
values of earlier positions back from the cache in the precision under test (as a served
request does); then it generates greedily from `num_prompts` prompts taken from the corpus.
Per configuration:

- KL(reference || tested) of each scored position's next-token distribution, mean and p99;
- top-1 agreement: the share of positions whose most likely next token is the reference's;
- perplexity of the corpus under each (exp of the mean negative log-likelihood) and its change;
- greedy agreement: prompts whose `output_len` greedy tokens equal the reference's, and the mean
  share of tokens before the first difference.

A precision policy (`precisions`: the policy grammar's `precision=` family, e.g.
`age:recent=64,depth=2`) is measured at the model's own dtype with that policy's demotions
(issue 48): the windows are prefilled a page at a time, and before each page the pages of the
tokens computed so far are requantized to the levels the policy's rule gives them
(`AgeDemotion`: as the manager demotes at a step's start, whatever the pool's pressure), so
each position reads its context as a decode step at that position would (within a page);
the greedy prompts run through the engine's manager with the policy as given.

Engines run one at a time (one model in memory); the reference's log-probabilities are kept
on the host in float32 between them: `num_tokens x vocab x 4` bytes (8,192 tokens of a 128k
vocabulary: 4 GiB; lower `num_tokens` for large vocabularies).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

from kvlab.engine import EngineConfig, LLMEngine, SamplingParams
from kvlab.errors import KvlabError
from kvlab.kernels import AttentionMetadata
from kvlab.policies import registry
from kvlab.policies.serving import ServingConfig
from kvlab.policies.spec import PolicySpec, parse_policy
from kvlab.specs.kv_dtype import kv_cache_dtype

REFERENCE = "auto"


@dataclass(slots=True, frozen=True, kw_only=True)
class AccuracyConfig:
    """One accuracy run: the model (preset or Hugging Face folder with a tokenizer), the KV
    precisions to test against `auto`, the corpus's token windows, and the greedy prompts.

    `num_tokens` bounds the scored positions (whole windows of `window` tokens, each
    prefilled `chunk` tokens at a time); `num_prompts` prompts of `prompt_len` corpus tokens
    generate `output_len` greedy tokens each. `device`, `attention_backend`, `cpu_gemm`, `dtype`
    and `block_size` are the engine's. `precisions`: precision policies (`age:recent=R,...`)
    measured at `auto` beside the dtypes."""

    model: str
    kv_cache_dtypes: tuple[str, ...]
    precisions: tuple[str, ...] = ()
    window: int = 512
    chunk: int = 128
    num_tokens: int = 8192
    num_prompts: int = 32
    prompt_len: int = 64
    output_len: int = 32
    device: str = "cpu"
    attention_backend: str = "torch"
    cpu_gemm: str = "onednn"
    dtype: str | None = None
    block_size: int = 16

    def __post_init__(self) -> None:
        for name in ("window", "chunk", "num_tokens", "num_prompts", "prompt_len", "output_len",
                     "block_size"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise KvlabError(f"{name} is {value!r}; expected a whole number >= 1",
                                 parameters=(name,))
        if not self.kv_cache_dtypes and not self.precisions:
            raise KvlabError("no kv_cache_dtype or precision to test; name one or more",
                             parameters=("kv_cache_dtype",))
        for name in self.kv_cache_dtypes:
            kv_cache_dtype(name)  # a KvlabError naming the choices
        for precision in self.precisions:
            precision_policy(precision, self.block_size)

    def configurations(self) -> list[tuple[str, str]]:
        """(kv_cache_dtype, precision) of each measured configuration, in order."""
        return ([(name, "none") for name in self.kv_cache_dtypes]
                + [(REFERENCE, precision) for precision in self.precisions])


def precision_policy(precision: str, block_size: int) -> PolicySpec:
    """The paged policy demoting by `precision` (the policy grammar's `precision=` value);
    a KvlabError naming --precision where it is not a demoting family's spec."""
    name, valid = precision.split(":", 1)[0], registry.names("precision")
    if name not in valid:
        named = "" if name == precision else f" {name!r}"
        raise KvlabError(f"--precision {precision!r}: unknown policy{named}; valid: "
                         f"{', '.join(valid)}", parameters=("precision",))
    try:
        spec = parse_policy(f"paged:block_size={block_size},precision={precision}")
    except KvlabError as exc:  # (its own words, without the spec it names again)
        reason = str(exc).removeprefix(f"precision {precision!r}: ")
        raise KvlabError(f"--precision {precision!r}: {reason}", parameters=("precision",)
                         ) from None
    if spec.precision == "none":
        raise KvlabError(f"--precision {precision!r}: expected a policy that demotes, "
                         "e.g. age:recent=64,depth=2 (kvlab policies)", parameters=("precision",))
    return spec


@dataclass(slots=True)
class DTypeAccuracy:
    """One KV precision's figures against the reference (`kvlab.fidelity.accuracy` docstring)."""

    kv_cache_dtype: str
    num_tokens: int
    kl_mean: float
    kl_p99: float
    top1_agreement: float
    perplexity: float
    reference_perplexity: float
    greedy_identical: int
    num_prompts: int
    greedy_prefix_share: float
    precision: str = "none"

    @property
    def perplexity_change(self) -> float:
        """Perplexity minus the reference's."""
        return self.perplexity - self.reference_perplexity

    def to_json(self) -> dict[str, Any]:
        """The figures as a JSON-ready dict, the perplexity change included."""
        return {
            "kv_cache_dtype": self.kv_cache_dtype, "precision": self.precision,
            "num_tokens": self.num_tokens,
            "kl_mean": self.kl_mean, "kl_p99": self.kl_p99,
            "top1_agreement": self.top1_agreement, "perplexity": self.perplexity,
            "reference_perplexity": self.reference_perplexity,
            "perplexity_change": self.perplexity_change,
            "greedy_identical": self.greedy_identical, "num_prompts": self.num_prompts,
            "greedy_prefix_share": self.greedy_prefix_share,
        }


@dataclass(slots=True)
class _Reference:
    """What the reference engine produced: per window, its log-probabilities and the tokens
    that follow; its greedy outputs."""

    logprobs: list[torch.Tensor] = field(default_factory=list)
    targets: list[torch.Tensor] = field(default_factory=list)
    outputs: list[list[int]] = field(default_factory=list)


def corpus_windows(token_ids: Sequence[int], config: AccuracyConfig) -> list[list[int]]:
    """Whole windows of `window + 1` tokens (a window's positions and the token after the
    last), consecutive, up to `num_tokens` scored positions; a KvlabError when the corpus
    holds not even one."""
    size = config.window + 1
    count = min(len(token_ids) // size, max(1, config.num_tokens // config.window))
    if count < 1:
        raise KvlabError(f"the corpus holds {len(token_ids):,} tokens, fewer than one window "
                         f"of {size:,}; give a longer corpus or a smaller window",
                         parameters=("window",))
    return [list(token_ids[i * size:(i + 1) * size]) for i in range(count)]


def greedy_prompts(token_ids: Sequence[int], config: AccuracyConfig) -> list[list[int]]:
    """`num_prompts` prompts of `prompt_len` tokens, spread evenly over the corpus."""
    span = len(token_ids) - config.prompt_len
    if span < 0:
        raise KvlabError(f"the corpus holds {len(token_ids):,} tokens, fewer than one prompt "
                         f"of {config.prompt_len}", parameters=("prompt_len",))
    step = span / max(1, config.num_prompts - 1) if config.num_prompts > 1 else 0
    starts = [round(i * step) for i in range(config.num_prompts)]
    return [list(token_ids[s:s + config.prompt_len]) for s in starts]


def build_engine(config: AccuracyConfig, name: str, precision: str = "none") -> LLMEngine:
    """An engine of the model with its KV cache in precision `name` (demoting by `precision`),
    its pages enough for one window or one batch of greedy prompts, whichever is more."""
    longest = max(config.window, config.prompt_len + config.output_len)
    pages = config.num_prompts * -(-(config.prompt_len + config.output_len) // config.block_size)
    pages = max(pages, -(-config.window // config.block_size)) + 1
    policy = "paged" if precision == "none" else precision_policy(precision, config.block_size)
    serving = ServingConfig.create(policy, block_size=config.block_size,
                                   num_gpu_blocks_override=pages, kv_cache_dtype=name,
                                   max_num_batched_tokens=max(config.chunk, 2048),
                                   max_model_len=None)
    engine_config = EngineConfig(model=config.model, device=config.device, serving=serving,
                                 attention_backend=config.attention_backend, dtype=config.dtype,
                                 cpu_gemm=config.cpu_gemm, warmup=False)
    engine = LLMEngine(engine_config)
    if engine.max_model_len < longest:
        raise KvlabError(f"model {config.model!r} reads at most {engine.max_model_len:,} "
                         f"tokens; lower window (or prompt_len + output_len) to that",
                         parameters=("window",))
    if len(engine.runner.layer_groups) and max(engine.runner.layer_groups) > 0:
        raise KvlabError(f"model {config.model!r} has several KV-cache groups; kvlab accuracy "
                         "reads models whose layers share one block table",
                         parameters=("model",))
    return engine


def window_logprobs(engine: LLMEngine, window: Sequence[int], chunk: int) -> torch.Tensor:
    """Log-probabilities (float32, on the host) of the next token at each position of
    `window`, prefilled `chunk` tokens a step into pages 0.. of the engine's cache: each chunk
    attends to the earlier ones as the cache holds them."""
    runner = engine.runner
    page_size = runner.page_size
    table = list(range(-(-len(window) // page_size)))
    demotion = _Demotion.of(engine)
    if demotion is not None:  # a page at a time: each position reads what a decode would
        chunk = min(chunk, page_size)
    device = runner.device
    ids = torch.tensor(window, dtype=torch.long, device=device)
    rows = []
    with torch.inference_mode():
        for start in range(0, len(window), chunk):
            end = min(start + chunk, len(window))
            if demotion is not None:
                demotion.before_chunk(table, start)
            meta = AttentionMetadata.build(block_tables=[table], seq_lens=[end],
                                           query_lens=[end - start], page_size=page_size,
                                           device=device)
            positions = torch.arange(start, end, device=device)
            hidden = runner.model(ids[start:end], positions, runner.kv_cache.layers(), meta)
            logits = runner.model.compute_logits(hidden).float()
            rows.append(torch.log_softmax(logits, dim=-1).cpu())
    runner.platform.synchronize()
    return torch.cat(rows)


@dataclass(slots=True)
class _Demotion:
    """An engine's precision policy applied to a window's pages outside its manager."""

    pages: Any  # engine/precision_pages.py's PrecisionPages
    policy: Any  # policies/precision/age.py's AgeDemotion
    depth: int

    @classmethod
    def of(cls, engine: LLMEngine) -> _Demotion | None:
        """The engine's demotion, its pages all back at level 0; None without one."""
        pages, manager = engine.kv_cache.precision, engine.manager.precision
        if pages is None or manager is None:
            return None
        pages.demote_to({})
        return cls(pages, manager.policy, min(manager.policy.depth, pages.ladder.depth))

    def before_chunk(self, table: list[int], num_computed: int) -> None:
        """The pages of `num_computed` tokens at the levels the rule gives them."""
        page_size = self.pages.page_size
        targets: dict[int, int] = {}
        for level in range(1, self.depth + 1):
            count = self.policy.num_pages_at_least(level, num_computed, page_size)
            targets.update(dict.fromkeys(table[:count], level))
        if targets:
            self.pages.demote_to(targets)


def greedy_outputs(engine: LLMEngine, prompts: list[list[int]], output_len: int
                   ) -> list[list[int]]:
    """Each prompt's `output_len` greedy tokens (end-of-sequence ignored)."""
    params = SamplingParams(temperature=0.0, max_tokens=output_len, ignore_eos=True)
    requests = [engine.make_request(prompt, params) for prompt in prompts]
    engine.run(requests, replay="fast")
    return [list(request.output_token_ids) for request in requests]


def measure_accuracy(config: AccuracyConfig, token_ids: Sequence[int],
                     progress: Any = None) -> list[DTypeAccuracy]:
    """The figures of every precision of `config` against `auto` on the corpus `token_ids`
    (the model's tokens). `progress`, when given, is called with a line per engine run."""
    windows = corpus_windows(token_ids, config)
    prompts = greedy_prompts(token_ids, config)
    reference = _Reference()
    _note(progress, f"reference (auto): {len(windows)} windows of {config.window} tokens, "
                    f"{len(prompts)} prompts")
    engine = build_engine(config, REFERENCE)
    for window in windows:
        reference.logprobs.append(window_logprobs(engine, window[:-1], config.chunk))
        reference.targets.append(torch.tensor(window[1:], dtype=torch.long))
    reference.outputs = greedy_outputs(engine, prompts, config.output_len)
    del engine
    reference_nll = _mean_nll(reference.logprobs, reference.targets)
    results = []
    for name, precision in config.configurations():
        label = name if precision == "none" else f"{name}, precision={precision}"
        _note(progress, f"{label}: the same windows and prompts")
        engine = build_engine(config, name, precision)
        kls, agree, nll_sum = [], 0, 0.0
        for window, ref, targets in zip(windows, reference.logprobs, reference.targets,
                                        strict=True):
            tested = window_logprobs(engine, window[:-1], config.chunk)
            kls.append((ref.exp() * (ref - tested)).sum(dim=-1).clamp_min(0.0))
            agree += int((ref.argmax(dim=-1) == tested.argmax(dim=-1)).sum())
            nll_sum += _nll(tested, targets)
        outputs = greedy_outputs(engine, prompts, config.output_len)
        del engine
        kl = torch.cat(kls).double()
        num_tokens = kl.numel()
        identical = sum(a == b for a, b in zip(reference.outputs, outputs, strict=True))
        prefix = [_common_prefix(a, b) / config.output_len
                  for a, b in zip(reference.outputs, outputs, strict=True)]
        results.append(DTypeAccuracy(
            kv_cache_dtype=kv_cache_dtype(name).name, num_tokens=num_tokens,
            kl_mean=float(kl.mean()), kl_p99=float(torch.quantile(kl, 0.99)),
            top1_agreement=agree / num_tokens, perplexity=math.exp(nll_sum / num_tokens),
            reference_perplexity=math.exp(reference_nll), greedy_identical=identical,
            num_prompts=len(prompts), greedy_prefix_share=sum(prefix) / len(prefix),
            precision=precision))
    return results


def _nll(logprobs: torch.Tensor, targets: torch.Tensor) -> float:
    """The summed negative log-likelihood of a window's next tokens."""
    return -float(logprobs.gather(1, targets[:, None]).sum())


def _mean_nll(logprobs: list[torch.Tensor], targets: list[torch.Tensor]) -> float:
    total = sum(_nll(lp, t) for lp, t in zip(logprobs, targets, strict=True))
    return total / sum(t.numel() for t in targets)


def _common_prefix(a: Sequence[int], b: Sequence[int]) -> int:
    for i, (x, y) in enumerate(zip(a, b, strict=False)):
        if x != y:
            return i
    return min(len(a), len(b))


def _note(progress: Any, line: str) -> None:
    if progress is not None:
        progress(line)
