import pytest

from managers.closing import AsyncClosing

pytestmark = pytest.mark.anyio


class Holder(AsyncClosing):
    def __init__(self) -> None:
        self.closed = 0

    async def aclose(self) -> None:
        self.closed += 1


async def test_async_with_gives_the_object_and_closes_it_when_the_block_ends() -> None:
    holder = Holder()
    async with holder as entered:
        assert entered is holder and holder.closed == 0
    assert holder.closed == 1


async def test_async_with_closes_the_object_when_the_block_fails_and_lets_the_error_through() -> (
    None
):
    holder = Holder()
    with pytest.raises(KeyError, match="lost"):
        async with holder:
            raise KeyError("lost")
    assert holder.closed == 1


async def test_the_default_aclose_holds_nothing_to_release() -> None:
    async with AsyncClosing() as plain:
        assert isinstance(plain, AsyncClosing)
