"""The simulator as a user runs it: the whole `kvlab sim` process on the full Azure conversation
trace (Llama-2-7B on an A100-80GB, paged blocks of 16, timestamps replayed, `--save-result`),
CPU seconds of the child process (user + system: start-up, imports, trace loading, simulation,
report and result tables), and the start-up alone (`--num-prompts 1`, no tables).

With `--baseline-rev REV` the same commands run, alternated, on an older commit too, so both
sides see the same machine load: each side installed into a temporary folder with
`pip install --no-deps --target` (the older commit's tree, and this working tree too: an
editable install spends about 0.15 s more on start-up, which would count against this side),
put first on PYTHONPATH. Each side's simulated output tokens per
CPU second of the whole process are printed as well. Target (issue 52): at most 2.0 s of CPU.

    .venv/bin/python benchmarks/sim_cli_bench.py [--path TRACE.csv] [--repeats 3]
        [--baseline-rev HEAD~5]
"""

from __future__ import annotations

import argparse
import os
import re
import resource
import subprocess
import sys
import tempfile
from pathlib import Path

DEFAULT_PATH = "/work/shared/traces/azure2023_conv.csv"
TARGET_CPU_S = 2.0
REPO = Path(__file__).resolve().parents[1]
_TOKENS = re.compile(r"Total generated tokens:\s+(\d+)")


def _command(path: str, result_dir: str, *, startup: bool) -> list[str]:
    command = [sys.executable, "-c", "import sys; from kvlab.cli import main; sys.exit(main())",
               "sim", "--dataset-name", "azure", "--dataset-path", path,
               "--model", "llama-2-7b", "--hardware", "a100-80g", "--block-size", "16"]
    if startup:
        return [*command, "--num-prompts", "1"]
    return [*command, "--save-result", "--result-dir", result_dir]


def run_once(path: str, python_path: str | None, *, startup: bool) -> tuple[float, int]:
    """CPU seconds (user + system) of one `kvlab sim` child process, and the output tokens
    its report counts."""
    env = dict(os.environ)
    if python_path is not None:
        env["PYTHONPATH"] = python_path
    with tempfile.TemporaryDirectory() as results:
        before = resource.getrusage(resource.RUSAGE_CHILDREN)
        done = subprocess.run(_command(path, results, startup=startup), env=env, check=True,
                              capture_output=True, text=True)
        after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu_s = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    found = _TOKENS.search(done.stdout)
    return cpu_s, int(found.group(1)) if found else 0


def install_revision(revision: str, folder: Path) -> Path:
    """The tree of `revision` installed (no dependencies) into `folder`/site; its path."""
    source = folder / "src"
    source.mkdir()
    archive = subprocess.run(["git", "-C", str(REPO), "archive", revision], check=True,
                             capture_output=True).stdout
    subprocess.run(["tar", "-x", "-C", str(source)], input=archive, check=True)
    return install_tree(source, folder / "site")


def install_tree(source: Path, site: Path) -> Path:
    """The project at `source` installed (no dependencies) into `site`; `site`."""
    subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-deps",
                    "--no-build-isolation", "--target", str(site), str(source)], check=True)
    return site


def _sides(args: argparse.Namespace, folder: Path) -> list[tuple[str, str | None]]:
    """(name, PYTHONPATH or None for the environment's own install) of each side."""
    if not args.baseline_rev:
        return [("this tree", None)]
    (folder / "old").mkdir()
    return [(args.baseline_rev, str(install_revision(args.baseline_rev, folder / "old"))),
            ("this tree", str(install_tree(REPO, folder / "this")))]


def main() -> None:
    """Run each side's whole command and its start-up alone, alternated, and print them."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--path", default=DEFAULT_PATH, help="Azure conv trace CSV")
    parser.add_argument("--repeats", type=int, default=3, help="runs of each side (>= 1)")
    parser.add_argument("--baseline-rev", default=None, metavar="REV",
                        help="also run this git revision, alternated with this tree")
    args = parser.parse_args()
    if not Path(args.path).is_file():
        parser.error(f"--path {args.path}: no such file; expected the Azure conv trace CSV")
    if args.repeats < 1:
        parser.error(f"--repeats {args.repeats}: expected a whole number >= 1")
    with tempfile.TemporaryDirectory() as scratch:
        sides = _sides(args, Path(scratch))
        whole: dict[str, list[float]] = {name: [] for name, _ in sides}
        startup: dict[str, list[float]] = {name: [] for name, _ in sides}
        tokens: dict[str, int] = {}
        for _ in range(args.repeats):
            for name, python_path in sides:
                cpu_s, tokens[name] = run_once(args.path, python_path, startup=False)
                whole[name].append(cpu_s)
                startup[name].append(run_once(args.path, python_path, startup=True)[0])
    print(f"kvlab sim --save-result on {args.path}: llama-2-7b, a100-80g, paged 16; "
          f"{args.repeats} alternated runs each, CPU s of the whole process (user + system)")
    print(f"{'side':>12} {'whole CPU s':>17} {'start-up CPU s':>17} {'out tokens':>11} "
          f"{'tok / CPU s':>12}")
    for name, _ in sides:
        low, high = min(whole[name]), max(whole[name])
        print(f"{name:>12} {low:>8.2f}-{high:<8.2f} {min(startup[name]):>8.2f}-"
              f"{max(startup[name]):<8.2f} {tokens[name]:>11,} {tokens[name] / low:>12,.0f}")
    best = min(whole["this tree"])
    print(f"this tree: {best:.2f} s at best ({'meets' if best <= TARGET_CPU_S else 'misses'} "
          f"the {TARGET_CPU_S:.1f} s target)")


if __name__ == "__main__":
    main()
