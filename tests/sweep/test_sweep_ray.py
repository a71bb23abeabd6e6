"""The Ray executor on a local Ray instance of two CPUs gives the local pool's rows."""

import pytest

from kvlab.sweep import PoolExecutor, SweepStore, run_sweep

from .sweep_cases import comparable, small_spec

ray = pytest.importorskip("ray", reason="Ray is not installed (pip install 'kvlab[sweep]')")


@pytest.fixture(scope="module")
def local_ray():
    ray.init(num_cpus=2, include_dashboard=False, logging_level="WARNING")
    try:
        yield
    finally:
        ray.shutdown()


def test_a_sweep_on_ray_gives_the_rows_of_the_local_pool(tmp_path, local_ray):
    from kvlab.sweep.ray_executor import RayExecutor

    # 12 runs, 6 of them failing (max_model_len over llama-2-7b's 4,096)
    points = small_spec(policy=["paged", "contiguous:reserve=max", "buddy"],
                        max_num_seqs=[8, 64], max_model_len=[2048, 100_000]).points()
    on_ray, local = SweepStore(tmp_path / "ray"), SweepStore(tmp_path / "local")
    executor = RayExecutor()
    try:
        report = run_sweep(points, on_ray, executor)
    finally:
        executor.close()
    pool = PoolExecutor(2)
    try:
        run_sweep(points, local, pool)
    finally:
        pool.close()
    assert (report.num_run, report.num_errors) == (12, 6)
    assert comparable(on_ray.read()) == comparable(local.read())
    assert ray.is_initialized()  # the executor leaves an instance it did not start running


def test_tune_on_ray_ranks_as_on_this_process(local_ray):
    from kvlab.sweep import SearchOptions, SerialExecutor, tune
    from kvlab.sweep.ray_executor import RayExecutor

    candidates = [{"num_prompts": 40, "policy": p} for p in ("paged", "contiguous:reserve=max")]
    options = SearchOptions(start_rate=4.0, rate_tolerance=0.2, max_rate=256.0)
    slos = {"ttft": 2000.0, "tpot": 100.0}
    executor = RayExecutor()
    try:
        on_ray = tune(candidates, slos, executor, options=options)
    finally:
        executor.close()
    here = tune(candidates, slos, SerialExecutor(), options=options)
    assert on_ray.equals(here)
