"""C8 (int8) scales calibrated without a checkpoint's: on text where the model has a tokenizer,
which reaches the keys and values served text reaches (random ids reach smaller ones, and
their scales clip text: docs/kv_precision.md)."""

from __future__ import annotations

import torch

from kvlab.engine.kv_scales import calibrate_channel_scales, calibration_token_ids
from kvlab.engine.loader import load_model
from kvlab.engine.models.stdlib_llama.corpus import load_corpus
from kvlab.engine.platform import get_platform


def test_a_tokenizer_calibrates_on_the_corpus_text_and_none_on_seeded_ids():
    _model, config, tokenizer = load_model("stdlib-llama")
    text = list(tokenizer("\n\n".join(s.text for s in load_corpus().split(held_out=False)[:64]))
                ["input_ids"])
    assert calibration_token_ids(config.vocab_size, 256, tokenizer).tolist() == text[:256]
    random_ids = calibration_token_ids(config.vocab_size, 256)
    assert torch.equal(random_ids, calibration_token_ids(config.vocab_size, 256))
    assert random_ids.tolist() != text[:256]


def test_text_reaches_larger_keys_than_random_ids():
    model, config, tokenizer = load_model("stdlib-llama")
    platform = get_platform("cpu")
    on_text = calibrate_channel_scales(model, config, platform=platform, page_size=16,
                                       max_model_len=512, tokenizer=tokenizer)
    on_ids = calibrate_channel_scales(model, config, platform=platform, page_size=16,
                                      max_model_len=512)
    text_k = torch.stack([k for k, _ in on_text])
    ids_k = torch.stack([k for k, _ in on_ids])
    assert float(text_k.max()) > float(ids_k.max())
    assert float((text_k > ids_k).float().mean()) > 0.5
