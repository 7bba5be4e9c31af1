"""A bench script of this tree against the same script of another revision, in one run.

Checks the revision ``--against`` out beside this tree (a temporary ``git worktree``,
its compiled extension built in place), then runs the script given after ``--`` from
each tree in turn, ``--pairs`` times, alternating which tree goes first, so that a
machine that gets busier or quieter during the run weighs on both alike. Each run is a
process of its own whose last line of output is the script's JSON (``rows``: a list of
dicts); the figures named by ``--keys`` are read from each row, the rows told apart by
``--row-key``. For every figure it prints the median over the pairs of new/old, the
spread of those ratios (minimum, quartiles, maximum) and both medians. It reports, it
does not gate.

    python bench/studies/side_by_side.py --against 996c7b0 --pairs 7 \\
        -- bench/fedavg_vs_tff.py --skip-tff --clients 10 100 --repeats 1

``--old-script`` gives the script's path in the old revision where it moved.
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

ROOT = Path(__file__).resolve().parents[2]


def checkout(revision: str, tree: Path) -> None:
    """A work tree of ``revision`` at ``tree``, its extension built where it has one."""
    subprocess.run(
        ["git", "-C", str(ROOT), "worktree", "add", "--detach", str(tree), revision],
        check=True,
        capture_output=True,
    )
    if (tree / "setup.py").exists():
        built = subprocess.run(
            [sys.executable, "setup.py", "build_ext", "--inplace"],
            cwd=tree,
            capture_output=True,
            text=True,
        )
        if built.returncode != 0:  # Cython is in the dev extra
            sys.exit(f"side_by_side: building {revision}'s extension failed:\n{built.stderr}")


def run_once(tree: Path, script: str, arguments: list[str]) -> list[dict[str, Any]]:
    """The ``rows`` of one run of ``script`` in ``tree``."""
    environment = {**os.environ, "PYTHONPATH": str(tree)}
    done = subprocess.run(
        [sys.executable, script, *arguments],
        cwd=tree,
        env=environment,
        capture_output=True,
        text=True,
    )
    if done.returncode != 0:
        sys.exit(f"side_by_side: {script} in {tree} failed:\n{done.stderr[-3000:]}")
    last = done.stdout.strip().splitlines()[-1]
    return json.loads(last)["rows"]


def figures(rows: list[dict[str, Any]], row_key: str, keys: list[str]) -> dict[str, float]:
    """``{"<row>/<key>": value}`` for every row and every key it has."""
    return {f"{row[row_key]}/{key}": float(row[key]) for row in rows for key in keys if key in row}


def summary(old: list[dict[str, float]], new: list[dict[str, float]]) -> dict[str, Any]:
    """Per figure: the median new/old ratio over the pairs, its spread, both medians."""
    result = {}
    for name in old[0]:
        ratios = sorted(n[name] / o[name] for o, n in zip(old, new, strict=True))
        quartiles = statistics.quantiles(ratios, n=4) if len(ratios) > 1 else ratios * 3
        result[name] = {
            "ratio_median": statistics.median(ratios),
            "ratio_min": ratios[0],
            "ratio_q1": quartiles[0],
            "ratio_q3": quartiles[2],
            "ratio_max": ratios[-1],
            "old_median": statistics.median(o[name] for o in old),
            "new_median": statistics.median(n[name] for n in new),
        }
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--against", required=True, metavar="REVISION")
    parser.add_argument("--pairs", type=int, default=7)
    parser.add_argument("--old-script", help="the script's path in the old revision")
    parser.add_argument("--row-key", default="clients")
    parser.add_argument(
        "--keys", nargs="+", default=["ours_bare_median_ms", "ours_program_median_ms"]
    )
    parser.add_argument("command", nargs=argparse.REMAINDER)
    arguments = parser.parse_args()
    command = arguments.command[1:] if arguments.command[:1] == ["--"] else arguments.command
    if not command:
        parser.error("give the script to run after --")
    script, script_arguments = command[0], command[1:]
    old_script = arguments.old_script or script
    with tempfile.TemporaryDirectory(prefix="side_by_side_") as scratch:
        old_tree = Path(scratch) / "old"
        try:
            checkout(arguments.against, old_tree)
            old, new = [], []
            for pair in range(arguments.pairs):
                order = [("old", old_tree, old_script), ("new", ROOT, script)]
                for label, tree, path in order if pair % 2 == 0 else order[::-1]:
                    rows = run_once(tree, path, script_arguments)
                    (old if label == "old" else new).append(
                        figures(rows, arguments.row_key, arguments.keys)
                    )
                print(f"# pair {pair + 1} of {arguments.pairs} done", file=sys.stderr)
        finally:
            subprocess.run(
                ["git", "-C", str(ROOT), "worktree", "remove", "--force", str(old_tree)],
                capture_output=True,
            )
    result = summary(old, new)
    for name, row in result.items():
        print(
            f"{name:40s} new/old {row['ratio_median']:.3f} "
            f"(min {row['ratio_min']:.3f}, q1 {row['ratio_q1']:.3f}, "
            f"q3 {row['ratio_q3']:.3f}, max {row['ratio_max']:.3f}); "
            f"medians old {row['old_median']:.2f}, new {row['new_median']:.2f}"
        )
    print(
        json.dumps(
            {
                "benchmark": "side by side",
                "against": arguments.against,
                "command": command,
                "pairs": arguments.pairs,
                "figures": result,
            }
        )
    )


if __name__ == "__main__":
    main()
