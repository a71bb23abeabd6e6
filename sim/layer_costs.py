"""The attention work of a model whose layers do not all attend to every earlier token, for the
roofline (`RooflineCostModel`): what a step reads, writes and multiplies in each kind of layer.

Per request of a step, with d tokens computed before it and n new ones (context c = d + n),
query position p reading keys(p) keys:

- full attention: keys(p) = p; reads the c tokens' KV (as a plain model);
- sliding window W: keys(p) = min(p, W); reads min(c, W - 1 + n) tokens' KV;
- chunked local C: keys(p) = the tokens of p's chunk so far; reads from the chunk of the first
  query on, c - (d // C) x C tokens;
- DeepSeek-V3.2 sparse attention (`index_topk` k on MLA layers): keys(p) = min(p, k) latents,
  reads at most min(c, n x k) of them, and its indexer reads all c indexer keys and scores
  every causal (query, key) pair (INDEXER_NUM_HEADS heads of `index_head_dim`);
- linear attention (Gated DeltaNet, Mamba): no KV history; each request's fixed state is read
  and written once per step (a prefill chunk keeps it on chip between its tokens), and each
  token updates and reads it: STATE_FLOPS_PER_ELEMENT FLOPs per state element.

Every attention layer writes the KV of every new token. A layer kind's (query, key) pairs are
charged as the plain roofline charges full attention's: the exact pairs of the prefill chunks
plus the tokens read (`num_attention_pairs + num_context_tokens`), so a window longer than every
context costs what full attention does. A step shape without per-request lists (a `StepShape`,
the decode fast path's aggregates) is charged an upper bound: each kind's reads and pairs at
most the full layers' and at most the window's per token (exact when every context is at least
the window, or every one within it).
"""

from __future__ import annotations

from collections.abc import Sequence

from kvlab.specs import ModelSpec

# DeepSeek-V3.2's lightning indexer: index_n_heads 64 in its config.json (ModelSpec does not
# carry it: the KV cache does not depend on it).
INDEXER_NUM_HEADS = 64
# Per token and state element: the decay-and-update (multiply-add) and the read-out
# (multiply-add) of a delta-rule / SSM state [estimate].
STATE_FLOPS_PER_ELEMENT = 4


def has_layer_kinds(model: ModelSpec) -> bool:
    """Whether `model`'s attention differs from full attention on every layer (the layered
    roofline applies): sliding, chunked or linear-attention layers, or sparse attention."""
    return set(model.layer_kinds) != {"full_attention"} or model.index_topk is not None


def window_pairs(num_computed: int, num_new: int, window: int) -> int:
    """Sum of min(p, window) over query positions p = num_computed + 1 .. num_computed +
    num_new: the (query, key) pairs of a sliding window (or a top-k) prefill chunk."""
    first, last = num_computed + 1, num_computed + num_new
    pairs = 0
    top = min(last, window)
    if top >= first:
        pairs += top * (top + 1) // 2 - (first - 1) * first // 2
    beyond = last - max(first, window + 1) + 1
    return pairs + max(beyond, 0) * window


def chunk_pairs(num_computed: int, num_new: int, chunk: int) -> int:
    """Sum over query positions num_computed + 1 .. num_computed + num_new of the keys of its
    chunk of `chunk` tokens up to itself: the pairs of chunked local attention."""

    def upto(num_tokens: int) -> int:
        whole, rest = divmod(num_tokens, chunk)
        return whole * (chunk * (chunk + 1) // 2) + rest * (rest + 1) // 2

    return upto(num_computed + num_new) - upto(num_computed)


class LayerCosts:
    """Seconds of attention memory traffic and compute of one step, per layer kind (see the
    module docstring), on one of `tensor_parallel_size` devices at `bandwidth` bytes/s and
    `flops` FLOP/s."""

    __slots__ = ("_full_pair_s", "_full_token_s", "_index_pair_s", "_index_token_s",
                 "_kinds", "_state_seq_s", "_state_token_s")

    def __init__(self, model: ModelSpec, tensor_parallel_size: int, bandwidth: float,
                 flops: float) -> None:
        tp = tensor_parallel_size
        kinds = model.layer_kinds
        token_bytes = model.kv_bytes_per_token_per_layer(tp)  # a layer's KV (latent + index key)
        index_bytes = 0
        if model.index_head_dim is not None:
            index_bytes = model.index_head_dim + model.index_head_dim // 128 * 4
        num_attention = model.num_attention_layers
        pair_flops = model.attention_flops_per_pair() // num_attention if num_attention else 0
        # (name, layers, window, seconds per token read or written, seconds per pair)
        per_token_s = (token_bytes - index_bytes) / bandwidth
        per_pair_s = pair_flops / tp / flops
        full = kinds.count("full_attention")
        sparse = model.index_topk is not None
        self._full_token_s = full * per_token_s
        self._full_pair_s = full * per_pair_s
        self._kinds: list[tuple[str, int, float, float]] = []
        if sparse and full:
            self._kinds.append(("sparse", model.index_topk or 0, self._full_token_s,
                                self._full_pair_s))
            self._full_token_s = self._full_pair_s = 0.0
        for kind, name, window in (("sliding_attention", "sliding", model.sliding_window),
                                   ("chunked_attention", "chunked", model.attention_chunk_size)):
            layers = kinds.count(kind)
            if layers:
                self._kinds.append((name, window or 0, layers * per_token_s,
                                    layers * per_pair_s))
        # the indexer: its keys of every token, and its scores of every causal pair
        index_layers = full if sparse else 0
        self._index_token_s = index_layers * index_bytes / bandwidth
        self._index_pair_s = (index_layers * 2 * INDEXER_NUM_HEADS * (model.index_head_dim or 0)
                              / tp / flops)
        linear = kinds.count("linear_attention")
        state_bytes = model.linear_state_bytes_per_device(tp)
        self._state_seq_s = linear * 2 * state_bytes / bandwidth  # read and write, per request
        self._state_token_s = (linear * STATE_FLOPS_PER_ELEMENT * state_bytes
                               / model.dtype_bytes / flops)

    def step_s(self, num_tokens: int, num_prefill_tokens: int, num_seqs: int, num_context: int,
               num_pairs: int, requests: tuple[Sequence[int], Sequence[int],
                                               Sequence[bool]] | None) -> tuple[float, float]:
        """(memory seconds, compute seconds) of a step's attention in every layer.

        `requests` are the step's per-request (new tokens, computed tokens, is a decode), or
        None for an upper bound from the aggregates alone."""
        memory_s = (num_context + num_tokens) * (self._full_token_s + self._index_token_s) \
            + num_seqs * self._state_seq_s
        compute_s = (num_pairs + num_context) * (self._full_pair_s + self._index_pair_s) \
            + num_tokens * self._state_token_s
        for name, window, token_s, pair_s in self._kinds:
            if requests is None:
                span = window if name == "sparse" else window - 1
                reads = min(num_context, (num_tokens if name == "sparse" else num_seqs) * span
                            + (0 if name == "sparse" else num_tokens))
                pairs = min(num_pairs, num_prefill_tokens * window)
            else:
                reads, pairs = _reads_and_pairs(name, window, *requests)
            memory_s += (reads + num_tokens) * token_s
            compute_s += (pairs + reads) * pair_s
        return memory_s, compute_s


def _reads_and_pairs(name: str, window: int, news: Sequence[int], computeds: Sequence[int],
                     decodes: Sequence[bool]) -> tuple[int, int]:
    """A layer kind's KV tokens read and its prefill chunks' (query, key) pairs, summed over
    the step's requests."""
    reads = pairs = 0
    for new, done, decode in zip(news, computeds, decodes, strict=True):
        context = done + new
        if name == "sliding":
            reads += min(context, window - 1 + new)
        elif name == "chunked":
            reads += context - done // window * window
        else:  # sparse: top-k of the context per query
            reads += min(context, new * window)
        if not decode:
            pairs += (chunk_pairs(done, new, window) if name == "chunked"
                      else window_pairs(done, new, window))
    return reads, pairs
