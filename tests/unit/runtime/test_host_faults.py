"""Whose failure an execution's is (issue 31): the host's (dropped, never trained) or its agent's (scored 0)."""

from __future__ import annotations

import errno

import httpx

from gyre.runtime.dispatch import _host_fault


def _raised_from(cause: BaseException, wrapper: BaseException) -> BaseException:
    try:
        try:
            raise cause
        except BaseException as inner:
            raise wrapper from inner
    except BaseException as outer:
        return outer


def test_the_driver_out_of_descriptors_memory_or_disk_is_the_hosts_fault_however_wrapped() -> None:
    emfile = OSError(errno.EMFILE, "Too many open files")
    assert _host_fault(emfile)
    assert _host_fault(_raised_from(emfile, httpx.ConnectError("cannot connect")))  # an agent's model call
    assert _host_fault(ExceptionGroup("calls", [ValueError("x"), OSError(errno.ENOSPC, "No space left")]))
    assert _host_fault(RuntimeError("[Errno 24] Too many open files"))  # a library that kept only the message


def test_what_the_agent_caused_is_its_own() -> None:
    assert not _host_fault(OSError(errno.ENAMETOOLONG, "File name too long"))  # a 2,100-deep workspace
    assert not _host_fault(PermissionError(errno.EACCES, "Permission denied"))
    assert not _host_fault(TimeoutError())
    assert not _host_fault(_raised_from(ValueError("bad reply"), RuntimeError("the agent gave up")))
