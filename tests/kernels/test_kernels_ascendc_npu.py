"""On an Atlas machine: kvlab's AscendC kernels and the ascend backend's compiled Triton kernels
against the torch reference, on the NPU (`pytest -m npu`; build kvkernels/ascendc first, see its
CMakeLists.txt). Never run here: no NPU, no CANN. Unverified until someone runs them."""

import importlib.util
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from kernel_cases import make_case, max_relative_error, move_case

from kvlab.kernels import get_backend

pytestmark = pytest.mark.npu

BF16_TOL = 1e-2


def _npu_available() -> bool:
    if importlib.util.find_spec("torch_npu") is None:
        return False
    import torch_npu  # noqa: F401  (registers torch.npu)

    return bool(torch.npu.is_available())  # type: ignore[attr-defined]


requires_npu = pytest.mark.skipif(not _npu_available(), reason="needs an Ascend NPU with torch_npu")


@pytest.fixture(scope="module")
def ascendc():
    from kvlab.kernels.ascendc_ops import load_ascendc_ops

    ops = load_ascendc_ops()
    if ops is None:
        pytest.skip("kvlab's AscendC kernels are not built (cmake -S kvkernels/ascendc ...)")
    return ops


@requires_npu
def test_ascendc_decode_over_runs_of_pages_matches_reference(ascendc):
    from kvlab.kernels.extents import build_extents

    case = move_case(
        make_case(
            [4096, 1000, 77, 1],
            [1] * 4,
            page_size=128,
            num_heads=32,
            num_kv_heads=8,
            head_dim=128,
            run_pages=4,
            dtype=torch.bfloat16,
        ),
        "npu",
    )
    extents = build_extents(case.meta.block_tables, case.meta.seq_lens, case.meta.page_size)
    out = torch.empty_like(case.query)
    ascendc.paged_decode(
        case.query, case.k_cache, case.v_cache, extents, case.meta.seq_lens, case.scale, out
    )
    expected = get_backend("torch").paged_attention(
        case.query, case.k_cache, case.v_cache, case.meta, scale=case.scale, num_kv_heads=8
    )
    assert max_relative_error(out.cpu(), expected.cpu()) < BF16_TOL


@requires_npu
def test_ascendc_copy_and_swap_move_pages_bit_exact(ascendc):
    dev_k, dev_v = torch.randn(2, 16, 128, 8, 128, dtype=torch.bfloat16).to("npu")
    host_k = torch.zeros(8, 128, 8, 128, dtype=torch.bfloat16).pin_memory()
    host_v = torch.zeros_like(host_k).pin_memory()
    before = dev_k.cpu()
    ascendc.copy_pages(
        dev_k, dev_v, torch.tensor([0, 1], device="npu"), torch.tensor([8, 9], device="npu")
    )
    ascendc.swap_pages(dev_k, dev_v, host_k, host_v, torch.tensor([[3, 0], [4, 1], [8, 2]]))
    torch.npu.synchronize()  # type: ignore[attr-defined]
    assert torch.equal(dev_k.cpu()[8], before[0]) and torch.equal(host_k[2], before[0])
    assert torch.equal(host_k[0], before[3]) and torch.equal(host_k[1], before[4])


@requires_npu
@pytest.mark.skipif(importlib.util.find_spec("triton") is None, reason="needs triton-ascend")
def test_ascend_backend_compiled_on_the_npu_matches_reference():
    # compiled kernels need a process without the interpreter that the test session runs
    script = Path(__file__).with_name("ascend_npu_check.py")
    env = {**os.environ, "TRITON_INTERPRET": "0"}
    result = subprocess.run([sys.executable, str(script)], env=env, capture_output=True, text=True)
    assert result.returncode == 0, result.stdout + result.stderr
