"""The error tree. A failed execution is data recorded on the execution; everything else propagates.

::

    GyreError
    ├── ConfigError            a config file, override or model directory is wrong; says which field
    ├── ProtocolError          a message between processes could not be decoded
    ├── EngineError            an inference engine failed or refused a request
    │   ├── EngineRequestError     the engine rejected the request (HTTP 4xx): the caller's input is wrong
    │   ├── EngineUnavailable      the engine cannot be reached, crashed, timed out or answered 5xx
    │   │   └── EngineHung         it keeps its sockets open but stopped answering /health (router.hung_after_s)
    │   └── EngineCapacityError    the request can never fit (longer than the context or the KV cache)
    ├── SandboxError           a sandbox could not be created, used or cleaned up
    │   ├── WorkspaceLimitExceeded a workspace passed its disk, inode or copy-time limit (recorded on its execution)
    │   └── ResourceExceeded       a command agent's processes passed the sandbox's memory, process or CPU limit
    ├── AgentError             an agent broke its contract (recorded on the execution)
    ├── TaskError              a task directory or task suite is malformed; says which file and field
    ├── TrainerError           the core trainer refused a request or did not answer; says which and why
    │   ├── CoreUnreachable        a satellite lost its core (silent, or refused it) and stops
    │   └── CoreLost               the driver lost the core cell (it holds the optimizer): the run stops, resumable
    └── CellError              a cell did not start, or a role switch failed; says which cell and why
        └── SwitchFailed           a switch was refused, reported an error, or its cell went away
"""

from __future__ import annotations


class GyreError(Exception):
    """Root of every error Gyre raises on purpose."""


class ConfigError(GyreError):
    """A config file, a dotted-key override or a model directory is wrong."""


class ProtocolError(GyreError):
    """A message between processes could not be encoded or decoded."""


class EngineError(GyreError):
    """An inference engine failed or refused a request."""


class EngineRequestError(EngineError):
    """The engine rejected a request as invalid (HTTP 4xx). ``status`` is the HTTP status."""

    def __init__(self, message: str, status: int = 400) -> None:
        super().__init__(message)
        self.status = status


class EngineUnavailable(EngineError):
    """The engine cannot serve: connection refused, crashed, timed out or answered 5xx."""


class EngineHung(EngineUnavailable):
    """The engine stopped answering its ``/health`` probe while calls were in flight there."""


class EngineCapacityError(EngineRequestError):
    """The request can never fit in this engine (context length or KV cache size); HTTP 413."""

    def __init__(self, message: str, status: int = 413) -> None:
        super().__init__(message, status)


class SandboxError(GyreError):
    """A sandbox could not be created, used or cleaned up."""


class WorkspaceLimitExceeded(SandboxError):
    """A workspace passed one of its limits: ``resource`` ("disk", "inodes" or "time"), ``limit``, ``seen``."""

    def __init__(self, resource: str, limit: float, seen: float) -> None:
        if resource == "disk":
            what = f"holds more than {limit / 2**20:g} MiB of files (sandbox.disk_quota_mib)"
        elif resource == "inodes":
            what = f"holds more than {int(limit)} files, directories and links (sandbox.max_inodes)"
        else:
            what = f"took longer than {limit:g} s to copy (sandbox.copy_timeout_s)"
        super().__init__(f"the workspace {what}")
        self.resource, self.limit, self.seen = resource, limit, seen


class ResourceExceeded(SandboxError):
    """A command agent's processes passed one of their sandbox's limits (``resource``: one of
    `gyre.sandbox.interface.RESOURCES`) and were killed inside it; recorded on its execution (``resource_exceeded``)."""

    def __init__(self, message: str, resource: str) -> None:
        super().__init__(message)
        self.resource = resource


class AgentError(GyreError):
    """An agent broke its contract; recorded on its execution, never raised into the driver."""


class ContextOverflow(AgentError):
    """A model call's prompt cannot fit the model's context (the router's 413): the agent's to handle."""


class TaskError(GyreError):
    """A task directory or suite is malformed; the message names the file and field."""


class TrainerError(GyreError):
    """The core trainer refused a request or did not answer in time; the message says which and why."""


class CoreUnreachable(TrainerError):
    """A satellite's core stopped answering or refused it; the satellite stops."""


class CoreLost(TrainerError):
    """The core cell (the optimizer and the weights) went away mid-run; the run stops, and ``gyre train --resume``
    continues it from its last checkpoint."""


class CellError(GyreError):
    """A cell did not start, or a role switch of a cell failed."""


class SwitchFailed(CellError):
    """A role switch could not be carried out (refused, the cell reported an error, went away or timed out)."""
