"""config.wsgi_bridge: a WSGI application served from ASGI, answered in one hop when it does not stream."""

from __future__ import annotations

import asyncio
import threading
from typing import Any

import pytest

from config.wsgi_bridge import WsgiOnThreads


def _scope(path: str, method: str = "POST") -> dict[str, Any]:
    return {
        "type": "http",
        "method": method,
        "path": path,
        "root_path": "",
        "query_string": b"a=1",
        "http_version": "1.1",
        "scheme": "http",
        "server": ("127.0.0.1", 8000),
        "client": ("127.0.0.1", 5000),
        "headers": [(b"content-type", b"application/json"), (b"x-thing", b"yes")],
    }


def _serve(
    app: Any, *, messages: list[dict[str, Any]], path: str = "/x", method: str = "POST"
) -> list[dict[str, Any]]:
    scope = _scope(path, method)
    incoming = list(messages)
    sent: list[dict[str, Any]] = []

    async def receive() -> dict[str, Any]:
        return incoming.pop(0) if incoming else {"type": "http.disconnect"}

    async def send(message: dict[str, Any]) -> None:
        sent.append(message)

    bridge = WsgiOnThreads(app, workers=2)
    try:
        asyncio.run(bridge(scope, receive, send))
    finally:
        bridge.executor.shutdown()
    return sent


class _Joined(list):
    """What Django's WSGIHandler returns for an HttpResponse: iterable, ``streaming`` False, closable."""

    streaming = False

    def __init__(self, chunks: list[bytes], closed: list[str]) -> None:
        super().__init__(chunks)
        self.closed = closed

    def close(self) -> None:
        self.closed.append(threading.current_thread().name)


def test_a_response_that_does_not_stream_is_sent_whole_after_its_thread_closed_it():
    closed: list[str] = []
    seen: dict[str, Any] = {}

    def app(environ: dict[str, Any], start_response: Any) -> Any:
        seen["body"] = environ["wsgi.input"].read()
        seen["environ"] = {
            k: environ[k] for k in ("REQUEST_METHOD", "PATH_INFO", "QUERY_STRING", "HTTP_X_THING")
        }
        start_response("201 Created", [("Content-Type", "application/json"), ("X-Y", " z ")])
        return _Joined([b'{"a":', b"1}"], closed)

    sent = _serve(app, messages=[{"type": "http.request", "body": b'{"limit": 10}', "more_body": False}])

    assert seen == {
        "body": b'{"limit": 10}',
        "environ": {
            "REQUEST_METHOD": "POST",
            "PATH_INFO": "/x",
            "QUERY_STRING": "a=1",
            "HTTP_X_THING": "yes",
        },
    }
    assert sent == [
        {
            "type": "http.response.start",
            "status": 201,
            "headers": [(b"content-type", b"application/json"), (b"x-y", b"z")],
        },
        {"type": "http.response.body", "body": b'{"a":1}'},
    ]
    assert len(closed) == 1 and closed[0].startswith("WSGI")  # in the request's thread


def test_a_body_in_several_messages_is_read_as_the_application_asks_for_it():
    def app(environ: dict[str, Any], start_response: Any) -> Any:
        body = environ["wsgi.input"].read()
        start_response("200 OK", [])
        return _Joined([body[::-1]], [])

    sent = _serve(
        app,
        messages=[
            {"type": "http.request", "body": b"abc", "more_body": True},
            {"type": "http.request", "body": b"def", "more_body": True},
            {"type": "http.request", "body": b"g", "more_body": False},
        ],
    )

    assert sent[-1] == {"type": "http.response.body", "body": b"gfedcba"}


def test_a_streaming_response_is_sent_chunk_by_chunk_and_closed():
    closed: list[str] = []

    class Streaming:
        streaming = True

        def __iter__(self) -> Any:
            yield b"one"
            yield b""
            yield b"two"

        def close(self) -> None:
            closed.append("closed")

    def app(environ: dict[str, Any], start_response: Any) -> Any:
        write = start_response("200 OK", [("Content-Type", "text/csv")])
        write(b"zero")
        return Streaming()

    sent = _serve(app, messages=[{"type": "http.request", "body": b"", "more_body": False}])

    assert sent == [
        {"type": "http.response.start", "status": 200, "headers": [(b"content-type", b"text/csv")]},
        {"type": "http.response.body", "body": b"zero", "more_body": True},
        {"type": "http.response.body", "body": b"one", "more_body": True},
        {"type": "http.response.body", "body": b"two", "more_body": True},
        {"type": "http.response.body", "body": b""},
    ]
    assert closed == ["closed"]


def test_a_second_start_response_with_exc_info_replaces_the_first_and_an_error_reaches_the_server():
    def app(environ: dict[str, Any], start_response: Any) -> Any:
        start_response("200 OK", [("A", "1")])
        start_response("500 Internal Server Error", [("B", "2")], (None, None, None))
        return _Joined([b"oops"], [])

    sent = _serve(app, messages=[{"type": "http.request", "body": b"", "more_body": False}])
    assert sent[0] == {"type": "http.response.start", "status": 500, "headers": [(b"b", b"2")]}

    def failing(environ: dict[str, Any], start_response: Any) -> Any:
        raise ValueError("boom")

    with pytest.raises(ValueError, match="boom"):
        _serve(failing, messages=[{"type": "http.request", "body": b"", "more_body": False}])


def test_a_client_gone_before_its_request_runs_nothing():
    def app(environ: dict[str, Any], start_response: Any) -> Any:  # pragma: no cover - must not run
        raise AssertionError("ran")

    assert _serve(app, messages=[{"type": "http.disconnect"}]) == []


@pytest.mark.django_db(transaction=True)
def test_django_answers_through_the_bridge():
    """Django's own handler, as the production server runs it."""
    from django.core.wsgi import get_wsgi_application

    sent = _serve(
        get_wsgi_application(),
        messages=[{"type": "http.request", "body": b""}],
        path="/healthz",
        method="GET",
    )
    assert sent[0]["status"] == 200
    assert len(sent) == 2 and sent[1]["body"]


def test_batches_run_in_a_lane_of_their_own_and_never_hold_up_other_requests():
    """With one bulk thread and one other: while a batch holds the bulk lane, a second batch waits for it,
    and a quote arriving after both is answered at once, on the other thread."""
    release = threading.Event()
    order: list[tuple[str, str]] = []

    def app(environ: dict[str, Any], start_response: Any) -> Any:
        path = environ["PATH_INFO"]
        order.append((path, threading.current_thread().name.split("_")[0]))
        if path == "/bulk" and not release.is_set():
            assert release.wait(10)
        start_response("200 OK", [("Content-Type", "text/plain")])
        return _Joined([path.encode()], [])

    bridge = WsgiOnThreads(app, workers=1, bulk_workers=1, bulk_paths=["/bulk"])

    async def request(path: str, answered: list[str]) -> None:
        async def receive() -> dict[str, Any]:
            return {"type": "http.request", "body": b"", "more_body": False}

        async def send(message: dict[str, Any]) -> None:
            if message["type"] == "http.response.body":
                answered.append(message["body"].decode())

        await bridge(_scope(path), receive, send)

    async def main() -> list[str]:
        answered: list[str] = []
        first = asyncio.ensure_future(request("/bulk", answered))
        await asyncio.sleep(0.05)
        second = asyncio.ensure_future(request("/bulk", answered))
        await asyncio.sleep(0.05)
        await asyncio.wait_for(request("/quote", answered), 5)  # not behind the batches
        assert answered == ["/quote"]
        assert len(order) == 2  # the second batch has not started: it waits for the first
        release.set()
        await asyncio.wait_for(asyncio.gather(first, second), 5)
        return answered

    try:
        answered = asyncio.run(main())
    finally:
        release.set()
        bridge.executor.shutdown()
        bridge.bulk_executor.shutdown()
    assert answered == ["/quote", "/bulk", "/bulk"]
    assert order == [("/bulk", "WSGI-bulk"), ("/quote", "WSGI"), ("/bulk", "WSGI-bulk")]


@pytest.mark.parametrize("bulk_workers", [0, 2])
def test_without_a_bulk_lane_every_request_shares_the_one_pool(bulk_workers: int):
    bridge = WsgiOnThreads(lambda e, s: [], workers=2, bulk_workers=bulk_workers, bulk_paths=["/bulk"])
    try:
        if bulk_workers:
            assert bridge.bulk_executor is not bridge.executor
            assert bridge.bulk_paths == {"/bulk"}
        else:
            assert bridge.bulk_executor is bridge.executor
            assert bridge.bulk_paths == frozenset()
    finally:
        bridge.executor.shutdown()
        bridge.bulk_executor.shutdown()


def test_the_bulk_lane_serves_the_operator_agents_batches():
    """The paths of the production server's bulk lane are the usage and heartbeat batch endpoints (a renamed
    route would silently move them back among the buyers' requests)."""
    from django.conf import settings
    from django.urls import resolve

    from broker.api.operator import OperatorUsageCreateApi
    from federation.api.views import HeartbeatBatchApi

    views = {resolve(path).func.view_class for path in settings.CARDHOUR_BULK_PATHS}  # type: ignore[attr-defined]
    assert views == {OperatorUsageCreateApi, HeartbeatBatchApi}
    assert settings.CARDHOUR_WSGI_BULK_THREADS >= 1
