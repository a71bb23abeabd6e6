"""`kvlab presets`: the model and hardware presets with their key figures, as tables or JSON.

"layers by kind" counts each model's layers per KV-cache group kind (full, sliding_window(W),
chunked_local(C), state) in `kvlab.specs.kv_groups.parse_groups` words; "KV KiB/token" is
one token in every attention layer (how many tokens each group keeps: `kvlab capacity`).
"""

from __future__ import annotations

import argparse
from collections.abc import Sequence
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from kvlab.specs import HardwareSpec, ModelSpec


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Flags of `kvlab presets`."""
    parser.add_argument(
        "--json",
        action="store_true",
        help="print every preset's fields as JSON; one preset's block is a valid spec file",
    )


def run(args: argparse.Namespace) -> int:
    """Print the presets; returns the exit code."""
    import dataclasses
    import json

    from kvlab.specs import list_hardware, list_models

    models, hardware = list_models(), list_hardware()
    if args.json:
        document = {
            "models": {name: dataclasses.asdict(spec) for name, spec in models.items()},
            "hardware": {name: dataclasses.asdict(spec) for name, spec in hardware.items()},
        }
        print(json.dumps(document, indent=2))
        return 0
    print("Models")
    print(format_table(_MODEL_HEADER, [_model_row(spec) for spec in models.values()]))
    print()
    print("Hardware (per device)")
    print(format_table(_HARDWARE_HEADER, [_hardware_row(spec) for spec in hardware.values()]))
    return 0


_MODEL_HEADER = (
    "model",
    "attention",
    "layers",
    "layers by kind",
    "heads",
    "kv heads",
    "head dim",
    "params B",
    "active B",
    "KV KiB/token",
    "max len",
)
_HARDWARE_HEADER = (
    "hardware",
    "HBM GiB",
    "HBM TB/s",
    "TFLOPS",
    "host link GB/s",
    "peer link GB/s",
    "host GiB/device",
    "devices",
)


def _model_row(spec: ModelSpec) -> list[str]:
    from kvlab.specs.kv_layout import layer_summary

    if spec.is_mla:
        attention = f"MLA {spec.kv_lora_rank}+{spec.qk_rope_head_dim}"
        if spec.index_topk:
            attention += f" top-{spec.index_topk}"
    elif spec.num_kv_heads == spec.num_heads:
        attention = "MHA"
    else:
        attention = "GQA"
    return [
        spec.name,
        attention,
        str(spec.num_layers),
        layer_summary(spec),
        str(spec.num_heads),
        str(spec.num_kv_heads),
        str(spec.head_dim),
        _billions(spec.num_params),
        _billions(spec.num_active_params),
        f"{spec.kv_bytes_per_token() / 1024:g}",
        f"{spec.max_model_len:,}",
    ]


def _billions(count: float) -> str:
    """Three significant digits without switching to exponent notation (6.74, 13.0, 671)."""
    billions = count / 1e9
    decimals = 2 if billions < 10 else 1 if billions < 100 else 0
    return f"{billions:.{decimals}f}"


def _hardware_row(spec: HardwareSpec) -> list[str]:
    peer = f"{spec.interconnect_bandwidth / 1e9:g}" if spec.interconnect_bandwidth else "-"
    return [
        spec.name,
        f"{spec.hbm_bytes / 1024**3:.1f}",
        f"{spec.hbm_bandwidth / 1e12:.2f}",
        f"{spec.peak_flops / 1e12:g}",
        f"{spec.host_link_bandwidth / 1e9:g}",
        peer,
        "-" if spec.host_memory_bytes is None else f"{spec.host_memory_bytes / 1024**3:g}",
        str(spec.num_devices),
    ]


def format_table(header: Sequence[str], rows: Sequence[Sequence[str]]) -> str:
    """Columns padded to their widest cell: numbers right-aligned, text left-aligned."""
    columns = list(zip(header, *rows, strict=True))
    widths = [max(len(cell) for cell in column) for column in columns]
    numeric = [all(_is_number(cell) for cell in column[1:]) for column in columns]

    def line(cells: Sequence[str]) -> str:
        padded = (
            cell.rjust(width) if is_numeric else cell.ljust(width)
            for cell, width, is_numeric in zip(cells, widths, numeric, strict=True)
        )
        return "  ".join(padded).rstrip()

    return "\n".join([line(header), *(line(row) for row in rows)])


def _is_number(cell: str) -> bool:
    try:
        float(cell.replace(",", ""))
    except ValueError:
        return cell == "-"
    return True
