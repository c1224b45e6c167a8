"""`TrainerClient.abandon`: a wait for a core that will never answer ends at once, from another thread."""

from __future__ import annotations

import threading
import time

import pytest

from gyre.engine.launcher import free_port
from gyre.errors import TrainerError
from gyre.train.trainerclient import TrainerClient


@pytest.mark.timing
def test_an_abandoned_wait_raises_the_reason_at_once_and_so_does_every_later_request() -> None:
    client = TrainerClient(f"tcp://127.0.0.1:{free_port()}", timeout_s=60.0)  # nobody listens there
    failed: list[BaseException] = []

    def wait() -> None:
        try:
            client.wait_step(3, timeout_s=3600.0)
        except TrainerError as exc:
            failed.append(exc)

    waiter = threading.Thread(target=wait)
    waiter.start()
    time.sleep(0.3)  # (the wait is under way; abandoning earlier must end it just the same)
    client.abandon("the core cell died")
    waiter.join(timeout=60.0)
    # only abandon ends a wait of 3600 s within 60 s, and with its reason (a loaded machine may take seconds)
    assert not waiter.is_alive()
    assert [str(e) for e in failed] == ["the core cell died"]
    with pytest.raises(TrainerError, match="the core cell died"):
        client.statistics()
    client.close()
