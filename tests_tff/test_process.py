"""TFFLearningProcess: plain states that the file state manager keeps exactly, TFF's
client data from our data sources, and clear errors for what does not fit.
"""

from __future__ import annotations

import collections

import numpy as np
import pytest
import tensorflow as tf
import tensorflow_federated as tff
from conftest import CLASSES, FEATURES, to_dataset

from managers import FileProgramStateManager
from managers.serialization import dumps
from programlogic import ClientError, InMemoryDataSource
from programlogic.contexts.tff import TFFContext, TFFLearningProcess, from_plain, to_plain

pytestmark = pytest.mark.anyio


def leaves_are_plain(structure) -> bool:
    if isinstance(structure, dict):
        return all(isinstance(k, str) and leaves_are_plain(v) for k, v in structure.items())
    if isinstance(structure, list):
        return all(leaves_are_plain(v) for v in structure)
    return isinstance(structure, np.ndarray | np.generic)


async def test_states_are_plain_and_survive_the_file_state_manager_bit_for_bit(
    fedavg, data_source, tmp_path
) -> None:
    process = TFFLearningProcess(fedavg)
    clients = data_source.iterator(0).select(3, 1)
    async with TFFContext():
        initial = await process.initialize()
        trained = (await process.next(initial, clients)).state
        async with FileProgramStateManager(tmp_path) as manager:
            await manager.save({"train_state": trained}, 1)
            loaded, version = await manager.load_latest({"train_state": initial})
        loaded = loaded["train_state"]
        assert version == 1
        assert dumps(loaded) == dumps(trained)
        # The loaded state trains on exactly as the state it was saved from.
        again = await process.next(loaded, clients)
        original = await process.next(trained, clients)
    assert dumps(again) == dumps(original)
    assert leaves_are_plain(initial) and leaves_are_plain(trained)
    assert list(initial) == [
        "global_model_weights",
        "distributor",
        "client_work",
        "aggregator",
        "finalizer",
    ]
    assert initial["global_model_weights"]["trainable"][0].shape == (FEATURES, CLASSES)
    assert initial["global_model_weights"]["trainable"][0].dtype == np.float32
    tff_state = process.to_tff_state(trained)
    assert isinstance(tff_state, tff.learning.templates.LearningAlgorithmState)
    assert isinstance(tff_state.global_model_weights, tff.learning.models.ModelWeights)
    assert dumps(process.from_tff_state(tff_state)) == dumps(trained)


async def test_model_weights_go_out_and_back_in_plain(fedavg, data_source) -> None:
    process = TFFLearningProcess(fedavg)
    clients = data_source.iterator(0).select(3, 1)
    async with TFFContext():
        initial = await process.initialize()
        trained = (await process.next(initial, clients)).state
        weights = await process.get_model_weights(trained)
        moved = await process.set_model_weights(initial, weights)
        tff_weights = process.to_tff_state(trained).global_model_weights
        moved_from_tff = await process.set_model_weights(initial, tff_weights)
    assert list(weights) == ["trainable", "non_trainable"]
    assert dumps(weights) == dumps(trained["global_model_weights"])
    assert dumps(moved["global_model_weights"]) == dumps(trained["global_model_weights"])
    assert dumps(moved_from_tff) == dumps(moved)
    # Only the weights moved: the optimizer state stays the initial one.
    assert dumps(moved["finalizer"]) == dumps(initial["finalizer"])


async def test_client_data_fn_turns_loaded_data_into_datasets(fedavg, arrays, datasets) -> None:
    from_arrays = TFFLearningProcess(fedavg, client_data_fn=to_dataset)
    from_datasets = TFFLearningProcess(fedavg)
    array_clients = InMemoryDataSource(arrays).iterator(0).select(4, 1)
    dataset_clients = InMemoryDataSource(datasets).iterator(0).select(4, 1)
    async with TFFContext():
        state = await from_arrays.initialize()
        one = await from_arrays.next(state, array_clients)
        other = await from_datasets.next(state, dataset_clients)
    assert dumps(one) == dumps(other)
    assert one.metrics["client_work"]["train"]["num_examples"] == sum(
        len(arrays[client.client_id][1]) for client in array_clients
    )


async def test_bad_processes_and_client_data_are_clear_errors(fedavg, arrays) -> None:
    with pytest.raises(TypeError, match=r"tff_process must be a tff\.learning\.templates"):
        TFFLearningProcess(object())
    with pytest.raises(TypeError, match=r"tff_process must be .* got IterativeProcess"):
        TFFLearningProcess(tff.templates.IterativeProcess(fedavg.initialize, fedavg.next))
    with pytest.raises(TypeError, match="client_data_fn must be callable or None, got int"):
        TFFLearningProcess(fedavg, client_data_fn=3)
    process = TFFLearningProcess(fedavg)
    clients = InMemoryDataSource(arrays).iterator(0).select(2, 1)
    async with TFFContext():
        state = await process.initialize()
        with pytest.raises(ClientError, match=r"client_data_fn to make one.*got tuple") as raised:
            await process.next(state, clients)
        assert raised.value.client_ids == (clients[0].client_id,)
        del state["finalizer"]
        with pytest.raises(ValueError, match="at the top: expected the keys"):
            await process.next(state, clients)
        state = await process.initialize()
        weights = await process.get_model_weights(state)
        weights["trainable"][0] = np.zeros((FEATURES + 1, CLASSES), np.float32)
        with pytest.raises(
            ValueError, match=r"at /trainable/0: expected shape \(8, 3\), got \(9, 3\)"
        ):
            await process.set_model_weights(state, weights)
        weights["trainable"][0] = np.zeros((FEATURES, CLASSES), np.complex64)
        with pytest.raises(
            TypeError, match="at /trainable/0: expected dtype float32, got complex64"
        ):
            await process.set_model_weights(state, weights)
        weights["trainable"] = {"kernel": 0}
        with pytest.raises(TypeError, match="at /trainable: expected a list"):
            await process.set_model_weights(state, weights)


async def test_to_plain_and_from_plain_follow_the_tff_type() -> None:
    type_spec = tff.FederatedType(
        tff.StructWithPythonType(
            [("a", tff.TensorType(np.int64)), ("b", tff.StructType([np.float32, (np.int32, [2])]))],
            dict,
        ),
        tff.SERVER,
    )
    value = {"a": 7, "b": (1.5, [1, 2])}
    plain = to_plain(value, type_spec)
    assert dumps(plain) == dumps(
        {"a": np.int64(7), "b": [np.float32(1.5), np.array([1, 2], np.int32)]}
    )
    back = from_plain(plain, type_spec)
    assert back["a"] == 7 and back["b"][0] == np.float32(1.5)
    assert dumps(to_plain(back, type_spec)) == dumps(plain)
    reordered = to_plain({"b": (1.5, [1, 2]), "a": 7}, type_spec)  # matched by name
    assert dumps(reordered) == dumps(plain)
    with pytest.raises(ValueError, match=r"at the top: expected the names \['a', 'b'\]"):
        to_plain({"a": 7, "c": (1.5, [1, 2])}, type_spec)
    with pytest.raises(TypeError, match=r"at /s: values of type .* have no plain form"):
        to_plain({"s": []}, tff.StructType([("s", tff.SequenceType(np.int32))]))
    with pytest.raises(ValueError, match="at /b: expected 2 elements"):
        from_plain({"a": 1, "b": [1.0]}, type_spec)
    with pytest.raises(TypeError, match=r"at /a: expected a int64 tensor, got list"):
        from_plain({"a": [1], "b": [1.0, [1, 2]]}, type_spec)


async def test_a_process_composed_with_a_dataset_computation_takes_client_ids(fedavg) -> None:
    @tff.tensorflow.computation(np.str_)
    def dataset_of(client_id):
        seed = tf.strings.to_hash_bucket_fast(client_id, 1000)
        x = tf.random.stateless_normal([20, FEATURES], seed=[seed, 0])
        y = tf.random.stateless_uniform([20], seed=[seed, 1], maxval=CLASSES, dtype=tf.int32)
        return tf.data.Dataset.from_tensor_slices(collections.OrderedDict(x=x, y=y)).batch(8)

    composed = tff.simulation.compose_dataset_computation_with_learning_process(dataset_of, fedavg)
    process = TFFLearningProcess(composed)
    source = InMemoryDataSource({f"client_{i}": f"client_{i}" for i in range(6)})
    async with TFFContext():
        state = await process.initialize()
        output = await process.next(state, source.iterator(0).select(3, 1))
    assert output.metrics["client_work"]["train"]["num_examples"] == 60
    assert dumps(output.state["finalizer"]) != dumps(state["finalizer"])
