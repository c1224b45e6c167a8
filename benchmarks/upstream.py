"""A minimal engine stand-in for benchmarks: answers ``/generate`` with canned token ids, after a chosen latency.

Run as ``python benchmarks/upstream.py PORT MEDIAN_LATENCY_S REPLIES_JSON``: a bare asyncio HTTP/1.1 server (so
it costs the measurement as little as possible) that answers each POST, after a lognormal delay with the given
median (0: at once), with one of the replies (lists of token ids, picked uniformly).
"""

from __future__ import annotations

import asyncio
import json
import random
import sys


def response(ids: list[int]) -> bytes:
    """A whole HTTP response carrying a finished /generate body for ``ids``."""
    meta = {
        "id": "x", "finish_reason": {"type": "stop", "matched": ids[-1]}, "prompt_tokens": 1,
        "completion_tokens": len(ids), "weight_version": "0", "output_token_logprobs": [[-0.5, t, None] for t in ids],
    }  # fmt: skip
    data = json.dumps({"text": "", "output_ids": ids, "meta_info": meta}).encode()
    return (
        b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: %d\r\n\r\n" % len(data) + data
    )


async def serve(port: int, median_s: float, replies: list[list[int]]) -> None:
    """Serve until killed."""
    answers = [response(ids) for ids in replies]

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while True:
                header = await reader.readuntil(b"\r\n\r\n")
                length = 0
                for line in header.split(b"\r\n"):
                    if line.lower().startswith(b"content-length:"):
                        length = int(line.split(b":")[1])
                if length:
                    await reader.readexactly(length)
                if header.startswith(b"GET"):
                    writer.write(b"HTTP/1.1 200 OK\r\ncontent-length: 0\r\n\r\n")
                    continue
                if median_s > 0:
                    await asyncio.sleep(random.lognormvariate(0, 0.75) * median_s)
                writer.write(random.choice(answers))
        except (asyncio.IncompleteReadError, ConnectionError):
            writer.close()

    server = await asyncio.start_server(handle, "127.0.0.1", port, backlog=4096)
    await server.serve_forever()


if __name__ == "__main__":
    asyncio.run(serve(int(sys.argv[1]), float(sys.argv[2]), json.loads(sys.argv[3])))
