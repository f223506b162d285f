"""Paging for every list of the API: ``?page=N&page_size=M`` (1 ≤ M ≤ 500, default 50).

A malformed ``page_size`` (negative, zero, a fraction, text, over the maximum) is refused with 400
``invalid_paging`` instead of being silently replaced by the default, so a client's bug shows at once; a
``page`` that is not a positive whole number, or past the last page, stays DRF's 404 ``not_found``.
"""

from __future__ import annotations

from typing import Any

from rest_framework.pagination import PageNumberPagination
from rest_framework.request import Request

from core.errors import InvalidInputError


class InvalidPagingError(InvalidInputError):
    code = "invalid_paging"


class StandardPagination(PageNumberPagination):
    page_size = 50
    page_size_query_param = "page_size"
    max_page_size = 500

    def get_page_size(self, request: Request) -> int:
        raw = request.query_params.get(self.page_size_query_param)
        if raw is None:
            return self.page_size
        if not raw.isdigit() or not 1 <= int(raw) <= self.max_page_size:
            message = f"page_size must be a whole number from 1 to {self.max_page_size}."
            raise InvalidPagingError(message, extra={"fields": {"page_size": [message]}})
        return int(raw)

    def get_schema_operation_parameters(self, view: Any) -> list[dict[str, Any]]:
        parameters = super().get_schema_operation_parameters(view)
        for parameter in parameters:
            if parameter["name"] == self.page_size_query_param:
                parameter["schema"] = {"type": "integer", "minimum": 1, "maximum": self.max_page_size}
            elif parameter["name"] == self.page_query_param:
                parameter["schema"] = {"type": "integer", "minimum": 1}
        return parameters
