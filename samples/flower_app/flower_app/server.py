"""The ServerApp: the program of ``program`` in a FlowerContext on the SuperLink's nodes.

Its state lives under the run config's absolute ``root``, not under Flower's run id,
so ``flwr run`` again (after a crash, a ``flwr stop``, or a finished run) resumes where
the last run stopped.
"""

from __future__ import annotations

from flwr.app import Context
from flwr.serverapp import Grid, ServerApp

import programlogic
from flower_app.program import Settings, train
from programlogic.contexts.flower import FlowerContext, node_data_source

app = ServerApp()


@app.main()
def main(grid: Grid, context: Context) -> None:
    settings = Settings.from_run_config(context.run_config)
    programlogic.run(_main(grid, settings))


async def _main(grid: Grid, settings: Settings) -> None:
    train_source = node_data_source(settings.train_clients, "train")
    eval_source = None
    if settings.eval_clients:
        eval_source = node_data_source(settings.eval_clients, "test")
    async with FlowerContext(
        grid, round_deadline=settings.round_deadline, min_clients=settings.min_clients
    ):
        await train(settings, train_source, eval_source)
