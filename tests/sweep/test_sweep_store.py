"""The Parquet dataset of a sweep: appended parts that pandas reads as one table, whatever
columns and types later parts bring, and rows removed by key."""

import pandas as pd
import pyarrow.parquet as pq

from kvlab.sweep import SweepStore


def rows(*keys, **columns):
    return [{"run_key": key, "status": "ok", "error": None,
             **{name: values[i] for name, values in columns.items()}}
            for i, key in enumerate(keys)]


def test_appended_parts_read_back_as_one_table(tmp_path):
    store = SweepStore(tmp_path / "s")
    store.append(rows("a", "b", x=[1, 2]))
    store.append(rows("c", x=[3]))
    frame = pd.read_parquet(tmp_path / "s")
    assert sorted(frame["run_key"]) == ["a", "b", "c"]
    assert sorted(frame["x"]) == [1, 2, 3]
    assert store.statuses() == {"a": "ok", "b": "ok", "c": "ok"}


def test_a_part_with_new_columns_or_wider_types_widens_every_part(tmp_path):
    store = SweepStore(tmp_path / "s")
    store.append([{"run_key": "a", "status": "error", "error": "boom", "n": None}])
    store.append(rows("b", n=[2], y=[0.5], label=["p"]))
    store.append(rows("c", n=[2.5], y=[1], label=[7]))
    schemas = {str(pq.read_schema(part)) for part in store.parts()}
    assert len(schemas) == 1  # every part has the same schema
    frame = pd.read_parquet(tmp_path / "s").set_index("run_key")
    assert frame.loc["b", "n"] == 2.0 and frame.loc["c", "n"] == 2.5
    assert frame.loc["c", "label"] == "7" and frame.loc["b", "label"] == "p"
    assert pd.isna(frame.loc["a", "y"]) and frame.loc["a", "error"] == "boom"


def test_an_older_store_object_sees_the_widened_schema_of_another(tmp_path):
    SweepStore(tmp_path / "s").append(rows("a", x=[1]))
    SweepStore(tmp_path / "s").append(rows("b", z=["new"]))
    frame = pd.read_parquet(tmp_path / "s")
    assert set(frame.columns) >= {"x", "z"} and len(frame) == 2


def test_dropping_keys_removes_their_rows_and_empty_parts(tmp_path):
    store = SweepStore(tmp_path / "s")
    store.append(rows("a", "b", x=[1, 2]))
    store.append(rows("c", x=[3]))
    assert store.drop({"b", "c", "missing"}) == 2
    assert list(pd.read_parquet(tmp_path / "s")["run_key"]) == ["a"]
    assert len(store.parts()) == 1


def test_no_temporary_file_is_left_and_nothing_is_written_for_no_rows(tmp_path):
    store = SweepStore(tmp_path / "s")
    assert store.append([]) is None and not (tmp_path / "s").exists()
    store.append(rows("a", x=[1]))
    assert [p.name.startswith("part-") for p in (tmp_path / "s").iterdir()] == [True]
