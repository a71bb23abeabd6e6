"""Running a sweep: rows as runs finish, re-runs skip stored rows, --force and --retry-failed
redo them, a failing run (or a dying worker) is a row and never stops the sweep."""

import pandas as pd

from kvlab.sweep import PoolExecutor, SerialExecutor, SweepStore, run_sweep
from kvlab.sweep import executors as executors_module

from .sweep_cases import comparable, die_on_fifo, small_spec

# the second max_model_len is over llama-2-7b's 4,096: those runs fail
SPEC = small_spec(max_num_seqs=[4, 64], max_model_len=[2048, 100_000])


def test_a_sweep_writes_one_row_per_run_and_failures_as_rows(tmp_path):
    store = SweepStore(tmp_path / "rows")
    report = run_sweep(SPEC.points(), store, SerialExecutor())
    frame = pd.read_parquet(tmp_path / "rows")
    assert (report.num_points, report.num_run, report.num_errors) == (4, 4, 2)
    assert sorted(frame["status"]) == ["error", "error", "ok", "ok"]
    failed = frame[frame["status"] == "error"]
    assert (failed["param.max_model_len"] == 100_000).all()
    assert failed["error"].str.contains("max_model_len").all()


def test_a_rerun_skips_stored_rows_and_force_redoes_them(tmp_path):
    store = SweepStore(tmp_path / "rows")
    first = run_sweep(SPEC.points(), store, SerialExecutor())
    parts = store.parts()
    again = run_sweep(SPEC.points(), store, SerialExecutor())
    assert (again.num_skipped, again.num_run) == (4, 0)
    assert store.parts() == parts
    forced = run_sweep(SPEC.points(), store, SerialExecutor(), force=True)
    assert (forced.num_skipped, forced.num_run) == (0, 4)
    frame = pd.read_parquet(tmp_path / "rows")
    assert len(frame) == 4 and frame["run_key"].is_unique
    assert first.num_errors == forced.num_errors == 2


def test_an_interrupted_sweep_resumes_with_the_missing_runs(tmp_path):
    store = SweepStore(tmp_path / "rows")
    points = SPEC.points()
    run_sweep(points[:3], store, SerialExecutor())
    report = run_sweep(points, store, SerialExecutor())
    assert (report.num_skipped, report.num_run) == (3, 1)
    assert len(pd.read_parquet(tmp_path / "rows")) == 4


def test_retry_failed_reruns_only_the_error_rows(tmp_path):
    store = SweepStore(tmp_path / "rows")
    run_sweep(SPEC.points(), store, SerialExecutor())
    report = run_sweep(SPEC.points(), store, SerialExecutor(), retry_failed=True)
    assert (report.num_skipped, report.num_run, report.num_errors) == (2, 2, 2)
    assert len(pd.read_parquet(tmp_path / "rows")) == 4


def test_the_process_pool_gives_the_rows_of_the_serial_run(tmp_path):
    serial, pool = SweepStore(tmp_path / "serial"), SweepStore(tmp_path / "pool")
    run_sweep(SPEC.points(), serial, SerialExecutor())
    executor = PoolExecutor(2)
    try:
        run_sweep(SPEC.points(), pool, executor)
    finally:
        executor.close()
    assert comparable(pool.read()) == comparable(serial.read())


def test_a_dying_worker_is_an_error_row_and_the_sweep_goes_on(tmp_path, monkeypatch):
    monkeypatch.setattr(executors_module, "run_point", die_on_fifo)
    points = small_spec(eviction=["fifo", "lru", "lfu"], max_num_seqs=[8, 16]).points()
    executor = PoolExecutor(1)  # two points in flight: both fifo when its worker dies
    try:
        report = run_sweep(points, SweepStore(tmp_path / "rows"), executor)
    finally:
        executor.close()
    frame = pd.read_parquet(tmp_path / "rows")
    assert report.num_run == len(frame) == 6
    fifo = frame["param.eviction"] == "fifo"
    assert frame.loc[fifo, "error"].str.contains("worker process died").all()
    assert (frame.loc[~fifo, "status"] == "ok").all()  # a new pool ran the rest
