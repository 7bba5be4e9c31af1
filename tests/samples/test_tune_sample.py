"""The tuning sample, small: what it prints and saves, and a rerun that resumes the study.

The first run is in this process (under each backend), the rerun is the command a user
types, in a process of its own.
"""

import pathlib
import subprocess
import sys

import pytest

from managers import ModelFileReleaseManager

pytestmark = pytest.mark.anyio

SAMPLES = pathlib.Path(__file__).parent.parent.parent / "samples"
PNG = b"\x89PNG\r\n\x1a\n"


def load_study(root: pathlib.Path):
    import optuna

    return optuna.load_study(study_name="study", storage=f"sqlite:///{root / 'study.db'}")


def printed_best(stdout: str) -> tuple[int, str, dict[str, str], pathlib.Path]:
    """The best trial's number, accuracy, parameters and model path, as the sample printed."""
    lines = stdout.splitlines()
    (at,) = [index for index, line in enumerate(lines) if line.startswith("best trial ")]
    number, accuracy = lines[at].removeprefix("best trial ").split(": held-out accuracy ")
    params = dict(line.strip().split(" = ") for line in lines[at + 1 : at + 4])
    (model,) = [line for line in lines if line.startswith("best model: ")]
    path = pathlib.Path(model.removeprefix("best model: ").split(" (")[0])
    return int(number), accuracy, params, path


async def test_a_small_study_prints_its_best_trial_saves_plots_and_resumes(tmp_path, capsys):
    import tune as sample

    root = tmp_path / "tune"
    flags = ["--trials", "3", "--concurrency", "2", "--rounds", "2", "--root", str(root)]
    await sample.run(sample.parse_arguments(flags))
    out, err = capsys.readouterr()

    study = load_study(root)
    assert [trial.state.name for trial in study.trials] == ["COMPLETE"] * 3
    assert out.splitlines()[0] == "3 trials: 3 complete, 0 pruned, 0 failed"
    assert "3/3" in err
    best = study.best_trial
    assert f"running 0, pruned 0, complete 3, failed 0, best accuracy {best.value:.4f}" in err

    number, accuracy, params, model = printed_best(out)
    assert (number, accuracy) == (best.number, f"{best.value:.4f}")
    assert params == {name: f"{value:.4g}" for name, value in best.params.items()}
    assert set(params) == {"client_lr", "server_lr", "epochs"}
    models = root / "trials" / str(number) / "models"
    assert model == models / "final_training_checkpoint_round_2.model" and model.is_file()
    weights = await ModelFileReleaseManager(models).load("final_training_checkpoint_round_2")
    assert [array.shape for array in weights["trainable"]] == [(64, 10), (10,)]

    for name in ("optimization_history.png", "param_importances.png"):
        assert f"saved {root / name}" in out
        assert (root / name).read_bytes().startswith(PNG)

    again = subprocess.run(
        [sys.executable, str(SAMPLES / "tune.py"), *flags],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert again.returncode == 0, again.stderr
    assert again.stdout == out
    resumed = load_study(root)
    assert [(trial.number, trial.datetime_complete) for trial in resumed.trials] == [
        (trial.number, trial.datetime_complete) for trial in study.trials
    ]

    with pytest.raises(SystemExit) as refused:
        await sample.run(sample.parse_arguments([*flags, "--rounds", "3"]))
    assert str(refused.value) == (
        f"tune: {root} holds a study run otherwise (--rounds 2 -> 3): "
        "repeat its flags to resume, or pick another --root"
    )
    assert len(load_study(root).trials) == 3


async def test_help_shows_each_written_default_once_and_no_missing_one():
    completed = subprocess.run(
        [sys.executable, str(SAMPLES / "tune.py"), "--help"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert completed.returncode == 0, completed.stderr
    text = " ".join(completed.stdout.split())  # argparse wraps lines
    assert "(default: None)" not in text and "(default: False)" not in text
    assert "(default: 0)" in text  # --seed's, though 0 is falsy
    assert text.count("(default: CPUs)") == 1 and "(default: sqlite:///<root>/study.db)" in text
