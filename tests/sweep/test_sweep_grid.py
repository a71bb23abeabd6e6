"""Grid expansion, random samples of it, `--grid` texts and sweep files with their lines."""

import itertools
import re

import pytest
from hypothesis import given
from hypothesis import strategies as st

from kvlab.errors import KvlabError
from kvlab.sweep import SweepSpec, load_sweep_file, parse_grid_item, run_key, split_values

grids = st.dictionaries(
    st.sampled_from(["max_num_seqs", "max_num_batched_tokens", "num_prompts", "seed",
                     "random_input_len"]),
    st.lists(st.integers(1, 50_000), min_size=1, max_size=4, unique=True),
    max_size=4)


@given(grids)
def test_the_points_are_every_combination_in_grid_order(grid):
    spec = SweepSpec.create({"model": "llama-3.1-8b"}, grid)
    names = list(grid)
    expected = [{"model": "llama-3.1-8b", **dict(zip(names, combo, strict=True))}
                for combo in itertools.product(*(grid[n] for n in names))]
    assert spec.points() == expected
    assert spec.grid_size == len(expected)


@given(grids, st.integers(1, 300), st.integers(0, 10))
def test_a_sample_is_distinct_points_of_the_grid_and_the_same_for_a_seed(grid, size, seed):
    spec = SweepSpec.create({}, grid, sample=size, sample_seed=seed)
    points = spec.points()
    keys = [run_key(point) for point in points]
    assert len(points) == min(size, spec.grid_size)
    assert len(set(keys)) == len(keys)
    everything = [run_key(point) for point in SweepSpec.create({}, grid).points()]
    assert set(keys) <= set(everything)
    assert keys == sorted(keys, key=everything.index)  # in grid order
    assert spec.points() == SweepSpec.create({}, grid, sample=size, sample_seed=seed).points()


def test_samples_of_two_seeds_differ():
    grid = {"max_num_seqs": list(range(1, 101))}
    one = SweepSpec.create({}, grid, sample=10, sample_seed=1).points()
    other = SweepSpec.create({}, grid, sample=10, sample_seed=2).points()
    assert one != other


def test_a_grid_value_overrides_the_base_and_repeats_are_dropped():
    spec = SweepSpec.create({"max_num_seqs": 8}, {"max_num_seqs": ["16", 16, 32]})
    assert spec.points() == [{"max_num_seqs": 16}, {"max_num_seqs": 32}]


def test_policies_in_a_grid_text_keep_their_commas():
    assert split_values("policy", "paged:block_size=32,eviction=lru,buddy,contiguous:"
                        "reserve=max") == ["paged:block_size=32,eviction=lru", "buddy",
                                           "contiguous:reserve=max"]
    assert split_values("max_num_seqs", "8, 16,") == ["8", "16"]


def test_precision_policies_in_a_grid_text_keep_their_commas():
    assert parse_grid_item("precision=none,age:recent=32,depth=2,age:recent=128") == (
        "precision", ["none", "age:recent=32,depth=2", "age:recent=128"])
    with pytest.raises(KvlabError, match=r"precision='fifo:recent=3'; valid: age"):
        parse_grid_item("precision=fifo:recent=3")


def test_a_grid_text_is_read_and_checked():
    assert parse_grid_item("max-num-seqs=8,16") == ("max_num_seqs", [8, 16])
    assert parse_grid_item("eviction=lru,fifo") == ("eviction", ["lru", "fifo"])


@pytest.mark.parametrize(("text", "problem"), [
    ("max_num_seqs", "is not KEY=V1,V2"),
    ("blocksize=16", "unknown setting 'blocksize'; did you mean block_size"),
    ("block_size=", "give at least one value"),
    ("block_size=16,big", "block_size 'big': expected a whole number"),
    ("goodput=ttft:100", "goodput shapes every row's columns"),
])
def test_a_bad_grid_text_says_what_is_wrong(text, problem):
    with pytest.raises(KvlabError, match=re.escape(problem)):
        parse_grid_item(text)


def test_a_sweep_file_gives_base_grid_and_sample(tmp_path):
    path = tmp_path / "s.yaml"
    path.write_text("base:\n  model: llama-3.1-8b\n  num_prompts: 50\ngrid:\n"
                    "  policy: [paged, 'contiguous:reserve=max']\n  block_size: 16\n"
                    "sample: 1\nsample_seed: 3\n")
    spec = load_sweep_file(path)
    assert spec.base == {"model": "llama-3.1-8b", "num_prompts": 50}
    assert spec.grid == {"policy": ["paged", "contiguous:reserve=max"], "block_size": [16]}
    assert (spec.sample, spec.sample_seed) == (1, 3)


@pytest.mark.parametrize(("text", "problem"), [
    ("grid:\n  block_size: [16, 32\n", "line 3: not valid YAML"),
    ("base:\n  model: llama-3.1-8b\n  blocksize: 16\n", "line 3: unknown setting 'blocksize'"),
    ("grid:\n  max_num_seqs:\n    - 8\n    - lots\n",
     "line 4: max_num_seqs 'lots': expected a whole number"),
    ("grid:\n  eviction: [lru, sometimes]\n", "line 2: policy paged: eviction='sometimes'"),
    ("grids:\n  block_size: [16]\n", "line 1: unknown section 'grids'"),
    ("grid: [16, 32]\n", "line 1: grid must be a mapping"),
    ("grid:\n  block_size: [16]\nsample: 0\n", "line 3: sample 0: expected a whole number"),
    ("- 1\n- 2\n", "expected a mapping with base, grid"),
])
def test_a_bad_sweep_file_names_the_file_and_the_line(tmp_path, text, problem):
    path = tmp_path / "bad.yaml"
    path.write_text(text)
    with pytest.raises(KvlabError, match=re.escape(problem)) as caught:
        load_sweep_file(path)
    assert str(caught.value).startswith(str(path))
    assert "\n" not in str(caught.value)
