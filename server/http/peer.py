"""Only the daemon's own user: a loopback connection from another local account is refused.

qmdd binds loopback, but loopback is shared by every user of the machine: without this,
anyone on it could add `/etc` as a collection, read what the daemon can read, or set a
collection's update command and have the daemon run it (issue 13). The kernel knows
who owns each end of a loopback TCP connection (`/proc/net/tcp`, `/proc/net/tcp6`), so
the daemon asks it, per request: no token to generate, copy or configure, and every
same-user client (the CLI, the MCP bridge, an editor speaking MCP over HTTP) works as
it is. A configured token (`QMD_TOKEN`) replaces this check: it is how a daemon is
shared on purpose (a container's published port, a team machine). Where `/proc` has
no such table (not Linux) the check cannot run; the daemon says so at start.
"""

from __future__ import annotations

import errno
import ipaddress
import json
import os
import socket
import struct
from collections.abc import Awaitable, Callable, MutableMapping
from pathlib import Path
from typing import Any

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]

OPEN_PATHS = frozenset({"/health"})
"""Liveness probes answer anyone: they reveal no more than that a qmdd runs."""
TABLES = (Path("/proc/net/tcp"), Path("/proc/net/tcp6"))


def supported() -> bool:
    return TABLES[0].exists()


def _packed(host: str) -> tuple[bytes | None, bytes]:
    """The address as 4 bytes (None for an IPv6 one that maps no IPv4 one) and as 16 (an IPv4
    one mapped): a loopback connection can be listed in either family."""
    ip = ipaddress.ip_address(host)
    v6 = ip if isinstance(ip, ipaddress.IPv6Address) else ipaddress.IPv6Address(f"::ffff:{ip}")
    v4 = ip if isinstance(ip, ipaddress.IPv4Address) else v6.ipv4_mapped
    return (v4.packed if v4 is not None else None), v6.packed


def _hex(host: str, port: int) -> tuple[str, str]:
    """`host:port` as /proc/net/tcp{,6} spell it, for both tables: each 32-bit word of
    the address in host (little-endian) byte order, then the port in hex."""
    four, raw = _packed(host)
    words = "".join(raw[i : i + 4][::-1].hex() for i in range(0, 16, 4)).upper()
    return f"{four[::-1].hex().upper() if four else ''}:{port:04X}", f"{words}:{port:04X}"


def peer_uid(client: tuple[str, int], server: tuple[str, int]) -> int | None:
    """The uid owning the client end of the TCP connection `client` → `server`, or None
    when the kernel does not list it (not Linux, or the connection just closed).

    Asked of the kernel for that one socket (sock_diag over netlink, as `ss` does: about
    30 µs) where it can be; else read from the whole tables, which the kernel writes out in
    full on every read (5 ms a read measured on a sandboxed kernel: 10 ms of every
    request before its route ran)."""
    try:
        return _diag_uid(client, server)
    except OSError:
        return _table_uid(client, server)


SOCK_DIAG_BY_FAMILY = 20
NLMSG_ERROR = 2
NETLINK_SOCK_DIAG = 4
_NO_COOKIE = struct.pack("=II", 0xFFFFFFFF, 0xFFFFFFFF)


def _diag_uid(client: tuple[str, int], server: tuple[str, int]) -> int | None:
    """sock_diag's exact lookup of the socket bound to `client` and connected to `server`,
    in each address family it could live in (an IPv4 peer of a dual-stack socket is a
    mapped IPv6 one); None if in none. OSError when netlink itself cannot answer."""
    try:
        families = _families(client[0], server[0])
    except ValueError:
        return None
    with socket.socket(socket.AF_NETLINK, socket.SOCK_DGRAM, NETLINK_SOCK_DIAG) as nl:
        nl.settimeout(1.0)
        for family, (src, dst) in families:
            sockid = struct.pack("!HH", client[1], server[1]) + src + dst + struct.pack("=I", 0) + _NO_COOKIE
            request = struct.pack("=BBBBI", family, socket.IPPROTO_TCP, 0, 0, 0xFFFFFFFF) + sockid
            header = struct.pack("=IHHII", 16 + len(request), SOCK_DIAG_BY_FAMILY, 1, 1, 0)  # NLM_F_REQUEST
            nl.sendto(header + request, (0, 0))
            reply = nl.recv(8192)
            kind = struct.unpack_from("=H", reply, 4)[0]
            if kind == SOCK_DIAG_BY_FAMILY:
                return int(struct.unpack_from("=I", reply, 16 + 64)[0])  # inet_diag_msg.idiag_uid
            error = -struct.unpack_from("=i", reply, 16)[0] if kind == NLMSG_ERROR else errno.EPROTO
            if error != errno.ENOENT:
                raise OSError(error, f"sock_diag: {os.strerror(error)}")
    return None


def _families(client: str, server: str) -> list[tuple[socket.AddressFamily, tuple[bytes, bytes]]]:
    """(family, (client, server) as inet_diag_sockid spells them: 16 bytes each)."""
    (client4, client6), (server4, server6) = _packed(client), _packed(server)
    v6 = (socket.AF_INET6, (client6, server6))
    if client4 is None or server4 is None:
        return [v6]
    return [(socket.AF_INET, (client4 + bytes(12), server4 + bytes(12))), v6]


def _table_uid(client: tuple[str, int], server: tuple[str, int]) -> int | None:
    """The same from /proc/net/tcp{,6}: every connection of the machine, read and searched."""
    try:
        local4, local6 = _hex(*client)
        remote4, remote6 = _hex(*server)
    except ValueError:
        return None
    for table, local, remote in ((TABLES[0], local4, remote4), (TABLES[1], local6, remote6)):
        try:
            lines = table.read_text().splitlines()[1:]
        except OSError:
            continue
        for line in lines:
            parts = line.split()
            if len(parts) > 7 and parts[1] == local and parts[2] == remote:
                return int(parts[7])
    return None


def _loopback(host: str) -> bool:
    try:
        ip = ipaddress.ip_address(host)
    except ValueError:
        return False
    mapped = ip.ipv4_mapped if isinstance(ip, ipaddress.IPv6Address) else None
    return (mapped or ip).is_loopback


class SameUser:
    """ASGI middleware: a loopback request from another uid (root excepted) is a 403."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app
        self.uid = os.getuid()
        self.checkable = supported()

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        client, server = scope.get("client"), scope.get("server")
        if (
            scope["type"] not in ("http", "websocket")
            or scope.get("path") in OPEN_PATHS
            or not client
            or not server
            or not _loopback(client[0])
        ):
            await self.app(scope, receive, send)
            return
        uid = peer_uid((client[0], int(client[1])), (server[0], int(server[1])))
        if uid in (self.uid, 0) or (uid is None and not self.checkable):
            await self.app(scope, receive, send)
            return
        if scope["type"] == "websocket":
            await send({"type": "websocket.close", "code": 1008})
            return
        # Unlisted on a system that lists connections: the client is already gone, or
        # hiding; either way nobody is known to be allowed.
        who = f"another local user (uid {uid})" if uid is not None else "a peer the kernel does not list"
        body = json.dumps(
            {
                "error": f"refused: this connection comes from {who}; qmdd serves only its own user"
                f" (uid {self.uid}). To share a daemon on purpose, start it with QMD_TOKEN set"
                " and send 'Authorization: Bearer <token>'."
            }
        ).encode()
        await send(
            {
                "type": "http.response.start",
                "status": 403,
                "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())],
            }
        )
        await send({"type": "http.response.body", "body": body, "more_body": False})
