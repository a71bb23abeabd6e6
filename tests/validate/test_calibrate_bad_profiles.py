"""`kvlab calibrate` refuses a profile it cannot fit honestly (issue 15): a negative, NaN or
absurd step time names its file, line and column; a profile with no step left to fit names the
file and --skip-first-steps. Exit 2, no cost model written."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from kvlab.cli import main
from kvlab.metrics.records import FLOAT_COLUMNS, STEP_COLUMNS


def _profile(path, wall_times):
    rows = {column: np.ones(len(wall_times), dtype=np.int64) for column in STEP_COLUMNS}
    for column in FLOAT_COLUMNS:
        rows[column] = np.full(len(wall_times), 0.01)
    for column in ("num_swap_out_pages", "num_swap_in_pages", "num_swap_out_transfers",
                   "num_swap_in_transfers", "num_copied_pages"):
        rows[column] = np.zeros(len(wall_times), dtype=np.int64)
    rows["wall_time_s"] = np.asarray(wall_times, dtype=float)
    pd.DataFrame(rows).to_csv(path, index=False)
    return path


@pytest.mark.parametrize("bad, shown", [(-1.0, "-1.0"), (float("nan"), "nan"),
                                        (1e308, "1e+308")])
def test_a_bad_step_time_names_file_line_and_column(tmp_path, capsys, bad, shown):
    path = _profile(tmp_path / "run.steps.csv", [0.01, 0.01, bad, 0.01])
    out = tmp_path / "cm.json"
    assert main(["calibrate", str(path), "-o", str(out)]) == 2
    err = capsys.readouterr().err
    assert f"{path} line 4, column wall_time_s: {shown}; expected seconds" in err
    assert not out.exists()


def test_nothing_left_to_fit_names_the_file_and_the_flag(tmp_path, capsys):
    path = _profile(tmp_path / "run.steps.csv", [0.01] * 3)
    assert main(["calibrate", str(path), "-o", str(tmp_path / "cm.json"),
                 "--skip-first-steps", "3"]) == 2
    err = capsys.readouterr().err
    assert str(path) in err and "--skip-first-steps 3" in err
