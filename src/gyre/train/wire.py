"""What a process wrote to its TCP sockets, counted by the kernel (``TCP_INFO``'s ``tcpi_bytes_sent``).

The core cell's ranks report it around their collectives (``gyre.train.sharded``), so the bytes a gradient reduction
or a weight gather moves are the bytes that crossed the wire, whatever the collective library does inside; a rank's
pair groups with satellites and its ZeroMQ sockets are TCP sockets of the same process and count too when they send
at the same time.
"""

from __future__ import annotations

import os
import socket
import struct

_BYTES_SENT = 200  # offset of tcpi_bytes_sent (u64) in struct tcp_info (Linux >= 4.19)
_INFO_SIZE = 232


def tcp_bytes_sent() -> int:
    """Bytes sent so far over this process's open TCP sockets (0 where the kernel has no ``TCP_INFO``)."""
    total = 0
    for fd in os.listdir("/proc/self/fd"):
        try:
            if not os.readlink(f"/proc/self/fd/{fd}").startswith("socket:"):
                continue
            sock = socket.socket(fileno=os.dup(int(fd)))
        except OSError:  # closed meanwhile, or not a socket we may look at
            continue
        try:
            if sock.family not in (socket.AF_INET, socket.AF_INET6) or sock.type != socket.SOCK_STREAM:
                continue
            info = sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_INFO, _INFO_SIZE)
            if len(info) >= _BYTES_SENT + 8:
                total += struct.unpack_from("Q", info, _BYTES_SENT)[0]
        except OSError:
            continue
        finally:
            sock.close()
    return total
