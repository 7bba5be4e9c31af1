"""The main job's differential privacy flags: the process they build, the errors, DP runs.

The runs start the job as processes (TensorFlow import and compilation take seconds),
so these tests run under asyncio only. The digits have 10 training writers; with 5
clients a round and noise multiplier 1, epsilon (delta 1 / 10**1.1) is about 1.01,
1.59 and 2.08 after rounds 1 to 3.
"""

import csv
import json
import pathlib
import shutil
import subprocess
import sys

import anyio
import numpy as np
import pytest

from managers import FileProgramStateManager, ModelFileReleaseManager

pytestmark = pytest.mark.anyio

SAMPLES = pathlib.Path(__file__).parent.parent.parent / "samples"
DIGITS_DELTA = 10**-1.1
DP = ("--dp-noise-multiplier", "1", "--clients-per-round", "5", "--eval-every", "2")


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


def run_job(*arguments: object) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, str(SAMPLES / "main_job.py"), *map(str, arguments)],
        capture_output=True,
        text=True,
        timeout=300,
    )


def metric_rows(path: pathlib.Path) -> list[dict[str, str]]:
    with path.open(newline="") as file:
        return list(csv.DictReader(file))


def mechanism_description(noise: float, per_round: int, sampling: str = "poisson") -> dict:
    return {
        "noise_multiplier": noise,
        "num_clients": 10,
        "clients_per_round": per_round,
        "sampling": sampling,
        "accountant": "rdp",
        "adjacency": "replace_one" if sampling == "uniform" else "add_or_remove_one",
    }


DP_AGGREGATORS = {
    ("--dp-noise-multiplier", "1"): {
        "aggregator": "dp_mean",
        "mechanism": mechanism_description(1.0, 10),
        "clip": 1.0,
        "delta": DIGITS_DELTA,
    },
    (
        "--dp-noise-multiplier",
        "0.8",
        "--dp-clip",
        "0.25",
        "--dp-delta",
        "1e-3",
        "--clients-per-round",
        "4",
        "--sampling",
        "uniform",
    ): {
        "aggregator": "dp_mean",
        "mechanism": mechanism_description(0.8, 4, "uniform"),
        "clip": 0.25,
        "delta": 1e-3,
    },
    ("--dp-noise-multiplier", "2", "--algorithm", "fedprox", "--clients-per-round", "3"): {
        "aggregator": "dp_mean",
        "mechanism": mechanism_description(2.0, 3),
        "clip": 1.0,
        "delta": DIGITS_DELTA,
    },
    ("--dp-noise-multiplier", "0.5", "--dp-clip", "adaptive", "--algorithm", "fedavgm"): {
        "aggregator": "dp_mean",
        "mechanism": mechanism_description(0.5, 10),
        "clip": {
            "initial_clip": 0.1,
            "target_quantile": 0.5,
            "learning_rate": 0.2,
            "count_stddev": None,
        },
        "delta": DIGITS_DELTA,
    },
}


@pytest.mark.parametrize("flags", list(DP_AGGREGATORS))
async def test_dp_flags_build_unweighted_fed_avg_with_dp_mean(flags, tmp_path):
    from main_job import build_process
    from main_job_flags import parse_arguments
    from programlogic.learning import build_model

    arguments = parse_arguments([*flags, "--root", str(tmp_path)])
    process = build_process(arguments, lambda: build_model("softmax", (8, 8), 10), num_clients=10)
    config = process.describe_configuration()
    assert config["client_weighting"] == "uniform"
    assert config.get("proximal_strength") == (0.01 if "fedprox" in flags else None)
    assert config["model_aggregator"] == DP_AGGREGATORS[flags]
    momentum = 0.9 if "fedavgm" in flags else 0.0
    assert config["server_optimizer"]["momentum"] == momentum


async def test_a_dp_process_needs_the_number_of_training_clients(tmp_path):
    from main_job import build_process
    from main_job_flags import parse_arguments
    from programlogic.learning import build_model

    arguments = parse_arguments(["--dp-noise-multiplier", "1", "--root", str(tmp_path)])
    with pytest.raises(ValueError, match="a DP run needs num_clients"):
        build_process(arguments, lambda: build_model("softmax", (8, 8), 10))


async def test_dp_runs_sample_by_poisson_unless_told_and_others_uniformly(tmp_path):
    from main_job_flags import parse_arguments

    root = ["--root", str(tmp_path)]
    assert parse_arguments(root).sampling == "uniform"
    assert parse_arguments(root).aggregator == "mean"
    private = parse_arguments(["--dp-noise-multiplier", "1", *root])
    assert (private.sampling, private.aggregator, private.dp_clip) == ("poisson", None, 1.0)
    fixed = parse_arguments(["--dp-noise-multiplier", "1", "--sampling", "fixed", *root])
    assert fixed.sampling == "fixed"


@pytest.mark.parametrize(
    ("arguments", "message"),
    [
        (["--dp-clip", "0.5"], "--dp-clip goes with --dp-noise-multiplier"),
        (["--dp-delta", "1e-5"], "--dp-delta goes with --dp-noise-multiplier"),
        (["--privacy-budget", "3"], "--privacy-budget goes with --dp-noise-multiplier"),
        (
            ["--dp-noise-multiplier", "1", "--sampling", "with_replacement"],
            "--sampling with_replacement does not go with --dp-noise-multiplier",
        ),
        (
            ["--dp-noise-multiplier", "1", "--aggregator", "median"],
            "--aggregator and --clip-norm do not go with --dp-noise-multiplier",
        ),
        (
            ["--dp-noise-multiplier", "1", "--clip-norm", "2"],
            "--aggregator and --clip-norm do not go with --dp-noise-multiplier",
        ),
        (
            ["--dp-noise-multiplier", "1", "--dp-clip", "adaptive"],
            "--dp-clip adaptive needs --dp-noise-multiplier below 1 (a tenth of",
        ),
        (
            ["--dp-noise-multiplier", "0"],
            "argument --dp-noise-multiplier: must be a finite number above 0, got 0",
        ),
        (
            ["--dp-noise-multiplier", "1", "--dp-clip", "0"],
            "argument --dp-clip: must be a finite number above 0",
        ),
        (
            ["--dp-noise-multiplier", "1", "--dp-clip", "auto"],
            "argument --dp-clip: expected a number or 'adaptive', got 'auto'",
        ),
        (
            ["--dp-noise-multiplier", "1", "--dp-delta", "1"],
            "argument --dp-delta: must be between 0 and 1 (excluded), got 1",
        ),
        (
            ["--dp-noise-multiplier", "1", "--privacy-budget", "inf"],
            "argument --privacy-budget: must be a finite number above 0, got inf",
        ),
    ],
)
async def test_bad_dp_flags_get_a_one_line_error(tmp_path, capsys, arguments, message):
    from main_job_flags import parse_arguments

    with pytest.raises(SystemExit) as exited:
        parse_arguments([*arguments, "--root", str(tmp_path / "run")])
    assert exited.value.code == 2
    assert message in capsys.readouterr().err.strip().splitlines()[-1]
    assert not (tmp_path / "run").exists()


async def test_old_configs_without_dp_flags_resume_as_non_private_runs(tmp_path):
    from main_job_flags import RUN_DEFINING, check_config, parse_arguments, run_config

    config = run_config(parse_arguments(["--root", str(tmp_path)]))
    old = {key: value for key, value in config.items() if not key.startswith(("dp_", "privacy"))}
    assert {"dp_noise_multiplier", "dp_clip", "dp_delta", "privacy_budget"} <= set(RUN_DEFINING)
    (tmp_path / "config.json").write_text(json.dumps(old))
    check_config(tmp_path, config)


async def test_a_dp_run_reports_epsilon_each_round_and_refuses_other_dp_flags(tmp_path):
    from programlogic.privacy import GaussianMechanism

    root = tmp_path / "run"
    done = run_job(*DP, "--rounds", 3, "--root", root)
    assert done.returncode == 0, done.stderr
    rows = metric_rows(root / "metrics.csv")
    assert [int(row["key"]) for row in rows] == [1, 2, 3]
    epsilons = [float(row["privacy/epsilon"]) for row in rows]
    expected = GaussianMechanism(1.0, 10, 5).epsilon
    assert epsilons == pytest.approx([expected(rounds, DIGITS_DELTA) for rounds in (1, 2, 3)])
    assert epsilons[0] < epsilons[1] < epsilons[2]
    assert {float(row["privacy/clip"]) for row in rows} == {1.0}
    assert f"privacy: epsilon {epsilons[2]:.4g} at delta 0.0794 after round 3" in done.stderr
    assert "poisson sampling of 5 of 10 clients" in done.stderr
    assert "privacy budget" not in done.stderr
    config = json.loads((root / "config.json").read_text())
    assert {name: config[name] for name in ("sampling", "aggregator", "clip_norm")} == {
        "sampling": "poisson",
        "aggregator": None,
        "clip_norm": None,
    }
    assert [config[f"dp_{name}"] for name in ("noise_multiplier", "clip", "delta")] == [
        1.0,
        1.0,
        None,
    ]
    assert config["privacy_budget"] is None

    other = run_job(*DP, "--dp-clip", "adaptive", "--dp-noise-multiplier", "0.4", "--root", root)
    assert other.returncode == 1
    assert other.stderr.strip().splitlines()[-1] == (
        f"main_job: {root} holds a run configured otherwise (--dp-noise-multiplier 1.0 -> 0.4; "
        "--dp-clip 1.0 -> 'adaptive'): repeat its flags to resume, or pick another --root"
    )
    private = run_job("--clients-per-round", 5, "--eval-every", 2, "--root", root)
    assert private.returncode == 1
    assert "--sampling 'poisson' -> 'uniform'" in private.stderr
    assert "--dp-noise-multiplier 1.0 -> None" in private.stderr
    assert [int(row["key"]) for row in metric_rows(root / "metrics.csv")] == [1, 2, 3]

    plotted = subprocess.run(
        [sys.executable, str(SAMPLES / "plot_metrics.py"), str(root)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert plotted.returncode == 0, plotted.stderr
    assert (root / "metrics.png").read_bytes().startswith(b"\x89PNG\r\n\x1a\n")


async def final_weights(root: pathlib.Path, rounds: int) -> list[np.ndarray]:
    weights = await ModelFileReleaseManager(root / "models").load(
        f"final_training_checkpoint_round_{rounds}"
    )
    return [*weights["trainable"], *weights["non_trainable"]]


async def test_a_privacy_budget_stops_the_run_and_a_resumed_run_stops_alike(tmp_path):
    whole, pieces, copy = tmp_path / "whole", tmp_path / "pieces", tmp_path / "copy"
    budget = ("--privacy-budget", "1.8")  # epsilon 1.59 after round 2, 2.08 after round 3
    done = run_job(*DP, *budget, "--rounds", 4, "--root", whole)
    assert done.returncode == 0, done.stderr
    assert [int(row["key"]) for row in metric_rows(whole / "metrics.csv")] == [1, 2]
    assert "privacy budget: epsilon 1.8 at delta 0.0794 allows 2 rounds" in done.stderr
    assert "privacy_budget_exhausted at round 2;" in done.stderr
    assert "the privacy budget (epsilon 1.8) stopped training after round 2 of 4" in done.stderr

    first = run_job(*DP, *budget, "--rounds", 1, "--root", pieces)
    assert first.returncode == 0, first.stderr
    assert "completed at round 1" in first.stderr
    assert "stopped training" not in first.stderr
    shutil.copytree(pieces, copy)
    second = run_job(*DP, *budget, "--rounds", 4, "--root", pieces)
    assert second.returncode == 0, second.stderr
    assert "resuming after round 1" in second.stderr
    assert "privacy_budget_exhausted at round 2 (resumed after round 1)" in second.stderr
    assert [int(row["key"]) for row in metric_rows(pieces / "metrics.csv")] == [1, 2]
    # A new run draws its own noise secret (so whole's model differs), a resumed one reads
    # it from the checkpoint: resuming the same checkpoint twice gives the same model.
    resumed_again = run_job(*DP, *budget, "--rounds", 4, "--root", copy)
    assert resumed_again.returncode == 0, resumed_again.stderr
    for expected, resumed in zip(
        await final_weights(pieces, 2), await final_weights(copy, 2), strict=True
    ):
        assert np.array_equal(expected, resumed)

    again = run_job(*DP, *budget, "--rounds", 10, "--root", pieces)
    assert again.returncode == 0, again.stderr
    assert f"{pieces} already holds round 2, the last the privacy budget allows" in again.stderr
    assert "the privacy budget (epsilon 1.8) stopped training after round 2 of 10" in again.stderr
    assert [int(row["key"]) for row in metric_rows(pieces / "metrics.csv")] == [1, 2]
    async with FileProgramStateManager(pieces / "state") as state:
        assert max(await state.get_versions()) == 2

    larger = run_job(*DP, "--privacy-budget", "5", "--rounds", 4, "--root", pieces)
    assert larger.returncode == 1
    assert "--privacy-budget 1.8 -> 5.0" in larger.stderr


async def test_the_progress_bar_shows_epsilon_when_a_round_reports_it(capsys):
    from main_job import Progress

    train = {"loss": 0.5, "sparse_categorical_accuracy": 0.75}
    async with Progress(3) as bar:
        bar.start(0)
        await bar.release({"client_work": {"train": train}}, 1)
        assert "eps=" not in capsys.readouterr().err
        await bar.release({"client_work": {"train": train}, "privacy": {"epsilon": 1.2345}}, 2)
        assert "acc=0.7500, eps=1.23" in capsys.readouterr().err


async def test_a_dp_run_killed_mid_run_resumes_counting_each_round_once(tmp_path):
    """SIGKILL while rounds run, rerun: every round's epsilon is the epsilon of that many
    rounds (a replayed round is not counted twice) and the rounds count on from the
    checkpoint, as in an uninterrupted run."""
    import os
    import signal

    from programlogic.privacy import GaussianMechanism

    root = tmp_path / "run"
    command = [sys.executable, str(SAMPLES / "main_job.py"), *DP, "--rounds", "400"]
    running = subprocess.Popen(
        [*command, "--root", str(root)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
    )
    try:
        # A hang guard only: the kill comes once three rounds are released.
        with anyio.fail_after(240):
            while not (root / "metrics.csv").exists() or len(metric_rows(root / "metrics.csv")) < 3:
                assert running.poll() is None
                await anyio.sleep(0.05)
        os.kill(running.pid, signal.SIGKILL)
        running.wait(timeout=60)
    finally:
        running.kill()
    async with FileProgramStateManager(root / "state") as state:
        _, killed_after = await state.load_latest()
    resumed = run_job(*DP, "--rounds", killed_after + 3, "--root", root)
    assert resumed.returncode == 0, resumed.stderr
    assert f"resuming after round {killed_after}" in resumed.stderr
    rows = metric_rows(root / "metrics.csv")
    by_round = {int(row["key"]): row for row in rows}
    assert sorted(by_round) == list(range(1, killed_after + 4))
    epsilon = GaussianMechanism(1.0, 10, 5).epsilon
    for round_num, row in by_round.items():
        assert int(row["privacy/rounds"]) == round_num
        assert float(row["privacy/epsilon"]) == pytest.approx(epsilon(round_num, DIGITS_DELTA))
