"""Load a model: a tiny preset, a bundled trained model, or a local Hugging Face folder
(config.json + *.safetensors)."""

from __future__ import annotations

import json
from collections import defaultdict
from pathlib import Path
from typing import Any

import torch
from safetensors import SafetensorError, safe_open

from kvlab.engine.models.config import ModelConfig
from kvlab.engine.models.llama import LlamaForCausalLM
from kvlab.engine.models.presets import BUNDLED_MODELS, MODEL_PRESETS, build_preset
from kvlab.errors import KvlabError

DTYPE_NAMES = {
    "float32": torch.float32,
    "fp32": torch.float32,
    "float": torch.float32,
    "float16": torch.float16,
    "fp16": torch.float16,
    "half": torch.float16,
    "bfloat16": torch.bfloat16,
    "bf16": torch.bfloat16,
}
INDEX_FILE = "model.safetensors.index.json"
TOKENIZER_FILES = ("tokenizer.json", "tokenizer.model", "tokenizer_config.json", "vocab.json")
# Tensors some checkpoints carry that this model recomputes instead of loading.
_IGNORED_SUFFIXES = ("rotary_emb.inv_freq",)
# A checkpoint's KV-cache scales (fp8's k_scale/v_scale and the older kv_scale, vLLM-Ascend
# C8's kv_cache_scale/kv_cache_offset): not weights of the model; engine/kv_scales.py reads
# them when the KV cache is quantized.
KV_SCALE_SUFFIXES = (".k_scale", ".v_scale", ".kv_scale", ".kv_cache_scale", ".kv_cache_offset")


def load_model(
    name_or_path: str | Path,
    *,
    dtype: str | torch.dtype | None = None,
    device: str | torch.device = "cpu",
    attn_backend: Any = "torch",
) -> tuple[LlamaForCausalLM, ModelConfig, Any]:
    """(model, config, tokenizer or None) for a preset name or a local Hugging Face folder.

    `dtype` overrides the checkpoint's (float32, float16, bfloat16 or their short names).
    `attn_backend` is a kvlab.kernels backend name or a backend object. The tokenizer is
    transformers' AutoTokenizer, loaded only when the folder holds tokenizer files.
    """
    backend = _backend(attn_backend)
    path = model_folder(name_or_path)
    if path is None:
        torch_dtype = resolve_dtype(dtype, "dtype") if dtype is not None else None
        model = build_preset(
            str(name_or_path), attn_backend=backend, dtype=torch_dtype, device=device
        )
        return model, model.config, None
    if not path.is_dir():
        raise KvlabError(
            f"model {str(name_or_path)!r} is neither a preset "
            f"({', '.join([*MODEL_PRESETS, *BUNDLED_MODELS])}) "
            "nor a folder"
        )
    config = ModelConfig.from_json(path / "config.json")
    torch_dtype = (
        resolve_dtype(dtype, "dtype")
        if dtype is not None
        else resolve_dtype(config.torch_dtype, f"{path / 'config.json'}: dtype")
    )
    model = LlamaForCausalLM(config, attn_backend=backend, dtype=torch_dtype, device=device)
    load_weights(model, path)
    return model, config, load_tokenizer(path)


def resolve_dtype(value: str | torch.dtype, where: str) -> torch.dtype:
    """A supported torch dtype from a name or a dtype; `where` names its source in the error."""
    if isinstance(value, torch.dtype) and value in DTYPE_NAMES.values():
        return value
    if isinstance(value, str) and value.lower() in DTYPE_NAMES:
        return DTYPE_NAMES[value.lower()]
    raise KvlabError(
        f"{where} {value!r} is not supported; expected float32, float16 or bfloat16 "
        "(or fp32, fp16, bf16)"
    )


def weight_files(folder: Path) -> dict[str, Path]:
    """Checkpoint tensor name -> the safetensors file holding it (sharded or single file)."""
    index = folder / INDEX_FILE
    if index.exists():
        try:
            weight_map = json.loads(index.read_text(encoding="utf-8"))["weight_map"]
        except (json.JSONDecodeError, KeyError, TypeError) as exc:
            raise KvlabError(f"{index}: expected JSON with a 'weight_map' object ({exc})") from exc
        for shard in sorted(set(weight_map.values())):
            if not (folder / shard).is_file():
                raise KvlabError(f"{folder / shard}: no such file (listed in {index})")
        return {name: folder / shard for name, shard in weight_map.items()}
    files = sorted(folder.glob("*.safetensors"))
    if not files:
        other = sorted(p.name for p in folder.glob("*.bin")) + sorted(
            p.name for p in folder.glob("*.pt")
        )
        hint = f" ({', '.join(other)} found: only safetensors is loaded)" if other else ""
        raise KvlabError(f"{folder}: no *.safetensors weight file{hint}")
    names: dict[str, Path] = {}
    for file in files:
        try:
            with safe_open(str(file), framework="pt", device="cpu") as f:
                names.update(dict.fromkeys(f.keys(), file))
        except (SafetensorError, OSError) as exc:
            raise KvlabError(f"{file}: not a readable safetensors file ({exc})") from None
    return names


def load_weights(model: LlamaForCausalLM, folder: Path) -> None:
    """Fill every parameter of `model` from the folder's safetensors files."""
    located = weight_files(folder)
    needed = model.hf_weight_names()
    missing = [name for name in needed if name not in located]
    if missing:
        more = f" and {len(missing) - 1} more" if len(missing) > 1 else ""
        raise KvlabError(f"{folder}: tensor {missing[0]!r}{more} missing from the checkpoint")
    _check_unexpected(model, located, folder)
    by_file: dict[Path, list[str]] = defaultdict(list)
    for name in needed:
        by_file[located[name]].append(name)
    for file, names in sorted(by_file.items()):
        with safe_open(str(file), framework="pt", device="cpu") as f:
            present = set(f.keys())
            for name in names:
                if name not in present:
                    raise KvlabError(f"{file}: tensor {name!r} missing (the index lists it here)")
                try:
                    model.load_hf_weight(name, f.get_tensor(name))
                except KvlabError as exc:
                    raise KvlabError(f"{file}: {exc}") from exc


def _check_unexpected(model: LlamaForCausalLM, located: dict[str, Path], folder: Path) -> None:
    """Refuse checkpoints with tensors this model would silently drop (another architecture)."""
    needed = set(model.hf_weight_names())
    if model.config.tie_word_embeddings:
        needed.add("lm_head.weight")  # some tied checkpoints still store the shared matrix
    ignored = (*_IGNORED_SUFFIXES, *KV_SCALE_SUFFIXES)
    unexpected = [name for name in located if name not in needed and not name.endswith(ignored)]
    if unexpected:
        raise KvlabError(
            f"{folder}: checkpoint tensor {unexpected[0]!r} ({len(unexpected)} unexpected in all) "
            f"is not part of a {model.config.architecture} of this config.json"
        )


def model_folder(name_or_path: str | Path) -> Path | None:
    """The Hugging Face folder a model name means: a bundled model's (stdlib-llama), the path
    itself, or None for a preset built with random weights (tiny-llama)."""
    path = Path(name_or_path)
    if path.is_dir():
        return path
    if str(name_or_path) in BUNDLED_MODELS:
        return BUNDLED_MODELS[str(name_or_path)]
    return None if str(name_or_path) in MODEL_PRESETS else path


def load_kv_scale_tensors(name_or_path: str | Path) -> dict[str, torch.Tensor]:
    """The KV-cache scale tensors (KV_SCALE_SUFFIXES) of a Hugging Face folder's checkpoint,
    by name, on the CPU; none for a preset."""
    path = model_folder(name_or_path)
    if path is None:
        return {}
    by_file: dict[Path, list[str]] = defaultdict(list)
    for name, file in weight_files(path).items():
        if name.endswith(KV_SCALE_SUFFIXES):
            by_file[file].append(name)
    tensors: dict[str, torch.Tensor] = {}
    for file, file_names in sorted(by_file.items()):
        with safe_open(str(file), framework="pt", device="cpu") as f:
            for name in file_names:
                tensors[name] = f.get_tensor(name)
    return tensors


def load_tokenizer(folder: Path) -> Any:
    """transformers' AutoTokenizer for the folder, or None when it holds no tokenizer files."""
    if not any((folder / name).is_file() for name in TOKENIZER_FILES):
        return None
    from transformers import AutoTokenizer

    try:
        return AutoTokenizer.from_pretrained(str(folder), local_files_only=True)
    except (OSError, ValueError) as exc:
        raise KvlabError(f"{folder}: could not load the tokenizer ({exc})") from exc


def _backend(attn_backend: Any) -> Any:
    """A kernel backend object from its name (imported here, when first needed)."""
    if not isinstance(attn_backend, str):
        return attn_backend
    from kvlab.kernels import get_backend

    return get_backend(attn_backend)
