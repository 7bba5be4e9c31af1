import numpy as np
import pytest

from programlogic.datasets import dirichlet_partition

pytestmark = pytest.mark.anyio

LABELS = np.repeat(np.arange(10), 100)  # 10 classes of 100 examples


def majority_share(parts: list[np.ndarray], labels: np.ndarray) -> float:
    """The mean, over clients, of the share of a client's examples in its largest class."""
    return float(np.mean([np.bincount(labels[part]).max() / part.size for part in parts]))


async def test_every_index_goes_to_exactly_one_client() -> None:
    parts = dirichlet_partition(LABELS, 7, 0.5, seed=3)
    assert len(parts) == 7
    assert np.sort(np.concatenate(parts)).tolist() == list(range(LABELS.size))
    assert all((np.diff(part) > 0).all() for part in parts)


async def test_a_small_alpha_skews_labels_and_a_large_one_does_not() -> None:
    skewed = majority_share(dirichlet_partition(LABELS, 10, 0.05, seed=0), LABELS)
    mixed = majority_share(dirichlet_partition(LABELS, 10, 1000.0, seed=0), LABELS)
    assert skewed > 0.5  # one class in ten would give 0.1
    assert mixed < 0.2


async def test_every_client_gets_an_example_even_when_the_draw_leaves_some_empty() -> None:
    labels = np.repeat(np.arange(3), 10)  # 30 examples, 25 clients, very skewed
    for seed in range(20):
        parts = dirichlet_partition(labels, 25, 0.01, seed=seed)
        assert min(part.size for part in parts) >= 1
        assert np.sort(np.concatenate(parts)).tolist() == list(range(30))
    as_many_clients_as_examples = dirichlet_partition(labels, 30, 0.01, seed=0)
    assert [part.size for part in as_many_clients_as_examples] == [1] * 30


async def test_the_partition_is_a_pure_function_of_the_seed() -> None:
    first = dirichlet_partition(LABELS, 5, 0.3, seed=9)
    again = dirichlet_partition(LABELS, 5, 0.3, seed=9)
    other = dirichlet_partition(LABELS, 5, 0.3, seed=10)
    assert [part.tolist() for part in first] == [part.tolist() for part in again]
    assert [part.tolist() for part in first] != [part.tolist() for part in other]


@pytest.mark.parametrize(
    ("arguments", "message"),
    [
        ({"num_clients": 0}, "num_clients must be an int >= 1, got 0"),
        ({"num_clients": 1001}, r"num_clients must be at most the number of examples \(1000\)"),
        ({"alpha": 0.0}, "alpha must be a finite number > 0, got 0.0"),
        ({"alpha": float("nan")}, "alpha must be a finite number > 0, got nan"),
        ({"seed": -2}, "seed must be an int >= 0, got -2"),
        ({"labels": np.zeros((2, 3))}, r"labels must be one-dimensional, got shape \(2, 3\)"),
    ],
)
async def test_bad_arguments_are_value_errors(arguments: dict, message: str) -> None:
    given = {"labels": LABELS, "num_clients": 4, "alpha": 0.5, "seed": 0} | arguments
    with pytest.raises(ValueError, match=message):
        dirichlet_partition(**given)
