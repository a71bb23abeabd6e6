"""The bundled excerpts are unchanged prefixes of the shared traces, with their attribution."""

from pathlib import Path

import pytest

from kvlab.traces import bundled_traces
from kvlab.traces.bundled import DATA_DIR

SHARED = Path("/work/shared/traces")
SOURCES = {"azure-conv": "azure2023_conv.csv", "azure-code": "azure2023_code.csv",
           "mooncake": "mooncake_synthetic.jsonl"}


@pytest.mark.skipif(not SHARED.is_dir(), reason="the full traces are not on this machine")
@pytest.mark.parametrize("name", sorted(SOURCES))
def test_excerpt_is_a_byte_prefix_of_its_source(name):
    excerpt = bundled_traces()[name].read_bytes()
    assert (SHARED / SOURCES[name]).read_bytes()[: len(excerpt)] == excerpt


def test_attribution_names_sources_and_licences():
    text = (DATA_DIR / "ATTRIBUTION.md").read_text()
    for needle in ("CC-BY 4.0", "Apache-2.0", "Splitwise", "ISCA 2024", "Mooncake", "FAST 2025",
                   *(path.name for path in bundled_traces().values())):
        assert needle in text
