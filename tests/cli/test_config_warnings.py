"""The warnings `kvlab sim` prints about a machine's config, printed by `kvlab sweep` too:
each distinct warning once, with how many of the sweep's runs it concerns."""

from __future__ import annotations

from kvlab.cli import main


def test_sweep_prints_the_platform_and_host_memory_warnings_sim_prints(tmp_path, capsys):
    flags = ["--hardware", "atlas-800t-a2", "--model", "llama-3.1-8b", "--kv-tiers",
             "host:4TiB", "--num-prompts", "5", "--disable-tqdm"]
    assert main(["sim", "--block-size", "16", *flags]) == 0
    sim_warnings = [line for line in capsys.readouterr().err.splitlines()
                    if line.startswith("warning:")]
    assert len(sim_warnings) == 2  # vLLM-Ascend's block size, and the host tier's size
    assert main(["sweep", "--grid", "block_size=16,128", "-o", str(tmp_path / "s.parquet"),
                 *flags]) == 0
    err = capsys.readouterr().err.splitlines()
    swept = [line for line in err if line.startswith("warning:")]
    assert swept == [f"{sim_warnings[0]} (1 of 2 runs)", f"{sim_warnings[1]} (2 of 2 runs)"]
