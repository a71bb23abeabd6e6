"""A ModelSpec from a Hugging Face model folder: its config.json (architectures, dimensions,
dtype) and, when present, the parameter count from its safetensors headers (read as JSON, no
torch). What `kvlab run --model FOLDER` serves, `kvlab sim --model FOLDER` simulates."""

from __future__ import annotations

import json
import struct
from pathlib import Path
from typing import Any

from kvlab.errors import KvlabError
from kvlab.specs.model import ModelSpec

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
    spec_fields: dict[str, Any] = {
        "name": str(folder),
        "num_layers": need("num_hidden_layers"),
        "hidden_size": hidden,
        "num_heads": heads,
        "num_kv_heads": raw.get("num_key_value_heads") or heads,
        "head_dim": raw.get("head_dim") or hidden // heads,
        "intermediate_size": need("intermediate_size"),
        "vocab_size": need("vocab_size"),
        "max_model_len": int(raw.get("max_position_embeddings") or 2048),
        "dtype_bytes": _dtype_bytes(raw, config_path),
    }
    num_params = _safetensors_params(folder) or _estimated_params(spec_fields, raw)
    return ModelSpec(**spec_fields, num_params=float(num_params),
                     num_active_params=float(num_params))


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
