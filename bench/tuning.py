"""``tune``'s wall time, cores used and memory at concurrency 1, 2 and 4, and its overhead.

The workload is the main job's (``samples/main_job.py``): FedAvg of the tutorial's
softmax regression on scikit-learn's digits split by writer, 10 training writers a round,
5 local epochs of batches of 5, server SGD 1.0, evaluated every round on the 4 held-out
writers. A study of ``--trials`` trials (default 8) of ``--rounds`` rounds each tunes the
client learning rate (log-uniform in [0.005, 0.5], TPE's random start-up phase over every
trial, no pruning), so every trial's parameters, and its rounds, are the same at every
concurrency. The factory builds each trial's processes, as a user's would. The runs, each
in a fresh subprocess (so that its peak memory is its own):

- ``tune`` at each ``--concurrency`` (default 1, 2, 4);
- by hand: the same trials, parameters and ``train_model`` calls with the managers a
  trial has (file state, CSV metrics, one-round evaluations that training waits for,
  model files), without tuner or Optuna, one after another and, as a measure of what the
  machine can overlap, at each ``--hand-concurrency`` above 1 (default 2) in an anyio
  task group.

Each run first imports TensorFlow (and Optuna for ``tune``), loads the data and trains
one untimed warm-up round by hand (the process's first-use costs), then times from there,
in the federated context, until the last trial has ended. Cores used = the process's CPU
time over that time; peak RSS = the highest resident memory sampled every 10 ms meanwhile,
and "added" = that peak less the RSS when the timing started.

Every configuration runs ``--repeats`` times (default 2), the configurations alternating.
Prints a Markdown table and one JSON line: per configuration the median wall time, its
speed-up against concurrency 1 (``tune`` against ``tune``, by hand against by hand), cores
used, peak and added memory; the tuner's overhead per trial, (``tune`` at concurrency 1
- by hand) / trials, in ms and as a share of a trial, and the part of it spent awaiting
the study's storage and locks (timed around the tuner's private ``StudyStore.call``: the
direct cost, which the difference of two noisy wall times cannot resolve); whether every
run's trials ended with the same held-out accuracies; the 1-minute load average the runs
started at. Exits 1 if a run's trials got other parameters than the first run's.

    python bench/tuning.py [--trials 8] [--rounds 30] [--concurrency 1,2,4]
                           [--hand-concurrency 2] [--repeats 2] [--short]

``--short`` (CI): 4 trials of 2 rounds, ``tune`` at concurrency 1 and 2, by hand at 1
and 2, once each (under a minute on 2 shared cores; the whole bench 3-6 minutes).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")


def run_in_subprocess(
    kind: str, concurrency: int, arguments: argparse.Namespace, root: Path, rates: list[float]
) -> dict[str, Any]:
    """Run one configuration in a fresh Python; its JSON line."""
    command = [
        sys.executable,
        str(Path(__file__).resolve()),
        f"--worker={kind}",
        f"--run={concurrency}",
        f"--trials={arguments.trials}",
        f"--rounds={arguments.rounds}",
        f"--root={root}",
        f"--rates={json.dumps(rates)}",
    ]
    done = subprocess.run(command, capture_output=True, text=True, check=False)
    lines = [line for line in done.stdout.splitlines() if line.startswith("{")]
    if done.returncode != 0 or not lines:
        sys.exit(
            f"bench/tuning.py: the {kind} run at concurrency {concurrency} failed:\n"
            f"{done.stderr[-3000:]}"
        )
    return json.loads(lines[-1])


def configurations(arguments: argparse.Namespace) -> list[tuple[str, int]]:
    """The runs of one repeat in order: one at a time first, then each concurrency."""
    order = [("tuner", 1), ("hand", 1)]
    for concurrency in sorted(set(arguments.concurrency + arguments.hand_concurrency) - {1}):
        if concurrency in arguments.concurrency:
            order.append(("tuner", concurrency))
        if concurrency in arguments.hand_concurrency:
            order.append(("hand", concurrency))
    return order


def row(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """One configuration's repeats as one row: medians, and the highest peak."""
    walls = [run["wall_s"] for run in runs]
    return {
        "run": runs[0]["run"],
        "concurrency": runs[0]["concurrency"],
        "wall_s": round(statistics.median(walls), 3),
        "wall_s_each": walls,
        "cores_used": round(statistics.median(run["cores_used"] for run in runs), 2),
        "rss_before_mib": round(statistics.median(run["rss_before_mib"] for run in runs), 1),
        "peak_rss_mib": max(run["peak_rss_mib"] for run in runs),
        "added_rss_mib": round(statistics.median(run["added_rss_mib"] for run in runs), 1),
        "storage_s": None
        if runs[0]["storage_s"] is None
        else round(statistics.median(run["storage_s"] for run in runs), 3),
        "storage_calls": runs[0]["storage_calls"],
    }


def summarize(runs: list[dict[str, Any]], arguments: argparse.Namespace) -> dict[str, Any]:
    """The rows with their speed-ups against concurrency 1, the tuner's overhead per trial."""
    rows = [
        row([run for run in runs if (run["run"], run["concurrency"]) == configuration])
        for configuration in configurations(arguments)
    ]
    one = {item["run"]: item for item in rows if item["concurrency"] == 1}
    for item in rows:
        item["speed_up"] = round(one[item["run"]]["wall_s"] / item["wall_s"], 2)
    overhead = (one["tuner"]["wall_s"] - one["hand"]["wall_s"]) / arguments.trials
    per_trial = one["hand"]["wall_s"] / arguments.trials
    storage = one["tuner"]["storage_s"] / arguments.trials
    loads = [run["load_average"] for run in runs]
    return {
        "benchmark": "tuning",
        "trials": arguments.trials,
        "rounds": arguments.rounds,
        "repeats": arguments.repeats,
        "client_lrs": runs[0]["client_lrs"],
        "rows": rows,
        "hand_trial_s": round(per_trial, 3),
        "tuner_overhead_per_trial_ms": round(overhead * 1000, 1),
        "tuner_overhead_per_trial_pct": round(100 * overhead / per_trial, 2),
        "tuner_storage_per_trial_ms": round(storage * 1000, 1),
        "tuner_storage_per_trial_pct": round(100 * storage / per_trial, 2),
        "same_parameters": all(run["client_lrs"] == runs[0]["client_lrs"] for run in runs),
        "same_accuracies": all(run["accuracies"] == runs[0]["accuracies"] for run in runs),
        "load_average_1min": [min(loads), max(loads)],
        "cpus": os.cpu_count(),
    }


def print_table(summary: dict[str, Any]) -> None:
    """The rows as a Markdown table, and the overhead line."""
    print("| run | concurrency | wall s | speed-up | cores used | peak RSS MiB | added MiB |")
    print("|---|---|---|---|---|---|---|")
    for item in summary["rows"]:
        name = "tune" if item["run"] == "tuner" else "by hand"
        print(
            f"| {name} | {item['concurrency']} | {item['wall_s']:.1f} | {item['speed_up']:.2f}x "
            f"| {item['cores_used']:.2f} | {item['peak_rss_mib']:.0f} "
            f"| {item['added_rss_mib']:.0f} |"
        )
    low, high = summary["load_average_1min"]
    print(
        f"tuner overhead per trial (tune at 1 - by hand at 1): "
        f"{summary['tuner_overhead_per_trial_ms']:.1f} ms, "
        f"{summary['tuner_overhead_per_trial_pct']:.2f} % of a {summary['hand_trial_s']:.2f} s "
        f"trial; of which awaiting the study's storage: "
        f"{summary['tuner_storage_per_trial_ms']:.1f} ms, "
        f"{summary['tuner_storage_per_trial_pct']:.2f} %"
    )
    print(
        f"same accuracies in every run: {summary['same_accuracies']}; "
        f"load average {low:.1f}-{high:.1f} on {summary['cpus']} CPUs"
    )


def integers(text: str) -> list[int]:
    """A comma-separated list of positive integers."""
    values = [int(part) for part in text.split(",") if part.strip()]
    if not values or min(values) < 1:
        raise argparse.ArgumentTypeError(f"expected positive integers, got {text!r}")
    return values


def parse(argv: list[str] | None = None) -> argparse.Namespace:
    """The flags; ``--short`` replaces trials, rounds and concurrencies with CI's."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--trials", type=int, default=8)
    parser.add_argument("--rounds", type=int, default=30, help="rounds per trial")
    parser.add_argument("--concurrency", type=integers, default=[1, 2, 4])
    parser.add_argument("--hand-concurrency", type=integers, default=[2])
    parser.add_argument("--repeats", type=int, default=2, help="runs of each configuration")
    parser.add_argument("--short", action="store_true", help="CI: 4 trials, 2 rounds, 1 and 2")
    parser.add_argument("--worker", choices=["tuner", "hand"], help=argparse.SUPPRESS)
    parser.add_argument("--run", type=int, default=1, help=argparse.SUPPRESS)
    parser.add_argument("--root", type=Path, help=argparse.SUPPRESS)
    parser.add_argument("--rates", default="", help=argparse.SUPPRESS)
    arguments = parser.parse_args(argv)
    if arguments.short:
        arguments.trials, arguments.rounds = 4, 2
        arguments.concurrency, arguments.hand_concurrency, arguments.repeats = [1, 2], [2], 1
    if min(arguments.trials, arguments.rounds, arguments.repeats) < 1:
        parser.error("--trials, --rounds and --repeats must be at least 1")
    return arguments


def main() -> None:
    arguments = parse()
    if arguments.worker is not None:
        import anyio
        from _tuning_run import worker

        print(json.dumps(anyio.run(worker, arguments)))
        return
    runs: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory(prefix="tuning_bench_") as scratch:
        for repeat in range(arguments.repeats):
            for kind, concurrency in configurations(arguments):
                root = Path(scratch) / f"{kind}_{concurrency}_{repeat}"
                rates = runs[0]["client_lrs"] if runs else []
                runs.append(run_in_subprocess(kind, concurrency, arguments, root, rates))
                print(
                    f"{kind} at concurrency {concurrency}: {runs[-1]['wall_s']:.1f} s",
                    file=sys.stderr,
                    flush=True,
                )
    summary = summarize(runs, arguments)
    print_table(summary)
    print(json.dumps(summary))
    if not summary["same_parameters"]:
        sys.exit("bench/tuning.py: the runs' trials had different parameters")


if __name__ == "__main__":
    main()
