"""What the layers promise at run time: the torch-free layers import and simulate without torch.

Which layer may import which is checked statically by import-linter's contracts in `make lint`
(pyproject.toml, docs/architecture.md)."""

import subprocess
import sys


def test_the_torch_free_layers_import_and_simulate_without_torch():
    # Block torch, triton and the engine side at import time, then simulate a few requests.
    code = """
import sys
class Block:
    def find_spec(self, name, path=None, target=None):
        blocked = ('torch', 'triton', 'kvlab.engine', 'kvlab.kernels')
        if name.split('.')[0] in blocked or name.startswith(blocked):
            raise ImportError('blocked: ' + name)
sys.meta_path.insert(0, Block())
import kvlab.policies, kvlab.traces, kvlab.sim, kvlab.metrics, kvlab.specs, kvlab.fidelity
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


def test_kvlab_sim_runs_on_the_base_install():
    """`make run` installs kvlab without extras: `kvlab sim` must not import what only an
    extra installs (a fresh clone's `make run` failed on prometheus_client, imported through
    kvlab.fidelity -> kvlab.bench)."""
    code = """
import sys
class Block:
    def find_spec(self, name, path=None, target=None):
        extras = ('torch', 'triton', 'safetensors', 'transformers', 'prometheus_client',
                  'aiohttp', 'zmq', 'msgpack', 'fastapi', 'uvicorn', 'streamlit', 'plotly',
                  'pyarrow', 'ray', 'httpx', 'openai')
        if name.split('.')[0] in extras:
            raise ImportError('not in the base install: ' + name)
sys.meta_path.insert(0, Block())
from kvlab.cli import main
sys.exit(main(['sim', '--num-prompts', '30', '--disable-tqdm']))
"""
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert result.returncode == 0, result.stderr[-2000:]
    assert "Serving Benchmark Result" in result.stdout
