"""`kvlab policies`: every registered memory policy, family by family, with its description."""

from __future__ import annotations

import argparse
from typing import Any

_TITLES = {
    "allocation": "allocation (KIND)",
    "reserve": "reserve= (contiguous only)",
    "block_sizing": "block_sizing=",
    "eviction": "eviction=NAME[:key=value] (a policy's own parameter, as shown)",
    "victim": "victim=",
    "preemption": "preemption=",
    "scheduling": "--scheduling-policy NAME[:key=value,...] (its own flag; default fcfs)",
    "precision": "precision=NAME[:key=value,...] (sim, run, serve, accuracy; "
                 "docs/kv_precision.md)",
}


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Flags of `kvlab policies`."""
    parser.add_argument("--json", action="store_true", help="print the registry as JSON")


def run(args: argparse.Namespace) -> int:
    """Print the policy registry and the spec grammar."""
    import json

    from kvlab.policies import PolicySpec, registry

    entries = registry.entries()
    if args.json:
        table: dict[str, dict[str, str]] = {}
        for entry in entries:
            table.setdefault(entry.family, {})[entry.name] = entry.help
        print(json.dumps({"families": table, "defaults": PolicySpec().to_json()}, indent=2))
        return 0
    print(format_policies(entries))
    return 0


def format_policies(entries: list) -> str:
    """The registry as aligned text, with the spec grammar and an example."""
    from kvlab.policies import PolicySpec

    width = max(len(entry.name) for entry in entries) + 2
    lines = [
        "Policy spec: KIND[:key=value,...]   e.g. paged:block_size=16,eviction=lru,preemption=swap",
        "",
    ]
    family = None
    for entry in entries:
        if entry.family != family:
            family = entry.family
            lines.append(_TITLES[family])
        lines.append(f"  {entry.name:<{width}}{entry.help}{_own_parameters(entry)}")
    defaults = PolicySpec().to_json()
    lines += [
        "",
        "other keys: block_size (tokens per page, default "
        f"{defaults['block_size']}), watermark (share of pages kept free at admission, default "
        f"{defaults['watermark']}), host_pages (swap space in pages; default: as many as device "
        "pages)",
        "defaults are vLLM V1's; --preset vllm-v0 fills the keys a spec leaves unset with V0's "
        "(victim=last-arrived, watermark=0.01)",
        "defaults: " + ",".join(f"{key}={value}" for key, value in defaults.items()),
        "scheduling order: not a key of the policy spec but vLLM's own flag, e.g. "
        "--scheduling-policy priority or --scheduling-policy lpm:max_queue=256",
    ]
    return "\n".join(lines)


def _own_parameters(entry: Any) -> str:
    """` (slru:protected_share=0.8)`: an eviction policy's parameters with their defaults."""
    from kvlab.policies.params import parameters

    params = parameters(entry.factory) if entry.family == "eviction" else {}
    shown = ",".join(f"{key}={value}" for key, value in params.items())
    return f" ({entry.name}:{shown})" if params else ""
