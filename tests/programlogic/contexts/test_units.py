import pytest

from programlogic import ClientError, ClientHandle
from programlogic.contexts.units import check_group_size, compute_unit, split_units

pytestmark = pytest.mark.anyio


def handles(count: int) -> list[ClientHandle]:
    return [ClientHandle(f"c{i}", lambda i=i: i) for i in range(count)]


async def test_clients_are_cut_in_order_into_units_of_the_group_size() -> None:
    units = split_units(handles(7), 3)
    assert [[c.client_id for c in unit] for unit in units] == [
        ["c0", "c1", "c2"],
        ["c3", "c4", "c5"],
        ["c6"],
    ]
    assert [len(unit) for unit in split_units(handles(3), None)] == [1, 1, 1]
    assert split_units([], 4) == []


@pytest.mark.parametrize(
    ("bad", "error"),
    [(0, ValueError), (-1, ValueError), (1.5, TypeError), (True, TypeError), ("2", TypeError)],
)
async def test_a_bad_group_size_is_a_clear_error(bad, error) -> None:
    with pytest.raises(error, match="group_size must be an int >= 1 or None, got"):
        check_group_size(bad)


async def test_a_unit_loads_its_clients_and_calls_the_function() -> None:
    clients = handles(3)
    loads = [client.load for client in clients]
    assert compute_unit(lambda b, cid, d: (cid, b + d), 10, ["c0"], loads[:1], False) == [
        ("c0", 10)
    ]
    grouped = compute_unit(
        lambda b, ids, ds: [b * d for d in ds], 2, ["c0", "c1", "c2"], loads, True
    )
    assert grouped == [0, 2, 4]


async def test_a_failing_unit_names_its_clients() -> None:
    def wrong_count(broadcast, ids, datas):
        return [1]

    with pytest.raises(ClientError, match=r"\['a', 'b'\].*returned 1 results for 2 clients"):
        compute_unit(wrong_count, 0, ["a", "b"], [lambda: 1, lambda: 2], True)
    with pytest.raises(ClientError, match=r"client 'a'.*ZeroDivisionError"):
        compute_unit(lambda b, cid, d: 1 / 0, 0, ["a"], [lambda: 1], False)
