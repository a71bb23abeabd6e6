"""This machine's memory, as both worlds need it before they allocate: the engine for its KV
tensors on cpu, the simulator for its page books (torch-free)."""

from __future__ import annotations

import os


def available_ram_bytes() -> int:
    """RAM available to new allocations: /proc/meminfo's MemAvailable, else free pages."""
    available = _meminfo_bytes("MemAvailable")
    if available is not None:
        return available
    return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_AVPHYS_PAGES")


def _meminfo_bytes(key: str) -> int | None:
    """One field of /proc/meminfo in bytes, or None where the file or the field is missing."""
    try:
        with open("/proc/meminfo", encoding="ascii") as f:
            for line in f:
                name, _, rest = line.partition(":")
                if name == key:
                    return int(rest.split()[0]) * 1024  # the file counts kB
    except (OSError, ValueError, IndexError):
        return None
    return None
