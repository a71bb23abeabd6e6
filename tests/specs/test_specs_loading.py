"""Model names as users and servers give them."""

import pytest

from kvlab.errors import KvlabError
from kvlab.specs import get_model


def test_a_hugging_face_id_or_served_name_finds_its_preset():
    """A server's model name (`kvlab bench serve`, `calibrate --from-bench`) is often the
    Hugging Face id of a tuned variant: it maps to the preset of its base model."""
    assert get_model("meta-llama/Llama-3.1-8B-Instruct").name == "llama-3.1-8b"
    assert get_model("google/gemma-3-27b-it").name == "gemma-3-27b"
    assert get_model("Qwen/Qwen3-Next-80B-A3B-Instruct").name == "qwen3-next-80b-a3b"
    with pytest.raises(KvlabError, match="unknown model preset 'meta-llama/Other-1B'"):
        get_model("meta-llama/Other-1B")
