"""The driver's collector (`gyre.driver.eventloop`): full collections skip what survived the last one, and a periodic one that
walks everything still reclaims garbage cycles among old objects."""

from __future__ import annotations

import gc
import weakref

import pytest

from gyre.driver.eventloop import Governor, run


class Node:
    pass


@pytest.fixture
def governed():  # type: ignore[no-untyped-def]
    gc.collect()
    governor = Governor(thaw_every=3, thaw_interval_s=0).install()
    yield governor
    governor.remove()
    gc.unfreeze()


def _old_cycle() -> weakref.ref[Node]:
    """A cycle that survives a full collection (so it is frozen), then becomes garbage."""
    node = Node()
    node.me = node  # type: ignore[attr-defined]
    gc.collect()
    return weakref.ref(node)


def test_survivors_are_frozen_and_a_thaw_reclaims_old_cycles(governed: Governor) -> None:
    ref = _old_cycle()
    assert governed.full >= 1 and gc.get_freeze_count() > 0, "survivors of a full collection were not frozen"
    while not governed.due():  # collections before the next thaw skip the cycle
        gc.collect()
        assert ref() is not None, "a frozen object was walked before its thaw"
    gc.collect()  # the thaw: walks the whole heap
    assert ref() is None, "a garbage cycle among old objects outlived the collection that walks everything"
    assert governed.thawed == 1


def test_young_cycles_are_reclaimed_without_a_thaw(governed: Governor) -> None:
    node = Node()
    node.me = node  # type: ignore[attr-defined]
    ref = weakref.ref(node)
    del node
    gc.collect()
    assert ref() is None and governed.thawed == 0


def test_collections_in_quick_succession_never_walk_the_whole_heap_twice() -> None:
    """However fast something allocates (and so collects), the whole heap is walked at most once an interval."""
    gc.collect()
    governor = Governor(thaw_every=2, thaw_interval_s=3600).install()
    try:
        for _ in range(20):
            gc.collect()
        assert (governor.full, governor.thawed) == (20, 0)
    finally:
        governor.remove()
        gc.unfreeze()


def test_run_returns_the_result_and_leaves_no_governor_behind() -> None:
    async def main() -> int:
        assert any(isinstance(cb, Governor) for cb in gc.callbacks)
        return 7

    assert run(main()) == 7
    assert not any(isinstance(cb, Governor) for cb in gc.callbacks)
    gc.unfreeze()


def test_thaw_every_must_be_positive() -> None:
    with pytest.raises(ValueError, match="at least 1"):
        Governor(thaw_every=0)
