"""The throwaway cluster serves Optuna's RDB storage to several processes at once.

The ground the tests of tuners sharing one study stand on: a trial one process records
is seen by another, both ways.
"""

from __future__ import annotations

import os
import sys
import uuid
from pathlib import Path

import anyio
import optuna
import pytest

from tests.programlogic.tuning.postgres_cluster import postgres_bin

pytestmark = pytest.mark.anyio

REPO = Path(__file__).resolve().parents[3]

# Loads the study, reports the values it sees, records a trial of value 2.0.
CHILD = """
import sys
import optuna
optuna.logging.set_verbosity(optuna.logging.WARNING)
storage = optuna.storages.RDBStorage(sys.argv[1])
study = optuna.load_study(study_name=sys.argv[2], storage=storage)
print(sorted(trial.value for trial in study.trials))
study.optimize(lambda trial: 2.0, n_trials=1)
storage.engine.dispose()
"""


async def test_two_processes_see_each_others_trials(postgresql_url: str) -> None:
    name = f"study-{uuid.uuid4().hex}"
    storage = optuna.storages.RDBStorage(postgresql_url)
    try:
        study = optuna.create_study(study_name=name, storage=storage)
        study.optimize(lambda trial: 1.0, n_trials=1)
        environment = {**os.environ, "PYTHONPATH": str(REPO)}
        child = await anyio.run_process(
            [sys.executable, "-c", CHILD, postgresql_url, name], env=environment, check=False
        )
        assert child.returncode == 0, child.stderr.decode()
        assert child.stdout.decode().strip() == "[1.0]"
        seen = optuna.load_study(study_name=name, storage=storage).trials
        assert [(trial.number, trial.value) for trial in seen] == [(0, 1.0), (1, 2.0)]
        assert all(trial.state == optuna.trial.TrialState.COMPLETE for trial in seen)
    finally:
        storage.engine.dispose()


async def test_the_newest_postgresql_with_an_initdb_is_chosen(tmp_path: Path) -> None:
    for version in ("9.6", "13", "15", "17"):
        (tmp_path / version / "bin").mkdir(parents=True)
    for version in ("9.6", "13", "15"):  # 17 as a client-only install has no initdb
        (tmp_path / version / "bin" / "initdb").touch()
    assert postgres_bin(tmp_path) == tmp_path / "15" / "bin"


async def test_without_postgresql_the_tests_fail_saying_what_to_install(tmp_path: Path) -> None:
    with pytest.raises(pytest.fail.Exception, match=r"apt-get install postgresql \(.ci/run"):
        postgres_bin(tmp_path)
