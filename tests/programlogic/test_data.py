import pickle

import pytest

from programlogic import (
    AllClientsDataSource,
    ClientHandle,
    ClientSampler,
    ClientTable,
    FederatedDataSource,
    HandleDataSource,
    InMemoryDataSource,
    Sampling,
    TableBackedLoader,
)
from programlogic.testing import FakeDataSource

pytestmark = pytest.mark.anyio


def make_source(count: int = 10, sampling: str = "uniform") -> InMemoryDataSource:
    return InMemoryDataSource({f"c{i}": [i] for i in range(count)}, sampling=sampling)


def ids(handles: list[ClientHandle]) -> list[str]:
    return [handle.client_id for handle in handles]


async def test_selection_is_a_pure_function_of_seed_and_round() -> None:
    first = make_source().iterator(seed=7)
    second = make_source().iterator(seed=7)
    forward = [ids(first.select(3, r)) for r in range(1, 6)]
    backward = [ids(second.select(3, r)) for r in reversed(range(1, 6))]
    assert forward == list(reversed(backward))


async def test_selection_changes_with_round_and_seed() -> None:
    source = make_source(50)
    by_round = {tuple(ids(source.iterator(0).select(5, r))) for r in range(1, 11)}
    by_seed = {tuple(ids(source.iterator(s).select(5, 1))) for s in range(10)}
    assert len(by_round) > 1 and len(by_seed) > 1


async def test_uniform_sampling_picks_distinct_clients() -> None:
    iterator = make_source(10).iterator(3)
    for round_num in range(1, 50):
        chosen = ids(iterator.select(10, round_num))
        assert sorted(chosen) == sorted(f"c{i}" for i in range(10))


async def test_sampling_with_replacement_may_repeat_and_exceed_the_client_count() -> None:
    iterator = make_source(3, Sampling.WITH_REPLACEMENT).iterator(0)
    chosen = ids(iterator.select(30, 1))
    assert len(chosen) == 30
    assert len(set(chosen)) <= 3


async def test_fixed_cohort_is_the_same_every_round() -> None:
    iterator = make_source(20, "fixed").iterator(5)
    cohorts = {tuple(ids(iterator.select(4, r))) for r in range(1, 20)}
    assert len(cohorts) == 1
    assert len(set(next(iter(cohorts)))) == 4


async def test_selection_does_not_depend_on_the_order_of_the_mapping() -> None:
    forward = InMemoryDataSource({f"c{i}": i for i in range(8)})
    backward = InMemoryDataSource({f"c{i}": i for i in reversed(range(8))})
    assert ids(forward.iterator(1).select(3, 4)) == ids(backward.iterator(1).select(3, 4))
    assert forward.iterator(1).describe() == backward.iterator(1).describe()


async def test_describe_tells_seed_sampling_and_clients_apart() -> None:
    base = make_source(5).iterator(0).describe()
    assert make_source(5).iterator(1).describe() != base
    assert make_source(5, "fixed").iterator(0).describe() != base
    assert InMemoryDataSource({f"d{i}": i for i in range(5)}).iterator(0).describe() != base


@pytest.mark.parametrize("k", [0, -1])
async def test_non_positive_k_is_a_value_error(k: int) -> None:
    with pytest.raises(ValueError, match=rf"k must be an int >= 1, got {k}$"):
        make_source().iterator(0).select(k, 1)


async def test_more_clients_than_exist_without_replacement_is_a_value_error() -> None:
    with pytest.raises(ValueError, match="cannot select 11 distinct clients from 10"):
        make_source(10).iterator(0).select(11, 1)
    with pytest.raises(ValueError, match="cannot select 11 distinct clients from 10"):
        make_source(10, "fixed").iterator(0).select(11, 1)


async def test_bad_k_type_round_and_seed_are_rejected() -> None:
    iterator = make_source().iterator(0)
    with pytest.raises(TypeError, match="k must be an int"):
        iterator.select(2.0, 1)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="round_num must be an int >= 0"):
        iterator.select(2, -1)
    with pytest.raises(ValueError, match="seed must be an int >= 0"):
        make_source().iterator(-3)


async def test_bad_data_sources_are_rejected() -> None:
    with pytest.raises(ValueError, match="at least one client"):
        InMemoryDataSource({})
    with pytest.raises(TypeError, match="client ids must be str"):
        InMemoryDataSource({1: "data"})  # type: ignore[dict-item]
    with pytest.raises(TypeError, match="clients must be a Mapping, got list"):
        InMemoryDataSource([("a", 1)])  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="sampling must be one of 'uniform'"):
        InMemoryDataSource({"a": 1}, sampling="round_robin")


async def test_handles_load_their_client_data_and_compare_by_id() -> None:
    source = InMemoryDataSource({"alice": [1, 2], "bob": [3]})
    handles = {h.client_id: h for h in source.iterator(0).select(2, 1)}
    assert handles["alice"].load() == [1, 2]
    assert handles["bob"].load() == [3]
    assert handles["alice"] == ClientHandle("alice", lambda: None)
    assert handles["alice"] != handles["bob"]
    assert sorted(handles.values()) == [handles["alice"], handles["bob"]]
    assert len({handles["alice"], ClientHandle("alice", list)}) == 1
    assert repr(handles["bob"]) == "ClientHandle('bob')"
    assert str(handles["bob"]) == "bob"


async def test_handles_can_travel_to_another_process() -> None:
    handle = make_source().iterator(0).select(1, 1)[0]
    copy = pickle.loads(pickle.dumps(handle))
    assert copy == handle and copy.load() == handle.load()


async def test_the_mapping_is_copied() -> None:
    clients = {"a": 1, "b": 2}
    source = InMemoryDataSource(clients)
    clients["c"] = 3
    assert source.client_ids == ["a", "b"]


async def test_fake_data_source_is_deterministic() -> None:
    first, second = FakeDataSource(4, dim=3, seed=2), FakeDataSource(4, dim=3, seed=2)
    handle = first.iterator(0).select(1, 1)[0]
    same = next(h for h in second.iterator(0).select(4, 1) if h == handle)
    assert (handle.load() == same.load()).all()
    assert handle.load().shape == (5, 3)
    with pytest.raises(ValueError, match="num_clients must be an int >= 1, got 0"):
        FakeDataSource(0)


@pytest.mark.parametrize(
    ("sampling", "expected"),
    [
        ("uniform", ["c08", "c10", "c01", "c16", "c19"]),
        ("with_replacement", ["c08", "c01", "c02", "c08", "c11"]),
        ("fixed", ["c01", "c14", "c12", "c04", "c11"]),
    ],
)
async def test_selection_is_pinned_so_checkpoints_resume_across_library_versions(
    sampling: str, expected: list[str]
) -> None:
    source = InMemoryDataSource({f"c{i:02d}": i for i in range(20)}, sampling=sampling)
    assert ids(source.iterator(42).select(5, 7)) == expected


async def test_a_fixed_cohort_of_k_is_the_start_of_a_larger_one() -> None:
    iterator = make_source(30, "fixed").iterator(9)
    assert ids(iterator.select(12, 1))[:5] == ids(iterator.select(5, 1))


async def test_uniform_sampling_is_close_to_uniform() -> None:
    iterator = make_source(10).iterator(0)
    counts = dict.fromkeys((f"c{i}" for i in range(10)), 0)
    rounds = 4000
    for round_num in range(rounds):
        for client_id in ids(iterator.select(3, round_num)):
            counts[client_id] += 1
    expected = rounds * 3 / 10
    chi_square = sum((count - expected) ** 2 / expected for count in counts.values())
    assert chi_square < 27.9  # the 0.999 quantile of chi-square with 9 degrees of freedom


async def test_an_in_memory_handle_pickles_with_its_data() -> None:
    source = make_source(4)
    handles = source.all_clients()
    copies = pickle.loads(pickle.dumps(handles))
    assert [copy.client_id for copy in copies] == ["c0", "c1", "c2", "c3"]
    assert [copy.load() for copy in copies] == [[0], [1], [2], [3]]
    # The handles of one pickle share one copy of the table.
    assert len({id(copy.loader.table) for copy in copies}) == 1


async def test_in_memory_loaders_offer_their_shared_table_to_remote_backends() -> None:
    handles = make_source(3).all_clients()
    loaders = [handle.loader for handle in handles]
    assert all(isinstance(loader, TableBackedLoader) for loader in loaders)
    assert len({loader.table.key for loader in loaders}) == 1
    for handle, loader in zip(handles, loaders, strict=True):
        assert loader.table.data[loader.client_id] == handle.load()
    assert not isinstance(ClientHandle("plain", list).loader, TableBackedLoader)


async def test_a_loader_of_ones_own_table_is_table_backed() -> None:
    class RowLoader:
        def __init__(self, table: ClientTable, client_id: str) -> None:
            self.table, self.client_id = table, client_id

        def __call__(self) -> list[int]:
            return self.table.data[self.client_id]

    table = ClientTable({"a": [1], "b": [2]})
    assert isinstance(RowLoader(table, "b"), TableBackedLoader)


async def test_sources_that_list_every_client_are_all_clients_data_sources() -> None:
    class SamplingOnly:
        client_ids = ("a",)

        def iterator(self, seed: int):
            return make_source().iterator(seed)

    assert isinstance(make_source(), AllClientsDataSource)
    assert isinstance(FakeDataSource(3), AllClientsDataSource)
    assert isinstance(SamplingOnly(), FederatedDataSource)
    assert not isinstance(SamplingOnly(), AllClientsDataSource)


async def test_a_source_of_handles_with_duplicated_ids_is_refused_naming_them() -> None:
    handles = [ClientHandle(f"c{i % 7}", list) for i in range(10)]
    with pytest.raises(ValueError, match=r"handles.*duplicated client ids: \['c0', 'c1', 'c2'\]"):
        HandleDataSource(handles)
    many = [ClientHandle(f"c{i % 30}", list) for i in range(80)]
    with pytest.raises(
        ValueError, match=r"\['c0', 'c1', 'c2', 'c3', 'c4'\] and 25 more \(30 ids appear"
    ):
        HandleDataSource(many)


async def test_a_sampler_of_handles_with_duplicated_ids_is_refused() -> None:
    # A "distinct" uniform round used to pick the same client twice.
    handles = [ClientHandle(f"c{i}", list) for i in range(199)] + [ClientHandle("c5", list)]
    with pytest.raises(ValueError, match=r"duplicated client ids: \['c5'\] \(1 id appears"):
        ClientSampler(handles, seed=0)


async def test_distinct_handles_give_rounds_of_distinct_clients() -> None:
    source = HandleDataSource([ClientHandle(f"c{i}", list) for i in range(12)])
    iterator = source.iterator(3)
    for round_num in range(200):
        chosen = ids(iterator.select(12, round_num))
        assert len(set(chosen)) == 12
