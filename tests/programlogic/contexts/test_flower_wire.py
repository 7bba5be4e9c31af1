"""What Flower messages may carry (programlogic.contexts.flower.wire) and the node-data
loader: neither needs Flower, so they run in the main test command."""

from __future__ import annotations

import functools
import os
import pickle

import numpy as np
import pytest

from programlogic.contexts.flower.nodes import NodeData, node_data_source, on_node
from programlogic.contexts.flower.wire import RefusedReference, decode, encode
from programlogic.exceptions import ClientError
from tests.programlogic.needs_learning import NEEDS_LEARNING

pytestmark = pytest.mark.anyio


class _Evil:
    def __reduce__(self):
        return (os.system, ("echo owned",))


@NEEDS_LEARNING
async def test_the_library_s_work_weights_and_errors_travel_whole() -> None:
    from programlogic.datasets import Preprocessing, load_digits_writers
    from programlogic.learning import build_weighted_fed_avg, sgd, softmax_regression

    data = load_digits_writers()
    model_fn = functools.partial(softmax_regression, data.feature_shape, data.num_classes)
    process = build_weighted_fed_avg(
        model_fn, client_optimizer=sgd(0.1), server_optimizer=sgd(1.0), preprocess=Preprocessing()
    )
    state = process.initialize()
    fn, weights = decode(encode((process._train_group, state["model"])))
    assert type(fn.__self__) is type(process) and fn.__name__ == "_train_group"
    for got, sent in zip(weights["trainable"], state["model"]["trainable"], strict=True):
        np.testing.assert_array_equal(got, sent)
    error = decode(encode(ClientError(["c1"], ZeroDivisionError("none"))))
    assert error.client_ids == ("c1",) and isinstance(error.__cause__, ZeroDivisionError)


@pytest.mark.parametrize(
    ("value", "named"),
    [
        (os.system, "posix.system"),
        (_Evil(), "posix.system"),
        (eval, "builtins.eval"),
        (pytest.fail, "_pytest.outcomes"),
        (functools.partial(exec, "x = 1"), "builtins.exec"),
    ],
)
async def test_code_outside_the_trusted_packages_is_refused_naming_it(value, named) -> None:
    with pytest.raises(RefusedReference, match=named):
        decode(encode(value))


async def test_a_package_named_by_the_receiver_is_trusted() -> None:
    data = encode(functools.partial(_Evil))
    with pytest.raises(RefusedReference, match=r"test_flower_wire._Evil"):
        decode(data)
    assert isinstance(decode(data, packages=[__name__.partition(".")[0]])(), _Evil)


async def test_dunder_attributes_are_refused() -> None:
    class Sneaky:
        def __reduce__(self):
            return (getattr, (NodeData, "__init__"))

    with pytest.raises(RefusedReference, match="__init__"):
        decode(pickle.dumps(Sneaky()))


async def test_node_data_loads_through_the_node_s_hook_only() -> None:
    loader = decode(encode(NodeData("test")))
    with pytest.raises(RuntimeError, match=r"NodeData\('test'\) loads .* on its Flower node only"):
        loader()
    with on_node(lambda config, split: (config["client-id"], split), {"client-id": "w3"}):
        assert loader() == ("w3", "test")


async def test_node_data_source_declares_the_population() -> None:
    source = node_data_source(["w1", "w0"], "train")
    assert source.client_ids == ["w1", "w0"]
    assert [handle.loader for handle in source.all_clients()] == [NodeData("train")] * 2
    with pytest.raises(TypeError, match="client_ids must be a sequence"):
        node_data_source("w0", "train")
    with pytest.raises(ValueError, match="duplicated client ids"):
        node_data_source(["w0", "w0"], "train")
    with pytest.raises(TypeError, match="split must be a str"):
        NodeData(3)
