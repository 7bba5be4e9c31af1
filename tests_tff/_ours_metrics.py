"""Our FedAvg's released metrics on the clients of an ``.npz``, for test_metrics_vs_ours.py.

Run with a Python that has Keras 3 (the project's own environment, not the TFF one):
``python _ours_metrics.py CLIENTS.npz ROUNDS`` prints one JSON list, a round's
``client_work/train`` metrics each. The file holds ``x_<i>``, ``y_<i>`` for every client,
``kernel`` and ``bias`` (the initial weights), and ``batch_size``.
"""

from __future__ import annotations

import asyncio
import functools
import json
import sys

import numpy as np


def model_fn(kernel: np.ndarray, bias: np.ndarray):
    import keras

    model = keras.Sequential([keras.Input((kernel.shape[0],)), keras.layers.Dense(len(bias))])
    model.set_weights([kernel, bias])
    return model


async def main(path: str, rounds: int) -> None:
    import keras

    from programlogic import ClientHandle, LocalContext
    from programlogic.datasets import ClientArrays, Preprocessing
    from programlogic.learning import build_weighted_fed_avg, sgd

    data = np.load(path)
    count = len([name for name in data.files if name.startswith("x_")])
    clients = [ClientArrays(data[f"x_{i}"], data[f"y_{i}"]) for i in range(count)]
    process = build_weighted_fed_avg(
        functools.partial(model_fn, data["kernel"], data["bias"]),
        sgd(0.1),
        sgd(1.0),
        loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
        metrics=[
            keras.metrics.SparseCategoricalAccuracy(),
            keras.metrics.SparseTopKCategoricalAccuracy(k=3),
        ],
        preprocess=Preprocessing(epochs=1, batch_size=int(data["batch_size"]), shuffle_buffer=0),
    )
    handles = [
        ClientHandle(str(i), functools.partial(lambda c: c, client))
        for i, client in enumerate(clients)
    ]
    state, released = process.initialize(), []
    async with LocalContext(max_workers=2):
        for _ in range(rounds):
            output = await process.next(state, handles)
            state = output.state
            released.append(output.metrics["client_work"]["train"])
    print(json.dumps(released))


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1], int(sys.argv[2])))
