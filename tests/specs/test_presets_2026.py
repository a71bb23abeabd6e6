"""The presets of issue 47: sound layouts, the hardware asked for, and short hardware names."""

import pytest

from kvlab.specs import get_hardware, list_models
from kvlab.specs.loading import model_problem


@pytest.mark.parametrize("name", sorted(list_models()))
def test_every_model_preset_is_consistent(name):
    assert model_problem(list_models()[name]) is None


@pytest.mark.parametrize("name", ["b200", "h20", "ascend-910c", "atlas-800t-a3", "h200-141g"])
def test_the_hardware_presets_exist(name):
    assert get_hardware(name).name == name


def test_short_gpu_names_are_aliases():
    assert get_hardware("h200") is get_hardware("h200-141g")
    assert get_hardware("H100").name == "h100-80g"
