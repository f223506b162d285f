"""A real localstripe server for the payment tests, on a free loopback port, for the whole session.

Import the fixtures into the test module under their function names
(``from tests.metering.localstripe import localstripe_fixture, ...``); tests ask for them by their
fixture names (``localstripe``, ``stripe_webhooks``, ``stripe_on_localstripe``).

* ``localstripe`` (session): ``manage.py run_localstripe`` in a subprocess — the same launcher
  ``make run`` uses, so its loopback binding, private state and ``charge.refunded`` shim are what the
  tests exercise — with its state in memory only. Stopped at the end of the session.
* ``stripe_webhooks`` (session): a small HTTP receiver registered with localstripe as a webhook
  endpoint. It records every delivery exactly as localstripe sent it — raw body and
  ``Stripe-Signature`` — so a test hands those bytes to the platform's real webhook endpoint, replays
  them, or reorders them, with the database in the test's own transaction on SQLite and PostgreSQL
  alike. One test (``test_webhook_delivered_by_localstripe_to_live_server``) has localstripe POST to a
  live Django server instead, which proves the same path over the network.
* ``stripe_on_localstripe`` (function): points the settings at the server.

localstripe delivers each event about a second after it happens, to every registered endpoint in
registration order, one after the other. The live-server endpoint (id ``django``, disabled unless a
test enables it) is registered before the receiver, so when the receiver gets an event the live server
has already answered it. Endpoints are only ever re-registered, never added mid-session: localstripe
iterates its endpoint dict while it delivers, and adding one then would break a delivery in flight.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import os
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest
import requests
from django.conf import settings as django_settings
from django.test import Client

ROOT = Path(__file__).resolve().parent.parent.parent
WEBHOOK_PATH = "/api/v1/stripe/webhook"
LIVE_SERVER_WEBHOOK_ID = "django"
RECEIVER_WEBHOOK_ID = "receiver"
DISABLED_EVENTS = ["cardhour.disabled"]  # no event has this type: the endpoint receives nothing


@dataclass(frozen=True)
class Delivery:
    """One webhook POST, as localstripe sent it."""

    event_id: str
    type: str
    object_id: str
    payment_intent_id: str
    body: bytes
    signature: str
    webhook: str  # which registered endpoint got it

    @property
    def event(self) -> dict[str, Any]:
        return json.loads(self.body)


class LocalStripe:
    def __init__(self, url: str, process: subprocess.Popen[bytes], log_path: Path):
        self.url = url
        self.process = process
        self.log_path = log_path

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def register_webhook(self, webhook_id: str, url: str, *, events: list[str] | None = None) -> None:
        body: dict[str, Any] = {"url": url, "secret": django_settings.STRIPE_WEBHOOK_SECRET}
        if events is not None:
            body["events"] = events
        response = requests.post(f"{self.url}/_config/webhooks/{webhook_id}", json=body, timeout=10)
        response.raise_for_status()

    def post(self, path: str, body: dict[str, Any]) -> dict[str, Any]:
        response = requests.post(
            f"{self.url}{path}",
            json=body,
            headers={"Authorization": f"Bearer {django_settings.STRIPE_SECRET_KEY}"},
            timeout=10,
        )
        response.raise_for_status()
        return response.json()

    def allow_retry_after_decline(self, payment_intent_id: str) -> None:
        """Stripe lets a declined PaymentIntent be confirmed again with another card; localstripe keeps
        it stuck on its failed charge. Forget that charge, as Stripe's state machine would."""
        self.post(f"/v1/payment_intents/{payment_intent_id}", {"latest_charge": None})

    def get(self, path: str, **params: Any) -> dict[str, Any]:
        """A Stripe object read straight from localstripe (what the platform would see)."""
        response = requests.get(
            f"{self.url}{path}",
            params=params,
            headers={"Authorization": f"Bearer {django_settings.STRIPE_SECRET_KEY}"},
            timeout=10,
        )
        response.raise_for_status()
        return response.json()


class WebhookReceiver:
    """Records localstripe's webhook deliveries and answers 200."""

    def __init__(self) -> None:
        self._deliveries: list[Delivery] = []
        self._condition = threading.Condition()
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
                receiver._record(self.path.strip("/"), body, self.headers.get("Stripe-Signature", ""))
                self.send_response(200)
                self.send_header("Content-Length", "0")
                self.end_headers()

            def log_message(self, format: str, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def _record(self, webhook: str, body: bytes, signature: str) -> None:
        event = json.loads(body)
        obj = event["data"]["object"]
        if obj.get("object") == "payment_intent":
            payment_intent_id = obj["id"]
        else:
            payment_intent_id = obj.get("payment_intent") or ""
        delivery = Delivery(
            event_id=event["id"],
            type=event["type"],
            object_id=obj.get("id", ""),
            payment_intent_id=payment_intent_id,
            body=body,
            signature=signature,
            webhook=webhook,
        )
        with self._condition:
            self._deliveries.append(delivery)
            self._condition.notify_all()

    def wait_for(self, *, type: str, payment_intent_id: str, timeout: float = 20.0) -> Delivery:
        """The first delivery of an event of ``type`` about ``payment_intent_id``."""
        deadline = time.monotonic() + timeout
        with self._condition:
            while True:
                for delivery in self._deliveries:
                    if delivery.type == type and delivery.payment_intent_id == payment_intent_id:
                        return delivery
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    seen = [(d.type, d.payment_intent_id) for d in self._deliveries[-10:]]
                    raise AssertionError(f"localstripe sent no {type} for {payment_intent_id}; last: {seen}")
                self._condition.wait(remaining)

    def stop(self) -> None:
        self.server.shutdown()
        self.server.server_close()


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@pytest.fixture(scope="session", name="localstripe")
def localstripe_fixture() -> Iterator[LocalStripe]:
    port = _free_port()
    log_file = tempfile.NamedTemporaryFile(prefix="localstripe-", suffix=".log", delete=False)  # noqa: SIM115
    log_path = Path(log_file.name)
    env = {**os.environ, "DJANGO_SETTINGS_MODULE": "config.settings.test", "PYTHONUNBUFFERED": "1"}
    process = subprocess.Popen(  # noqa: S603  # our own interpreter and manage.py
        [
            sys.executable,
            str(ROOT / "manage.py"),
            "run_localstripe",
            "--host",
            "127.0.0.1",
            "--port",
            str(port),
            "--state-file",
            "",
            "--webhook-url",
            "",
        ],
        cwd=ROOT,
        env=env,
        stdout=log_file,
        stderr=subprocess.STDOUT,
    )
    server = LocalStripe(f"http://127.0.0.1:{port}", process, log_path)
    deadline = time.monotonic() + 60
    while True:
        if process.poll() is not None:
            raise RuntimeError(f"localstripe exited with {process.returncode}:\n{server.log()}")
        try:
            # Served without credentials: a cheap readiness probe.
            if requests.get(f"{server.url}/js.stripe.com/v3/", timeout=1).status_code == 200:
                break
        except requests.ConnectionError:
            pass
        if time.monotonic() > deadline:
            process.kill()
            raise RuntimeError(f"localstripe did not start on port {port}:\n{server.log()}")
        time.sleep(0.1)
    try:
        yield server
    finally:
        process.terminate()
        try:
            process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(timeout=10)
        log_file.close()
        log_path.unlink(missing_ok=True)


@pytest.fixture(scope="session", name="stripe_webhooks")
def stripe_webhooks_fixture(localstripe: LocalStripe) -> Iterator[WebhookReceiver]:
    receiver = WebhookReceiver()
    # The live-server endpoint first (disabled until a test points it at a live server), then ours.
    localstripe.register_webhook(LIVE_SERVER_WEBHOOK_ID, f"{receiver.url}/unused", events=DISABLED_EVENTS)
    localstripe.register_webhook(RECEIVER_WEBHOOK_ID, f"{receiver.url}/{RECEIVER_WEBHOOK_ID}")
    try:
        yield receiver
    finally:
        receiver.stop()


@pytest.fixture(name="stripe_on_localstripe")
def stripe_on_localstripe_fixture(
    settings: Any, localstripe: LocalStripe, stripe_webhooks: WebhookReceiver
) -> LocalStripe:
    """The platform talks to the session's localstripe (test mode), and its webhooks are recorded."""
    settings.STRIPE_API_BASE = localstripe.url
    settings.STRIPE_JS_URL = f"{localstripe.url}/js.stripe.com/v3/"
    return localstripe


# --- Delivering events to the platform ---------------------------------------------------------------


def sign(body: bytes, *, secret: str | None = None, timestamp: int | None = None) -> str:
    """A ``Stripe-Signature`` header for ``body``, computed as Stripe (and localstripe) do."""
    timestamp = int(time.time()) if timestamp is None else timestamp
    key = (secret if secret is not None else django_settings.STRIPE_WEBHOOK_SECRET).encode()
    digest = hmac.new(key, b"%d.%s" % (timestamp, body), hashlib.sha256).hexdigest()
    return f"t={timestamp},v1={digest}"


def post_webhook(body: bytes, signature: str | None) -> Any:
    """POST to the platform's webhook endpoint as Stripe does: no credentials, raw JSON, signed."""
    headers = {"HTTP_STRIPE_SIGNATURE": signature} if signature is not None else {}
    return Client().post(WEBHOOK_PATH, data=body, content_type="application/json; charset=utf-8", **headers)


def deliver(delivery: Delivery) -> Any:
    """Hand a recorded localstripe delivery, byte for byte, to the platform's webhook endpoint."""
    return post_webhook(delivery.body, delivery.signature)


def synthetic_event(event_type: str, obj: dict[str, Any], *, event_id: str | None = None) -> bytes:
    """An event localstripe never sends (e.g. ``payment_intent.created``) around a real object read
    from localstripe, to be signed with ``sign``."""
    event = {
        "id": event_id or f"evt_test_{int(time.time() * 1000)}_{obj['id']}",
        "object": "event",
        "api_version": "2017-08-15",
        "created": int(time.time()),
        "livemode": False,
        "type": event_type,
        "data": {"object": obj},
    }
    return json.dumps(event, indent=2, sort_keys=True).encode()


# --- Buying through the real services ----------------------------------------------------------------


def order_pack(*, buyer: Any, product: Any, key: str = "order-1", quantity: int = 1) -> Any:
    """Order through ``pack_order_create`` (a PaymentIntent on localstripe); returns the order."""
    from core.types import Actor
    from metering.services.payments import pack_order_create

    payment = pack_order_create(
        buyer=buyer,
        product=product,
        quantity=quantity,
        idempotency_key=key,
        actor=Actor(organisation=buyer, system_label="test"),
    )
    return payment.order


def pay(order: Any, payment_method: str = "pm_card_visa") -> Any:
    """Confirm the order's PaymentIntent on localstripe with a test payment method (what Stripe.js does
    in the browser); returns the PaymentIntent as Stripe then reports it."""
    from metering.services.payments import pack_order_confirm_test_payment

    return pack_order_confirm_test_payment(order=order, payment_method=payment_method)
