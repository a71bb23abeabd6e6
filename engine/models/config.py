"""A Llama-family model's shape, read from a Hugging Face config.json."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from kvlab.errors import KvlabError

ARCHITECTURES = ("LlamaForCausalLM", "MistralForCausalLM", "Qwen2ForCausalLM")
ROPE_TYPES = ("default", "linear", "llama3")


@dataclass(slots=True, frozen=True)
class ModelConfig:
    """The shape and numerics of one Llama-family model (Hugging Face names).

    `rope_scaling` is None or a tuple of sorted (key, value) pairs of the config's rope parameters
    without `rope_theta` and `rope_type` (kept hashable); `rope_type` is one of ROPE_TYPES.
    `torch_dtype` is the config's dtype name as written. `eos_token_ids` may be empty.
    `max_model_len` is the longest sequence the engine may run: the position limit.
    `layer_windows[i]` is layer i's sliding window W in tokens (a token attends to itself and
    the W - 1 before it), 0 for full attention; left empty, every layer takes `sliding_window`
    (0 where it is None). `sliding_window` is the window the config turns on, or None.
    """

    architecture: str
    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_hidden_layers: int
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    rms_norm_eps: float = 1e-6
    rope_theta: float = 10000.0
    rope_type: str = "default"
    rope_scaling: tuple[tuple[str, Any], ...] | None = None
    max_position_embeddings: int = 2048
    sliding_window: int | None = None
    tie_word_embeddings: bool = False
    qkv_bias: bool = False
    o_proj_bias: bool = False
    mlp_bias: bool = False
    torch_dtype: str = "float32"
    bos_token_id: int | None = None
    eos_token_ids: tuple[int, ...] = ()
    layer_windows: tuple[int, ...] = ()

    def __post_init__(self) -> None:
        if not self.layer_windows:
            windows = (self.sliding_window or 0,) * self.num_hidden_layers
            object.__setattr__(self, "layer_windows", windows)
        if len(self.layer_windows) != self.num_hidden_layers:
            raise KvlabError(
                f"{len(self.layer_windows)} layer windows for {self.num_hidden_layers} layers"
            )
        if self.num_attention_heads % self.num_key_value_heads:
            raise KvlabError(
                f"num_attention_heads {self.num_attention_heads} is not a multiple of "
                f"num_key_value_heads {self.num_key_value_heads}"
            )

    @property
    def max_model_len(self) -> int:
        """The longest sequence (prompt plus output) this model runs correctly here."""
        return self.max_position_embeddings

    @property
    def has_sliding_window(self) -> bool:
        """True when some layer attends over a sliding window."""
        return any(self.layer_windows)

    def rope_parameter(self, key: str) -> Any:
        """One rope-scaling parameter; a KvlabError naming it when the config lacks it."""
        for name, value in self.rope_scaling or ():
            if name == key:
                return value
        raise KvlabError(f"rope_scaling of type {self.rope_type!r} needs {key!r} in config.json")

    def kv_bytes_per_token(self, dtype_bytes: int) -> int:
        """K and V bytes one token takes over all layers."""
        return 2 * self.num_hidden_layers * self.num_key_value_heads * self.head_dim * dtype_bytes

    @classmethod
    def from_json(cls, path: str | Path) -> ModelConfig:
        """Read a Hugging Face config.json; a KvlabError naming the file when it cannot."""
        path = Path(path)
        try:
            raw = json.loads(path.read_text(encoding="utf-8"))
        except FileNotFoundError as exc:
            raise KvlabError(f"{path}: no such file (a model folder needs config.json)") from exc
        except json.JSONDecodeError as exc:
            raise KvlabError(
                f"{path}: line {exc.lineno}, column {exc.colno}: not valid JSON ({exc.msg})"
            ) from exc
        try:
            return cls.from_hf_dict(raw)
        except KvlabError as exc:
            raise KvlabError(f"{path}: {exc}") from exc

    @classmethod
    def from_hf_dict(cls, raw: dict[str, Any]) -> ModelConfig:
        """Build from the dict of a Hugging Face config (transformers 4 or 5 layout)."""
        architecture = _architecture(raw)
        num_heads = _need(raw, "num_attention_heads")
        hidden_size = _need(raw, "hidden_size")
        if raw.get("hidden_act", "silu") != "silu":
            raise KvlabError(f"hidden_act {raw['hidden_act']!r} is not supported; expected 'silu'")
        rope_theta, rope_type, rope_scaling = _rope(raw)
        qkv_bias, o_proj_bias, mlp_bias = _biases(architecture, raw)
        num_layers = _need(raw, "num_hidden_layers")
        return cls(
            architecture=architecture,
            vocab_size=_need(raw, "vocab_size"),
            hidden_size=hidden_size,
            intermediate_size=_need(raw, "intermediate_size"),
            num_hidden_layers=num_layers,
            num_attention_heads=num_heads,
            num_key_value_heads=raw.get("num_key_value_heads") or num_heads,
            head_dim=raw.get("head_dim") or hidden_size // num_heads,
            rms_norm_eps=float(raw.get("rms_norm_eps", 1e-6)),
            rope_theta=rope_theta,
            rope_type=rope_type,
            rope_scaling=rope_scaling,
            max_position_embeddings=int(raw.get("max_position_embeddings", 2048)),
            sliding_window=_sliding_window(architecture, raw),
            tie_word_embeddings=bool(raw.get("tie_word_embeddings", False)),
            qkv_bias=qkv_bias,
            o_proj_bias=o_proj_bias,
            mlp_bias=mlp_bias,
            torch_dtype=_dtype_name(raw),
            bos_token_id=raw.get("bos_token_id"),
            eos_token_ids=_eos(raw.get("eos_token_id")),
            layer_windows=layer_windows(architecture, raw, num_layers),
        )

    def to_hf_dict(self) -> dict[str, Any]:
        """This config as a Hugging Face config dict (transformers 5 layout)."""
        rope = {"rope_type": self.rope_type, "rope_theta": self.rope_theta}
        rope.update(self.rope_scaling or ())
        model_type = {
            "LlamaForCausalLM": "llama",
            "MistralForCausalLM": "mistral",
            "Qwen2ForCausalLM": "qwen2",
        }[self.architecture]
        eos: int | list[int] | None = list(self.eos_token_ids) or None
        if len(self.eos_token_ids) == 1:
            eos = self.eos_token_ids[0]
        return {
            "architectures": [self.architecture],
            "model_type": model_type,
            "vocab_size": self.vocab_size,
            "hidden_size": self.hidden_size,
            "intermediate_size": self.intermediate_size,
            "num_hidden_layers": self.num_hidden_layers,
            "num_attention_heads": self.num_attention_heads,
            "num_key_value_heads": self.num_key_value_heads,
            "head_dim": self.head_dim,
            "hidden_act": "silu",
            "rms_norm_eps": self.rms_norm_eps,
            "rope_parameters": rope,
            "max_position_embeddings": self.max_position_embeddings,
            "sliding_window": self.sliding_window,
            **self._hf_window_fields(),
            "tie_word_embeddings": self.tie_word_embeddings,
            "attention_bias": self.o_proj_bias,
            "mlp_bias": self.mlp_bias,
            "dtype": self.torch_dtype,
            "bos_token_id": self.bos_token_id,
            "eos_token_id": eos,
        }


    def _hf_window_fields(self) -> dict[str, Any]:
        """The fields beside `sliding_window` that say which layers take it (Qwen2's)."""
        if self.architecture != "Qwen2ForCausalLM":
            return {}
        return {
            "use_sliding_window": self.sliding_window is not None,
            "max_window_layers": self.num_hidden_layers,
            "layer_types": [
                SLIDING_ATTENTION if window else FULL_ATTENTION for window in self.layer_windows
            ],
        }


def _architecture(raw: dict[str, Any]) -> str:
    names = raw.get("architectures") or []
    for name in names:
        if name in ARCHITECTURES:
            return name
    raise KvlabError(
        f"architectures {names} are not supported; expected one of {', '.join(ARCHITECTURES)}"
    )


def _biases(architecture: str, raw: dict[str, Any]) -> tuple[bool, bool, bool]:
    """Which of (q/k/v, o, MLP) projections carry a bias, as transformers builds each family."""
    if architecture == "Qwen2ForCausalLM":
        return True, False, False
    if architecture == "MistralForCausalLM":
        return False, False, False
    attention_bias = bool(raw.get("attention_bias", False))
    return attention_bias, attention_bias, bool(raw.get("mlp_bias", False))


def _need(raw: dict[str, Any], key: str) -> int:
    value = raw.get(key)
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise KvlabError(f"{key!r} is missing or not a whole number >= 1 (got {value!r})")
    return value


def _rope(raw: dict[str, Any]) -> tuple[float, str, tuple[tuple[str, Any], ...] | None]:
    """(theta, type, extra parameters) from transformers 5's rope_parameters or 4's fields."""
    params = dict(raw.get("rope_parameters") or raw.get("rope_scaling") or {})
    theta = float(params.pop("rope_theta", raw.get("rope_theta", 10000.0)))
    # transformers 4 configs name the type "type" in older files and "rope_type" in newer ones
    rope_type = params.pop("rope_type", None) or params.pop("type", None) or "default"
    params.pop("type", None)
    if float(params.pop("partial_rotary_factor", 1.0)) != 1.0:
        raise KvlabError("partial_rotary_factor other than 1.0 is not supported")
    if rope_type not in ROPE_TYPES:
        raise KvlabError(
            f"rope type {rope_type!r} is not supported; expected one of {', '.join(ROPE_TYPES)}"
        )
    if rope_type == "default":
        return theta, rope_type, None
    return theta, rope_type, tuple(sorted(params.items()))


def _sliding_window(architecture: str, raw: dict[str, Any]) -> int | None:
    """The config's window W, None where it is off (Qwen2 without use_sliding_window, Llama)."""
    if architecture in _NO_WINDOW:
        return None
    if architecture in _GATED_WINDOW and not raw.get("use_sliding_window", False):
        return None
    window = raw.get("sliding_window")
    if window is None or window == 0:
        return None
    if isinstance(window, bool) or not isinstance(window, int) or window < 1:
        raise KvlabError(f"'sliding_window' is {window!r}, expected a whole number >= 1 or null")
    return window


def layer_windows(architecture: str, raw: dict[str, Any], num_layers: int) -> tuple[int, ...]:
    """Each layer's sliding window (0: full attention), as transformers reads the config.

    Mistral: `sliding_window` on every layer (transformers' Mistral ignores `layer_types`).
    Llama: none (transformers' Llama has no window). Qwen2/Qwen3: only with
    `use_sliding_window`, on the layers `layer_types` marks "sliding_attention", or without
    `layer_types` on layers i >= `max_window_layers` (default 28). Others (gpt-oss, Gemma 3):
    `layer_types` where given, else `sliding_window` on every layer. Raises a KvlabError naming
    the field for a layer type other than full_attention / sliding_attention.
    """
    window = _sliding_window(architecture, raw)
    if window is None:
        return (0,) * num_layers
    if architecture in _EVERY_LAYER:
        return (window,) * num_layers
    types = raw.get("layer_types")
    if types is None and architecture in _GATED_WINDOW:
        first = raw.get("max_window_layers", 28)
        return tuple(window if i >= first else 0 for i in range(num_layers))
    if types is None:
        return (window,) * num_layers
    if not isinstance(types, list) or len(types) != num_layers:
        raise KvlabError(
            f"'layer_types' is {types!r}: expected a list of one type per layer "
            f"({num_layers}, num_hidden_layers)"
        )
    windows = []
    for index, kind in enumerate(types):
        if kind not in (FULL_ATTENTION, SLIDING_ATTENTION):
            raise KvlabError(
                f"'layer_types'[{index}] is {kind!r}: this engine runs only "
                f"{FULL_ATTENTION!r} and {SLIDING_ATTENTION!r} layers"
            )
        windows.append(window if kind == SLIDING_ATTENTION else 0)
    return tuple(windows)


FULL_ATTENTION = "full_attention"
SLIDING_ATTENTION = "sliding_attention"
# How each family reads its window fields (transformers' config and attention code).
_NO_WINDOW = frozenset({"LlamaForCausalLM"})
_EVERY_LAYER = frozenset({"MistralForCausalLM"})
_GATED_WINDOW = frozenset({"Qwen2ForCausalLM", "Qwen3ForCausalLM", "Qwen3MoeForCausalLM"})


def _dtype_name(raw: dict[str, Any]) -> str:
    # Kept as written: the loader checks it unless a dtype override replaces it.
    return str(raw.get("dtype") or raw.get("torch_dtype") or "float32")


def _eos(value: Any) -> tuple[int, ...]:
    if value is None:
        return ()
    if isinstance(value, int):
        return (value,)
    return tuple(int(v) for v in value)
