"""The SSRF guard (core.net): operator-chosen endpoint URLs cannot reach inside, when saved and when sent,
however the host name resolves at either moment."""

from __future__ import annotations

import socket
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest
from django.test import override_settings

from core.net import UnsafeEndpointError, address_forbidden, endpoint_url_check, post_pinned

STRICT = override_settings(CARDHOUR_ENDPOINT_ALLOW_HTTP=False, CARDHOUR_ENDPOINT_ALLOW_LOOPBACK=False)


@pytest.mark.parametrize(
    "url",
    [
        "http://93.184.216.34/events",  # plain http
        "https://169.254.169.254/latest/meta-data/",
        "https://10.0.0.5:6379/",
        "https://192.168.1.1/",
        "https://localhost:5432/",
        "https://127.0.0.1/",
        "https://[::1]/",
        "https://[::ffff:127.0.0.1]/",
        "https://[::ffff:169.254.169.254]/",
        "https://[fd00::1]/",
        "https://[fe80::1]/",
        "https://100.64.0.1/",  # carrier-grade NAT
        "https://0.0.0.0/",
        "https://224.0.0.1/",
        "https://metadata.google.internal/computeMetadata/v1/",
        "https://db.internal/",
        "https://user:pass@93.184.216.34/",
        "ftp://93.184.216.34/",
        "https://",
    ],
)
def test_internal_or_insecure_endpoints_are_refused_when_saved(url: str) -> None:
    with STRICT, pytest.raises(UnsafeEndpointError) as caught:
        endpoint_url_check(url)
    assert caught.value.code == "endpoint_url_forbidden"
    assert "endpoint_url" in caught.value.extra["fields"]


def test_public_https_endpoints_and_unresolvable_names_pass_when_saved() -> None:
    with STRICT:
        endpoint_url_check("https://93.184.216.34/cardhour/events")
        endpoint_url_check("https://[2606:2800:220:1:248:1893:25c8:1946]/events")
        endpoint_url_check("https://agent.cucc.example.com/cardhour")  # no DNS here: checked at send time
        endpoint_url_check("")


def test_nat64_and_6to4_forms_of_private_addresses_are_refused() -> None:
    with STRICT:
        assert address_forbidden("64:ff9b::a00:5") is not None  # 10.0.0.5
        assert address_forbidden("2002:a00:5::1") is not None  # 6to4 of 10.0.0.5
        assert address_forbidden("8.8.8.8") is None


@pytest.mark.django_db
def test_registering_a_cluster_with_a_metadata_endpoint_is_a_400(operator, token_client) -> None:  # type: ignore[no-untyped-def]
    from federation.models import Cluster

    with STRICT:
        response = token_client(operator).post(
            "/api/v1/clusters",
            {
                "cpi": f"cpi:{operator.slug}:nx:zw-ai09",
                "site": "Zhongwei",
                "accelerator": "nvidia-a800-sxm4-80gb",
                "islands": [{"name": "isl-01", "cards": 8, "fabric": "nvlink"}],
                "endpoint_url": "https://169.254.169.254/latest/meta-data/",
            },
            format="json",
        )

    assert response.status_code == 400, response.json()
    assert response.json()["code"] == "endpoint_url_forbidden"
    assert not Cluster.objects.exists()


# --- At send time -------------------------------------------------------------------------------------


class _Handler(BaseHTTPRequestHandler):
    received: list[dict[str, Any]]

    def do_POST(self) -> None:
        length = int(self.headers["Content-Length"])
        self.server.received.append({"host": self.headers["Host"], "body": self.rfile.read(length)})  # type: ignore[attr-defined]
        self.send_response(204)
        self.end_headers()

    def log_message(self, *args: Any) -> None:
        pass


@pytest.fixture
def listener() -> Iterator[ThreadingHTTPServer]:
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Handler)
    server.received = []  # type: ignore[attr-defined]
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield server
    server.shutdown()


def test_a_real_listener_on_loopback_gets_nothing_when_loopback_is_not_allowed(listener) -> None:  # type: ignore[no-untyped-def]
    port = listener.server_address[1]
    with override_settings(CARDHOUR_ENDPOINT_ALLOW_HTTP=True, CARDHOUR_ENDPOINT_ALLOW_LOOPBACK=False):
        with pytest.raises(UnsafeEndpointError):
            post_pinned(f"http://127.0.0.1:{port}/events", body=b"{}", headers={}, timeout=2)
        with pytest.raises(UnsafeEndpointError):
            post_pinned(f"http://localhost:{port}/events", body=b"{}", headers={}, timeout=2)
    assert listener.received == []  # type: ignore[attr-defined]


def test_dns_rebinding_is_refused_at_send_time_and_the_checked_address_is_the_one_connected(
    listener, monkeypatch: pytest.MonkeyPatch
) -> None:  # type: ignore[no-untyped-def]
    """A name that resolves to a private address when the event is sent is refused, whatever it resolved
    to when saved; and the connection goes to the address that was checked, with the name in Host."""
    port = listener.server_address[1]
    answers = {"agent.example.test": "10.0.0.5"}
    real = socket.getaddrinfo

    def resolver(host: str, *args: Any, **kwargs: Any) -> Any:
        if host in answers:
            return [(socket.AF_INET, socket.SOCK_STREAM, 6, "", (answers[host], args[0] if args else 0))]
        return real(host, *args, **kwargs)

    monkeypatch.setattr("core.net.socket.getaddrinfo", resolver)
    url = f"http://agent.example.test:{port}/events"
    with override_settings(CARDHOUR_ENDPOINT_ALLOW_HTTP=True, CARDHOUR_ENDPOINT_ALLOW_LOOPBACK=True):
        with pytest.raises(UnsafeEndpointError, match=r"10\.0\.0\.5 is not a public address"):
            post_pinned(url, body=b"{}", headers={}, timeout=2)
        assert listener.received == []  # type: ignore[attr-defined]

        answers["agent.example.test"] = "127.0.0.1"  # allowed here (tests): the pinned address is used
        assert post_pinned(url, body=b'{"n": 1}', headers={}, timeout=2) == 204
    assert listener.received == [{"host": f"agent.example.test:{port}", "body": b'{"n": 1}'}]  # type: ignore[attr-defined]
