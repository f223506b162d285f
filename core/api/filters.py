"""The API's filter backend: django-filter, refusing what it would silently ignore."""

from __future__ import annotations

from typing import Any

from django.db.models import QuerySet
from django_filters.rest_framework import DjangoFilterBackend
from rest_framework import serializers
from rest_framework.request import Request


class StrictDjangoFilterBackend(DjangoFilterBackend):
    """django-filter treats ``?period_to=`` as no filter at all, so a client that sent an empty date (or
    state, or id) got every row back as if it had asked for them. An empty value of a filter parameter is
    a 400 ``invalid`` naming the parameter instead; leaving the parameter out still means no filter. The
    schema says the same (``minLength: 1``, core.api.schema.CardhourDjangoFilterExtension)."""

    def filter_queryset(self, request: Request, queryset: QuerySet[Any], view: Any) -> QuerySet[Any]:
        filterset_class = self.get_filterset_class(view, queryset)
        if filterset_class is not None:
            empty = {
                name: ["Give a value, or leave the parameter out."]
                for name in filterset_class.base_filters
                if name in request.query_params and "" in request.query_params.getlist(name)
            }
            if empty:
                raise serializers.ValidationError(empty)
        return super().filter_queryset(request, queryset, view)
