"""Run localstripe on loopback for the embedded demo (and the tests), standing in for Stripe.

``make run`` starts it from Procfile.dev. With real Stripe keys configured (no localstripe API base) it
starts nothing and waits, so honcho — which stops every process when one exits — keeps the others
running.

What this launcher adds to ``python -m localstripe``:

* it listens on 127.0.0.1 only (localstripe itself binds every interface);
* its state goes to ``var/localstripe.pickle`` (or nowhere, ``--state-file ""``) instead of the shared
  ``/tmp/localstripe.pickle``, so two checkouts, or the tests and the demo, never overwrite each other;
* it registers the platform's webhook endpoint with the configured ``STRIPE_WEBHOOK_SECRET`` before it
  accepts requests, so no event is sent before the endpoint is known;
* it sends ``charge.refunded`` when a refund is created, as Stripe does and localstripe 1.15 does not,
  so a refund made in the back office reaches the ledger in the demo too.
"""

from __future__ import annotations

import os
import pickle
import signal
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from django.conf import settings
from django.core.management.base import BaseCommand, CommandError, CommandParser

from metering.services.payments import payment_public_config

DEFAULT_PORT = 8420
WEBHOOK_ID = "cardhour"


class Command(BaseCommand):
    help = "Run localstripe on 127.0.0.1 with the platform's webhook registered (embedded demo only)."

    def add_arguments(self, parser: CommandParser) -> None:
        base = urlsplit(settings.STRIPE_API_BASE or "")
        parser.add_argument("--host", default="127.0.0.1", help="Interface to listen on (loopback).")
        parser.add_argument("--port", type=int, default=base.port or DEFAULT_PORT)
        parser.add_argument(
            "--webhook-url",
            default=f"http://127.0.0.1:{os.environ.get('CARDHOUR_PORT', '8000')}/api/v1/stripe/webhook",
            help="Where localstripe sends events; empty for none.",
        )
        parser.add_argument(
            "--state-file",
            default=str(settings.VAR_DIR / "localstripe.pickle"),
            help='Where localstripe keeps its objects between runs; "" keeps them in memory only.',
        )

    def handle(self, *args: Any, **options: Any) -> None:
        config = payment_public_config()
        if not config.localstripe:
            self.stdout.write(
                f"Stripe keys are configured ({config.mode} mode): localstripe is not needed. Waiting."
            )
            signal.pause()  # honcho stops every process when one exits; wait for its signal instead
            return
        if not settings.STRIPE_WEBHOOK_SECRET:
            raise CommandError("STRIPE_WEBHOOK_SECRET is empty: localstripe could not sign its webhooks.")
        try:
            from aiohttp import web
            from localstripe import resources, server, webhooks
        except ImportError as exc:  # a dev dependency: production installs never run localstripe
            raise CommandError("localstripe is not installed (pip install -e '.[dev]').") from exc

        _use_state_file(resources, options["state_file"])
        _send_charge_refunded(resources)
        if options["webhook_url"]:
            webhooks.register_webhook(
                WEBHOOK_ID, options["webhook_url"], settings.STRIPE_WEBHOOK_SECRET, None
            )
        self.stdout.write(
            f"localstripe (Stripe test mode) on http://{options['host']}:{options['port']}, "
            f"webhooks to {options['webhook_url'] or 'nowhere'}"
        )
        web.run_app(server.app, host=options["host"], port=options["port"], print=None)


def _use_state_file(resources: Any, state_file: str) -> None:
    """Point localstripe's store at our own file (or at none)."""
    store_class = resources.Store

    def load(store: Any) -> None:
        if state_file and Path(state_file).exists():
            with open(state_file, "rb") as handle:
                saved = pickle.load(handle)  # noqa: S301  # our own file, written by this process
            store.clear()
            store.update(saved)

    def dump(store: Any) -> None:
        if state_file:
            Path(state_file).parent.mkdir(parents=True, exist_ok=True)
            with open(state_file, "wb") as handle:
                pickle.dump(store, handle, protocol=pickle.HIGHEST_PROTOCOL)

    store_class.try_load_from_disk = load
    store_class.dump_to_disk = dump
    resources.store.try_load_from_disk()


def _send_charge_refunded(resources: Any) -> None:
    """Stripe sends ``charge.refunded`` when a charge is refunded; localstripe sends nothing."""
    refund_class = resources.Refund
    original_init = refund_class.__init__

    def init(refund: Any, *args: Any, **kwargs: Any) -> None:
        original_init(refund, *args, **kwargs)
        charge = resources.Charge._api_retrieve(refund.charge)
        resources.schedule_webhook(resources.Event("charge.refunded", charge))

    refund_class.__init__ = init
