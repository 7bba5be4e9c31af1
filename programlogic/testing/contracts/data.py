"""The contract of federated data sources and their iterators, as tests a source runs.

Subclass :class:`FederatedDataSourceContract` in a test file, name the subclass
``Test...`` and override its ``make_source`` fixture to return a callable that builds
your source, the same configuration on every call (each call stands for the source a
restarted program builds again)::

    import pytest

    from programlogic.testing.contracts import FederatedDataSourceContract

    class TestMySource(FederatedDataSourceContract):
        @pytest.fixture
        def make_source(self, tmp_path):
            write_my_files(tmp_path)
            return lambda: MySource(tmp_path)

The source needs at least two clients, with distinct ids. A source with a
``describe_configuration()`` is also checked for a JSON-able description, equal for
two sources built alike. Client data is compared with
:meth:`FederatedDataSourceContract.assert_same_data` (NumPy's ``assert_equal``: nested
lists, tuples and dicts of arrays and scalars); override it for other kinds of data.
"""

from __future__ import annotations

import collections
import json
import pickle
from collections.abc import Callable
from typing import Any

import numpy as np
import pytest

from programlogic.data import ClientHandle, FederatedDataSource, FederatedDataSourceIterator
from programlogic.testing.contracts._base import Contract

__all__ = ["FederatedDataSourceContract"]

SEEDS = (0, 7)
ROUNDS = (0, 1, 2, 5, 100)


class FederatedDataSourceContract(Contract):
    """The promises every :class:`~programlogic.data.FederatedDataSource` keeps.

    Override the ``make_source`` fixture: a zero-argument callable returning a source,
    equally configured on every call. Set ``distinct_clients = False`` for a source
    that samples with replacement (a round may then hold a client twice),
    ``exact_round_size = False`` for one whose rounds hold ``k`` clients only on average
    (Poisson sampling), and ``loaders_pickle = False`` for a source whose loaders cannot
    travel to another process (it then only works with in-process contexts).
    """

    loop_stall_limit = None
    """Not watched: a source's calls are synchronous, made where the caller makes them
    (loading a client's data runs in the federated context's workers)."""

    distinct_clients: bool = True
    """Whether a round's clients are distinct (sampling without replacement)."""

    exact_round_size: bool = True
    """Whether ``select(k, r)`` gives exactly ``k`` clients (not so for Poisson sampling)."""

    loaders_pickle: bool = True
    """Whether client handles pickle, so remote backends can load the data where they run."""

    @pytest.fixture
    def make_source(self) -> Callable[[], FederatedDataSource]:
        """A callable building the source, equally configured every call (override this)."""
        pytest.fail(
            f"{type(self).__name__} must override the make_source fixture: return a "
            "zero-argument callable that builds the data source"
        )

    def assert_same_data(self, actual: Any, expected: Any) -> None:
        """Fail unless two loads of a client's data are equal (override for other data)."""
        np.testing.assert_equal(actual, expected)

    # The source.

    async def test_is_a_federated_data_source_with_an_iterator(
        self, make_source: Callable[[], FederatedDataSource]
    ) -> None:
        source = make_source()
        assert isinstance(source, FederatedDataSource)
        assert isinstance(source.iterator(0), FederatedDataSourceIterator)

    async def test_client_ids_are_distinct_strings_in_a_stable_order(
        self, make_source: Callable[[], FederatedDataSource]
    ) -> None:
        source = make_source()
        ids = list(source.client_ids)
        assert len(ids) >= 2, "the suite needs a source of at least two clients"
        assert all(isinstance(client_id, str) for client_id in ids)
        duplicated = sorted(i for i, count in collections.Counter(ids).items() if count > 1)
        assert not duplicated, (
            f"client ids must be distinct (a round of distinct clients could hold one "
            f"twice), these occur more than once: {duplicated[:5]!r}"
        )
        assert list(source.client_ids) == ids
        assert list(make_source().client_ids) == ids

    async def test_all_clients_gives_one_handle_per_client(
        self, make_source: Callable[[], FederatedDataSource]
    ) -> None:
        source = make_source()
        all_clients = getattr(source, "all_clients", None)
        if all_clients is None:
            pytest.skip(f"{type(source).__name__} has no all_clients()")
        handles = all_clients()
        assert all(isinstance(handle, ClientHandle) for handle in handles)
        ids = [handle.client_id for handle in handles]
        assert sorted(ids) == sorted(source.client_ids)

    # Sampling.

    async def test_select_gives_k_handles_of_clients_of_the_source(
        self, make_source: Callable[[], FederatedDataSource]
    ) -> None:
        source = make_source()
        iterator = source.iterator(0)
        known = set(source.client_ids)
        for k in range(1, min(len(known), 5) + 1):
            chosen = iterator.select(k, 1)
            assert isinstance(chosen, list)
            assert len(chosen) == k if self.exact_round_size else len(chosen) <= len(known)
            assert all(isinstance(handle, ClientHandle) for handle in chosen)
            assert {handle.client_id for handle in chosen} <= known

    async def test_a_round_holds_k_distinct_clients(
        self, make_source: Callable[[], FederatedDataSource]
    ) -> None:
        if not self.distinct_clients:
            pytest.skip(f"{type(self).__name__} samples with replacement")
        source = make_source()
        count = len(source.client_ids)
        for seed in SEEDS:
            iterator = source.iterator(seed)
            for round_num in ROUNDS:
                for k in {1, max(1, count // 2), count}:
                    ids = [handle.client_id for handle in iterator.select(k, round_num)]
                    size = k if self.exact_round_size else len(ids)
                    assert len(set(ids)) == size, (seed, round_num, ids)
        with pytest.raises(ValueError, match=rf"\b{count + 1}\b"):
            source.iterator(0).select(count + 1, 1)

    async def test_selection_is_a_pure_function_of_seed_and_round(
        self, make_source: Callable[[], FederatedDataSource]
    ) -> None:
        k = max(1, len(make_source().client_ids) // 2)
        for seed in SEEDS:
            first = make_source().iterator(seed)
            expected = {r: _ids(first.select(k, r)) for r in ROUNDS}
            same_source = make_source().iterator(seed)
            again = {r: _ids(same_source.select(k, r)) for r in reversed(ROUNDS)}
            restarted = make_source().iterator(seed)
            resumed = {r: _ids(restarted.select(k, r)) for r in ROUNDS[2:]}
            assert again == expected
            assert resumed == {r: expected[r] for r in ROUNDS[2:]}
            assert {r: _ids(first.select(k, r)) for r in ROUNDS} == expected

    async def test_a_wrong_k_is_a_type_or_value_error_naming_k(
        self, make_source: Callable[[], FederatedDataSource]
    ) -> None:
        iterator = make_source().iterator(0)
        for bad in (2.0, "2", True, None):
            with pytest.raises(TypeError, match=r"\bk\b"):
                iterator.select(bad, 1)  # type: ignore[arg-type]
        for bad in (0, -1):
            with pytest.raises(ValueError, match=rf"\bk\b.*{bad}"):
                iterator.select(bad, 1)

    async def test_a_wrong_round_is_a_type_or_value_error_naming_the_round(
        self, make_source: Callable[[], FederatedDataSource]
    ) -> None:
        iterator = make_source().iterator(0)
        for bad in (1.0, "1", None):
            with pytest.raises(TypeError, match="round"):
                iterator.select(1, bad)  # type: ignore[arg-type]
        with pytest.raises(ValueError, match=r"round.*-1"):
            iterator.select(1, -1)

    async def test_a_wrong_seed_is_a_type_or_value_error_naming_the_seed(
        self, make_source: Callable[[], FederatedDataSource]
    ) -> None:
        source = make_source()
        for bad in (1.0, "1", None):
            with pytest.raises(TypeError, match="seed"):
                source.iterator(bad)  # type: ignore[arg-type]
        with pytest.raises(ValueError, match=r"seed.*-1"):
            source.iterator(-1)

    # Describing the sampling.

    async def test_describe_is_json_and_equal_for_an_equal_configuration(
        self, make_source: Callable[[], FederatedDataSource]
    ) -> None:
        description = make_source().iterator(3).describe()
        assert json.loads(json.dumps(description)) == description
        assert make_source().iterator(3).describe() == description
        assert make_source().iterator(4).describe() != description

    async def test_a_configuration_description_is_json_and_equal_for_an_equal_source(
        self, make_source: Callable[[], FederatedDataSource]
    ) -> None:
        describe = getattr(make_source(), "describe_configuration", None)
        description = None if describe is None else describe()
        if description is None:
            pytest.skip("the source does not describe its configuration")
        assert isinstance(description, dict), (
            f"describe_configuration() must return a dict or None, got {description!r}"
        )
        assert json.loads(json.dumps(description, allow_nan=False)) == description
        assert make_source().describe_configuration() == description  # type: ignore[attr-defined]

    # Client data.

    async def test_a_handle_loads_the_same_data_every_time(
        self, make_source: Callable[[], FederatedDataSource]
    ) -> None:
        for handle in make_source().iterator(0).select(2, 1):
            data = handle.load()
            assert data is not None, f"client {handle.client_id!r} loaded None"
            self.assert_same_data(handle.load(), data)

    async def test_a_handle_pickles_and_loads_its_data_after_the_trip(
        self, make_source: Callable[[], FederatedDataSource]
    ) -> None:
        if not self.loaders_pickle:
            pytest.skip(f"{type(self).__name__}: loaders stay in this process")
        for handle in make_source().iterator(0).select(2, 1):
            copy = pickle.loads(pickle.dumps(handle))
            assert copy.client_id == handle.client_id
            self.assert_same_data(copy.load(), handle.load())


def _ids(handles: list[ClientHandle]) -> list[str]:
    return [handle.client_id for handle in handles]
