"""The statements a quote request makes around the quote itself (issue 14): the token and the job are one
read each, a repeated request writes nothing for the token, no per-request session statements (SET …),
and revoking the token refuses the very next quote request (no validity is kept between requests)."""

from __future__ import annotations

from django.db import connection
from django.test.utils import CaptureQueriesContext
from rest_framework.response import Response
from rest_framework.test import APIClient

from core.models import ApiToken, Organisation
from core.services import api_token_create, api_token_revoke
from tests.broker.test_jobs import body


def _quote(client: APIClient, job_id: int) -> Response:
    return client.post(f"/api/v1/jobs/{job_id}/quotes", {"limit": 10}, format="json")


def _quoted(buyer: Organisation) -> tuple[ApiToken, APIClient, int]:
    """A read-write token of the buyer, a client using it, and a job of the buyer quoted once."""
    token, secret = api_token_create(organisation=buyer, name="q", scope="read_write")
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"Bearer {secret}")
    job_id = client.post("/api/v1/jobs", body(), format="json").json()["id"]
    assert _quote(client, job_id).status_code == 201
    return token, client, job_id


def test_a_quote_request_reads_its_token_and_job_once_and_sets_nothing(buyer: Organisation) -> None:
    _, client, job_id = _quoted(buyer)
    with CaptureQueriesContext(connection) as captured:
        assert _quote(client, job_id).status_code == 201
    statements = [query["sql"] for query in captured.captured_queries]
    token_reads = [sql for sql in statements if "core_apitoken" in sql and sql.lstrip().startswith("SELECT")]
    token_writes = [
        sql for sql in statements if "core_apitoken" in sql and not sql.lstrip().startswith("SELECT")
    ]
    job_reads = [
        sql for sql in statements if sql.lstrip().startswith("SELECT") and 'FROM "broker_job"' in sql
    ]
    assert len(token_reads) == 1, statements
    assert token_writes == [], statements  # last_used_at is touched at most once per resolution
    assert len(job_reads) == 1, statements
    assert not [sql for sql in statements if sql.lstrip().upper().startswith("SET ")], statements
    # One transaction (a savepoint under the test's own) for the quote's writes, never nested further.
    assert sum(1 for sql in statements if sql.lstrip().upper().startswith("SAVEPOINT")) <= 1, statements


def test_revoking_the_token_refuses_the_next_quote_request(buyer: Organisation) -> None:
    token, client, job_id = _quoted(buyer)
    api_token_revoke(organisation=buyer, token_id=token.pk)
    refused = _quote(client, job_id)
    assert refused.status_code == 401, refused.content
