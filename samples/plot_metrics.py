"""Draws a run's training and held-out loss and accuracy over rounds to a PNG.

    python samples/plot_metrics.py runs/main_job [--output runs/main_job/metrics.png]

Reads the ``metrics.csv`` and ``evaluation.csv`` that ``samples/main_job.py`` writes.
A DP run's (whose ``metrics.csv`` has ``privacy/epsilon``) gets a third panel: the
held-out accuracy of each evaluated round against the epsilon spent by that round.
"""

from __future__ import annotations

import argparse
import csv
import sys
from pathlib import Path

TRAIN = "client_work/train/{}"
HELD_OUT = "client_work/eval/current_round_metrics/{}"
PANELS = (("loss", "loss"), ("sparse_categorical_accuracy", "accuracy"))
EPSILON = "privacy/epsilon"


def read_curves(path: Path, column: str) -> dict[str, tuple[list[int], list[float]]]:
    """``{metric: (rounds, values)}`` for each metric of ``PANELS`` in the CSV at ``path``."""
    with path.open(newline="") as file:
        rows = sorted(csv.DictReader(file), key=lambda row: int(row["key"]))
    curves = {}
    for metric, _ in PANELS:
        name = column.format(metric)
        if rows and name not in rows[0]:
            raise ValueError(f"{path} has no column {name!r}")
        curves[metric] = ([int(row["key"]) for row in rows], [float(row[name]) for row in rows])
    return curves


def read_epsilons(path: Path) -> dict[int, float] | None:
    """``{round: epsilon}`` from the CSV at ``path`` (round 0 spent none), or None without
    a ``privacy/epsilon`` column."""
    with path.open(newline="") as file:
        rows = list(csv.DictReader(file))
    if not rows or EPSILON not in rows[0]:
        return None
    return {0: 0.0, **{int(row["key"]): float(row[EPSILON]) for row in rows if row[EPSILON]}}


def accuracy_against_epsilon(
    epsilons: dict[int, float], path: Path
) -> tuple[list[float], list[float]]:
    """The held-out accuracies of the CSV at ``path`` with the epsilon of their round, by
    round (rounds without an epsilon are left out)."""
    if not path.exists():
        return [], []
    curve = read_curves(path, HELD_OUT)["sparse_categorical_accuracy"]
    pairs = [(epsilons[key], value) for key, value in zip(*curve, strict=True) if key in epsilons]
    return [epsilon for epsilon, _ in pairs], [value for _, value in pairs]


def plot(root: Path, output: Path) -> Path:
    """Draw the curves of the run in ``root`` to ``output``; return ``output``."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    sources = [
        ("train", root / "metrics.csv", TRAIN),
        ("held-out", root / "evaluation.csv", HELD_OUT),
    ]
    epsilons = read_epsilons(root / "metrics.csv") if (root / "metrics.csv").exists() else None
    panels = len(PANELS) + (0 if epsilons is None else 1)
    figure, axes = plt.subplots(1, panels, figsize=(5.5 * panels, 4), constrained_layout=True)
    for label, path, column in sources:
        if not path.exists():
            if label == "train":
                raise FileNotFoundError(
                    f"{path} does not exist: is {root} a main_job run directory?"
                )
            continue
        curves = read_curves(path, column)
        for axis, (metric, title) in zip(axes[: len(PANELS)], PANELS, strict=True):
            rounds, values = curves[metric]
            axis.plot(rounds, values, marker="." if label == "held-out" else None, label=label)
            axis.set_title(title)
            axis.set_xlabel("round")
            axis.grid(alpha=0.3)
            axis.legend()
    if epsilons is not None:
        axis = axes[-1]
        axis.plot(*accuracy_against_epsilon(epsilons, root / "evaluation.csv"), marker=".")
        axis.set_title("held-out accuracy against privacy spent")
        axis.set_xlabel("epsilon")
        axis.set_ylabel("accuracy")
        axis.grid(alpha=0.3)
    figure.suptitle(f"federated training: {root}")
    output.parent.mkdir(parents=True, exist_ok=True)
    figure.savefig(output, dpi=100)
    plt.close(figure)
    return output


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description="Plot a main_job run's metrics to a PNG.")
    parser.add_argument("root", type=Path, help="the run directory (main_job's --root)")
    parser.add_argument("--output", type=Path, help="the PNG to write (default: ROOT/metrics.png)")
    arguments = parser.parse_args(argv)
    try:
        written = plot(arguments.root, arguments.output or arguments.root / "metrics.png")
    except (FileNotFoundError, ValueError) as error:
        sys.exit(f"plot_metrics: {error}")
    print(written)


if __name__ == "__main__":
    main()
