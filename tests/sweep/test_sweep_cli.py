"""`kvlab sweep` end to end: rows in a Parquet folder, re-runs that skip, and every bad input
as one line naming the flag, file or line."""

import subprocess
import sys

import pandas as pd
import pytest

from kvlab.cli import main

SMALL = ["--num-prompts", "30", "--time-scale", "8", "--disable-tqdm"]


def sweep(*argv):
    return main(["sweep", *SMALL, *argv])


def test_a_grid_sweep_writes_its_rows_and_prints_them(tmp_path, capsys):
    out = tmp_path / "rows"
    assert sweep("--grid", "max_num_seqs=4,64", "--grid", "eviction=none,lru", "-o",
                 str(out), "--workers", "2") == 0
    printed = capsys.readouterr().out
    frame = pd.read_parquet(out)
    assert len(frame) == 4 and (frame["status"] == "ok").all()
    assert sorted(frame["param.max_num_seqs"]) == [4, 4, 64, 64]
    assert (frame["param.time_scale"] == 8.0).all()  # a flag is a setting of every run
    assert "max_num_seqs  eviction" in printed and "4 runs simulated" in printed


def test_a_swept_setting_asked_for_by_show_is_printed_once(tmp_path, capsys):
    """max_num_seqs is a summary key too: the table prints it once, as the setting."""
    assert sweep("--grid", "max_num_seqs=4,64", "--show", "max_num_seqs,output_throughput",
                 "-o", str(tmp_path / "rows"), "--workers", "1") == 0
    header = next(line for line in capsys.readouterr().out.splitlines()
                  if "output_throughput" in line)
    assert header.split() == ["max_num_seqs", "output_throughput"]


def test_a_rerun_skips_the_stored_runs_and_force_redoes_them(tmp_path, capsys):
    out = str(tmp_path / "rows")
    assert sweep("--grid", "max_num_seqs=4,64", "-o", out, "--workers", "1") == 0
    assert sweep("--grid", "max_num_seqs=4,64,128", "-o", out, "--workers", "1") == 0
    assert "1 runs simulated" in capsys.readouterr().out.splitlines()[-2]
    assert sweep("--grid", "max_num_seqs=4,64,128", "-o", out, "--force", "--workers", "1") == 0
    assert "3 runs simulated" in capsys.readouterr().out
    assert len(pd.read_parquet(out)) == 3


def test_a_sweep_file_with_a_sample_writes_next_to_it(tmp_path, capsys):
    spec = tmp_path / "study.yaml"
    spec.write_text("base:\n  num_prompts: 20\ngrid:\n  block_size: [8, 16, 32, 64]\n"
                    "  policy: [paged, buddy]\nsample: 3\nsample_seed: 1\n")
    assert main(["sweep", str(spec), "--disable-tqdm", "--workers", "1"]) == 0
    frame = pd.read_parquet(tmp_path / "study.parquet")
    assert len(frame) == 3 and frame["run_key"].is_unique
    assert main(["sweep", str(spec), "--dry-run"]) == 0
    assert "3 runs (8 in the grid); 0 to simulate, 3 stored" in capsys.readouterr().out


def test_a_flag_replaces_the_files_grid_for_its_setting(tmp_path):
    spec = tmp_path / "study.yaml"
    spec.write_text("grid:\n  block_size: [8, 16]\n  max_num_seqs: [4, 8]\n")
    assert main(["sweep", str(spec), *SMALL, "--block-size", "32", "--workers", "1"]) == 0
    frame = pd.read_parquet(tmp_path / "study.parquet")
    assert sorted(frame["page_size"]) == [32, 32]


@pytest.mark.parametrize(("argv", "message"), [
    (["--grid", "blocksize=16"],
     "--grid blocksize=16: unknown setting 'blocksize'; did you mean block_size"),
    (["--grid", "max_num_seqs=8,lots"],
     "--grid max_num_seqs=8,lots: max_num_seqs 'lots': expected a whole number"),
    (["--grid", "policy=paged,pagd"], "unknown kind 'pagd'"),
    (["--max-num-seqs", "0"], "--max-num-seqs is 0; expected a whole number >= 1"),
    (["--sample", "0"], "--sample 0: expected a whole number of runs >= 1"),
    (["--address", "auto"], "--address is the Ray cluster's: add --executor ray"),
    (["--workers", "0"], "--workers 0: expected a whole number >= 1"),
    (["no-such.yaml"], "no-such.yaml: cannot read the sweep file"),
])
def test_bad_input_is_one_line_naming_the_flag(tmp_path, capsys, argv, message):
    assert sweep(*argv, "-o", str(tmp_path / "rows")) == 2
    err = capsys.readouterr().err
    assert message in err, err
    assert err.count("\n") == 1 and err.startswith("kvlab sweep: error: ")
    assert not (tmp_path / "rows").exists()


def test_a_bad_sweep_file_is_one_line_with_its_line(tmp_path, capsys):
    spec = tmp_path / "bad.yaml"
    spec.write_text("grid:\n  max_num_seqs: [8, 16]\n  eviction: [lru, sometimes]\n")
    assert main(["sweep", str(spec)]) == 2
    err = capsys.readouterr().err
    assert f"kvlab sweep: error: {spec}, line 3: policy paged: eviction='sometimes'" in err
    assert err.count("\n") == 1


def test_the_ray_executor_without_ray_says_how_to_install_it(tmp_path, capsys, monkeypatch):
    monkeypatch.setitem(sys.modules, "ray", None)  # `import ray` raises ImportError
    assert sweep("--executor", "ray", "-o", str(tmp_path / "rows")) == 2
    err = capsys.readouterr().err
    assert "executor ray needs Ray, which is not installed: pip install 'kvlab[sweep]'" in err


def test_a_local_sweep_imports_neither_ray_nor_torch(tmp_path):
    code = f"""
import sys
class Block:
    def find_spec(self, name, path=None, target=None):
        if name.split('.')[0] in ('ray', 'torch', 'triton'):
            raise ImportError('blocked: ' + name)
sys.meta_path.insert(0, Block())
from kvlab.cli import main
assert main(['sweep', '--num-prompts', '10', '--grid', 'block_size=16,32', '-o',
             {str(tmp_path / 'rows')!r}, '--disable-tqdm']) == 0
assert not {{'ray', 'torch'}} & set(sys.modules)
print('ok')
"""
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert result.returncode == 0, result.stderr
    assert result.stdout.endswith("ok\n")
