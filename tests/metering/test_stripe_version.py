"""Every Stripe request asks for the pinned API version, whatever the installed library defaults to."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
from django.test import override_settings

from metering.integrations import stripe as gateway


class _Recorder(BaseHTTPRequestHandler):
    seen: list[dict[str, str]] = []

    def do_POST(self) -> None:
        self.rfile.read(int(self.headers.get("Content-Length") or 0))
        type(self).seen.append({k.lower(): v for k, v in self.headers.items()})
        body = json.dumps({"id": "cus_recorded", "object": "customer"}).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture
def recorder() -> Iterator[str]:
    _Recorder.seen = []
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Recorder)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()
    server.server_close()


def test_requests_carry_the_pinned_stripe_version(recorder: str) -> None:
    with override_settings(STRIPE_API_BASE=recorder):
        customer = gateway.customer_create(name="Acme", email="", metadata={}, idempotency_key="k-1")

    assert customer == "cus_recorded"
    assert [headers["stripe-version"] for headers in _Recorder.seen] == [gateway.STRIPE_API_VERSION]
    assert _Recorder.seen[0]["idempotency-key"] == "k-1"
