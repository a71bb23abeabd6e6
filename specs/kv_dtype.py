"""KV-cache precisions: vLLM's `--kv-cache-dtype` names, what one stored value and its scales
take, and which platform's vLLM runs each.

    kv = kv_cache_dtype("fp8")           # fp8_e4m3: 1 byte a value, per-tensor scales
    kv.head_token_bytes(128, 2)          # 128: one K (or V) row of one head and token

Scales, by `scales`:
- `none`: the model's own float dtype (auto, bfloat16, float16).
- `per_tensor`: one K and one V scale per layer (vLLM's `fp8`: `k_scale`/`v_scale`, 1.0 unless
  calibrated); nothing is stored per token.
- `per_channel`: static K and V scales per layer, KV head and channel (vLLM-Ascend's C8 int8),
  fixed before serving; nothing is stored per token.
- `per_token_head`: one fp32 scale for each token's K row and V row of each head, stored in the
  page after the head's values, as vLLM's Triton backend packs `int8_per_token_head`
  (`TritonAttentionBackend.customize_spec`: (head_size x bytes + 4) per side).

kvlab's `int4_per_token_head` is symmetric 4-bit with an fp32 scale, two values a byte, the bytes
of vLLM's; vLLM's also rotates heads (Hadamard) and keeps a zero point in the same bytes, which
kvlab does not model. vLLM's other names (nvfp4, turboquant_*, fp8_inc, fp8_ds_mla, ...) are
refused with the list of those kvlab models.
"""

from __future__ import annotations

from dataclasses import dataclass

from kvlab.errors import KvlabError

SCALE_BYTES = 4  # an fp32 scale


@dataclass(slots=True, frozen=True)
class KVCacheDType:
    """One KV-cache precision: its vLLM name, the element type pages store (`storage`, torch's
    dtype name; `model` for auto), bits per value (None: the model's) and its scales."""

    name: str
    storage: str
    bits: int | None
    scales: str
    help: str

    @property
    def is_quantized(self) -> bool:
        """True when values are stored scaled in fewer bits than a float of the model."""
        return self.scales != "none"

    def value_bytes(self, model_dtype_bytes: int) -> float:
        """Bytes of one stored value (half a byte for int4)."""
        return model_dtype_bytes if self.bits is None else self.bits / 8

    def head_token_bytes(self, head_dim: int, model_dtype_bytes: int) -> int:
        """Bytes one token's K (or V) row of one head takes in a page, its scale included."""
        data = head_dim * self.value_bytes(model_dtype_bytes)
        scale = SCALE_BYTES if self.scales == "per_token_head" else 0
        return int(data) + scale

    def latent_token_bytes(self, latent_dim: int, model_dtype_bytes: int) -> int:
        """Bytes one token's MLA latent takes in a page (per-token scales are not offered for
        MLA: `check_model`)."""
        return int(latent_dim * self.value_bytes(model_dtype_bytes))


_DTYPES = (
    KVCacheDType("auto", "model", None, "none", "the model's dtype (default)"),
    KVCacheDType("bfloat16", "bfloat16", 16, "none", "bf16 values"),
    KVCacheDType("float16", "float16", 16, "none", "fp16 values"),
    KVCacheDType("fp8_e4m3", "float8_e4m3fn", 8, "per_tensor",
                 "fp8 E4M3, per-tensor k_scale/v_scale (vLLM's fp8)"),
    KVCacheDType("fp8_e5m2", "float8_e5m2", 8, "per_tensor",
                 "fp8 E5M2, per-tensor k_scale/v_scale"),
    KVCacheDType("int8", "int8", 8, "per_channel",
                 "int8 with static per-channel scales (vLLM-Ascend's C8)"),
    KVCacheDType("int8_per_token_head", "int8", 8, "per_token_head",
                 "int8, an fp32 scale per token and head"),
    KVCacheDType("fp8_per_token_head", "float8_e4m3fn", 8, "per_token_head",
                 "fp8 E4M3, an fp32 scale per token and head"),
    KVCacheDType("int4_per_token_head", "int4", 4, "per_token_head",
                 "int4 (two a byte), an fp32 scale per token and head"),
)
KV_CACHE_DTYPES: dict[str, KVCacheDType] = {d.name: d for d in _DTYPES}
# vLLM's aliases: `fp8` is E4M3.
ALIASES = {"fp8": "fp8_e4m3"}


def kv_cache_dtype_names() -> list[str]:
    """Every name `kv_cache_dtype` accepts, aliases included (the CLI's choices)."""
    return [*KV_CACHE_DTYPES, *ALIASES]


def kv_cache_dtype(name: str) -> KVCacheDType:
    """The precision called `name` (vLLM's names; `fp8` is `fp8_e4m3`); a KvlabError naming
    `kv_cache_dtype` and the choices for any other."""
    found = KV_CACHE_DTYPES.get(ALIASES.get(name, name)) if isinstance(name, str) else None
    if found is None:
        raise KvlabError(
            f"kv_cache_dtype {name!r} is not one kvlab models; choose one of "
            f"{', '.join(kv_cache_dtype_names())}", parameters=("kv_cache_dtype",))
    return found


def check_model(dtype: KVCacheDType, *, is_mla: bool, model_name: str) -> None:
    """A KvlabError for a precision the model's cache cannot take: per-token-head scales are
    per KV head, and an MLA latent has none (vLLM offers them for MLA neither)."""
    if is_mla and dtype.scales == "per_token_head":
        raise KvlabError(
            f"kv_cache_dtype {dtype.name}: model {model_name!r} caches an MLA latent, which has "
            "no KV heads to scale; use auto, bfloat16, fp8_e4m3 or fp8_e5m2",
            parameters=("kv_cache_dtype",))


# What each platform's vLLM serves (FACTS.md): vLLM's CPU attention backend lists auto and fp8
# (e4m3, e5m2); vLLM-Ascend's C8 is int8 with static per-channel scales and Ascend 910B/C have
# no fp8; vLLM on CUDA takes fp8 and the per-token-head formats, and has no static C8.
PLATFORM_DTYPES = {
    "cpu": ("auto", "bfloat16", "float16", "fp8_e4m3", "fp8_e5m2"),
    "ascend": ("auto", "bfloat16", "float16", "int8"),
    "cuda": ("auto", "bfloat16", "float16", "fp8_e4m3", "fp8_e5m2", "int8_per_token_head",
             "fp8_per_token_head", "int4_per_token_head"),
}
PLATFORM_NAMES = {"cpu": "vLLM's CPU backend", "ascend": "vLLM-Ascend", "cuda": "vLLM on CUDA"}


def platform_warnings(dtype: KVCacheDType, platform: str) -> list[str]:
    """Why `platform`'s vLLM (`cpu`, `ascend`, `cuda`: `block_rules.platform_of`) would not
    run `dtype` (empty: it would). A what-if is still answered; the user is told."""
    served = PLATFORM_DTYPES[platform]
    if dtype.name in served:
        return []
    return [f"kv_cache_dtype {dtype.name}: {PLATFORM_NAMES[platform]} serves "
            f"{', '.join(served)}; kvlab answers the what-if all the same"]
