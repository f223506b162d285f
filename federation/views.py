"""Portal pages of federation: the operator's fleet import (CSV upload) and its template file.

The import itself is ``federation.fleet_import.fleet_import``: all or nothing, every bad line reported by
its number. A successful import (or dry run) redirects and shows its summary once, kept in the session.
"""

from __future__ import annotations

from dataclasses import asdict
from typing import Any

from django.contrib import messages
from django.http import HttpRequest, HttpResponse
from django.shortcuts import redirect, render
from django.urls import path
from django.utils.translation import gettext as _
from django.utils.translation import gettext_lazy, ngettext

from core.errors import ConflictError, InvalidInputError
from core.portal import portal_view
from federation.errors import FleetImportError
from federation.fleet_import import COLUMNS, MAX_LISTED_ISSUES, fleet_import
from federation.forms import MAX_UPLOAD_BYTES, FleetImportForm
from federation.selectors import accelerator_list

SESSION_RESULT_KEY = "cardhour_fleet_import_result"
# How many clusters of a result the page lists (the totals always cover all of them).
LISTED_CLUSTERS = 200

TEMPLATE_CSV = (
    "node_name,gpu_model,gpu_capacity_num,hub,site,fabric\r\n"
    "zw-gpu-001,A800-SXM4-80GB,8,nx,Zhongwei,\r\n"
    "zw-gpu-002,A800-SXM4-80GB,8,nx,Zhongwei,\r\n"
    "zw-npu-001,910B3,8,nx,Zhongwei,roce\r\n"
    "zw-npu-002,910B3,8,nx,Zhongwei,roce\r\n"
    "zw-cpu-001,,0,nx,Zhongwei,\r\n"
)

# What each column role means, for the page (the header names come from the importer itself).
COLUMN_HELP: dict[str, tuple[bool, Any]] = {
    "node": (True, gettext_lazy("The node's (server's) name; unique in the file.")),
    "model": (
        True,
        gettext_lazy("The accelerator model: a catalogue slug or one of its aliases (see the list below)."),
    ),
    "cards": (True, gettext_lazy("Cards in the node, 0–1024. A node with 0 cards (a CPU node) is skipped.")),
    "hub": (False, gettext_lazy("The hub code; the Hub option applies to rows without one.")),
    "site": (False, gettext_lazy("The data-centre site; the Site option applies to rows without one.")),
    "cluster": (False, gettext_lazy("The cluster name; by default one cluster per hub, site and model.")),
    "island": (False, gettext_lazy("The island name; if the column is there, every row names its island.")),
    "fabric": (False, gettext_lazy("The island's fabric: nvlink, hccs, infiniband, roce or pcie.")),
}


def _page_context(form: FleetImportForm, **extra: Any) -> dict[str, Any]:
    return {
        "form": form,
        "columns": [(role, COLUMNS[role], required, text) for role, (required, text) in COLUMN_HELP.items()],
        "template_csv": TEMPLATE_CSV.replace("\r\n", "\n"),
        "accelerators": accelerator_list().only("slug", "vendor", "model", "aliases"),
        "max_megabytes": MAX_UPLOAD_BYTES // (1024 * 1024),
        **extra,
    }


def _result_for_session(result: Any) -> dict[str, Any]:
    data = asdict(result)
    data["cluster_count"] = len(data["clusters"])
    data["clusters"] = data["clusters"][:LISTED_CLUSTERS]
    return data


@portal_view("operator", write=True)
def fleet_import_page(request: HttpRequest) -> HttpResponse:
    actor = request.portal  # type: ignore[attr-defined]
    if request.method != "POST":
        result = request.session.pop(SESSION_RESULT_KEY, None)
        return render(
            request, "federation/fleet_import.html", _page_context(FleetImportForm(), result=result)
        )

    form = FleetImportForm(request.POST, request.FILES)
    errors: list[dict[str, Any]] = []
    error_count = 0
    if form.is_valid():
        data = form.cleaned_data
        upload = data["file"]
        try:
            result = fleet_import(
                actor=actor.actor,
                operator=actor.organisation,
                content=upload.read(),
                hub=data["hub"] or None,
                site=data["site"],
                cluster_prefix=data["cluster_prefix"],
                nodes_per_island=data["nodes_per_island"],
                fabric=data["fabric"] or None,
                allow_unknown_models=data["allow_unknown_models"],
                dry_run=data["dry_run"],
                source_name=(upload.name or "upload")[:100],
            )
        except FleetImportError as exc:
            errors = list(exc.extra.get("errors", []))
            error_count = int(exc.extra.get("error_count", len(errors)))
            form.add_error(
                None,
                _(
                    "The file has errors; nothing was imported. Fix the lines listed above and upload the file again."
                ),
            )
        except InvalidInputError as exc:
            for name, problems in (exc.extra.get("fields") or {}).items():
                for problem in problems:
                    form.add_error(name if name in form.fields else None, problem)
            if not exc.extra.get("fields"):
                form.add_error(None, exc.message)
        except ConflictError as exc:
            form.add_error(None, exc.message)
        else:
            request.session[SESSION_RESULT_KEY] = _result_for_session(result)
            if result.dry_run:
                messages.info(
                    request,
                    _(
                        "Dry run: the file is valid and nothing was written. Untick “Check only” to import it."
                    ),
                )
            else:
                messages.success(
                    request,
                    ngettext(
                        "Imported: %(created)d cluster created, %(unchanged)d unchanged.",
                        "Imported: %(created)d clusters created, %(unchanged)d unchanged.",
                        result.clusters_created,
                    )
                    % {"created": result.clusters_created, "unchanged": result.clusters_unchanged},
                )
            return redirect("operator-fleet-import")
    return render(
        request,
        "federation/fleet_import.html",
        _page_context(
            form,
            errors=errors,
            error_count=error_count,
            errors_truncated=error_count > len(errors),
            max_listed=MAX_LISTED_ISSUES,
        ),
    )


@portal_view("operator")
def fleet_import_template(request: HttpRequest) -> HttpResponse:
    response = HttpResponse(TEMPLATE_CSV, content_type="text/csv; charset=utf-8")
    response["Content-Disposition"] = 'attachment; filename="cardhour-fleet-template.csv"'
    return response


urlpatterns = [
    path("operator/fleet-import/", fleet_import_page, name="operator-fleet-import"),
    path("operator/fleet-import/template.csv", fleet_import_template, name="operator-fleet-import-template"),
]
