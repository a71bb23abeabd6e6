"""The "may import" column of DESIGN.md, checked on the source and at run time."""

import ast
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
FOLDERS = {
    "policies": "kvlab.policies",
    "sim": "kvlab.sim",
    "traces": "kvlab.traces",
    "engine": "kvlab.engine",
    "kernels": "kvlab.kernels",
    "kvlab": "kvlab",
}

# folder -> top-level modules its code must never import (directly)
FORBIDDEN = {
    "policies": {
        "torch",
        "simpy",
        "triton",
        "kvlab.sim",
        "kvlab.engine",
        "kvlab.kernels",
        "kvlab.dashboard",
        "kvlab.traces",
    },
    "sim": {"torch", "triton", "kvlab.engine", "kvlab.kernels", "kvlab.dashboard"},
    "traces": {
        "torch",
        "triton",
        "simpy",
        "kvlab.sim",
        "kvlab.engine",
        "kvlab.kernels",
        "kvlab.dashboard",
    },
    "kernels": {"kvlab.engine", "kvlab.sim", "kvlab.policies", "kvlab.dashboard"},
    "engine": {"kvlab.sim", "kvlab.dashboard", "simpy"},
    "kvlab": {"kvlab.dashboard"},
}


def _imports(path: Path) -> set[str]:
    names = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names.add(node.module)
    return names


def _violations(folder: str) -> list[str]:
    found = []
    for path in sorted((ROOT / folder).rglob("*.py")):
        for name in _imports(path):
            for banned in FORBIDDEN[folder]:
                if name == banned or name.startswith(banned + "."):
                    found.append(f"{path.relative_to(ROOT)} imports {name}")
    return found


@pytest.mark.parametrize("folder", sorted(FORBIDDEN))
def test_folder_imports_only_what_design_allows(folder):
    assert _violations(folder) == []


def test_policies_sim_and_traces_run_without_torch():
    # Block torch, triton and the engine side at import time, then simulate a few requests.
    code = """
import sys
class Block:
    def find_spec(self, name, path=None, target=None):
        blocked = ('torch', 'triton', 'kvlab.engine', 'kvlab.kernels')
        if name.split('.')[0] in blocked or name.startswith(blocked):
            raise ImportError('blocked: ' + name)
sys.meta_path.insert(0, Block())
import kvlab.policies, kvlab.traces, kvlab.sim
from kvlab.policies import KVCacheManager, Request, Scheduler, SchedulerConfig
manager = KVCacheManager('paged:eviction=lru', 64, max_model_len=256)
scheduler = Scheduler(SchedulerConfig(max_model_len=256), manager)
for i in range(4):
    scheduler.add_request(Request(i, 40, 8))
steps = 0
while scheduler.has_unfinished():
    scheduler.update(scheduler.schedule(steps), None, steps + 1)
    steps += 1
assert 'torch' not in sys.modules
print('ok', steps)
"""
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert result.returncode == 0, result.stderr
    assert result.stdout.startswith("ok")
