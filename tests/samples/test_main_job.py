"""The main job and the plot command, run as a user runs them: as processes.

These tests start processes (TensorFlow import and compilation take seconds), so they
run under asyncio only.
"""

import csv
import json
import os
import pathlib
import shlex
import signal
import subprocess
import sys
import time

import anyio
import numpy as np
import pytest

from managers import FileProgramStateManager, ModelFileReleaseManager

pytestmark = pytest.mark.anyio

SAMPLES = pathlib.Path(__file__).parent.parent.parent / "samples"


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


def main_job(*arguments: object) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, str(SAMPLES / "main_job.py"), *map(str, arguments)],
        capture_output=True,
        text=True,
        timeout=300,
    )


def keys(path: pathlib.Path) -> list[int]:
    with path.open(newline="") as file:
        return [int(row["key"]) for row in csv.DictReader(file)]


async def final_model(root: pathlib.Path, rounds: int) -> list[np.ndarray]:
    weights = await ModelFileReleaseManager(root / "models").load(
        f"final_training_checkpoint_round_{rounds}"
    )
    return [*weights["trainable"], *weights["non_trainable"]]


LOAD_AS_PRINTED = """
import sys

import keras
import numpy as np
import tensorflow as tf

model = eval(sys.argv[1])
np.save(sys.argv[3], np.concatenate([weights.ravel() for weights in model.get_weights()]))
serving = eval(sys.argv[2])
print(sorted(serving.structured_outputs))
"""


async def check_shipped_models(root: pathlib.Path, stderr: str, weights: list[np.ndarray]) -> None:
    """The final model loads with the lines the job printed, in a fresh process; the best
    held-out round's model is among the best models."""
    printed = {}
    for line in stderr.splitlines():
        for what in ("Keras model", "SavedModel"):
            if f"load the {what}: " in line:
                printed[what] = line.split(f"load the {what}: ", 1)[1]
    assert printed == {
        "Keras model": f"keras.saving.load_model({str(root / 'model' / '4' / 'model.keras')!r})",
        "SavedModel": (
            f"tf.saved_model.load({str(root / 'model' / '4')!r}).signatures['serving_default']"
        ),
    }
    loaded = subprocess.run(
        [
            sys.executable,
            "-c",
            LOAD_AS_PRINTED,
            printed["Keras model"],
            printed["SavedModel"],
            str(root / "loaded.npy"),
        ],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert loaded.returncode == 0, loaded.stderr
    assert loaded.stdout.strip() == "['output_0']"
    expected = np.concatenate([array.ravel() for array in weights])
    assert np.array_equal(np.load(root / "loaded.npy"), expected)

    with (root / "evaluation.csv").open(newline="") as file:
        accuracy = {
            int(row["key"]): float(
                row["client_work/eval/total_rounds_metrics/sparse_categorical_accuracy"]
            )
            for row in csv.DictReader(file)
        }
    best = {key for key, value in accuracy.items() if value == max(accuracy.values())}
    bests = {int(version.name) for version in (root / "best_model").iterdir()}
    assert best & bests and bests <= set(accuracy)
    assert all((root / "best_model" / str(key) / "best_model.keras").is_file() for key in bests)


async def test_a_run_stopped_and_continued_ends_with_the_uninterrupted_model(tmp_path):
    whole, pieces = tmp_path / "whole", tmp_path / "pieces"
    done = main_job("--rounds", 4, "--eval-every", 2, "--root", whole)
    assert done.returncode == 0, done.stderr
    assert keys(whole / "metrics.csv") == [1, 2, 3, 4]
    assert sorted(keys(whole / "evaluation.csv")) == [0, 2, 4]  # evaluations end in any order
    assert list((whole / "tensorboard").glob("events.out.tfevents.*"))
    assert "held-out accuracy 0." in done.stderr
    await check_shipped_models(whole, done.stderr, await final_model(whole, 4))

    first = main_job("--rounds", 2, "--eval-every", 2, "--root", pieces)
    assert first.returncode == 0, first.stderr
    second = main_job("--rounds", 4, "--eval-every", 2, "--root", pieces)
    assert second.returncode == 0, second.stderr
    assert "resuming after round 2" in second.stderr
    assert keys(pieces / "metrics.csv") == [1, 2, 3, 4]
    for expected, resumed in zip(
        await final_model(whole, 4), await final_model(pieces, 4), strict=True
    ):
        assert expected.dtype == resumed.dtype and np.array_equal(expected, resumed)

    again = main_job("--rounds", 4, "--eval-every", 2, "--root", pieces)
    assert again.returncode == 0, again.stderr
    assert "already holds round 4 of 4" in again.stderr

    fewer = main_job("--rounds", 2, "--eval-every", 2, "--root", pieces)
    assert fewer.returncode == 0, fewer.stderr
    assert (
        f"main_job: --rounds 2 is below the 4 rounds {pieces} holds, and a run never goes "
        "back: it ends at once with round 4's model as the final one (pick another --root "
        "to train 2 rounds)"
    ) in fewer.stderr
    assert "final model final_training_checkpoint_round_4 in" in fewer.stderr
    assert keys(pieces / "metrics.csv") == [1, 2, 3, 4]

    other = main_job("--rounds", 4, "--model", "mlp", "--client-lr", 0.02, "--root", pieces)
    assert other.returncode == 1
    assert other.stderr.strip().splitlines()[-1] == (
        f"main_job: {pieces} holds a run configured otherwise (--model 'softmax' -> 'mlp'): "
        "repeat its flags to resume, or pick another --root"
    )

    plotted = subprocess.run(
        [sys.executable, str(SAMPLES / "plot_metrics.py"), str(whole)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert plotted.returncode == 0, plotted.stderr
    assert (whole / "metrics.png").read_bytes().startswith(b"\x89PNG\r\n\x1a\n")


@pytest.mark.parametrize(
    ("arguments", "message"),
    [
        (["--rounds", "0"], "argument --rounds: must be at least 1, got 0"),
        (["--client-lr", "-1"], "argument --client-lr: must be a finite number above 0, got -1"),
        (["--seed", "x"], "argument --seed: expected a whole number, got 'x'"),
        (["--dataset", "mnist"], "argument --dataset: invalid choice: 'mnist'"),
        (["--dataset", "emnist"], "--dataset emnist needs --emnist-train FILE.h5"),
        (["--clients-per-round", "11"], "--clients-per-round 11 is more than the 10 training"),
        (["--context", "spark"], "argument --context: invalid choice: 'spark'"),
        (["--ray-address", "10.0.0.1:6379"], "--ray-address goes with --context ray"),
        (["--context", "ray", "--ray-address", " "], "--ray-address must not be empty"),
        (["--algorithm", "fedsgd"], "argument --algorithm: invalid choice: 'fedsgd'"),
        (["--proximal-strength", "0.1"], "--proximal-strength goes with --algorithm fedprox"),
        (
            ["--algorithm", "fedprox", "--proximal-strength", "0"],
            "must be a finite number above 0, got 0",
        ),
        (["--aggregator", "krum"], "argument --aggregator: invalid choice: 'krum'"),
        (["--clip-norm", "0"], "argument --clip-norm: must be a finite number above 0, got 0"),
    ],
)
async def test_bad_flags_get_a_one_line_error(tmp_path, arguments, message):
    failed = main_job(*arguments, "--root", tmp_path / "run")
    assert failed.returncode != 0
    assert message in failed.stderr.strip().splitlines()[-1]
    assert not (tmp_path / "run" / "state").exists()


def write_hdf5_clients(path: pathlib.Path) -> None:
    import h5py

    with h5py.File(path, "w") as file:
        file.create_group("examples/writer_0")


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        (
            ["--dataset", "emnist", "--emnist-train", "{tmp}/none_train.h5"],
            "argument --emnist-train: no file at {tmp}/none_train.h5",
        ),
        (
            ["--dataset", "emnist", "--emnist-train", "{tmp}"],
            "argument --emnist-train: {tmp} is a directory",
        ),
        (
            [
                "--dataset",
                "emnist",
                "--emnist-train",
                "{tmp}/a_train.h5",
                "--emnist-test",
                "{tmp}/b.h5",
            ],
            "argument --emnist-test: no file at {tmp}/b.h5",
        ),
        (
            ["--dataset", "emnist", "--emnist-train", "{tmp}/a_train.h5", "--root", "{tmp}/run"],
            "argument --emnist-test: federated HDF5 file {tmp}/a_test.h5 not found "
            "(the default beside --emnist-train)",
        ),
        (["--root", "{tmp}/a_train.h5"], "argument --root: {tmp}/a_train.h5 is not a directory"),
        (
            ["--root", "{tmp}/a_train.h5/run"],
            "argument --root: cannot create {tmp}/a_train.h5/run: Not a directory",
        ),
    ],
    ids=["no-train", "train-dir", "no-test", "no-default-test", "root-file", "root-in-file"],
)
async def test_a_missing_file_or_an_unwritable_root_gets_one_line_naming_flag_and_path(
    tmp_path, flags, message
):
    write_hdf5_clients(tmp_path / "a_train.h5")
    failed = main_job(*[flag.format(tmp=tmp_path) for flag in flags])
    assert failed.returncode == 2
    assert failed.stderr.strip().splitlines() == [
        f"main_job.py: error: {message.format(tmp=tmp_path)}"
    ]


async def test_help_groups_the_flags_and_shows_only_written_defaults():
    shown = main_job("--help")
    assert shown.returncode == 0, shown.stderr
    text = shown.stdout
    assert "(default: None)" not in text and "(default: False)" not in text
    headings = [
        line[:-1]
        for line in text.splitlines()
        if line and not line[0].isspace() and line.endswith(":")
    ]
    assert headings == [
        "options",
        "data",
        "model and training",
        "differential privacy",
        "run and output",
        "backend",
    ]
    options = text.split("\ndata:\n")[0].split("\noptions:\n")[1]
    assert options.split() == ["-h,", "--help", "show", "this", "help", "message", "and", "exit"]
    flattened = " ".join(text.split())
    assert "--rounds N train up to this round;" in flattened
    assert (
        "(default: 50)" in flattened
        and "--seed N seeds sampling and shuffles (default: 0)" in flattened
    )
    assert "(default: runs/main_job)" in flattened


async def test_the_plot_hint_names_the_interpreter_as_typed_and_runs(tmp_path):
    """Run as ``bin/python`` from the interpreter's environment, the job's hint says
    ``bin/python``, and the command it shows draws the plot."""
    where = pathlib.Path(sys.executable).parent.parent
    typed = os.path.relpath(sys.executable, where)
    root = tmp_path / "run"
    done = subprocess.run(
        [typed, str(SAMPLES / "main_job.py"), "--rounds", "2", "--root", str(root)],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=where,
    )
    assert done.returncode == 0, done.stderr
    [hint] = [line for line in done.stderr.splitlines() if "plot the curves with: " in line]
    shown = hint.split("plot the curves with: ", 1)[1]
    assert shlex.split(shown) == [typed, str(SAMPLES / "plot_metrics.py"), str(root)]
    plotted = subprocess.run(
        shlex.split(shown), capture_output=True, text=True, timeout=120, cwd=where
    )
    assert plotted.returncode == 0, plotted.stderr
    assert (root / "metrics.png").read_bytes().startswith(b"\x89PNG\r\n\x1a\n")


async def test_plotting_a_directory_without_metrics_says_what_is_missing(tmp_path):
    failed = subprocess.run(
        [sys.executable, str(SAMPLES / "plot_metrics.py"), str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert failed.returncode == 1
    assert failed.stderr.strip() == (
        f"plot_metrics: {tmp_path / 'metrics.csv'} does not exist: "
        f"is {tmp_path} a main_job run directory?"
    )


async def test_ctrl_c_stops_the_run_with_a_loadable_checkpoint_and_a_rerun_resumes(tmp_path):
    root = tmp_path / "run"
    script = SAMPLES / "main_job.py"
    log = tmp_path / "stderr.txt"
    with log.open("w") as stderr:
        running = subprocess.Popen(
            [sys.executable, str(script), "--rounds", "5000", "--root", str(root)],
            stdout=subprocess.DEVNULL,
            stderr=stderr,
            # A shell may start background jobs with SIGINT ignored, and Python then
            # leaves it ignored; a person at a terminal has it.
            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
        )
    try:
        deadline = time.monotonic() + 120
        while not (root / "metrics.csv").exists() or len(keys(root / "metrics.csv")) < 3:
            assert running.poll() is None and time.monotonic() < deadline
            await anyio.sleep(0.1)
        running.send_signal(signal.SIGINT)
        running.wait(timeout=60)
    finally:
        running.kill()
    assert running.returncode == 1
    errors = log.read_text()
    assert (
        errors.strip().splitlines()[-1] == "main_job: interrupted; rerun the same command to resume"
    )

    async with FileProgramStateManager(root / "state") as state:
        _, stopped_at = await state.load_latest()
    assert 3 <= stopped_at < 5000
    resumed = main_job("--rounds", stopped_at + 2, "--root", root)
    assert resumed.returncode == 0, resumed.stderr
    assert f"resuming after round {stopped_at}" in resumed.stderr
    assert keys(root / "metrics.csv")[-2:] == [stopped_at + 1, stopped_at + 2]


ALGORITHM_PROCESSES = {
    # flags -> (process class, server optimizer, proximal strength)
    ("--algorithm", "fedavg"): ("WeightedFedAvg", {"class": "SGD", "learning_rate": 1.0}, None),
    ("--algorithm", "fedprox"): ("FedProx", {"class": "SGD", "learning_rate": 1.0}, 0.01),
    ("--algorithm", "fedprox", "--proximal-strength", "0.5", "--server-lr", "0.7"): (
        "FedProx",
        {"class": "SGD", "learning_rate": 0.7},
        0.5,
    ),
    ("--algorithm", "fedavgm"): (
        "WeightedFedAvg",
        {"class": "SGD", "learning_rate": 0.2, "momentum": 0.9},
        None,
    ),
    ("--algorithm", "fedadam"): ("WeightedFedAvg", {"class": "Adam", "learning_rate": 0.1}, None),
    ("--algorithm", "fedyogi", "--server-lr", "0.03"): (
        "WeightedFedAvg",
        {"class": "Yogi", "learning_rate": 0.03},
        None,
    ),
}


@pytest.mark.parametrize("flags", list(ALGORITHM_PROCESSES))
async def test_each_algorithm_flag_builds_its_process(flags, tmp_path):
    from main_job import build_process
    from main_job_flags import parse_arguments
    from programlogic.learning import build_model

    arguments = parse_arguments([*flags, "--root", str(tmp_path)])
    process = build_process(arguments, lambda: build_model("softmax", (8, 8), 10))
    kind, server, strength = ALGORITHM_PROCESSES[flags]
    config = process.describe_configuration()
    assert type(process).__name__ == kind
    assert {name: config["server_optimizer"][name] for name in server} == server
    assert config["client_optimizer"] == {"class": "SGD", "learning_rate": 0.02, "momentum": 0.0}
    assert config.get("proximal_strength") == strength
    if server["class"] in ("Adam", "Yogi"):
        assert config["server_optimizer"]["epsilon"] == 1e-3


async def test_a_fedprox_run_records_its_algorithm_and_refuses_a_rerun_with_another(tmp_path):
    root = tmp_path / "run"
    done = main_job("--algorithm", "fedprox", "--rounds", 2, "--eval-every", 2, "--root", root)
    assert done.returncode == 0, done.stderr
    assert keys(root / "metrics.csv") == [1, 2]
    config = json.loads((root / "config.json").read_text())
    assert (config["algorithm"], config["proximal_strength"], config["server_lr"]) == (
        "fedprox",
        0.01,
        1.0,
    )
    other = main_job("--algorithm", "fedadam", "--rounds", 3, "--root", root)
    assert other.returncode == 1
    assert other.stderr.strip().splitlines()[-1] == (
        f"main_job: {root} holds a run configured otherwise (--algorithm 'fedprox' -> "
        "'fedadam'; --server-lr 1.0 -> 0.1; --proximal-strength 0.01 -> None): "
        "repeat its flags to resume, or pick another --root"
    )
    assert keys(root / "metrics.csv") == [1, 2]


AGGREGATOR_FLAGS = {
    (): None,
    ("--aggregator", "median"): {"aggregator": "median"},
    ("--aggregator", "trimmed_mean"): {"aggregator": "trimmed_mean", "beta": 0.2},
    ("--clip-norm", "2.5"): {
        "aggregator": "clipping",
        "clip_norm": 2.5,
        "inner": {"aggregator": "mean", "weighted": True},
    },
    ("--algorithm", "fedprox", "--aggregator", "median", "--clip-norm", "1"): {
        "aggregator": "clipping",
        "clip_norm": 1.0,
        "inner": {"aggregator": "median"},
    },
}


@pytest.mark.parametrize("flags", list(AGGREGATOR_FLAGS))
async def test_each_aggregator_flag_builds_its_model_aggregator(flags, tmp_path):
    from main_job import build_process
    from main_job_flags import parse_arguments
    from programlogic.learning import build_model

    arguments = parse_arguments([*flags, "--root", str(tmp_path)])
    process = build_process(arguments, lambda: build_model("softmax", (8, 8), 10))
    assert process.describe_configuration().get("model_aggregator") == AGGREGATOR_FLAGS[flags]


async def test_a_median_run_trains_records_its_aggregator_and_refuses_the_mean(tmp_path):
    root = tmp_path / "run"
    done = main_job("--aggregator", "median", "--rounds", 2, "--eval-every", 2, "--root", root)
    assert done.returncode == 0, done.stderr
    assert keys(root / "metrics.csv") == [1, 2]
    config = json.loads((root / "config.json").read_text())
    assert (config["aggregator"], config["clip_norm"]) == ("median", None)
    other = main_job("--rounds", 3, "--root", root)
    assert other.returncode == 1
    assert "--aggregator 'median' -> 'mean'" in other.stderr
