"""The main job's memory and start-up time beside ``import tensorflow`` and TFF, in one run.

Each measurement is a fresh process:

- **floor**: ``python -c "import tensorflow"``: its peak RSS (``ru_maxrss`` of the
  reaped child) and wall time;
- **main job**: ``samples/main_job.py --rounds 10`` (digits, defaults) in a temporary
  root: peak RSS, and the time from starting the process to the first finished round,
  seen as the first row of its ``metrics.csv`` (polled every 10 ms); then rounds 2-10;
- **TFF**: ``../shared/anchors/tff_fedavg.py --rounds 1`` in the TFF venv (its own
  synthetic 10 clients of 100 examples, 784 features; the main job's digits are 64):
  time from start to its JSON line (import + build + first round), the build+init
  seconds it prints, and its peak RSS (the Python process, and its process tree sampled);
- **long run**: the main job with ``--rounds 1000 --eval-every 1000``: its RSS sampled
  when ``metrics.csv`` reaches rounds 10, 100 and 1,000, and the mean round time
  between rounds 10 and 1,000;
- **imports**: ``python -X importtime samples/main_job.py --rounds 1 --verbose``: the
  modules that took longest (cumulative), and whether Matplotlib, scikit-learn, SciPy,
  TensorBoard, tensorboardX, Ray or Optuna were imported at all.

``--baseline-main-job PATH`` also runs another checkout's ``main_job.py`` (with that
checkout on ``PYTHONPATH``) for the 10-round measurement, for a before/after in one run.
Prints a table and one JSON line. Other work on the machine moves the figures: compare
rows of one run.

    python bench/startup_memory.py [--short] [--skip-tff] [--long-rounds 1000]
        [--tff-python /work/venv-tff/bin/python] [--baseline-main-job PATH]

In CI: ``python bench/startup_memory.py --short`` (no long run, no TFF).
"""

from __future__ import annotations

import argparse
import ast
import json
import os
import re
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import psutil

ROOT = Path(__file__).resolve().parent.parent
MAIN_JOB = ROOT / "samples" / "main_job.py"
ANCHORS = ROOT.parent / "shared" / "anchors"
WATCHED = ("matplotlib", "sklearn", "scipy", "tensorboard", "tensorboardX", "ray", "optuna")
MB = 2**20


def _rows(path: Path) -> int:
    """The data rows of a CSV file being written (0 while it is absent)."""
    try:
        with path.open("rb") as file:
            return max(0, sum(1 for _ in file) - 1)
    except FileNotFoundError:
        return 0


def _tree_rss(process: psutil.Process) -> int:
    try:
        tree = [process, *process.children(recursive=True)]
    except psutil.NoSuchProcess:
        return 0
    total = 0
    for member in tree:
        try:
            total += member.memory_info().rss
        except psutil.NoSuchProcess:
            pass
    return total


def run_process(
    command: list[str],
    *,
    env: dict[str, str] | None = None,
    csv: Path | None = None,
    marks: tuple[int, ...] = (),
    stdout_line: str | None = None,
) -> dict[str, Any]:
    """Run ``command`` to its end in a session of its own, sampling it every 10 ms.

    Returns its exit status, wall seconds, peak RSS in MB (``ru_maxrss``), the peak RSS
    of its process tree as sampled, the seconds at which ``csv`` reached each row count
    of ``marks`` with the RSS then, and the seconds at which a stdout line starting with
    ``stdout_line`` was printed (with that line). What is left of its session is ended.
    """
    result: dict[str, Any] = {"marks": {}, "tree_peak_mb": 0.0}
    start = time.perf_counter()
    child = subprocess.Popen(
        command,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
        start_new_session=True,
    )
    process = psutil.Process(child.pid)
    done = threading.Event()

    def sample() -> None:
        pending = list(marks)
        while not done.is_set():
            rss = _tree_rss(process)
            result["tree_peak_mb"] = max(result["tree_peak_mb"], rss / MB)
            if csv is not None and pending:
                rows = _rows(csv)
                while pending and rows >= pending[0]:
                    result["marks"][pending.pop(0)] = (time.perf_counter() - start, rss / MB)
            time.sleep(0.01)

    def read() -> None:
        assert child.stdout is not None
        for line in child.stdout:
            if stdout_line is not None and line.startswith(stdout_line) and "line" not in result:
                result["line_s"], result["line"] = time.perf_counter() - start, line
                try:
                    os.killpg(child.pid, signal.SIGTERM)  # TFF's worker keeps stdout open
                except ProcessLookupError:
                    pass

    sampler, reader = threading.Thread(target=sample), threading.Thread(target=read)
    sampler.start()
    reader.start()
    _, status, usage = os.wait4(child.pid, 0)
    result["wall_s"] = time.perf_counter() - start
    done.set()
    sampler.join()
    try:
        os.killpg(child.pid, signal.SIGTERM)
    except ProcessLookupError:
        pass
    reader.join()
    child.returncode = os.waitstatus_to_exitcode(status)
    result["returncode"] = child.returncode
    result["peak_mb"] = usage.ru_maxrss / 1024
    return result


def _env(pythonpath: Path) -> dict[str, str]:
    return {**os.environ, "PYTHONPATH": str(pythonpath)}


def measure_floor() -> dict[str, Any]:
    run = run_process([sys.executable, "-c", "import tensorflow"], env=_env(ROOT))
    return {"peak_mb": run["peak_mb"], "wall_s": run["wall_s"]}


def measure_main_job(
    main_job: Path, rounds: int, marks: tuple[int, ...], span: tuple[int, int]
) -> dict[str, Any]:
    """The main job's ``rounds`` rounds in a temporary root, sampled at row counts ``marks``,
    with the mean round time between the marks ``span`` names (``round_ms``)."""
    with tempfile.TemporaryDirectory() as root:
        command = [sys.executable, str(main_job), "--rounds", str(rounds), "--root", root]
        if rounds > 10:
            command += ["--eval-every", str(rounds)]
        run = run_process(
            command, env=_env(main_job.parent.parent), csv=Path(root) / "metrics.csv", marks=marks
        )
    if run["returncode"] != 0:
        raise SystemExit(f"{main_job} exited with {run['returncode']}")
    first_s = run["marks"][1][0]
    figures = {"peak_mb": run["peak_mb"], "first_round_s": first_s, "wall_s": run["wall_s"]}
    if 10 in run["marks"]:  # the split at round 1 moves with when round 0's evaluation compiles
        figures["round_10_s"] = run["marks"][10][0]
    figures["rss_at_round_mb"] = {str(mark): rss for mark, (_, rss) in run["marks"].items()}
    low, high = span
    between = run["marks"][high][0] - run["marks"][low][0]
    # None when one poll saw both (a slow poll on a busy machine)
    figures["round_ms"] = 1000 * between / (high - low) if between else None
    figures["round_ms_span"] = list(span)
    return figures


def measure_tff(python: str) -> dict[str, Any]:
    command = [python, str(ANCHORS / "tff_fedavg.py"), "--rounds", "1"]
    run = run_process(command, stdout_line="{")
    if "line" not in run:
        raise SystemExit(f"the TFF anchor printed no JSON line (exit {run['returncode']})")
    printed = json.loads(run["line"])
    return {
        "first_round_s": run["line_s"],
        "build_init_s": printed["build_init_s"],
        "round_s": printed["round_s"][0],
        "peak_mb": run["peak_mb"],
        "tree_peak_mb": run["tree_peak_mb"],
    }


_RUN_AND_LIST = """
import atexit, os, runpy, sys
atexit.register(lambda: print("MODULES", sorted({m.partition(".")[0] for m in sys.modules})))
sys.argv = sys.argv[1:]
sys.path[0] = os.path.dirname(os.path.abspath(sys.argv[0]))  # as `python script` sets it
runpy.run_path(sys.argv[0], run_name="__main__")
"""


def measure_imports(main_job: Path, *, verbose: bool = True) -> dict[str, Any]:
    """The top-level modules of a one-round main job, by cumulative import time, and
    which of :data:`WATCHED` it held at exit (importtime lists failed imports too).

    ``verbose`` passes ``--verbose``, without which the quiet import sends importtime's
    lines to its temporary file (a main job from before the flag needs False).
    """
    with tempfile.TemporaryDirectory() as root:
        arguments = [str(main_job), "--rounds", "1", "--root", root]
        if verbose:
            arguments.append("--verbose")
        done = subprocess.run(
            [sys.executable, "-X", "importtime", "-c", _RUN_AND_LIST, *arguments],
            env=_env(main_job.parent.parent),
            capture_output=True,
            text=True,
            timeout=600,
        )
    if done.returncode != 0:
        raise SystemExit(f"the main job exited with {done.returncode}: {done.stderr[-2000:]}")
    top: dict[str, int] = {}
    for match in re.finditer(r"^import time:\s+\d+ \|\s+(\d+) \| +(\S+)$", done.stderr, re.M):
        cumulative, name = int(match[1]), match[2]
        if "." not in name:  # a package's cumulative time holds what it imported first
            top[name] = max(top.get(name, 0), cumulative)
    slowest = sorted(top.items(), key=lambda item: -item[1])[:8]
    [listed] = [line for line in done.stdout.splitlines() if line.startswith("MODULES ")]
    held = set(ast.literal_eval(listed.removeprefix("MODULES ")))
    return {
        "slowest_top_level_ms": {name: round(us / 1000) for name, us in slowest},
        "imported": {name: name in held for name in WATCHED},
    }


def _ms(value: float | None) -> str:
    return "n/a" if value is None else f"{value:.1f}"


def _row(name: str, peak: float, floor: float, first: float | None, note: str = "") -> str:
    first_text = "" if first is None else f"{first:6.2f}"
    return f"{name:<28} {peak:8.0f} {peak - floor:+9.0f} {first_text:>8}  {note}"


def print_table(figures: dict[str, Any]) -> None:
    floor = figures["floor"]["peak_mb"]
    print(f"{'':<28} {'peak MB':>8} {'vs floor':>9} {'1st rnd s':>8}")
    print(
        _row("import tensorflow (floor)", floor, floor, None, f"{figures['floor']['wall_s']:.2f} s")
    )
    for key, name in (("baseline", "main job (baseline)"), ("main_job", "main job")):
        if key in figures:
            job = figures[key]
            rounds = f"rounds 2-10 {_ms(job['round_ms'])} ms/round"
            note = f"round 10 at {job['round_10_s']:.2f} s ({rounds})"
            print(_row(name, job["peak_mb"], floor, job["first_round_s"], note))
    if "tff" in figures:
        tff = figures["tff"]
        note = f"build+init {tff['build_init_s']:.2f} s, round 1 {tff['round_s']:.2f} s"
        print(_row("TFF import+build+round 1", tff["peak_mb"], floor, tff["first_round_s"], note))
    if "long" in figures:
        long = figures["long"]
        rss = ", ".join(f"round {k}: {v:.0f} MB" for k, v in long["rss_at_round_mb"].items())
        print(f"long run: {rss}; {_ms(long['round_ms'])} ms/round after round 10")
    for key in ("baseline_imports", "imports"):
        imports = figures.get(key)
        if not imports:
            continue
        print(f"{'baseline' if key == 'baseline_imports' else 'main job'}:")
        print(
            "imported:",
            ", ".join(f"{k} {'yes' if v else 'no'}" for k, v in imports["imported"].items()),
        )
        print("slowest imports (ms, cumulative):", imports["slowest_top_level_ms"])
    print("load average:", " ".join(f"{load:.2f}" for load in os.getloadavg()))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--short", action="store_true", help="no long run, no TFF (for CI)")
    parser.add_argument("--skip-tff", action="store_true")
    parser.add_argument("--long-rounds", type=int, default=1000)
    parser.add_argument("--tff-python", default="/work/venv-tff/bin/python")
    parser.add_argument("--baseline-main-job", type=Path, help="another checkout's main_job.py")
    arguments = parser.parse_args()
    figures: dict[str, Any] = {"load_before": os.getloadavg()[0]}
    figures["floor"] = measure_floor()
    if arguments.baseline_main_job is not None:
        figures["baseline"] = measure_main_job(arguments.baseline_main_job, 10, (1, 10), (1, 10))
    figures["main_job"] = measure_main_job(MAIN_JOB, 10, (1, 10), (1, 10))
    if not (arguments.short or arguments.skip_tff) and Path(arguments.tff_python).exists():
        figures["tff"] = measure_tff(arguments.tff_python)
    if not arguments.short:
        long = arguments.long_rounds
        marks = tuple(sorted({1, 10, min(100, long), long}))
        figures["long"] = measure_main_job(MAIN_JOB, long, marks, (10, long))
    figures["imports"] = measure_imports(MAIN_JOB)
    if arguments.baseline_main_job is not None:
        figures["baseline_imports"] = measure_imports(arguments.baseline_main_job, verbose=False)
    figures["load_after"] = os.getloadavg()[0]
    print(json.dumps(figures), flush=True)
    print_table(figures)


if __name__ == "__main__":
    main()
