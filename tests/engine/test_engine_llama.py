"""The paged Llama-family model gives transformers' logits and greedy tokens (fp32, CPU)."""

from __future__ import annotations

import dataclasses

import pytest
import torch
from engine_hf_models import save_hf_model, tiny_llama_config
from transformers import AutoModelForCausalLM, MistralConfig

from kvlab.engine.loader import load_model
from kvlab.engine.models.config import ModelConfig
from kvlab.engine.models.llama import rope_inv_freq
from kvlab.engine.models.presets import MODEL_PRESETS, build_preset
from kvlab.engine.sampler import SamplingParams, check_stop
from kvlab.kernels import AttentionMetadata, get_backend

ATOL = 1e-4
PAGE_SIZE = 4


def _hf(folder):
    return AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32).eval()


def _caches(config: ModelConfig, num_pages: int) -> list[tuple[torch.Tensor, torch.Tensor]]:
    shape = (num_pages, PAGE_SIZE, config.num_key_value_heads, config.head_dim)
    return [(torch.zeros(shape), torch.zeros(shape)) for _ in range(config.num_hidden_layers)]


class PagedRunner:
    """Runs steps of several sequences over scattered pages, as an engine loop would."""

    def __init__(self, model, config: ModelConfig, num_pages: int = 64) -> None:
        self.model = model
        self.caches = _caches(config, num_pages)
        # hand out pages from the back, so block tables are neither contiguous nor ascending
        self.free_pages = list(range(num_pages))
        self.tables: dict[int, list[int]] = {}

    def step(self, chunks: dict[int, tuple[list[int], int]]) -> torch.Tensor:
        """chunks: seq -> (new token ids, num cached tokens). Logits for every new token."""
        input_ids, positions, tables, seq_lens, query_lens = [], [], [], [], []
        for seq, (tokens, num_cached) in chunks.items():
            table = self.tables.setdefault(seq, [])
            seq_len = num_cached + len(tokens)
            while len(table) * PAGE_SIZE < seq_len:
                table.append(self.free_pages.pop())
            input_ids += tokens
            positions += range(num_cached, seq_len)
            tables.append(table)
            seq_lens.append(seq_len)
            query_lens.append(len(tokens))
        meta = AttentionMetadata.build(
            block_tables=tables, seq_lens=seq_lens, query_lens=query_lens, page_size=PAGE_SIZE
        )
        hidden = self.model(torch.tensor(input_ids), torch.tensor(positions), self.caches, meta)
        return self.model.compute_logits(hidden)


@pytest.fixture(scope="module")
def llama(hf_tiny_llama):
    model, config, _ = load_model(hf_tiny_llama)
    return model, config, _hf(hf_tiny_llama)


@pytest.fixture(scope="module")
def qwen2(hf_tiny_qwen2):
    model, config, _ = load_model(hf_tiny_qwen2)
    return model, config, _hf(hf_tiny_qwen2)


def _tokens(config: ModelConfig, n: int, seed: int) -> list[int]:
    generator = torch.Generator().manual_seed(seed)
    return torch.randint(3, config.vocab_size, (n,), generator=generator).tolist()


@pytest.mark.parametrize("family", ["llama", "qwen2"])
def test_one_paged_sequence_gives_transformers_logits(family, request):
    model, config, hf = request.getfixturevalue(family)
    tokens = _tokens(config, 23, seed=1)
    logits = PagedRunner(model, config).step({0: (tokens, 0)})
    with torch.no_grad():
        expected = hf(torch.tensor([tokens])).logits[0]
    torch.testing.assert_close(logits, expected, atol=ATOL, rtol=0)


@pytest.mark.parametrize("family", ["llama", "qwen2"])
def test_ragged_batch_with_prefill_chunks_gives_transformers_logits(family, request):
    model, config, hf = request.getfixturevalue(family)
    prompts = [_tokens(config, n, seed=n) for n in (13, 9, 19)]
    runner = PagedRunner(model, config)
    # step 1: a chunk of seq 0, all of seq 1, a chunk of seq 2
    runner.step({0: (prompts[0][:6], 0), 1: (prompts[1], 0), 2: (prompts[2][:4], 0)})
    # step 2: the rest of seq 0, one decode token for seq 1, the next chunk of seq 2
    decode_token = 7
    logits = runner.step(
        {
            0: (prompts[0][6:], 6),
            1: ([decode_token], 9),
            2: (prompts[2][4:15], 4),
        }
    )
    with torch.no_grad():
        expected = [
            hf(torch.tensor([prompts[0]])).logits[0, 6:],
            hf(torch.tensor([[*prompts[1], decode_token]])).logits[0, -1:],
            hf(torch.tensor([prompts[2][:15]])).logits[0, 4:],
        ]
    torch.testing.assert_close(logits, torch.cat(expected), atol=ATOL, rtol=0)


@pytest.mark.parametrize("family", ["llama", "qwen2"])
def test_greedy_decode_matches_transformers_generate(family, request):
    model, config, hf = request.getfixturevalue(family)
    prompt = _tokens(config, 11, seed=5)
    params = SamplingParams(temperature=0.0, max_tokens=8)
    runner = PagedRunner(model, config)
    outputs: list[int] = []
    logits = runner.step({0: (prompt, 0)})
    while True:
        outputs.append(int(logits[-1].argmax()))
        if check_stop(params, outputs, config.eos_token_ids) is not None:
            break
        logits = runner.step({0: ([outputs[-1]], len(prompt) + len(outputs) - 1)})
    with torch.no_grad():
        expected = hf.generate(
            torch.tensor([prompt]), max_new_tokens=8, do_sample=False, pad_token_id=0
        )[0, len(prompt) :]
    assert outputs == expected.tolist()


def test_mistral_with_linear_rope_scaling_gives_transformers_logits(tmp_path):
    hf_config = MistralConfig(
        vocab_size=300,
        hidden_size=64,
        intermediate_size=96,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=1,
        max_position_embeddings=128,
        sliding_window=None,
        initializer_range=0.2,
        rope_parameters={"rope_type": "linear", "rope_theta": 10000.0, "factor": 2.0},
    )
    folder = save_hf_model(tmp_path, hf_config, seed=3)
    model, config, _ = load_model(folder)
    tokens = _tokens(config, 17, seed=2)
    logits = PagedRunner(model, config).step({0: (tokens, 0)})
    with torch.no_grad():
        expected = _hf(folder)(torch.tensor([tokens])).logits[0]
    torch.testing.assert_close(logits, expected, atol=ATOL, rtol=0)


def test_llama_with_attention_and_mlp_bias_gives_transformers_logits(tmp_path):
    hf_config = tiny_llama_config(attention_bias=True, mlp_bias=True, tie_word_embeddings=True)
    folder = save_hf_model(tmp_path, hf_config, seed=4)
    model, config, _ = load_model(folder)
    assert config.o_proj_bias and config.mlp_bias and config.tie_word_embeddings
    tokens = _tokens(config, 10, seed=3)
    logits = PagedRunner(model, config).step({0: (tokens, 0)})
    with torch.no_grad():
        expected = _hf(folder)(torch.tensor([tokens])).logits[0]
    torch.testing.assert_close(logits, expected, atol=ATOL, rtol=0)


def test_llama3_rope_scaling_slows_only_long_wavelengths():
    base = ModelConfig(
        architecture="LlamaForCausalLM",
        vocab_size=10,
        hidden_size=128,
        intermediate_size=8,
        num_hidden_layers=1,
        num_attention_heads=1,
        num_key_value_heads=1,
        head_dim=128,
        rope_theta=500000.0,
    )
    scaled = dataclasses.replace(
        base,
        rope_type="llama3",
        rope_scaling=(
            ("factor", 8.0),
            ("high_freq_factor", 4.0),
            ("low_freq_factor", 1.0),
            ("original_max_position_embeddings", 8192),
        ),
    )
    plain, llama3 = rope_inv_freq(base), rope_inv_freq(scaled)
    assert llama3[0] == plain[0]  # the fastest rotation is untouched
    torch.testing.assert_close(llama3[-1], plain[-1] / 8)  # the slowest is divided by factor


def test_presets_are_identical_on_every_build():
    backend = get_backend("torch")
    first = build_preset("tiny-llama", attn_backend=backend)
    second = build_preset("tiny-llama", attn_backend=backend)
    for (name, a), (_, b) in zip(first.named_parameters(), second.named_parameters(), strict=True):
        assert torch.equal(a, b), name


@pytest.mark.parametrize("name", sorted(MODEL_PRESETS))
def test_preset_runs_a_paged_step_to_finite_logits(name):
    model, config, tokenizer = load_model(name)
    assert tokenizer is None
    assert 1000 <= config.vocab_size <= 4000 and config.num_key_value_heads == 2
    logits = PagedRunner(model, config).step({0: (list(range(5, 25)), 0), 1: ([9, 8, 7], 0)})
    assert logits.shape == (23, config.vocab_size)
    assert torch.isfinite(logits).all()


def test_preset_config_round_trips_through_transformers():
    from transformers import AutoConfig

    for config in MODEL_PRESETS.values():
        raw = config.to_hf_dict()
        hf_config = AutoConfig.for_model(raw.pop("model_type"), **raw)
        assert ModelConfig.from_hf_dict(hf_config.to_dict()) == config
