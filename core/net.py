"""Outbound requests to addresses other people choose: the SSRF guard.

Operators choose the URL their lease events are POSTed to; the platform's workers sit inside its network,
next to PostgreSQL, Redis and the cloud's metadata service. So an endpoint URL must be https (http only
where ``CARDHOUR_ENDPOINT_ALLOW_HTTP`` says so: development), carry no credentials, and its host must not
be — or resolve to — a loopback, private, link-local, CGNAT, multicast, reserved or otherwise non-global
address (IPv4-mapped and NAT64 forms included), nor a well-known internal name. ``CARDHOUR_ENDPOINT_ALLOW_LOOPBACK``
lets loopback through for tests and `make run`'s demo agents, never anything else.

Checked twice: when the URL is saved (``endpoint_url_check``: a clear 400 naming the field), and when a
request is sent (``post_pinned``): the host is resolved again, every address is checked, and the connection
is made to the checked address itself, with the host name kept for TLS (SNI and certificate) and the Host
header — so a name that resolved to a public address when saved and to 10.0.0.5 now (DNS rebinding) is
refused at send time, and nothing re-resolves between the check and the connect. Redirects are never
followed.

A host that does not resolve when saved is accepted (the operator may register before DNS is live, and
this sandbox has no DNS at all); the check at send time still applies.
"""

from __future__ import annotations

import http.client
import ipaddress
import socket
import ssl
from dataclasses import dataclass
from urllib.parse import urlsplit

from django.conf import settings
from django.utils.translation import gettext as _

from core.errors import InvalidInputError

BLOCKED_NAMES = ("localhost", "metadata.google.internal", "metadata", "instance-data", "metadata.azure.com")
BLOCKED_SUFFIXES = (".localhost", ".internal", ".local", ".localdomain", ".home.arpa")


class UnsafeEndpointError(InvalidInputError):
    code = "endpoint_url_forbidden"


@dataclass(frozen=True)
class Target:
    scheme: str
    host: str
    port: int
    path: str


def _fail(url: str, why: str, field: str) -> UnsafeEndpointError:
    return UnsafeEndpointError(
        _("%(url)s cannot be an endpoint: %(why)s.") % {"url": url[:200], "why": why},
        extra={"fields": {field: [_("Not allowed: %(why)s.") % {"why": why}]}, "reason": why},
    )


def _parse(url: str, *, field: str) -> Target:
    try:
        parts = urlsplit(url)
        port = parts.port
    except ValueError as exc:
        raise _fail(url, _("not a valid URL"), field) from exc
    allowed = ("https", "http") if settings.CARDHOUR_ENDPOINT_ALLOW_HTTP else ("https",)
    if parts.scheme not in allowed:
        raise _fail(url, _("the scheme must be %(schemes)s") % {"schemes": " / ".join(allowed)}, field)
    if parts.username is not None or parts.password is not None:
        raise _fail(url, _("credentials in the URL"), field)
    host = (parts.hostname or "").rstrip(".").lower()
    if not host:
        raise _fail(url, _("no host"), field)
    loopback_name = host == "localhost" or host.endswith(".localhost")
    internal = host in BLOCKED_NAMES or host.endswith(BLOCKED_SUFFIXES)
    if internal and not (loopback_name and settings.CARDHOUR_ENDPOINT_ALLOW_LOOPBACK):
        raise _fail(url, _("%(host)s is an internal name") % {"host": host}, field)
    path = parts.path or "/"
    if parts.query:
        path = f"{path}?{parts.query}"
    return Target(parts.scheme, host, port or (443 if parts.scheme == "https" else 80), path)


def address_forbidden(address: str) -> str | None:
    """Why an address may not be connected to, or None if it is a global unicast address."""
    ip = ipaddress.ip_address(address.split("%", 1)[0])
    if isinstance(ip, ipaddress.IPv6Address):
        mapped = ip.ipv4_mapped or ip.sixtofour
        if mapped is not None:
            ip = mapped
        elif ip in ipaddress.ip_network("64:ff9b::/96"):  # NAT64: the IPv4 address is in the low 32 bits
            ip = ipaddress.IPv4Address(int(ip) & 0xFFFFFFFF)
    if ip.is_loopback:
        return (
            None
            if settings.CARDHOUR_ENDPOINT_ALLOW_LOOPBACK
            else _("%(ip)s is a loopback address") % {"ip": ip}
        )
    if ip.is_multicast:
        return _("%(ip)s is a multicast address") % {"ip": ip}
    if ip.is_link_local:
        return _("%(ip)s is a link-local address (cloud metadata lives there)") % {"ip": ip}
    if ip.is_private or ip.is_reserved or ip.is_unspecified or not ip.is_global:
        return _("%(ip)s is not a public address") % {"ip": ip}
    return None


def _addresses(host: str, port: int) -> list[str]:
    infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    return list(dict.fromkeys(str(info[4][0]) for info in infos))


def endpoint_url_check(url: str, *, field: str = "endpoint_url") -> None:
    """Refuse an endpoint URL that is not https (unless allowed), carries credentials, names an internal
    host or resolves to a non-public address. An empty URL (no endpoint) is fine. Raises
    UnsafeEndpointError (400 ``endpoint_url_forbidden`` with the field)."""
    if not url:
        return
    target = _parse(url, field=field)
    try:
        addresses = _addresses(target.host, target.port)
    except (OSError, UnicodeError):
        return  # not resolvable now: checked again, on the resolved address, at every send
    for address in addresses:
        why = address_forbidden(address)
        if why:
            raise _fail(url, why, field)


def post_pinned(url: str, *, body: bytes, headers: dict[str, str], timeout: float) -> int:
    """POST ``body`` to ``url`` on an address checked now, and return the HTTP status. Raises
    UnsafeEndpointError when the URL or any address the host resolves to is forbidden, OSError (and
    http.client errors) when the connection fails. Never follows a redirect (a 3xx is returned as is)."""
    target = _parse(url, field="endpoint_url")
    addresses = _addresses(target.host, target.port)
    for address in addresses:
        why = address_forbidden(address)
        if why:
            raise _fail(url, why, "endpoint_url")
    address = addresses[0]
    connection: http.client.HTTPConnection
    if target.scheme == "https":
        connection = _PinnedHTTPS(target.host, target.port, address=address, timeout=timeout)
    else:
        connection = _PinnedHTTP(target.host, target.port, address=address, timeout=timeout)
    try:
        connection.request("POST", target.path, body=body, headers=headers)
        response = connection.getresponse()
        response.read(65536)
        return response.status
    finally:
        connection.close()


class _PinnedHTTP(http.client.HTTPConnection):
    def __init__(self, host: str, port: int, *, address: str, timeout: float) -> None:
        super().__init__(host, port, timeout=timeout)
        self._address = address

    def connect(self) -> None:
        self.sock = socket.create_connection((self._address, self.port), self.timeout)


class _PinnedHTTPS(http.client.HTTPSConnection):
    def __init__(self, host: str, port: int, *, address: str, timeout: float) -> None:
        super().__init__(host, port, timeout=timeout, context=ssl.create_default_context())
        self._address = address

    def connect(self) -> None:
        sock = socket.create_connection((self._address, self.port), self.timeout)
        self.sock = self._context.wrap_socket(sock, server_hostname=self.host)  # type: ignore[attr-defined]
