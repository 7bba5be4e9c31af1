"""A compiled function takes nested NumPy arguments and returns its function's results."""

import threading
from typing import NamedTuple

import numpy as np
import pytest

from programlogic.learning._tensorflow import CompiledFunction, tf

pytestmark = pytest.mark.anyio


class Pair(NamedTuple):
    first: np.ndarray
    second: np.ndarray


def combine(weights, pair, params):
    scaled = [w * params["scale"] for w in weights]
    return {"scaled": scaled, "total": tf.reduce_sum(pair.first) + tf.reduce_sum(pair.second)}


def arguments(seed: int) -> tuple:
    rng = np.random.default_rng(seed)
    weights = [rng.random((3, 2), dtype=np.float32), rng.random(2, dtype=np.float32)]
    pair = Pair(rng.random(4, dtype=np.float32), rng.random(4, dtype=np.float32))
    return weights, pair, {"scale": np.float32(rng.random())}


def as_numpy(result):
    return tf.nest.map_structure(np.asarray, result)


async def test_nested_arguments_give_the_results_of_the_function_run_eagerly() -> None:
    compiled = CompiledFunction(combine)
    for seed in range(3):  # the first call traces, the others reuse it
        args = arguments(seed)
        result = as_numpy(compiled(*args))
        expected = as_numpy(combine(*args))
        assert list(result) == ["scaled", "total"]
        for actual, wanted in zip(result["scaled"], expected["scaled"], strict=True):
            np.testing.assert_array_equal(actual, wanted)
        np.testing.assert_allclose(result["total"], expected["total"], rtol=1e-6)


async def test_arguments_of_the_same_leaves_in_another_structure_trace_their_own() -> None:
    compiled = CompiledFunction(lambda values: tf.nest.map_structure(lambda v: v * 2.0, values))
    ones, twos = np.ones(2, np.float32), np.full(2, 2.0, np.float32)

    by_name = compiled({"a": ones, "b": twos})
    by_other_name = compiled({"a": ones, "c": twos})
    as_list = compiled([ones, twos])
    as_tuple = compiled((ones, twos))

    assert sorted(by_name) == ["a", "b"] and sorted(by_other_name) == ["a", "c"]
    np.testing.assert_array_equal(by_other_name["c"].numpy(), [4.0, 4.0])
    assert isinstance(as_list, list) and isinstance(as_tuple, tuple)
    np.testing.assert_array_equal(as_tuple[0].numpy(), [2.0, 2.0])


async def test_a_namedtuple_result_keeps_its_type() -> None:
    compiled = CompiledFunction(lambda pair: Pair(pair.second, pair.first))
    swapped = compiled(Pair(np.zeros(2, np.float32), np.ones(2, np.float32)))
    assert isinstance(swapped, Pair)
    np.testing.assert_array_equal(swapped.first.numpy(), [1.0, 1.0])


async def test_threads_calling_a_new_signature_at_once_trace_it_once() -> None:
    traces = []

    def double(value):
        traces.append(1)
        return value * 2.0

    compiled = CompiledFunction(double)
    start = threading.Barrier(2)
    results = []

    def call() -> None:
        start.wait()
        results.append(compiled(np.ones(3, np.float32)).numpy())

    threads = [threading.Thread(target=call) for _ in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()

    assert len(traces) == 1
    for result in results:
        np.testing.assert_array_equal(result, [2.0, 2.0, 2.0])
    assert len(results) == 2
