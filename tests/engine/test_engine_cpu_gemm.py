"""The CPU fast paths: oneDNN matmuls (`cpu_gemm="onednn"`: transformers' logits within the
model tests' tolerance, packs that follow weights loaded later, F.linear for large batches) and
the float32 RMSNorm kernel (bit for bit transformers' steps)."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from test_engine_llama import ATOL, PagedRunner, _hf, _tokens

from kvlab.engine import LLM, SamplingParams
from kvlab.engine.loader import load_model
from kvlab.engine.models.cpu_gemm import ONEDNN_MAX_ROWS, Linear, linear, pack_weight
from kvlab.engine.models.llama import RMSNorm
from kvlab.errors import KvlabError

needs_onednn = pytest.mark.skipif(
    not torch.backends.mkldnn.is_available(), reason="torch built without oneDNN"
)


def _packed_linears(model) -> list[Linear]:
    return [m for m in model.modules() if isinstance(m, Linear) and m.packed is not None]


@needs_onednn
def test_onednn_decode_batch_gives_transformers_logits(hf_tiny_llama):
    model, config, _ = load_model(hf_tiny_llama)
    model.use_cpu_gemm("onednn")
    assert len(_packed_linears(model)) == 4 * config.num_hidden_layers + 1  # and the LM head
    prompts = {seq: _tokens(config, 9 + seq, seed=seq) for seq in range(3)}
    runner = PagedRunner(model, config)
    runner.step({seq: (tokens[:-1], 0) for seq, tokens in prompts.items()})
    logits = runner.step({seq: (tokens[-1:], len(tokens) - 1) for seq, tokens in prompts.items()})
    hf = _hf(hf_tiny_llama)
    with torch.no_grad():
        expected = torch.stack([hf(torch.tensor([t])).logits[0, -1] for t in prompts.values()])
    torch.testing.assert_close(logits, expected, atol=ATOL, rtol=0)


@needs_onednn
def test_weights_loaded_after_packing_are_packed_again(hf_tiny_llama):
    model, config, _ = load_model(hf_tiny_llama)
    model.use_cpu_gemm("onednn")
    hidden = torch.randn(4, config.hidden_size)
    before = model.compute_logits(hidden)
    model.load_hf_weight("lm_head.weight", 2 * model.lm_head.weight)
    torch.testing.assert_close(model.compute_logits(hidden), 2 * before, atol=ATOL, rtol=0)
    model.use_cpu_gemm("torch")
    assert not _packed_linears(model)


@needs_onednn
def test_batches_above_the_row_limit_run_f_linear_exactly():
    weight = torch.randn(48, 32)
    x = torch.randn(ONEDNN_MAX_ROWS + 1, 32)
    assert torch.equal(linear(x, weight, None, pack_weight(weight)), F.linear(x, weight))
    small = x[:8]
    torch.testing.assert_close(linear(small, weight, None, pack_weight(weight)),
                               F.linear(small, weight), atol=1e-5, rtol=1e-5)


def test_pack_weight_declines_what_onednn_cannot_pack():
    assert pack_weight(torch.randn(4, 4, dtype=torch.float16)) is None
    assert pack_weight(torch.randn(4)) is None


def test_torch_and_onednn_engines_agree_on_greedy_tokens():
    params = SamplingParams(temperature=0.0, max_tokens=8, ignore_eos=True)
    prompts = [[5, 9, 13, 2, 7], [11] * 12]
    outputs = {}
    for gemm in ("torch", "onednn"):
        llm = LLM("tiny-llama", num_gpu_blocks_override=32, cpu_gemm=gemm, verbose=False)
        outputs[gemm] = [o.outputs[0].token_ids for o in llm.generate(prompts, params,
                                                                       use_tqdm=False)]
    assert outputs["torch"] == outputs["onednn"]


def test_an_unknown_cpu_gemm_lists_the_valid_ones():
    with pytest.raises(KvlabError, match=r"cpu_gemm 'mkl'.*onednn"):
        LLM("tiny-llama", num_gpu_blocks_override=32, cpu_gemm="mkl", verbose=False)


@pytest.mark.parametrize("hidden_size", [64, 512, 896, 4096])
def test_float32_rms_norm_is_bit_for_bit_transformers_steps(hidden_size):
    norm = RMSNorm(hidden_size, eps=1e-5)
    norm.weight.data.normal_()
    x = 3 * torch.randn(37, hidden_size)
    steps = norm.weight * (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-5))
    assert torch.equal(norm(x), steps)


@pytest.mark.parametrize("command", ["run", "serve"])
def test_the_engine_commands_take_cpu_gemm(command):
    """`--cpu-gemm torch` reaches the engine's config (default onednn)."""
    import argparse
    import importlib

    module = importlib.import_module(f"kvlab.cli.commands.{command}")
    parser = argparse.ArgumentParser()
    module.add_arguments(parser)
    assert parser.parse_args(["--model", "tiny-llama"] if command == "run" else ["tiny-llama"]
                             ).cpu_gemm == "onednn"
    if command == "run":
        args = parser.parse_args(["--model", "tiny-llama", "--cpu-gemm", "torch"])
        assert module.engine_config(args).cpu_gemm == "torch"
