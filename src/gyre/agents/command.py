"""Command agents: any external scaffold process, run inside the execution's sandbox, talking to its own session.

The sandbox has no network. The router's agent API reaches it through one Unix socket bound into the sandbox at
``/run/gyre/router.sock``; a few lines of Python inside forward ``127.0.0.1:8000`` to it, so the scaffold is
started with ``OPENAI_BASE_URL=http://127.0.0.1:8000/s/{session}/v1``, ``OPENAI_API_KEY`` (the session token) and
the model name, like any OpenAI-compatible client expects (and ``GYRE_EXECUTION_ID``, its execution's id). Its
commands run in the same sandbox as it does. A scaffold that fails because its processes passed one of the
sandbox's limits (memory, processes, CPU time: the sandbox kills them, nothing outside it) raises
`ResourceExceeded`: its execution ends ``resource_exceeded`` and scores 0 (trained on), like a workspace over its
quota.
"""

from __future__ import annotations

from gyre.agents.contract import AgentContext, AgentResult, AgentStatus
from gyre.errors import ResourceExceeded

SOCKET_DIR = "/run/gyre"  # inside the sandbox
BRIDGE_PORT = 8000

# TCP on the sandbox's own loopback -> the router's Unix socket; runs on the sandbox's system python3.
BRIDGE = r"""
import asyncio, sys
async def pipe(reader, writer):
    try:
        while data := await reader.read(65536):
            writer.write(data)
            await writer.drain()
    except ConnectionError:
        pass
    finally:
        writer.close()
async def handle(reader, writer):
    up_reader, up_writer = await asyncio.open_unix_connection(sys.argv[1])
    await asyncio.gather(pipe(reader, up_writer), pipe(up_reader, writer))
async def main():
    server = await asyncio.start_server(handle, "127.0.0.1", int(sys.argv[2]))
    await server.serve_forever()
asyncio.run(main())
"""
LAUNCH = (
    f'python3 -c "$GYRE_BRIDGE" {SOCKET_DIR}/router.sock {BRIDGE_PORT} & bridge=$!; '
    f"for _ in $(seq 200); do (exec 3<>/dev/tcp/127.0.0.1/{BRIDGE_PORT}) 2>/dev/null && break; sleep 0.02; done; "
    '"$@"; code=$?; kill $bridge 2>/dev/null; exit $code'
)


class CommandAgent:
    """Runs ``argv`` in the sandbox with the OpenAI environment of its session; exit code 0 means it finished."""

    def __init__(self, argv: list[str], env: dict[str, str] | None = None) -> None:
        if not argv:
            raise ValueError("a command agent needs a command")
        self.argv, self.env = list(argv), dict(env or {})

    async def run(self, ctx: AgentContext) -> AgentResult:
        """Start the scaffold and wait for it (the runtime's deadline kills it with its sandbox)."""
        env = {
            "OPENAI_BASE_URL": f"http://127.0.0.1:{BRIDGE_PORT}/s/{ctx.api_key}/v1",
            "OPENAI_API_BASE": f"http://127.0.0.1:{BRIDGE_PORT}/s/{ctx.api_key}/v1",
            "OPENAI_API_KEY": ctx.api_key,
            "OPENAI_MODEL": ctx.model,
            "GYRE_MODEL": ctx.model,
            "GYRE_TASK": ctx.task.instruction,
            "GYRE_EXECUTION_ID": ctx.execution_id,
            "GYRE_BRIDGE": BRIDGE,
            **self.env,
        }
        result = await ctx.sandbox.exec(
            ["bash", "-c", LAUNCH, "gyre-agent", *self.argv], env=env, timeout_s=max(ctx.remaining_s(), 1.0)
        )
        tail = (result.stdout[-2000:] + "\n" + result.stderr[-2000:]).strip()
        if not result.ok and result.resource_exceeded is not None:
            raise ResourceExceeded(
                f"the scaffold's processes passed the sandbox's {result.resource_exceeded} limit and were killed "
                f"(exit code {result.exit_code}{', ' + result.killed_by if result.killed_by else ''})\n{tail}",
                result.resource_exceeded,
            )
        status: AgentStatus = "finished" if result.exit_code == 0 and not result.timed_out else "gave_up"
        return AgentResult(status=status, detail=f"exit code {result.exit_code}\n{tail}")
