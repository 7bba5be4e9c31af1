import pickle

import numpy as np
import pytest

from programlogic.datasets import ClientArrays, ClientBatches, Preprocessing, client_seed

pytestmark = pytest.mark.anyio


def client(count: int, shape: tuple[int, ...] = (3,)) -> ClientArrays:
    """Example i has every feature equal to i and label i % 10, so it can be recognized."""
    x = np.broadcast_to(
        np.arange(count, dtype=np.float32).reshape(-1, *[1] * len(shape)), (count, *shape)
    )
    return ClientArrays(np.ascontiguousarray(x), (np.arange(count) % 10).astype(np.int32))


def example_ids(batches: ClientBatches) -> np.ndarray:
    """The ids of the real examples, in output order."""
    flat_x = batches.x.reshape(batches.x.shape[0] * batches.x.shape[1], -1)
    return flat_x[batches.mask.reshape(-1) == 1, 0].astype(int)


def reference_order(count: int, epochs: int, buffer: int, seed: int) -> list[int]:
    """tf.data's repeat + shuffle buffer, element by element, drawing as documented."""
    rng = np.random.default_rng(seed)
    stream = [position % count for position in range(epochs * count)]
    size = min(buffer, len(stream))
    if size <= 1:
        return stream
    slots, rest = stream[:size], stream[size:]
    output = []
    for slot, element in zip(rng.integers(0, size, size=len(rest)).tolist(), rest, strict=True):
        output.append(slots[slot])
        slots[slot] = element
    return output + rng.permutation(slots).tolist()


async def test_shapes_dtypes_and_a_padded_last_batch() -> None:
    batches = Preprocessing(epochs=2, batch_size=4, shuffle_buffer=5)(client(7), seed=0)
    assert batches.x.shape == (4, 4, 3) and batches.x.dtype == np.float32
    assert batches.y.shape == (4, 4) and batches.y.dtype == np.int32
    assert batches.mask.shape == (4, 4) and batches.mask.dtype == np.float32
    assert batches.mask.reshape(-1).tolist() == [1.0] * 14 + [0.0] * 2
    assert not batches.x[3, 2:].any() and not batches.y[3, 2:].any()


async def test_every_example_appears_epochs_times() -> None:
    batches = Preprocessing(epochs=3, batch_size=7, shuffle_buffer=10)(client(50), seed=4)
    assert batches.mask.sum() == 150
    assert np.bincount(example_ids(batches), minlength=50).tolist() == [3] * 50


async def test_labels_travel_with_their_examples() -> None:
    batches = Preprocessing(epochs=2, batch_size=6, shuffle_buffer=8)(client(33), seed=2)
    real = batches.mask.reshape(-1) == 1
    assert (batches.y.reshape(-1)[real] == example_ids(batches) % 10).all()


async def test_without_a_buffer_the_order_is_epochs_of_the_data() -> None:
    for buffer in (0, 1):
        batches = Preprocessing(epochs=2, batch_size=4, shuffle_buffer=buffer)(client(5), 9)
        assert example_ids(batches).tolist() == [0, 1, 2, 3, 4, 0, 1, 2, 3, 4]


@pytest.mark.parametrize(("count", "epochs", "buffer"), [(30, 5, 10), (7, 2, 100), (20, 1, 20)])
async def test_the_order_is_the_shuffle_buffer_of_tf_data(
    count: int, epochs: int, buffer: int
) -> None:
    batches = Preprocessing(epochs=epochs, batch_size=4, shuffle_buffer=buffer)(
        client(count), seed=11
    )
    assert example_ids(batches).tolist() == reference_order(count, epochs, buffer, 11)


async def test_a_small_buffer_moves_examples_only_a_bounded_distance_forward() -> None:
    buffer = 5
    batches = Preprocessing(epochs=1, batch_size=10, shuffle_buffer=buffer)(client(200), 3)
    ids = example_ids(batches)
    # output i comes from the first i + buffer elements of the stream
    assert (ids <= np.arange(200) + buffer - 1).all()
    assert (ids != np.arange(200)).any()


async def test_the_result_is_a_pure_function_of_data_and_seed() -> None:
    preprocess = Preprocessing(epochs=2, batch_size=5, shuffle_buffer=50)
    first, again = preprocess(client(40), 123), preprocess(client(40), 123)
    other = preprocess(client(40), 124)
    for left, right in zip(first, again, strict=True):
        np.testing.assert_array_equal(left, right)
    assert not np.array_equal(first.x, other.x)


async def test_feature_shape_reshapes_each_example() -> None:
    data = client(6, (4, 4))
    flat = Preprocessing(epochs=1, batch_size=3, feature_shape=(16,))(data, 0)
    channel = Preprocessing(epochs=1, batch_size=3, feature_shape=(4, 4, 1))(data, 0)
    assert flat.x.shape == (2, 3, 16)
    assert channel.x.shape == (2, 3, 4, 4, 1)
    np.testing.assert_array_equal(flat.x.reshape(channel.x.shape), channel.x)


async def test_a_feature_shape_that_does_not_fit_is_a_value_error() -> None:
    with pytest.raises(ValueError, match=r"feature_shape \(784,\) does not fit .* \(8, 8\)"):
        Preprocessing(feature_shape=(784,))(client(3, (8, 8)), 0)


async def test_data_without_x_and_y_is_a_type_error_naming_client_arrays() -> None:
    x, y = np.zeros((4, 3), np.float32), np.zeros(4, np.int32)
    with pytest.raises(TypeError, match=r"ClientArrays\), got tuple"):
        Preprocessing(batch_size=2)((x, y), seed=0)


async def test_an_empty_client_gives_no_batches() -> None:
    batches = Preprocessing(batch_size=4)(client(0), 0)
    assert batches.x.shape == (0, 4, 3) and batches.mask.shape == (0, 4)


@pytest.mark.parametrize(
    ("arguments", "error", "message"),
    [
        ({"epochs": 0}, ValueError, "epochs must be an int >= 1, got 0"),
        ({"batch_size": 2.0}, TypeError, "batch_size must be an int >= 1, got float 2.0"),
        ({"shuffle_buffer": -1}, ValueError, "shuffle_buffer must be an int >= 0, got -1"),
        (
            {"feature_shape": [784]},
            TypeError,
            r"feature_shape must be a tuple or None, got list \[784\]",
        ),
        ({"feature_shape": (0,)}, ValueError, r"feature_shape must be .* >= 1 or None, got \(0,\)"),
    ],
)
async def test_bad_settings_are_refused(arguments: dict, error: type, message: str) -> None:
    with pytest.raises(error, match=message):
        Preprocessing(**arguments)


async def test_bad_seed_and_mismatched_labels_are_value_errors() -> None:
    with pytest.raises(ValueError, match="seed must be an int >= 0, got -1"):
        Preprocessing()(client(3), -1)
    with pytest.raises(ValueError, match=r"one label per example, got x of shape \(3, 3\)"):
        Preprocessing()(ClientArrays(client(3).x, np.zeros(2, np.int32)), 0)


async def test_it_pickles_and_works_after_a_round_trip() -> None:
    preprocess = Preprocessing(epochs=2, batch_size=3, shuffle_buffer=4, feature_shape=(3, 1))
    copy = pickle.loads(pickle.dumps(preprocess))
    assert copy == preprocess
    np.testing.assert_array_equal(copy(client(5), 8).x, preprocess(client(5), 8).x)


async def test_client_seed_is_the_documented_hash() -> None:
    assert client_seed(0, 1, "writer_00") == client_seed(0, 1, "writer_00")
    seeds = {client_seed(s, r, c) for s in (0, 1) for r in (1, 2) for c in ("a", "b")}
    assert len(seeds) == 8
    assert all(0 <= seed < 2**63 for seed in seeds)
    # sha256(b"0/1/a") starts 62 de 5a b5 ca 71 36 89: little endian 0x893671cab55ade62,
    # whose top bit is cleared
    assert client_seed(0, 1, "a") == 0x093671CAB55ADE62


async def test_the_evaluation_preprocessing_keeps_shape_and_batch_size() -> None:
    training = Preprocessing(epochs=5, batch_size=7, shuffle_buffer=100, feature_shape=(4,))
    evaluation = training.for_evaluation()
    assert evaluation == Preprocessing(epochs=1, batch_size=7, shuffle_buffer=0, feature_shape=(4,))
    data = ClientArrays(np.arange(40, dtype=np.float32).reshape(10, 2, 2), np.arange(10))
    batches = evaluation(data, seed=3)
    assert batches.x.shape == (2, 7, 4)
    assert batches.y[batches.mask == 1].tolist() == list(range(10))
