"""Smoke test of the production server, as CI runs it (.ci/run) and as the README deploys it.

On a scratch PostgreSQL database (created afresh; its name must contain "smoke"), with the production settings
from environment variables only, Redis as cache and broker:

    manage.py migrate, collectstatic, check --deploy, createsuperuser
    gunicorn -c config/gunicorn.conf.py config.asgi:application

then checks, over HTTP: /healthz; the API with a token and without one; a portal page and the static file it
links (hashed name, long cache); the admin log-in (CSRF, secure cookies through X-Forwarded-Proto); the Stripe
webhook (a signed event accepted, a forged one refused); a long-poll that waits its time out. Exits non-zero
on the first failure.

    python scripts/smoke_production.py [--database-url postgres://postgres@127.0.0.1:5432/cardhour_smoke]
"""

from __future__ import annotations

import argparse
import hashlib
import hmac
import http.cookies
import json
import os
import re
import subprocess
import sys
import tempfile
import time
import urllib.parse
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from benchmarks.prodserver import Server, free_port, production_env, production_server  # noqa: E402

WEBHOOK_SECRET = "whsec_smoke_" + "s" * 24
ADMIN = ("smoke-admin", "smoke-pass-" + "x" * 12)
HTTPS = {"X-Forwarded-Proto": "https"}


def fail(message: str) -> None:
    print(f"SMOKE FAILED: {message}", file=sys.stderr)
    raise SystemExit(1)


def check(condition: bool, what: str, detail: object = "") -> None:
    if not condition:
        fail(f"{what} {detail}")
    print(f"  ok  {what}")


def recreate_database(url: str) -> None:
    import psycopg

    parts = urllib.parse.urlsplit(url)
    name = parts.path.lstrip("/")
    if "smoke" not in name:
        fail(f"the smoke database's name must contain 'smoke' (it is dropped first): {name!r}")
    admin = urllib.parse.urlunsplit(parts._replace(path="/postgres", query=""))
    with psycopg.connect(admin.replace("postgres://", "postgresql://", 1), autocommit=True) as conn:
        conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        conn.execute(f'CREATE DATABASE "{name}"')


def manage(env: dict[str, str], *args: str, stdin: str | None = None) -> str:
    result = subprocess.run(  # noqa: S603 - our own manage.py, fixed arguments
        [sys.executable, "manage.py", *args],
        cwd=ROOT,
        env=env,
        input=stdin,
        capture_output=True,
        text=True,
        check=False,
    )
    if result.returncode != 0:
        fail(f"manage.py {' '.join(args)}:\n{result.stdout}\n{result.stderr}")
    return result.stdout


def cookies_from(headers: list[tuple[str, str]]) -> dict[str, str]:
    jar: dict[str, str] = {}
    for name, value in headers:
        if name.lower() == "set-cookie":
            parsed = http.cookies.SimpleCookie(value)
            jar.update({key: morsel.value for key, morsel in parsed.items()})
    return jar


def raw_request(
    server: Server,
    method: str,
    path: str,
    *,
    body: bytes | None = None,
    headers: dict[str, str] | None = None,
) -> tuple[int, list[tuple[str, str]], bytes]:
    import http.client

    conn = http.client.HTTPConnection("127.0.0.1", server.port, timeout=30)
    try:
        conn.request(method, path, body=body, headers={"Host": "127.0.0.1", **HTTPS, **(headers or {})})
        response = conn.getresponse()
        return response.status, response.getheaders(), response.read()
    finally:
        conn.close()


def smoke(server: Server, token: str) -> None:
    status, _, body = server.request("GET", "/healthz", headers=HTTPS)
    check(status == 200 and json.loads(body)["status"] == "ok", "GET /healthz", status)

    status, _, body = server.request("GET", "/livez")
    check(status == 200, "GET /livez", status)
    status, _, body = server.request("GET", "/readyz")
    checks = json.loads(body)["checks"]
    # No beat runs beside this server: readiness must say so rather than pass.
    check(
        status == 503 and checks["database"] == "ok" and checks["beat"] == "never ran", "GET /readyz", checks
    )

    auth = {"Authorization": f"Bearer {token}", **HTTPS}
    status, _, body = server.request("GET", "/api/v1/operator/leases", headers=auth)
    check(
        status == 200 and "cursor" in json.loads(body),
        "API with a token: GET /api/v1/operator/leases",
        status,
    )
    status, _, body = server.request("GET", "/api/v1/operator/leases", headers=HTTPS)
    check(
        status in (401, 403) and "code" in json.loads(body), "API without a token is refused in JSON", status
    )
    began = time.monotonic()
    status, _, body = server.request("GET", "/api/v1/operator/leases?after=0&wait=1", headers=auth)
    waited = time.monotonic() - began
    check(
        # A wait with nothing new ends in its second half (jitter: broker/api/operator.py).
        status == 200 and 0.5 <= waited < 5,
        "long-poll waits on the async path",
        f"{waited:.2f}s",
    )
    status, _, body = server.request("GET", "/api/schema/", headers=HTTPS)
    check(status == 200 and b"openapi" in body, "GET /api/schema/", status)

    status, headers_, body = server.request("GET", "/metrics")
    text = body.decode()
    check(
        status == 200
        and 'cardhour_http_request_duration_seconds_count{method="GET",route="/healthz",status="2xx"}' in text
        and "cardhour_clusters_offline 0.0" in text
        and "cardhour_task_last_started_timestamp_seconds" in text,
        "GET /metrics from loopback: request latency by route and the database gauges",
        status,
    )
    status, headers_, body = server.request("GET", "/healthz", headers={"X-Request-ID": "smoke-req-1"})
    check(
        headers_.get("x-request-id") == "smoke-req-1", "X-Request-ID comes back", headers_.get("x-request-id")
    )

    status, _, page = raw_request(server, "GET", "/accounts/login/")
    html = page.decode()
    check(status == 200 and "<form" in html, "portal page: GET /accounts/login/", status)
    static = re.search(r'(?:href|src)="(/static/[^"]+\.[0-9a-f]{12}\.(?:css|js))"', html)
    check(static is not None, "the portal page links a hashed static file")
    assert static is not None
    status, headers, _ = raw_request(server, "GET", static.group(1))
    cache = {k.lower(): v for k, v in headers}.get("cache-control", "")
    check(status == 200 and "immutable" in cache, f"static file {static.group(1)}", cache)

    status, headers, page = raw_request(server, "GET", "/admin/login/")
    jar = cookies_from(headers)
    token_match = re.search(r'name="csrfmiddlewaretoken" value="([^"]+)"', page.decode())
    check(status == 200 and "csrftoken" in jar and token_match is not None, "admin log-in form", status)
    assert token_match is not None
    form = urllib.parse.urlencode(
        {
            "csrfmiddlewaretoken": token_match.group(1),
            "username": ADMIN[0],
            "password": ADMIN[1],
            "next": "/admin/",
        }
    ).encode()
    status, headers, _ = raw_request(
        server,
        "POST",
        "/admin/login/?next=/admin/",
        body=form,
        headers={
            "Content-Type": "application/x-www-form-urlencoded",
            "Cookie": f"csrftoken={jar['csrftoken']}",
            "Referer": f"https://127.0.0.1:{server.port}/admin/login/",
            "Origin": f"https://127.0.0.1:{server.port}",
        },
    )
    jar.update(cookies_from(headers))
    check(status == 302 and "sessionid" in jar, "admin log-in with the superuser", status)
    secure = [v for k, v in headers if k.lower() == "set-cookie" and v.startswith("sessionid=")]
    check(
        bool(secure) and "Secure" in secure[0] and "HttpOnly" in secure[0],
        "session cookie is Secure and HttpOnly",
    )
    status, _, page = raw_request(
        server, "GET", "/admin/", headers={"Cookie": f"sessionid={jar['sessionid']}"}
    )
    check(status == 200 and "log out" in page.decode().lower(), "admin index as the superuser", status)

    event = {
        "id": "evt_smoke_1",
        "object": "event",
        "type": "customer.created",
        "api_version": "2024-06-20",
        "created": int(time.time()),
        "livemode": False,
        "data": {"object": {"id": "cus_smoke", "object": "customer"}},
    }
    payload = json.dumps(event).encode()
    stamp = str(int(time.time()))
    signature = hmac.new(WEBHOOK_SECRET.encode(), f"{stamp}.".encode() + payload, hashlib.sha256).hexdigest()
    hook = "/api/v1/stripe/webhook"
    status, _, body = server.request(
        "POST", hook, body=payload, headers={"Stripe-Signature": f"t={stamp},v1={signature}", **HTTPS}
    )
    check(
        status == 200 and json.loads(body)["event"] == "evt_smoke_1", "Stripe webhook: a signed event", status
    )
    status, _, body = server.request(
        "POST", hook, body=payload, headers={"Stripe-Signature": f"t={stamp},v1={'0' * 64}", **HTTPS}
    )
    check(status == 400, "Stripe webhook: a forged signature is refused", status)


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "--database-url",
        default=os.environ.get("SMOKE_DATABASE_URL", "postgres://postgres@127.0.0.1:5432/cardhour_smoke"),
    )
    parser.add_argument("--cache-url", default=os.environ.get("SMOKE_CACHE_URL", "redis://127.0.0.1:6379/14"))
    parser.add_argument(
        "--broker-url", default=os.environ.get("SMOKE_BROKER_URL", "redis://127.0.0.1:6379/15")
    )
    args = parser.parse_args()

    recreate_database(args.database_url)
    with tempfile.TemporaryDirectory(prefix="cardhour-static-") as static_root:
        port = free_port()
        env = production_env(
            database_url=args.database_url,
            port=port,
            extra={
                "CACHE_URL": args.cache_url,
                "CELERY_BROKER_URL": args.broker_url,
                "STRIPE_WEBHOOK_SECRET": WEBHOOK_SECRET,
                "DJANGO_STATIC_ROOT": static_root,
                "DJANGO_SECURE_SSL_REDIRECT": "true",
                "DJANGO_CSRF_TRUSTED_ORIGINS": f"https://127.0.0.1:{port}",
                "WEB_CONCURRENCY": "2",
            },
        )
        print("production server smoke test")
        manage(env, "migrate", "--noinput")
        manage(env, "collectstatic", "--noinput")
        manage(env, "check", "--deploy", "--fail-level", "WARNING")
        manage(
            {**env, "DJANGO_SUPERUSER_PASSWORD": ADMIN[1]},
            "createsuperuser",
            "--noinput",
            "--username",
            ADMIN[0],
            "--email",
            "smoke@example.com",
        )
        token = (
            manage(
                env,
                "shell",
                "-c",
                "from core.models import Organisation\n"
                "from core.services import api_token_create\n"
                "org = Organisation.objects.create(slug='smoke-op', name='Smoke Operator', is_operator=True)\n"
                "print(api_token_create(organisation=org, name='smoke', scope='read_write')[1])\n",
            )
            .strip()
            .splitlines()[-1]
        )
        print("  ok  migrate, collectstatic, check --deploy, createsuperuser, an operator token")
        with production_server(env) as server:
            smoke(server, token)
    print("production server smoke test passed")


if __name__ == "__main__":
    main()
