"""Paging for every list of the API: ``?page=N&page_size=M`` (1 ≤ M ≤ 500, default 50).

A malformed ``page_size`` (negative, zero, a fraction, text, over the maximum) or ``page`` (empty, zero,
text) is refused with 400 ``invalid_paging`` instead of being silently replaced by the default, so a
client's bug shows at once; a ``page`` past the last page stays DRF's 404 ``not_found``.
"""

from __future__ import annotations

from typing import Any

from rest_framework.pagination import PageNumberPagination
from rest_framework.request import Request

from core.errors import InvalidInputError


class InvalidPagingError(InvalidInputError):
    code = "invalid_paging"


MAX_PAGE_SIZE = 500
# The paging parameters' schemas, for views that declare them by hand.
PAGE_SCHEMA = {"type": "integer", "minimum": 1}
PAGE_SIZE_SCHEMA = {"type": "integer", "minimum": 1, "maximum": MAX_PAGE_SIZE}


class StandardPagination(PageNumberPagination):
    page_size = 50
    page_size_query_param = "page_size"
    max_page_size = MAX_PAGE_SIZE

    def get_page_size(self, request: Request) -> int:
        raw = request.query_params.get(self.page_size_query_param)
        if raw is None:
            return self.page_size
        if not raw.isdigit() or not 1 <= int(raw) <= self.max_page_size:
            message = f"page_size must be a whole number from 1 to {self.max_page_size}."
            raise InvalidPagingError(message, extra={"fields": {"page_size": [message]}})
        return int(raw)

    def paging_check(self, request: Request) -> None:
        """Refuse malformed paging parameters on a view that pages only some of its answers (the resolver
        pages the clusters of an operator or hub, not a cluster's description): the schema declares them
        for every answer, so they are checked for every answer."""
        self.get_page_size(request)
        raw = request.query_params.get(self.page_query_param)
        if raw is not None and raw not in self.last_page_strings:
            self.get_page_number(request, paginator=None)

    def get_page_number(self, request: Request, paginator: Any) -> Any:
        """A page number from 1 up; ``?page=`` (empty) or ``?page=0`` is ``invalid_paging`` rather than
        silently the first page. A number past the last page stays a 404 (``not_found``)."""
        raw = request.query_params.get(self.page_query_param)
        if raw is None or raw in self.last_page_strings:
            return super().get_page_number(request, paginator)
        if not raw.isdigit() or int(raw) < 1:
            message = "page must be a whole number from 1."
            raise InvalidPagingError(message, extra={"fields": {"page": [message]}})
        return raw

    def get_schema_operation_parameters(self, view: Any) -> list[dict[str, Any]]:
        parameters = super().get_schema_operation_parameters(view)
        for parameter in parameters:
            if parameter["name"] == self.page_size_query_param:
                parameter["schema"] = {**PAGE_SIZE_SCHEMA, "maximum": self.max_page_size}
            elif parameter["name"] == self.page_query_param:
                parameter["schema"] = dict(PAGE_SCHEMA)
        return parameters
