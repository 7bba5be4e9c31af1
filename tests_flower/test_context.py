"""FlowerContext in programs: FedAvg as on LocalContext, and the faults of a federation.

Every federation here is Flower's own machinery in this process
(:class:`~programlogic.contexts.flower.InProcessFederation`): its Grid and link state, a
thread a node running the ClientApp of :func:`make_client_app`. The nodes' data hook,
:func:`load`, serves the digits writers from this module, which the nodes may import
(the package of a ClientApp's hook is trusted).
"""

from __future__ import annotations

import functools
import logging
import time
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import pytest

from managers import MemoryProgramStateManager, MemoryReleaseManager
from programlogic import (
    ClientError,
    ClientHandle,
    LocalContext,
    NotEnoughClientsError,
    count_dropped_clients,
    train_model,
)
from programlogic.contexts.flower import (
    FlowerContext,
    InProcessFederation,
    NodeData,
    RefusedReference,
    make_client_app,
    node_data_source,
)
from programlogic.datasets import Preprocessing, load_digits_writers
from programlogic.learning import build_weighted_fed_avg, sgd, softmax_regression

pytestmark = pytest.mark.anyio

DIGITS = load_digits_writers()
WRITERS = DIGITS.train.client_ids
MODEL_FN = functools.partial(softmax_regression, DIGITS.feature_shape, DIGITS.num_classes)
SLOW = "slow"


def load(node_config: Mapping[str, Any], split: str) -> Any:
    """The data hook of the test's nodes: their writer's digits (``split`` "train")."""
    source = DIGITS.train if split == "train" else DIGITS.test
    (handle,) = [h for h in source.all_clients() if h.client_id == node_config["client-id"]]
    return handle.load()


def _value(broadcast: Any, client_id: str, data: Any) -> Any:
    if client_id == SLOW:
        time.sleep(broadcast)
    return client_id


def _group_size(broadcast: Any, client_ids: Sequence[str], datas: Sequence[Any]) -> list[int]:
    if "c2" in client_ids:
        raise ZeroDivisionError("no examples on c2")
    return [len(client_ids)] * len(client_ids)


def _process() -> Any:
    return build_weighted_fed_avg(
        MODEL_FN,
        client_optimizer=sgd(0.05),
        server_optimizer=sgd(1.0),
        preprocess=Preprocessing(epochs=1, batch_size=10, shuffle_buffer=50),
        clients_per_group=1,
    )


async def _train(context: Any, source: Any, rounds: int = 3) -> tuple[Any, dict[Any, Any]]:
    models, metrics = MemoryReleaseManager(), MemoryReleaseManager()
    async with context:
        await train_model(
            train_process=_process(),
            train_data_source=source,
            train_per_round_clients=4,
            train_total_rounds=rounds,
            program_state_manager=MemoryProgramStateManager(),
            model_output_manager=models,
            train_metrics_manager=metrics,
            seed=3,
        )
    (final,) = list(models.values().values())[-1:]
    return final, metrics.values()


def _leaves(weights: Any) -> list[np.ndarray]:
    import tensorflow as tf

    return [np.asarray(leaf) for leaf in tf.nest.flatten(weights)]


def _handles(*ids: str) -> list[ClientHandle]:
    return [ClientHandle(client_id, NodeData("train")) for client_id in ids]


async def test_fed_avg_on_flower_nodes_ends_with_the_weights_local_context_gives() -> None:
    with InProcessFederation(make_client_app(load), WRITERS) as federation:
        ours, metrics = await _train(
            FlowerContext(federation.grid), node_data_source(WRITERS, "train")
        )
    local, local_metrics = await _train(LocalContext(max_workers=2), DIGITS.train)
    for on_flower, on_local in zip(_leaves(ours), _leaves(local), strict=True):
        np.testing.assert_array_equal(on_flower, on_local)
    assert list(metrics) == list(local_metrics)


async def test_a_group_function_gets_one_client_a_call_and_a_failing_one_is_named() -> None:
    ids = ["c0", "c1", "c2", "c3"]
    with InProcessFederation(make_client_app(packages=[__name__]), ids) as federation:
        async with FlowerContext(federation.grid) as context:
            clients = [ClientHandle(i, functools.partial(int, 0)) for i in ids]
            with pytest.raises(ClientError, match=r"'c2'.*no examples on c2") as caught:
                await context.map_clients(_group_size, None, clients, group_size=4)
    assert caught.value.client_ids == ("c2",)


async def test_a_stopped_node_fails_the_call_naming_its_client_without_a_deadline() -> None:
    with InProcessFederation(make_client_app(load), WRITERS[:3]) as federation:
        async with FlowerContext(federation.grid) as context:
            federation.stop_node(WRITERS[1])
            with pytest.raises(ClientError) as caught:
                await context.map_clients(_value, 0, _handles(*WRITERS[:3]))
    assert caught.value.client_ids == (WRITERS[1],)
    assert isinstance(caught.value.error, ConnectionError)


async def test_a_client_without_a_node_fails_the_call_naming_it() -> None:
    with InProcessFederation(make_client_app(load), WRITERS[:2]) as federation:
        async with FlowerContext(federation.grid, handshake_timeout=0.2) as context:
            with pytest.raises(ClientError, match="no node of client 'ghost'") as caught:
                await context.map_clients(_value, 0, _handles(WRITERS[0], "ghost"))
    assert caught.value.client_ids == ("ghost",)


async def test_with_a_deadline_late_and_lost_clients_are_dropped_and_counted() -> None:
    ids = ["a", "b", SLOW, "d"]
    with InProcessFederation(make_client_app(packages=[__name__]), ids) as federation:
        context = FlowerContext(federation.grid, round_deadline=1.0, min_clients=2)
        clients = [ClientHandle(i, functools.partial(int, 0)) for i in ids]
        async with context:
            federation.stop_node("d")
            with count_dropped_clients() as dropped:
                results = await context.map_clients(_value, 2.5, clients)
            assert results == ["a", "b"]
            assert sorted(dropped.client_ids) == sorted([SLOW, "d"])
            assert not context.replays_rounds
            with pytest.raises(NotEnoughClientsError, match=r"only 2 clients finished.*at least 3"):
                context.min_clients = 3
                await context.map_clients(_value, 2.5, clients)


async def test_a_restarted_node_is_found_again_and_sampled(
    caplog: pytest.LogCaptureFixture,
) -> None:
    with InProcessFederation(make_client_app(load), WRITERS[:3]) as federation:
        async with FlowerContext(federation.grid) as context:
            first = await context.map_clients(_value, 0, _handles(*WRITERS[:3]))
            old = federation.node_ids[WRITERS[2]]
            new = federation.restart_node(WRITERS[2])
            with caplog.at_level(logging.INFO, "programlogic.contexts.flower.context"):
                again = await context.map_clients(_value, 0, _handles(*WRITERS[:3]))
    assert first == again == list(WRITERS[:3])
    assert new != old
    assert f"client {WRITERS[2]!r} is now node {new} (was {old})" in caplog.text


async def test_a_node_without_a_client_id_is_left_out_with_a_warning(
    caplog: pytest.LogCaptureFixture,
) -> None:
    app = make_client_app(load)
    with InProcessFederation(app, WRITERS[:1], node_configs=[{"region": "x"}]) as federation:
        with caplog.at_level(logging.WARNING, "programlogic.contexts.flower.context"):
            async with FlowerContext(federation.grid) as context:
                assert context.client_ids == [WRITERS[0]]
    assert "is no declared client" in caplog.text and "client-id" in caplog.text


async def test_work_naming_code_outside_the_trusted_packages_is_refused_on_the_node() -> None:
    with InProcessFederation(make_client_app(), ["c0"]) as federation:
        async with FlowerContext(federation.grid) as context:
            with pytest.raises(ClientError) as caught:
                await context.map_clients(
                    print, None, [ClientHandle("c0", functools.partial(int, 0))]
                )
    assert isinstance(caught.value.error, RefusedReference)
    assert "builtins.print" in str(caught.value.error)


async def test_the_node_data_hook_is_the_only_way_to_node_data() -> None:
    with pytest.raises(RuntimeError, match="on its Flower node only"):
        NodeData("train")()


async def test_a_grid_must_be_a_flower_grid() -> None:
    with pytest.raises(TypeError, match=r"grid must be a Flower Grid.*push_messages"):
        FlowerContext(object())


async def test_a_node_registered_under_a_name_is_that_client() -> None:
    app = make_client_app(packages=[__name__])
    with InProcessFederation(app, ["c0"], registered_names=["site-9"]) as federation:
        async with FlowerContext(federation.grid) as context:
            assert context.client_ids == ["c0", "site-9"]
            clients = [ClientHandle(i, functools.partial(int, 0)) for i in ("site-9", "c0")]
            assert await context.map_clients(_value, 0, clients) == ["site-9", "c0"]
