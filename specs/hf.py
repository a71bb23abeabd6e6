"""A ModelSpec from a Hugging Face model folder: its config.json (architectures, dimensions,
dtype, layer layout) and, when present, the parameter count from its safetensors headers (read
as JSON, no torch). What `kvlab run --model FOLDER` serves, `kvlab sim --model FOLDER` simulates.

The layer layout follows transformers' config classes: `layer_types` when written; else
Gemma 3's `sliding_window_pattern` (every Nth layer global, 6 by default), Qwen3-Next's
`full_attention_interval` (every Nth layer full, the rest linear attention, 4 by default),
Llama 4's `no_rope_layers` (0: a global NoPE layer, else chunked by `attention_chunk_size`; one
in `no_rope_layer_interval`, 4, by default), gpt-oss's alternation (sliding first), Qwen2/3's
`use_sliding_window` with `max_window_layers` (layers from that index on slide), and Mistral's
bare `sliding_window` (every layer slides). Where `layer_types` and a pattern field are both
written they must agree. MLA (`kv_lora_rank`, `qk_rope_head_dim`, `v_head_dim`) and
DeepSeek-V3.2's `index_topk` / `index_head_dim` are read; a linear-attention layer's state
from the Gated DeltaNet (`linear_*`) or Mamba2 (`mamba_*`, `n_groups`, `ssm_state_size`,
`conv_kernel`) fields (`kvlab.specs.linear_state`).
"""

from __future__ import annotations

import json
import struct
from pathlib import Path
from typing import Any

from kvlab.errors import KvlabError
from kvlab.specs.linear_state import gated_delta_net_state_bytes, mamba2_state_bytes
from kvlab.specs.model import LAYER_TYPES, ModelSpec

DTYPE_BYTES = {"float32": 4, "float": 4, "float16": 2, "half": 2, "bfloat16": 2,
               "float8_e4m3fn": 1, "int8": 1}
_HEADER_LIMIT = 100 << 20  # a safetensors header over 100 MiB is a corrupt file


def is_hf_folder(path: Path) -> bool:
    """A folder holding config.json, or a config.json itself."""
    return (path.is_dir() and (path / "config.json").is_file()) or path.name == "config.json"


def model_spec_from_hf(path: str | Path) -> ModelSpec:
    """Read a model folder (or its config.json); a KvlabError naming the file and field."""
    path = Path(path)
    config_path = path if path.name == "config.json" else path / "config.json"
    folder = config_path.parent
    try:
        raw = json.loads(config_path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise KvlabError(f"{config_path}: no such file (a model folder needs config.json)",
                         parameters=("model",)) from None
    except (OSError, UnicodeDecodeError, ValueError) as exc:
        raise KvlabError(f"{config_path}: not a JSON model config ({exc})",
                         parameters=("model",)) from None
    if not isinstance(raw, dict):
        raise KvlabError(f"{config_path}: expected a JSON object", parameters=("model",))
    raw = raw.get("text_config", raw) if "num_hidden_layers" not in raw else raw

    def need(name: str) -> int:
        value = raw.get(name)
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise KvlabError(f"{config_path}: {name} is {value!r}, expected a positive integer",
                             parameters=("model",))
        return value

    heads, hidden = need("num_attention_heads"), need("hidden_size")
    num_layers = need("num_hidden_layers")
    dtype_bytes = _dtype_bytes(raw, config_path)
    spec_fields: dict[str, Any] = {
        "name": str(folder),
        "num_layers": num_layers,
        "hidden_size": hidden,
        "num_heads": heads,
        "num_kv_heads": raw.get("num_key_value_heads") or heads,
        "head_dim": raw.get("head_dim") or raw.get("v_head_dim") or hidden // heads,
        "intermediate_size": need("intermediate_size"),
        "vocab_size": need("vocab_size"),
        "max_model_len": int(raw.get("max_position_embeddings") or 2048),
        "dtype_bytes": dtype_bytes,
        **_layer_layout(raw, config_path, num_layers, dtype_bytes),
    }
    num_params = _safetensors_params(folder) or _estimated_params(spec_fields, raw)
    return ModelSpec(**spec_fields, num_params=float(num_params),
                     num_active_params=float(num_params))


def _layer_layout(raw: dict[str, Any], where: Path, num_layers: int,
                  dtype_bytes: int) -> dict[str, Any]:
    """The ModelSpec fields of the layer layout, MLA and sparse attention (module docstring)."""

    def bad(field: str, value: Any, expected: str) -> KvlabError:
        return KvlabError(f"{where}: {field} is {value!r}, expected {expected}",
                          parameters=("model",))

    def number(field: str, default: int | None = None) -> int | None:
        return _positive(raw, where, field, default)

    model_type = str(raw.get("model_type") or "")
    pattern = _pattern_layer_types(raw, where, num_layers, model_type)
    written = raw.get("layer_types")
    if written is None:
        types = pattern
    else:
        if (not isinstance(written, list) or len(written) != num_layers
                or any(t not in LAYER_TYPES for t in written)):
            raise bad("layer_types", written, f"a list of {num_layers} words from "
                      f"{', '.join(LAYER_TYPES)} (one per layer)")
        types = tuple(written)
        if pattern is not None and pattern != types:
            raise KvlabError(f"{where}: layer_types contradicts {_pattern_field(raw)}; "
                             "remove one or make them agree", parameters=("model",))
    if types is not None and raw.get("use_sliding_window") is False \
            and "sliding_attention" in types:
        raise KvlabError(f"{where}: layer_types has sliding_attention layers but "
                         "use_sliding_window is false", parameters=("model",))
    kinds = set(types or ())
    fields: dict[str, Any] = {}
    if kinds - {"full_attention"}:
        fields["layer_types"] = types
    if "sliding_attention" in kinds:
        fields["sliding_window"] = _need(raw, where, "sliding_window", "sliding layers")
    if "chunked_attention" in kinds:
        fields["attention_chunk_size"] = _need(raw, where, "attention_chunk_size",
                                               "chunked layers")
    if "linear_attention" in kinds:
        fields["linear_state_bytes"] = _linear_state_bytes(raw, where, dtype_bytes)
    rank = number("kv_lora_rank")
    if rank is not None:
        fields["kv_lora_rank"] = rank
        fields["qk_rope_head_dim"] = _need(raw, where, "qk_rope_head_dim", "kv_lora_rank (MLA)")
    if raw.get("index_topk") is not None:
        if rank is None:
            raise KvlabError(f"{where}: index_topk without kv_lora_rank; DeepSeek sparse "
                             "attention is MLA", parameters=("model",))
        fields["index_topk"] = number("index_topk")
        fields["index_head_dim"] = number("index_head_dim", 128)  # V3.2's, as vLLM assumes
    return fields


def _positive(raw: dict[str, Any], where: Path, field: str,
              default: int | None = None) -> int | None:
    """A positive integer field, `default` when absent or null; a KvlabError when not one."""
    value = raw.get(field)
    if value is None:
        return default
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise KvlabError(f"{where}: {field} is {value!r}, expected a positive integer",
                         parameters=("model",))
    return value


def _need(raw: dict[str, Any], where: Path, field: str, because: str) -> int:
    """A positive integer field the config's other fields require."""
    value = _positive(raw, where, field)
    if value is None:
        raise KvlabError(f"{where}: {field} is missing, expected a positive integer (the "
                         f"config has {because})", parameters=("model",))
    return value


def _pattern_field(raw: dict[str, Any]) -> str:
    names = ("sliding_window_pattern", "full_attention_interval", "no_rope_layers",
             "max_window_layers")
    return next((n for n in names if n in raw), "the model type's default pattern")


def _pattern_layer_types(raw: dict[str, Any], where: Path, num_layers: int,
                         model_type: str) -> tuple[str, ...] | None:
    """Layer kinds from a model family's pattern fields (None: no pattern applies)."""
    full, sliding = "full_attention", "sliding_attention"

    def number(field: str, default: int) -> int:
        return _positive(raw, where, field, default) or default

    if "sliding_window_pattern" in raw or model_type.startswith("gemma3"):
        every = number("sliding_window_pattern", 6)
        return tuple(sliding if (i + 1) % every else full for i in range(num_layers))
    if "full_attention_interval" in raw or model_type == "qwen3_next":
        every = number("full_attention_interval", 4)
        return tuple("linear_attention" if (i + 1) % every else full for i in range(num_layers))
    if "no_rope_layers" in raw or model_type.startswith("llama4"):
        flags = raw.get("no_rope_layers")
        if not flags:  # transformers: null or [] means the default interval
            every = number("no_rope_layer_interval", 4)
            flags = [int((i + 1) % every != 0) for i in range(num_layers)]
        if not isinstance(flags, list) or len(flags) != num_layers \
                or any(f not in (0, 1) for f in flags):
            raise KvlabError(f"{where}: no_rope_layers is {flags!r}, expected {num_layers} "
                             "flags of 0 (global NoPE layer) or 1", parameters=("model",))
        local = "chunked_attention" if raw.get("attention_chunk_size") else full
        return tuple(local if flag else full for flag in flags)
    if model_type == "gpt_oss":
        return tuple(sliding if (i + 1) % 2 else full for i in range(num_layers))
    if "use_sliding_window" in raw:
        if not raw["use_sliding_window"] or raw.get("sliding_window") is None:
            return None
        start = number("max_window_layers", num_layers)
        if start > num_layers:
            raise KvlabError(f"{where}: max_window_layers is {start}, more than the "
                             f"{num_layers} layers", parameters=("model",))
        return tuple(sliding if i >= start else full for i in range(num_layers))
    if raw.get("sliding_window") is not None and "layer_types" not in raw:
        return (sliding,) * num_layers  # Mistral: every layer slides
    return None


def _linear_state_bytes(raw: dict[str, Any], where: Path, dtype_bytes: int) -> int:
    """One linear-attention layer's state (Gated DeltaNet or Mamba2 fields)."""

    def need(field: str) -> int:
        return _need(raw, where, field, "linear_attention layers")

    if "linear_num_value_heads" in raw:
        return gated_delta_net_state_bytes(
            num_key_heads=need("linear_num_key_heads"),
            num_value_heads=need("linear_num_value_heads"),
            key_head_dim=need("linear_key_head_dim"),
            value_head_dim=need("linear_value_head_dim"),
            conv_kernel_dim=need("linear_conv_kernel_dim"),
            dtype_bytes=dtype_bytes)
    if "mamba_num_heads" in raw:
        return mamba2_state_bytes(
            num_heads=need("mamba_num_heads"), head_dim=need("mamba_head_dim"),
            n_groups=_positive(raw, where, "n_groups", 1) or 1,
            state_size=need("ssm_state_size"),
            conv_kernel=_positive(raw, where, "conv_kernel", 4) or 4, dtype_bytes=dtype_bytes)
    raise KvlabError(f"{where}: linear_attention layers but no state fields; expected Gated "
                     "DeltaNet's linear_num_key_heads, linear_num_value_heads, "
                     "linear_key_head_dim, linear_value_head_dim, linear_conv_kernel_dim "
                     "or Mamba2's mamba_num_heads, mamba_head_dim, ssm_state_size",
                     parameters=("model",))


def _dtype_bytes(raw: dict[str, Any], where: Path) -> int:
    name = str(raw.get("dtype") or raw.get("torch_dtype") or "bfloat16").removeprefix("torch.")
    if name not in DTYPE_BYTES:
        raise KvlabError(f"{where}: dtype {name!r} is not one of {', '.join(DTYPE_BYTES)}",
                         parameters=("model",))
    return DTYPE_BYTES[name]


def _safetensors_params(folder: Path) -> int:
    """Elements of every tensor in the folder's safetensors files (0 when there are none)."""
    total = 0
    for file in sorted(folder.glob("*.safetensors")):
        try:
            with file.open("rb") as handle:
                (length,) = struct.unpack("<Q", handle.read(8))
                if length > _HEADER_LIMIT:
                    raise ValueError(f"header of {length} bytes")
                header = json.loads(handle.read(length))
        except (OSError, struct.error, ValueError) as exc:
            raise KvlabError(f"{file}: not a safetensors file ({exc})",
                             parameters=("model",)) from None
        for name, entry in header.items():
            if name != "__metadata__":
                count = 1
                for size in entry["shape"]:
                    count *= size
                total += count
    return total


def _estimated_params(spec: dict[str, Any], raw: dict[str, Any]) -> int:
    """A Llama-family parameter count from the dimensions (no weights to count)."""
    hidden, inter, vocab = spec["hidden_size"], spec["intermediate_size"], spec["vocab_size"]
    q = spec["num_heads"] * spec["head_dim"]
    kv = spec["num_kv_heads"] * spec["head_dim"]
    per_layer = hidden * (q + 2 * kv) + q * hidden + 3 * hidden * inter + 2 * hidden
    embeddings = vocab * hidden * (1 if raw.get("tie_word_embeddings") else 2)
    return spec["num_layers"] * per_layer + embeddings + hidden
