"""`ConnectionGate`: which connection makes room at a cap (issue 31: slow connections starved polite ones)."""

from __future__ import annotations

from gyre.router.listener import ConnectionGate


class Conn:
    """A connection as the gate sees it: one it can close."""

    def __init__(self) -> None:
        self.closed = False

    def evict(self) -> None:
        self.closed = True


def test_at_the_cap_the_longest_waiting_connection_is_closed_and_busy_ones_never() -> None:
    gate = ConnectionGate(limit=3, per_client=3)
    busy, old, recent = Conn(), Conn(), Conn()
    for conn in (busy, old, recent):
        assert gate.admit(conn, "127.0.0.1")
    gate.busy(busy)  # its request arrived whole
    newcomer = Conn()
    assert gate.admit(newcomer, "127.0.0.1")
    assert old.closed and not busy.closed and not recent.closed
    gate.busy(recent)
    gate.busy(newcomer)
    refused = Conn()
    assert not gate.admit(refused, "127.0.0.1")  # all three are serving requests
    assert (gate.evicted, gate.refused) == (1, 1)
    gate.waiting(busy)  # its response went out: it waits again, and is the one to go next
    assert gate.admit(Conn(), "127.0.0.1") and busy.closed and not recent.closed


def test_a_closed_connection_frees_its_place() -> None:
    gate = ConnectionGate(limit=1, per_client=1)
    first = Conn()
    assert gate.admit(first, "10.0.0.1")
    gate.busy(first)
    assert not gate.admit(Conn(), "10.0.0.2")
    gate.release(first)
    assert gate.admit(Conn(), "10.0.0.2") and not first.closed


def test_one_address_at_its_cap_makes_room_among_its_own_connections() -> None:
    gate = ConnectionGate(limit=10, per_client=2)
    neighbour = Conn()
    assert gate.admit(neighbour, "10.0.0.9")  # waiting longest of all
    flood = [Conn(), Conn()]
    for conn in flood:
        assert gate.admit(conn, "10.0.0.1")
    third = Conn()
    assert gate.admit(third, "10.0.0.1")
    assert flood[0].closed and not neighbour.closed
    for conn in (flood[1], third):
        gate.busy(conn)
    assert not gate.admit(Conn(), "10.0.0.1")  # its two are serving: refused, though the total has room
    assert gate.admit(Conn(), "10.0.0.2")


def test_loopback_clients_share_only_the_total() -> None:
    """Every agent on the router's own host comes from loopback: no per-address cap applies to it."""
    gate = ConnectionGate(limit=5, per_client=1)
    conns = [Conn() for _ in range(5)]
    for conn in conns:
        assert gate.admit(conn, "127.0.0.1")
        gate.busy(conn)
    assert not any(conn.closed for conn in conns)
    assert not gate.admit(Conn(), "::1")


def test_connections_that_never_sent_a_request_make_room_before_kept_alive_ones() -> None:
    """A client's connection idle between its calls outlives a flood of silent ones, however long it has idled."""
    gate = ConnectionGate(limit=3, per_client=3)
    kept = Conn()
    assert gate.admit(kept, "127.0.0.1")
    gate.busy(kept)
    gate.waiting(kept)  # answered; idle since, the longest of all
    flood = [Conn() for _ in range(10)]
    for conn in flood:
        assert gate.admit(conn, "127.0.0.1")
    assert not kept.closed and all(conn.closed for conn in flood[:-2])
    gate.busy(flood[-1])
    gate.busy(flood[-2])  # the last two sent whole requests, and are being served: only the kept one can go
    assert gate.admit(Conn(), "127.0.0.1") and kept.closed
