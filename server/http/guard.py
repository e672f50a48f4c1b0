"""Origin / Host guard: DNS-rebinding protection for every daemon route (spec §21.3).

Binding to loopback keeps remote machines out, but not a web page the user visits:
the page can re-point its own hostname at 127.0.0.1 (DNS rebinding) and the browser
then hands it our responses as same-origin. The only server-side evidence of such a
request is its headers, so each HTTP/WebSocket request is screened before routing:

- ``Origin`` is sent by browsers and only by browsers, so a present, foreign value is
  conclusive and an absent one (curl, MCP clients, editors) is fine;
- ``Host`` carries the attacker's hostname after a rebind, so it must name loopback,
  the bind address, or an operator-allowlisted name -- unless the bind address is a
  wildcard, where the legitimate names are unknowable and the check is opt-in.

This is a pure ASGI middleware rather than ``BaseHTTPMiddleware`` so that it also
covers mounted sub-apps (the MCP endpoint) and streaming responses, and never reads
or buffers a body: an allowed request reaches the app with the original ``receive``
and ``send`` untouched.

Header values are parsed the way a browser serialises them (WHATWG URL host rules,
including numeric IPv4 forms such as ``127.1``), but anything a browser could not
have produced -- userinfo, percent-escapes, spaces, non-ASCII, a bad port -- is
rejected rather than interpreted, since guessing at a malformed value can only widen
what is let through.
"""

from __future__ import annotations

import ipaddress
import json
import os
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from starlette.types import ASGIApp, Receive, Scope, Send

_WILDCARD_BIND_HOSTS = frozenset({"", "0.0.0.0", "::", "[::]", "*"})
"""Bind addresses for which the legitimate ``Host`` values cannot be known."""

_DISABLED_WARNING = (
    "Warning: QMD_ALLOWED_ORIGINS=* — DNS-rebinding protection is off. "
    "Only do this behind your own authenticating proxy."
)
_NO_HOST_CHECK_WARNING = (
    "Warning: bound to {host} with no QMD_ALLOWED_HOSTS — Host validation is off "
    "and the index is readable by anyone who can reach this port."
)

_FORBIDDEN_CODE = -32003
_LOOPBACK_V4 = re.compile(r"127\.[0-9]{1,3}\.[0-9]{1,3}\.[0-9]{1,3}")
# A DNS-style name: what a browser puts in Host/Origin after IDNA. Anything else
# (``@``, ``%``, ``\``, spaces, sub-delims) cannot come from a real page load.
_REG_NAME = re.compile(r"[a-z0-9._-]+")
_ORIGIN = re.compile(r"([a-z][a-z0-9+.-]*)://([^/?#]*)(?:[/?#].*)?", re.DOTALL)
_DIGITS = {10: re.compile(r"[0-9]+"), 8: re.compile(r"[0-7]+"), 16: re.compile(r"[0-9a-f]+")}
# Ports that WHATWG drops when serialising an origin, so "https://a:443" == "https://a".
_DEFAULT_PORTS = {"http": 80, "https": 443, "ws": 80, "wss": 443, "ftp": 21}


def is_loopback_hostname(host: str) -> bool:
    """Whether ``host`` names this machine's loopback interface.

    ``0.0.0.0`` is deliberately not loopback: browsers route it to local servers
    without any rebinding, so an ``Origin: http://0.0.0.0:8181`` is as untrusted as
    any foreign one. IPv6 literals are compared as addresses, so every spelling of
    ``::1`` and of an IPv4-mapped ``127/8`` address counts, not only the canonical one.
    """
    h = host.strip().lower().removeprefix("[").removesuffix("]")
    if h == "localhost" or h.endswith(".localhost"):
        return True
    if _LOOPBACK_V4.fullmatch(h.removeprefix("::ffff:")):
        return True
    if ":" not in h or "%" in h:
        return False
    try:
        address = ipaddress.IPv6Address(h)
    except ValueError:
        return False
    mapped = address.ipv4_mapped
    return address.is_loopback or (mapped is not None and mapped.is_loopback)


def _ipv4_number(part: str) -> int | None:
    """One dotted part in WHATWG's IPv4 syntax (decimal, ``0x`` hex, ``0``-octal)."""
    if not part:
        return None
    radix = 10
    if part.startswith("0x"):
        part, radix = part[2:], 16
    elif len(part) > 1 and part.startswith("0"):
        part, radix = part[1:], 8
    if not part:
        return 0
    # int() alone would also accept "_" separators, signs and whitespace.
    return int(part, radix) if _DIGITS[radix].fullmatch(part) else None


def _canonical_ipv4(host: str) -> str | None:
    """Dotted-quad form of a host that ends in a number, or None if it is not an address.

    A browser turns ``127.1`` or ``2130706433`` into ``127.0.0.1`` before sending it,
    and refuses ``evil.127`` outright; doing the same keeps local ``curl`` users working
    and leaves no numeric spelling that slips past the loopback test.
    """
    parts = host.split(".")
    if len(parts) > 1 and parts[-1] == "":
        parts.pop()
    if len(parts) > 4:
        return None
    numbers = [_ipv4_number(p) for p in parts]
    if any(n is None for n in numbers):
        return None
    values = [n for n in numbers if n is not None]
    if any(n > 255 for n in values[:-1]) or values[-1] >= 256 ** (5 - len(values)):
        return None
    packed = values[-1] + sum(n * 256 ** (3 - i) for i, n in enumerate(values[:-1]))
    return str(ipaddress.IPv4Address(packed))


def _ends_in_number(host: str) -> bool:
    """WHATWG's test for "this host must be parsed as an IPv4 address"."""
    parts = host.split(".")
    if len(parts) > 1 and parts[-1] == "":
        parts.pop()
    last = parts[-1]
    return bool(_DIGITS[10].fullmatch(last)) or _ipv4_number(last) is not None


def _canonical_hostname(raw: str) -> str | None:
    """Lowercase hostname (IPv6 kept in brackets), or None if a browser could not send it."""
    if not raw.isascii():
        return None
    host = raw.lower()
    if host.startswith("["):
        inner = host[1:-1]
        if not host.endswith("]") or "%" in inner:
            return None
        try:
            ipaddress.IPv6Address(inner)
        except ValueError:
            return None
        return host
    if not _REG_NAME.fullmatch(host):
        return None
    return _canonical_ipv4(host) if _ends_in_number(host) else host


def _parse_authority(authority: str) -> tuple[str, int | None] | None:
    """Split ``host[:port]`` into a canonical hostname and port; None if malformed.

    An empty port (``localhost:``) is accepted because both RFC 3986 and browsers
    accept it; it means "no port".
    """
    if authority.startswith("["):
        close = authority.find("]")
        if close < 0:
            return None
        host, rest = authority[: close + 1], authority[close + 1 :]
        if rest and not rest.startswith(":"):
            return None
        port_text: str | None = rest[1:] if rest else None
    else:
        host, colon, port_text = authority.partition(":")
        port_text = port_text if colon else None
    hostname = _canonical_hostname(host)
    if hostname is None:
        return None
    if not port_text:
        return hostname, None
    if not _DIGITS[10].fullmatch(port_text) or int(port_text) > 65535:
        return None
    return hostname, int(port_text)


def _parse_origin(origin: str) -> tuple[str, str, str] | None:
    """``(scheme, hostname, normalised scheme://host[:port])`` of an origin, or None.

    A path after the authority is tolerated (some non-browser clients send one);
    schemes without an authority -- ``null``, ``file://``, ``data:`` -- are not origins
    we can attribute to a host and fail here.
    """
    match = _ORIGIN.fullmatch(origin.strip().lower())
    if match is None:
        return None
    scheme, authority = match.group(1), match.group(2)
    parsed = _parse_authority(authority)
    if parsed is None:
        return None
    hostname, port = parsed
    if port is None or port == _DEFAULT_PORTS.get(scheme):
        return scheme, hostname, f"{scheme}://{hostname}"
    return scheme, hostname, f"{scheme}://{hostname}:{port}"


def _split_list(value: str | None) -> list[str]:
    """A comma-separated setting: items trimmed, empty items dropped."""
    if not value:
        return []
    return [item.strip() for item in value.split(",") if item.strip()]


@dataclass(frozen=True)
class GuardSettings:
    """What the guard accepts beyond loopback, resolved once at startup."""

    allowed_origins: frozenset[str]
    """Extra origins, normalised to ``scheme://host[:port]``, lowercase."""
    allowed_hosts: frozenset[str]
    """Extra ``Host`` values (bare hostnames or ``host:port``), lowercase."""
    disabled: bool
    """``QMD_ALLOWED_ORIGINS`` contains ``*``: neither header is checked."""
    enforce_host: bool
    """Whether ``Host`` is checked at all (off for a wildcard bind with no allowlist)."""

    @classmethod
    def build(
        cls, bind_host: str, allowed_origins: str | None, allowed_hosts: str | None
    ) -> tuple[GuardSettings, list[str]]:
        """Resolve the guard for a daemon bound to ``bind_host``.

        Returns the settings and the startup warnings to print (exact texts of §21.3).
        A concrete non-loopback bind address is trusted as a ``Host`` because it is the
        name clients were told to use; a wildcard bind answers to names we cannot know,
        so ``Host`` checking there needs an explicit allowlist. Unparsable origin
        entries are dropped silently, as the spec says.
        """
        origins = _split_list(allowed_origins)
        if "*" in origins:
            return cls(frozenset(), frozenset(), True, False), [_DISABLED_WARNING]
        normalised = frozenset(parsed[2] for parsed in map(_parse_origin, origins) if parsed is not None)
        hosts = {h.lower() for h in _split_list(allowed_hosts)}
        bind = bind_host.strip().lower()
        wildcard = bind in _WILDCARD_BIND_HOSTS
        if not wildcard and not is_loopback_hostname(bind):
            hosts.add(bind)
        enforce_host = not wildcard or bool(hosts)
        settings = cls(normalised, frozenset(hosts), False, enforce_host)
        warnings = [] if enforce_host else [_NO_HOST_CHECK_WARNING.format(host=bind_host)]
        return settings, warnings

    @classmethod
    def from_env(cls, bind_host: str, environ: Mapping[str, str] = os.environ) -> tuple[GuardSettings, list[str]]:
        """``build`` from ``QMD_ALLOWED_ORIGINS`` / ``QMD_ALLOWED_HOSTS``."""
        return cls.build(bind_host, environ.get("QMD_ALLOWED_ORIGINS"), environ.get("QMD_ALLOWED_HOSTS"))


def check_origin(origin: str | None, s: GuardSettings) -> bool:
    """Whether a request's ``Origin`` header value is acceptable.

    Missing or blank is fine (non-browser clients); otherwise an http(s) loopback
    origin or an allowlisted one. ``null``, ``file://``, other schemes on loopback and
    look-alikes such as ``http://127.0.0.1.evil.com`` are refused.
    """
    if s.disabled or origin is None or not origin.strip():
        return True
    parsed = _parse_origin(origin)
    if parsed is None:
        return False
    scheme, hostname, normalised = parsed
    if scheme in ("http", "https") and is_loopback_hostname(hostname):
        return True
    return normalised in s.allowed_origins


def check_host(host: str | None, s: GuardSettings) -> bool:
    """Whether a request's ``Host`` header value is acceptable.

    Missing or blank is fine (HTTP/1.0 clients). Otherwise the hostname must be
    loopback, or the whole value (with port) or its hostname must be allowlisted; an
    IPv6 hostname matches an allowlist entry written with or without brackets, since
    a bind address is usually given bare but always arrives bracketed.
    """
    if s.disabled or not s.enforce_host or host is None or not host.strip():
        return True
    value = host.strip()
    parsed = _parse_authority(value)
    if parsed is None:
        return False
    hostname = parsed[0]
    if is_loopback_hostname(hostname):
        return True
    candidates = {value.lower(), hostname, hostname.removeprefix("[").removesuffix("]")}
    return not candidates.isdisjoint(s.allowed_hosts)


def _rejection_reason(headers: Iterable[tuple[bytes, bytes]], s: GuardSettings) -> str | None:
    """Why a request must be refused, or None to let it through.

    Every ``Origin`` and ``Host`` header is checked, not just the first, so a
    duplicated header cannot smuggle a foreign value past the guard. Origin is
    judged before Host, as in the reference, which fixes the reported reason.
    """
    origins: list[str] = []
    hosts: list[str] = []
    for name, raw in headers:
        key = name.lower()
        if key == b"origin":
            origins.append(raw.decode("latin-1"))
        elif key == b"host":
            hosts.append(raw.decode("latin-1"))
    for origin in origins:
        if not check_origin(origin, s):
            return f"Origin not allowed: {origin.strip()}"
    for host in hosts:
        if not check_host(host, s):
            return f"Host not allowed: {host.strip()}"
    return None


def _forbidden_body(reason: str) -> bytes:
    """The JSON-RPC error document of §21.3, byte-for-byte (compact, key order fixed)."""
    document = {
        "jsonrpc": "2.0",
        "error": {"code": _FORBIDDEN_CODE, "message": f"Forbidden: {reason}"},
        "id": None,
    }
    return json.dumps(document, separators=(",", ":"), ensure_ascii=False).encode("utf-8")


class OriginHostGuard:
    """ASGI middleware applying the guard to every HTTP and WebSocket request.

    Wrap the whole application (or ``app.add_middleware(OriginHostGuard,
    settings=...)``) so that mounted sub-apps and every route, ``/health`` included,
    are behind it. Lifespan and any other scope type pass straight through.
    """

    def __init__(self, app: ASGIApp, settings: GuardSettings) -> None:
        self.app = app
        self.settings = settings

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] not in ("http", "websocket") or self.settings.disabled:
            await self.app(scope, receive, send)
            return
        reason = _rejection_reason(scope.get("headers", ()), self.settings)
        if reason is None:
            await self.app(scope, receive, send)
        elif scope["type"] == "http":
            await self._send_forbidden(send, reason, "http.response")
        elif "websocket.http.response" in scope.get("extensions", {}):
            await self._send_forbidden(send, reason, "websocket.http.response")
        else:
            # Closing before accept makes the server answer the handshake with 403.
            await send({"type": "websocket.close", "code": 1008})

    @staticmethod
    async def _send_forbidden(send: Send, reason: str, prefix: str) -> None:
        """Send the 403 without touching ``receive``: the request body is never read."""
        body = _forbidden_body(reason)
        await send(
            {
                "type": f"{prefix}.start",
                "status": 403,
                "headers": [
                    (b"content-type", b"application/json"),
                    (b"content-length", str(len(body)).encode("ascii")),
                ],
            }
        )
        await send({"type": f"{prefix}.body", "body": body, "more_body": False})
