"""The broker back office: jobs, quotes, leases with their capacity holds and state history, operators'
lease-event endpoints, the lease-event outbox and the notices buyers get.

Decisions, so the next person does not have to rediscover them:

- **Nothing is added, changed or deleted by hand.** Jobs come from buyers, quotes from the matcher, leases
  from accepted quotes and failover, transitions and deliveries from the lease state machine, notices from
  the services that tell buyers something. All of them are read-only here, even for a superuser: a lease
  holds cards and locks a price, its history is what operators pulled and were sent, and an edit would
  silently disagree with both.
- **Actions call services.** Cancelling jobs (``job_cancel``) and cancelling or stopping leases
  (``lease_cancel``) shows a confirmation page that says what will happen to each row and takes a required
  reason; the staff user is the actor (``actor_label`` on every transition written), the reason goes to
  the job's failure reason or the lease's reason and to the admin history. "Run failover now" runs the
  same service as the five-second task (``leases_fail_over``), after a confirmation page listing the live
  leases of down clusters; its transitions are the failover's, as when the task runs it.
- **Operator endpoints**: the signing secret is never shown (only a masked prefix) and never set here;
  operators rotate it through the API. Staff may pause and resume delivery (``enabled``) through
  ``operator_endpoint_enabled_set``, which keeps the secret (the operator's own disable forgets it), so an
  endpoint with no secret cannot be resumed here. Events that fall due while paused are given up; "Retry
  now" on the deliveries sends them again.
- **"Retry now"** (``lease_event_deliveries_retry``) makes pending deliveries due at once and gives up
  ones a fresh series of attempts. Delivery is at least once: an event being POSTed at that moment may be
  POSTed again, and receivers deduplicate on ``X-Cardhour-Delivery``.
- **Big tables stay fast.** Jobs, quotes (hundreds a second), leases, transitions, deliveries and notices
  never count the whole table (``show_full_result_count = False``, and on PostgreSQL the unfiltered count
  is the planner's estimate), order by id, join what they show (``list_select_related``), list buyers and
  operators from the organisation table (never a ``DISTINCT`` over the big one), and search by exact id or
  indexed key: a number finds rows by id, anything else the text fields named in the search help.

- **Reliability scores** are read-only (the hourly beat recomputes them from lease records); "Recompute
  every score now" runs the same service as the beat, which replaces every row from scratch.

``operator_endpoint_enabled_set`` and ``lease_event_deliveries_retry`` are in ``broker.services.dispatch``.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable, Sequence
from datetime import datetime
from decimal import Decimal
from functools import cache
from typing import TYPE_CHECKING, Any
from urllib.parse import urlencode

from django import forms
from django.contrib import admin, messages
from django.contrib.admin import helpers
from django.core.exceptions import ValidationError
from django.db import OperationalError
from django.db.models import Exists, OuterRef, Q, QuerySet
from django.http import HttpRequest, HttpResponse
from django.template import engines
from django.template.response import TemplateResponse
from django.urls import reverse
from django.utils import timezone
from django.utils.html import format_html, format_html_join
from django.utils.safestring import SafeString
from django.utils.translation import gettext as _
from django.utils.translation import gettext_lazy

from broker.models import (
    HOLDING_STATES,
    BuyerNotice,
    BuyerPreference,
    CapacityHold,
    ClusterReliability,
    DrawHold,
    DrawPending,
    Job,
    Lease,
    LeaseEventDelivery,
    LeaseState,
    LeaseTransition,
    OperatorEndpoint,
    Quote,
    SlaAssessment,
)
from broker.services import dispatch, reliability
from core.admin_tools import (
    BuyerFilter,
    LimitedInlineFormSet,
    OperatorFilter,
)
from core.admin_tools import EstimatedCountPaginator as _EstimatedCountPaginator
from core.admin_tools import ReadOnlyAdminMixin as _ReadOnlyAdminMixin
from core.admin_tools import changelist_url as _changelist_url
from core.admin_tools import staff_actor as _staff_actor
from core.errors import DomainError
from core.models import Organisation

if TYPE_CHECKING:
    from django_stubs_ext import StrOrPromise

logger = logging.getLogger(__name__)

# An action confirms at most this many rows at a time (its page lists each one and what will happen to it).
ACTION_ROW_LIMIT = 100
# Inlines show at most this many rows; the full list is one click away.
INLINE_ROW_LIMIT = 100
# The failover confirmation lists this many of the leases it is about to take over.
FAILOVER_ROWS_SHOWN = 50

_LEASE_STATE_COLOURS: dict[str, str] = {
    LeaseState.RESERVED: "#1d4ed8",
    LeaseState.RUNNING: "#15803d",
    LeaseState.STOP_REQUESTED: "#b45309",
    LeaseState.COMPLETED: "#6b7280",
    LeaseState.CANCELLED: "#6b7280",
    LeaseState.INTERRUPTED: "#b91c1c",
    LeaseState.FAILED: "#b91c1c",
}
_JOB_STATE_COLOURS: dict[str, str] = {
    Job.State.OPEN: "#1d4ed8",
    Job.State.PLACED: "#15803d",
    Job.State.COMPLETED: "#6b7280",
    Job.State.FAILED: "#b91c1c",
    Job.State.CANCELLED: "#6b7280",
}
_DELIVERY_COLOURS: dict[str, str] = {
    LeaseEventDelivery.Status.PENDING: "#b45309",
    LeaseEventDelivery.Status.DELIVERED: "#15803d",
    LeaseEventDelivery.Status.GAVE_UP: "#b91c1c",
}


# --- Helpers ---------------------------------------------------------------------------------------


def _change_url(model: type[Any], pk: object) -> str:
    return reverse(f"admin:{model._meta.app_label}_{model._meta.model_name}_change", args=[pk])


def _link(url: str, text: object) -> SafeString:
    return format_html('<a href="{}" style="white-space:nowrap">{}</a>', url, text)


def _lease_link(lease_id: int | None) -> str | SafeString:
    return "—" if lease_id is None else _link(_change_url(Lease, lease_id), f"lease {lease_id}")


def _job_link(job_id: int | None) -> str | SafeString:
    return "—" if job_id is None else _link(_change_url(Job, job_id), f"job {job_id}")


def _local(at: datetime | None) -> str:
    """A timestamp to the second in the site's time zone (history needs the seconds)."""
    return "—" if at is None else f"{timezone.localtime(at):%Y-%m-%d %H:%M:%S}"


def _moment(at: datetime) -> str:
    """A timestamp in the site's time zone, without seconds when they are zero (windows usually are)."""
    local = timezone.localtime(at)
    return f"{local:%Y-%m-%d %H:%M}" if local.second == 0 else f"{local:%Y-%m-%d %H:%M:%S}"


def _window(start_at: datetime, end_at: datetime) -> SafeString:
    """``[start, end)`` compactly: the end's date only when it differs from the start's."""
    start, end = timezone.localtime(start_at), timezone.localtime(end_at)
    end_text = _moment(end_at) if end.date() != start.date() else _moment(end_at)[11:]
    return format_html('<span style="white-space:nowrap">{} → {}</span>', _moment(start_at), end_text)


def _duration(seconds: int) -> str:
    """``2 h``, ``1 h 30 min``, ``3 d 4 h``, ``45 s``."""
    days, rest = divmod(max(int(seconds), 0), 86_400)
    hours, rest = divmod(rest, 3_600)
    minutes, secs = divmod(rest, 60)
    parts = [f"{days} d" if days else "", f"{hours} h" if hours else "", f"{minutes} min" if minutes else ""]
    if secs and not days:
        parts.append(f"{secs} s")
    return " ".join(part for part in parts if part) or "0 s"


def _cny(value: Decimal | None) -> SafeString:
    return format_html('<span style="white-space:nowrap">{} CNY</span>', "—" if value is None else value)


def _badge(value: str, label: str, colours: dict[str, str]) -> SafeString:
    return format_html(
        '<span style="color:{};font-weight:600;white-space:nowrap" title="{}">{}</span>',
        colours.get(value, "inherit"),
        label,
        value,
    )


def _timestamp(field: str, description: StrOrPromise) -> Callable[[Any, Any], str]:
    """A read-only column or field showing a model's datetime to the second (Django's default date format
    drops the seconds, which history needs)."""

    @admin.display(description=description, ordering=field)
    def show(self: Any, obj: Any) -> str:
        return _local(getattr(obj, field))

    return show


def _mask(secret: str) -> str:
    """A signing secret as staff may see it: its first eight characters (``chw_`` and four more)."""
    if not secret:
        return "— (none: the operator disabled lease events)"
    return f"{secret[:8]}… ({len(secret)} characters, hidden)"


class _BigTableMixin(admin.ModelAdmin):
    """Newest first by id (the primary key's index), never a whole-table count, and no per-choice filter
    counts (Django's "Show counts" would count each choice over the whole table)."""

    ordering = ["-id"]
    paginator = _EstimatedCountPaginator
    show_full_result_count = False
    show_facets = admin.ShowFacets.NEVER


class _DetailJoinsMixin(admin.ModelAdmin):
    """The change page loads its object with ``detail_select_related`` joined: one query, not one per
    related row it shows."""

    detail_select_related: tuple[str, ...] = ()

    def get_object(self, request: HttpRequest, object_id: str, from_field: str | None = None) -> Any:
        queryset = self.get_queryset(request).select_related(*self.detail_select_related)
        model = queryset.model
        field = model._meta.pk if from_field is None else model._meta.get_field(from_field)
        try:
            return queryset.get(**{field.name: field.to_python(object_id)})
        except (model.DoesNotExist, ValidationError, ValueError):
            return None


class _WideChangelistMixin(admin.ModelAdmin):
    """Hides the admin's navigation sidebar on lists with more columns than fit beside it and the filters."""

    def changelist_view(
        self, request: HttpRequest, extra_context: dict[str, Any] | None = None
    ) -> HttpResponse:
        return super().changelist_view(
            request, extra_context={"is_nav_sidebar_enabled": False, **(extra_context or {})}
        )


class _IdSearchMixin(admin.ModelAdmin):
    """A search term of digits finds rows by exact id (``id_search_fields``, ORed): an index lookup. Any
    other term goes to Django's search over ``search_fields``; with none, it finds nothing."""

    id_search_fields: tuple[str, ...] = ("pk",)
    text_search_fields: tuple[str, ...] = ()

    def get_search_fields(self, request: HttpRequest) -> tuple[str, ...]:
        # Non-empty so that the search box shows; the id lookups are made in get_search_results.
        return self.text_search_fields or self.id_search_fields

    def get_search_results(
        self, request: HttpRequest, queryset: QuerySet[Any], search_term: str
    ) -> tuple[QuerySet[Any], bool]:
        term = search_term.strip()
        if not term:
            return queryset, False
        if term.isdigit():
            if int(term) >= 2**63:
                return queryset.none(), False
            by_id = Q()
            for field in self.id_search_fields:
                by_id |= Q(**{field: int(term)})
            return queryset.filter(by_id), False
        if not self.text_search_fields:
            return queryset.none(), False
        return super().get_search_results(request, queryset, term)


class _LimitedInlineFormSet(LimitedInlineFormSet):
    row_limit = INLINE_ROW_LIMIT


class _ReadOnlyInline(_ReadOnlyAdminMixin, admin.TabularInline):
    formset = _LimitedInlineFormSet
    extra = 0
    can_delete = False


_CONFIRM_TEMPLATE = """{% extends "admin/base_site.html" %}
{% load i18n l10n admin_urls static %}
{% block extrahead %}{{ block.super }}{{ media }}<script src="{% static 'admin/js/cancel.js' %}" async></script>{% endblock %}
{% block extrastyle %}{{ block.super }}<link rel="stylesheet" href="{% static "admin/css/forms.css" %}">{% endblock %}
{% block bodyclass %}{{ block.super }} app-{{ opts.app_label }} model-{{ opts.model_name }} delete-confirmation{% endblock %}
{% block breadcrumbs %}
<div class="breadcrumbs">
<a href="{% url 'admin:index' %}">{% translate 'Home' %}</a>
&rsaquo; <a href="{% url 'admin:app_list' app_label=opts.app_label %}">{{ opts.app_config.verbose_name }}</a>
&rsaquo; <a href="{% url opts|admin_urlname:'changelist' %}">{{ opts.verbose_name_plural|capfirst }}</a>
&rsaquo; {{ title }}
</div>
{% endblock %}
{% block content %}
{% for paragraph in intro %}<p>{{ paragraph }}</p>{% endfor %}
{% if rows %}
<table>
  <thead><tr>{% for header in headers %}<th>{{ header }}</th>{% endfor %}</tr></thead>
  <tbody>{% for row in rows %}<tr>{% for cell in row %}<td>{{ cell }}</td>{% endfor %}</tr>{% endfor %}</tbody>
</table>
{% if more %}<p>… and {{ more }} more.</p>{% endif %}
{% endif %}
<form method="post">{% csrf_token %}
<div>
  {% for pk in selected %}<input type="hidden" name="{{ action_checkbox_name }}" value="{{ pk|unlocalize }}">{% endfor %}
  <input type="hidden" name="action" value="{{ action }}">
  <input type="hidden" name="confirm" value="yes">
  {% if form %}
  <fieldset class="module aligned">
  {% for field in form %}
    <div class="form-row{% if field.errors %} errors{% endif %}">
      {{ field.errors }}
      <div>
        <div class="flex-container">{{ field.label_tag }} {{ field }}</div>
        {% if field.help_text %}<div class="help"><div>{{ field.help_text }}</div></div>{% endif %}
      </div>
    </div>
  {% endfor %}
  </fieldset>
  {% endif %}
  <input type="submit" value="{{ submit_label }}">
  <a href="#" class="button cancel-link">{% translate "No, take me back" %}</a>
</div>
</form>
{% endblock %}
"""


@cache
def _confirm_template() -> Any:
    return engines["django"].from_string(_CONFIRM_TEMPLATE)


class ReasonForm(forms.Form):
    reason = forms.CharField(
        max_length=400,
        widget=forms.Textarea(attrs={"rows": 3, "cols": 60}),
        help_text=gettext_lazy(
            "Recorded with your name: in the admin history and as the job's or lease's reason."
        ),
    )


def _confirmed(request: HttpRequest) -> bool:
    return request.POST.get("confirm") == "yes"


def _too_many(request: HttpRequest, queryset: QuerySet[Any], noun: str) -> bool:
    if queryset.count() > ACTION_ROW_LIMIT:
        messages.error(
            request,
            _("Select at most %(limit)d %(noun)s at a time: nothing was changed.")
            % {"limit": ACTION_ROW_LIMIT, "noun": noun},
        )
        return True
    return False


def _confirm_page(
    model_admin: admin.ModelAdmin,
    request: HttpRequest,
    *,
    action: str,
    title: str,
    intro: Sequence[str],
    headers: Sequence[str],
    rows: Sequence[Sequence[object]],
    selected: Sequence[int],
    form: forms.Form | None,
    submit_label: str,
    more: int = 0,
) -> TemplateResponse:
    context = {
        **model_admin.admin_site.each_context(request),
        "opts": model_admin.model._meta,
        "title": title,
        "intro": intro,
        "headers": headers,
        "rows": rows,
        "more": more,
        "selected": selected,
        "form": form,
        "submit_label": submit_label,
        "action_checkbox_name": helpers.ACTION_CHECKBOX_NAME,
        "action": action,
        "media": model_admin.media,
    }
    return TemplateResponse(request, _confirm_template(), context)


# --- Jobs and quotes -------------------------------------------------------------------------------


class JobLeaseInline(_ReadOnlyInline):
    model = Lease
    fk_name = "job"
    fields = readonly_fields = (
        "lease_cell",
        "cluster_cpi",
        "cards",
        "window",
        "state_badge",
        "changed",
        "replaces_link",
    )
    ordering = ["id"]
    verbose_name_plural = f"leases (first {INLINE_ROW_LIMIT}, oldest first)"

    def get_queryset(self, request: HttpRequest) -> QuerySet[Lease]:
        return super().get_queryset(request).select_related("cluster")

    @admin.display(description=gettext_lazy("Lease"))
    def lease_cell(self, obj: Lease) -> str | SafeString:
        return _lease_link(obj.pk)

    @admin.display(description=gettext_lazy("Cluster"))
    def cluster_cpi(self, obj: Lease) -> str:
        return obj.cluster.cpi

    @admin.display(description=gettext_lazy("Window"))
    def window(self, obj: Lease) -> SafeString:
        return _window(obj.start_at, obj.end_at)

    @admin.display(description=gettext_lazy("State"))
    def state_badge(self, obj: Lease) -> SafeString:
        return _badge(obj.state, obj.get_state_display(), _LEASE_STATE_COLOURS)

    @admin.display(description=gettext_lazy("State changed"))
    def changed(self, obj: Lease) -> str:
        return _local(obj.state_changed_at)

    @admin.display(description=gettext_lazy("Replaces"))
    def replaces_link(self, obj: Lease) -> str | SafeString:
        return _lease_link(obj.replaces_id)


@admin.register(Job)
class JobAdmin(
    _DetailJoinsMixin,
    _WideChangelistMixin,
    _IdSearchMixin,
    _BigTableMixin,
    _ReadOnlyAdminMixin,
    admin.ModelAdmin,
):
    """Buyers' jobs as submitted; cancelled only through ``job_cancel`` (the action)."""

    detail_select_related = ("buyer", "origin_hub")
    list_display = [
        "id",
        "name",
        "buyer_slug",
        "cards_wanted",
        "chips",
        "origin",
        "window",
        "duration",
        "state_badge",
        "created",
    ]
    list_display_links = ["id", "name"]
    list_filter = ["state", "gang", "preference", "checkpointable", "origin_hub", BuyerFilter]
    list_select_related = ["buyer", "origin_hub"]
    text_search_fields = ("name", "buyer__slug__startswith")
    search_help_text = gettext_lazy("A job id, or part of its name, or the start of its buyer's slug.")
    actions = ["cancel_jobs"]
    inlines = [JobLeaseInline]
    fieldsets = [
        (
            gettext_lazy("Job"),
            {"fields": ["buyer", "name", "state_badge", "failure_reason", "quotes_link", "notices_link"]},
        ),
        (
            gettext_lazy("What"),
            {
                "fields": [
                    "cards_wanted",
                    "accelerators",
                    "min_fp16_tflops",
                    "min_memory_gb",
                    "fabrics",
                    "gang",
                    "checkpointable",
                ]
            },
        ),
        (
            gettext_lazy("Where and when"),
            {"fields": ["origin_hub", "latency_budget_ms", "earliest_start", "deadline", "duration"]},
        ),
        (gettext_lazy("Price"), {"fields": ["max_price_per_card_hour", "preference", "price_weight"]}),
        (None, {"fields": ["idempotency_key", "created_display", "updated"]}),
    ]
    readonly_fields = [
        "state_badge",
        "cards_wanted",
        "earliest_start",
        "deadline",
        "duration",
        "quotes_link",
        "notices_link",
        "created_display",
        "updated",
    ]
    earliest_start = _timestamp("earliest_start_at", gettext_lazy("Earliest start"))
    deadline = _timestamp("deadline_at", gettext_lazy("Deadline"))
    created_display = _timestamp("created_at", gettext_lazy("Created at"))
    updated = _timestamp("updated_at", gettext_lazy("Updated at"))

    @admin.display(description=gettext_lazy("Buyer"), ordering="buyer__slug")
    def buyer_slug(self, obj: Job) -> str:
        return obj.buyer.slug

    @admin.display(description=gettext_lazy("Cards"))
    def cards_wanted(self, obj: Job) -> str:
        if obj.cards is not None:
            return f"{obj.cards} cards"
        return f"{obj.standard_cards.normalize():f} standard cards" if obj.standard_cards else "—"

    @admin.display(description=gettext_lazy("Chips"))
    def chips(self, obj: Job) -> str | SafeString:
        if not obj.accelerators:
            return "any"
        return format_html_join(format_html("<br>"), "{}", ((slug,) for slug in obj.accelerators))

    @admin.display(description=gettext_lazy("From"), ordering="origin_hub__sort_order")
    def origin(self, obj: Job) -> SafeString:
        return format_html('<span title="{} ms budget">{}</span>', obj.latency_budget_ms, obj.origin_hub.code)

    @admin.display(description=gettext_lazy("Window"), ordering="earliest_start_at")
    def window(self, obj: Job) -> SafeString:
        return _window(obj.earliest_start_at, obj.deadline_at)

    @admin.display(description=gettext_lazy("Duration"), ordering="duration_seconds")
    def duration(self, obj: Job) -> str:
        return _duration(obj.duration_seconds)

    @admin.display(description=gettext_lazy("State"), ordering="state")
    def state_badge(self, obj: Job) -> SafeString:
        return _badge(obj.state, obj.get_state_display(), _JOB_STATE_COLOURS)

    @admin.display(description=gettext_lazy("Created"), ordering="id")
    def created(self, obj: Job) -> SafeString:
        return format_html('<span style="white-space:nowrap">{}</span>', _local(obj.created_at))

    @admin.display(description=gettext_lazy("Quotes"))
    def quotes_link(self, obj: Job) -> SafeString:
        return _link(_changelist_url(Quote, job__id__exact=obj.pk), _("Its quotes →"))

    @admin.display(description=gettext_lazy("Notices"))
    def notices_link(self, obj: Job) -> SafeString:
        return _link(_changelist_url(BuyerNotice, job__id__exact=obj.pk), _("What the buyer was told →"))

    def has_cancel_permission(self, request: HttpRequest) -> bool:
        return request.user.has_perm("broker.change_job")

    @admin.action(description=gettext_lazy("Cancel selected jobs"), permissions=["cancel"])
    def cancel_jobs(self, request: HttpRequest, queryset: QuerySet[Job]) -> HttpResponse | None:
        from broker.services.jobs import job_cancel

        if _too_many(request, queryset, _("jobs")):
            return None
        jobs = list(queryset.select_related("buyer").order_by("pk"))
        form = ReasonForm(request.POST if _confirmed(request) else None)
        if _confirmed(request) and form.is_valid():
            reason = form.cleaned_data["reason"].strip()
            actor = _staff_actor(request)
            done: list[str] = []
            for job in jobs:
                try:
                    job_cancel(job=job, actor=actor, reason=f"{reason} (staff, admin)")
                except DomainError as exc:
                    messages.warning(
                        request, _("Job %(job)s: %(message)s") % {"job": job.pk, "message": exc.message}
                    )
                    continue
                self.log_change(request, job, f"Cancelled: {reason}")
                done.append(str(job.pk))
            if done:
                messages.success(
                    request,
                    _("Cancelled %(n)d job(s): %(jobs)s.") % {"n": len(done), "jobs": ", ".join(done)},
                )
            return None
        live: dict[int, list[Lease]] = {}
        for lease in Lease.objects.filter(job__in=jobs, state__in=HOLDING_STATES).order_by("pk"):
            live.setdefault(lease.job_id, []).append(lease)
        rows = [
            [
                _job_link(job.pk),
                job.name,
                job.buyer.slug,
                job.get_state_display(),
                _job_cancel_outcome(job, live.get(job.pk, [])),
            ]
            for job in jobs
        ]
        return _confirm_page(
            self,
            request,
            action="cancel_jobs",
            title=_("Cancel these jobs?"),
            intro=[
                _(
                    "Each job is cancelled for good (the buyer cannot quote it again). Its reserved lease is "
                    "cancelled and its cards released at once; a running lease is asked to stop, and completes "
                    "when the operator reports it stopped. Usage already reported is billed as usual."
                ),
                _("A job already completed, failed or cancelled is refused by the service and reported."),
            ],
            headers=[_("Job"), _("Name"), _("Buyer"), _("State"), _("What happens")],
            rows=rows,
            selected=[job.pk for job in jobs],
            form=form,
            submit_label=_("Yes, cancel these jobs"),
        )


def _job_cancel_outcome(job: Job, live: list[Lease]) -> str:
    if job.state in (Job.State.COMPLETED, Job.State.FAILED, Job.State.CANCELLED):
        return _("refused: the job is %(state)s") % {"state": job.get_state_display()}
    parts = [_("cancelled")]
    for lease in live:
        if lease.state == LeaseState.RESERVED:
            parts.append(_("lease %(lease)s cancelled, cards released") % {"lease": lease.pk})
        elif lease.state == LeaseState.RUNNING:
            parts.append(_("lease %(lease)s asked to stop") % {"lease": lease.pk})
        else:
            parts.append(_("lease %(lease)s already stopping") % {"lease": lease.pk})
    return "; ".join(parts)


class LiveQuoteFilter(admin.SimpleListFilter):
    title = gettext_lazy("validity")
    parameter_name = "validity"

    def lookups(self, request: HttpRequest, model_admin: admin.ModelAdmin) -> list[tuple[str, str]]:
        return [("live", _("live (not expired)")), ("expired", _("expired"))]

    def queryset(self, request: HttpRequest, queryset: QuerySet[Any]) -> QuerySet[Any]:
        if self.value() == "live":
            return queryset.filter(expires_at__gt=timezone.now())
        if self.value() == "expired":
            return queryset.filter(expires_at__lte=timezone.now())
        return queryset


@admin.register(Quote)
class QuoteAdmin(
    _DetailJoinsMixin,
    _WideChangelistMixin,
    _IdSearchMixin,
    _BigTableMixin,
    _ReadOnlyAdminMixin,
    admin.ModelAdmin,
):
    """Ranked placements the matcher offered; they hold nothing and expire (purged a day later)."""

    detail_select_related = ("job", "cluster", "price_card")
    list_display = [
        "id",
        "job_cell",
        "rank",
        "cluster_cpi",
        "start",
        "cards",
        "cost_cny",
        "latency_ms",
        "expires",
        "accepted",
    ]
    list_filter = [LiveQuoteFilter, "balance_sufficient"]
    list_select_related = ["job", "cluster"]
    id_search_fields = ("pk", "job_id")
    search_help_text = gettext_lazy("A quote id or a job id.")
    fields = readonly_fields = (
        "job_cell",
        "rank",
        "cluster_cpi",
        "islands",
        "cards",
        "window",
        "price_card_display",
        "cost_cny",
        "breakdown_display",
        "latency_ms",
        "saving",
        "expected_draw_display",
        "balance_sufficient",
        "replaces_link",
        "created",
        "expires_display",
        "lease_link",
    )
    created = _timestamp("created_at", gettext_lazy("Created at"))
    expires_display = _timestamp("expires_at", gettext_lazy("Expires at"))

    def get_queryset(self, request: HttpRequest) -> QuerySet[Quote]:
        accepted = Lease.objects.filter(quote_id=OuterRef("pk"))
        return super().get_queryset(request).annotate(is_accepted=Exists(accepted))

    @admin.display(description=gettext_lazy("Job"), ordering="job_id")
    def job_cell(self, obj: Quote) -> SafeString:
        return format_html("{} {}", _job_link(obj.job_id), obj.job.name)

    @admin.display(description=gettext_lazy("Cluster"), ordering="cluster__cpi")
    def cluster_cpi(self, obj: Quote) -> str:
        return obj.cluster.cpi

    @admin.display(description=gettext_lazy("Start → end"), ordering="start_at")
    def start(self, obj: Quote) -> SafeString:
        return _window(obj.start_at, obj.end_at)

    @admin.display(description=gettext_lazy("Cost"), ordering="cost")
    def cost_cny(self, obj: Quote) -> SafeString:
        return _cny(obj.cost)

    @admin.display(description=gettext_lazy("Expires"), ordering="expires_at")
    def expires(self, obj: Quote) -> SafeString:
        expired = obj.expires_at <= timezone.now()
        return format_html(
            '<span style="white-space:nowrap;{}">{}</span>',
            "color:#6b7280" if expired else "",
            _local(obj.expires_at),
        )

    @admin.display(description=gettext_lazy("Accepted"), boolean=True, ordering="is_accepted")
    def accepted(self, obj: Quote) -> bool:
        return bool(getattr(obj, "is_accepted", False))

    @admin.display(description=gettext_lazy("Islands (id × cards)"))
    def islands(self, obj: Quote) -> str:
        return ", ".join(f"{island_id} × {cards}" for island_id, cards in obj.allocation)

    @admin.display(description=gettext_lazy("Window"))
    def window(self, obj: Quote) -> SafeString:
        return _window(obj.start_at, obj.end_at)

    @admin.display(description=gettext_lazy("Price card"))
    def price_card_display(self, obj: Quote) -> str:
        card = obj.price_card
        return f"v{card.version}: {card.rate_per_card_hour} CNY per card-hour"

    @admin.display(description=gettext_lazy("Cost by band"))
    def breakdown_display(self, obj: Quote) -> SafeString:
        return format_html(
            '<pre style="margin:0">{}</pre>', json.dumps(obj.breakdown, indent=2, ensure_ascii=False)
        )

    @admin.display(description=gettext_lazy("Expected draw"))
    def expected_draw_display(self, obj: Quote) -> str:
        return f"{obj.expected_draw} card-hours ({obj.draw_class})"

    @admin.display(description=gettext_lazy("Replaces"))
    def replaces_link(self, obj: Quote) -> str | SafeString:
        return _lease_link(obj.replaces_id)

    @admin.display(description=gettext_lazy("Lease"))
    def lease_link(self, obj: Quote) -> str | SafeString:
        lease_id = Lease.objects.filter(quote_id=obj.pk).values_list("pk", flat=True).first()
        return "not accepted" if lease_id is None else _lease_link(lease_id)


# --- Leases ----------------------------------------------------------------------------------------


class CapacityHoldInline(_ReadOnlyInline):
    model = CapacityHold
    fields = readonly_fields = ("island_cpi", "cards", "window", "active")
    ordering = ["island_id"]
    verbose_name_plural = "capacity holds"

    def get_queryset(self, request: HttpRequest) -> QuerySet[CapacityHold]:
        return super().get_queryset(request).select_related("island")

    @admin.display(description=gettext_lazy("Island"))
    def island_cpi(self, obj: CapacityHold) -> str:
        return obj.island.cpi

    @admin.display(description=gettext_lazy("Window"))
    def window(self, obj: CapacityHold) -> SafeString:
        return _window(obj.start_at, obj.end_at)


class LeaseTransitionInline(_ReadOnlyInline):
    model = LeaseTransition
    fields = readonly_fields = ("at_display", "from_to", "actor", "reason", "delivery_status")
    ordering = ["id"]
    verbose_name_plural = f"state history (first {INLINE_ROW_LIMIT}, oldest first)"

    def get_queryset(self, request: HttpRequest) -> QuerySet[LeaseTransition]:
        return super().get_queryset(request).select_related("delivery")

    @admin.display(description=gettext_lazy("At"))
    def at_display(self, obj: LeaseTransition) -> str:
        return _local(obj.at)

    @admin.display(description=gettext_lazy("From → to"))
    def from_to(self, obj: LeaseTransition) -> str:
        return f"{obj.from_state or '∅'} → {obj.to_state}"

    @admin.display(description=gettext_lazy("Actor"))
    def actor(self, obj: LeaseTransition) -> str:
        return obj.actor_label

    @admin.display(description=gettext_lazy("Event"))
    def delivery_status(self, obj: LeaseTransition) -> str | SafeString:
        try:
            delivery = obj.delivery
        except LeaseEventDelivery.DoesNotExist:
            return "not sent (pulled only)"
        return _link(_change_url(LeaseEventDelivery, delivery.pk), delivery.get_status_display())


@admin.register(Lease)
class LeaseAdmin(
    _DetailJoinsMixin,
    _WideChangelistMixin,
    _IdSearchMixin,
    _BigTableMixin,
    _ReadOnlyAdminMixin,
    admin.ModelAdmin,
):
    """Accepted quotes holding cards. Read-only even for superusers; cancelled or stopped only through
    ``lease_cancel`` (the action), failed over only through ``leases_fail_over``."""

    detail_select_related = ("job", "buyer", "operator", "cluster", "price_card__tariff_version__tariff")
    list_display = [
        "id",
        "job_cell",
        "buyer_slug",
        "operator_slug",
        "cluster_cpi",
        "cards",
        "window",
        "state_badge",
        "price_card_version",
        "expected_cost_cny",
        "replaces_link",
        "state_changed",
    ]
    list_filter = ["state", OperatorFilter, BuyerFilter, "cluster__hub"]
    list_select_related = ["job", "buyer", "operator", "cluster", "price_card"]
    text_search_fields = ("cluster__cpi__exact",)
    search_help_text = gettext_lazy("A lease id, or a cluster's full CPI (cpi:operator:hub:name).")
    actions = ["cancel_leases", "run_failover"]
    inlines = [CapacityHoldInline, LeaseTransitionInline]
    fieldsets = [
        (
            gettext_lazy("Lease"),
            {
                "fields": [
                    "reference",
                    "job_cell",
                    "quote_link",
                    "buyer",
                    "operator",
                    "cluster_link",
                    "cards",
                    "window",
                ]
            },
        ),
        (
            gettext_lazy("Price"),
            {"fields": ["price_card_display", "expected_cost_cny", "expected_draw_display"]},
        ),
        (
            gettext_lazy("State"),
            {
                "fields": [
                    "state_badge",
                    "state_changed",
                    "reason",
                    "started",
                    "stop_requested",
                    "ended",
                    "last_usage_end",
                    "replaces_link",
                    "replaced_by_link",
                    "usage_link",
                ]
            },
        ),
        (None, {"fields": ["created"]}),
    ]
    readonly_fields = [
        "reference",
        "job_cell",
        "quote_link",
        "cluster_link",
        "window",
        "price_card_display",
        "expected_cost_cny",
        "expected_draw_display",
        "state_badge",
        "replaces_link",
        "replaced_by_link",
        "usage_link",
        "state_changed",
        "started",
        "stop_requested",
        "ended",
        "last_usage_end",
        "created",
    ]
    started = _timestamp("started_at", gettext_lazy("Started at (reported)"))
    stop_requested = _timestamp("stop_requested_at", gettext_lazy("Stop requested at"))
    ended = _timestamp("ended_at", gettext_lazy("Ended at (billing stops here)"))
    last_usage_end = _timestamp("last_usage_end_at", gettext_lazy("Last usage reported up to"))
    created = _timestamp("created_at", gettext_lazy("Created at"))

    @admin.display(description=gettext_lazy("Job"), ordering="job_id")
    def job_cell(self, obj: Lease) -> SafeString:
        return format_html("{} {}", _job_link(obj.job_id), obj.job.name)

    @admin.display(description=gettext_lazy("Buyer"), ordering="buyer__slug")
    def buyer_slug(self, obj: Lease) -> str:
        return obj.buyer.slug

    @admin.display(description=gettext_lazy("Operator"), ordering="operator__slug")
    def operator_slug(self, obj: Lease) -> str:
        return obj.operator.slug

    @admin.display(description=gettext_lazy("Cluster"), ordering="cluster__cpi")
    def cluster_cpi(self, obj: Lease) -> SafeString:
        return format_html('<span style="white-space:nowrap">{}</span>', obj.cluster.cpi)

    @admin.display(description=gettext_lazy("Window"), ordering="start_at")
    def window(self, obj: Lease) -> SafeString:
        return _window(obj.start_at, obj.end_at)

    @admin.display(description=gettext_lazy("State"), ordering="state")
    def state_badge(self, obj: Lease) -> SafeString:
        return _badge(obj.state, obj.get_state_display(), _LEASE_STATE_COLOURS)

    @admin.display(description=gettext_lazy("Price card"), ordering="price_card__version")
    def price_card_version(self, obj: Lease) -> str:
        return f"v{obj.price_card.version}"

    @admin.display(description=gettext_lazy("Expected cost"), ordering="expected_cost")
    def expected_cost_cny(self, obj: Lease) -> SafeString:
        return _cny(obj.expected_cost)

    @admin.display(description=gettext_lazy("Replaces"), ordering="replaces_id")
    def replaces_link(self, obj: Lease) -> str | SafeString:
        return _lease_link(obj.replaces_id)

    @admin.display(description=gettext_lazy("State changed"), ordering="state_changed_at")
    def state_changed(self, obj: Lease) -> SafeString:
        return format_html('<span style="white-space:nowrap">{}</span>', _local(obj.state_changed_at))

    # --- change page ---

    @admin.display(description=gettext_lazy("Reference (on usage records)"))
    def reference(self, obj: Lease) -> str:
        return obj.reference

    @admin.display(description=gettext_lazy("Quote"))
    def quote_link(self, obj: Lease) -> str | SafeString:
        if obj.quote_id is None:
            return "none (placed by failover)" if obj.replaces_id else "none"
        return _link(_change_url(Quote, obj.quote_id), f"quote {obj.quote_id}")

    @admin.display(description=gettext_lazy("Cluster"))
    def cluster_link(self, obj: Lease) -> SafeString:
        return _link(reverse("admin:federation_cluster_change", args=[obj.cluster_id]), obj.cluster.cpi)

    @admin.display(description=gettext_lazy("Price card"))
    def price_card_display(self, obj: Lease) -> str:
        card = obj.price_card
        tariff = card.tariff_version
        return (
            f"v{card.version}: {card.rate_per_card_hour} CNY per card-hour, tariff {tariff.tariff.code} "
            f"v{tariff.version}"
        )

    @admin.display(description=gettext_lazy("Expected draw"))
    def expected_draw_display(self, obj: Lease) -> str:
        return f"{obj.expected_draw} card-hours ({obj.draw_class})"

    @admin.display(description=gettext_lazy("Replaced by"))
    def replaced_by_link(self, obj: Lease) -> str | SafeString:
        lease_id = Lease.objects.filter(replaces_id=obj.pk).values_list("pk", flat=True).first()
        return _lease_link(lease_id)

    @admin.display(description=gettext_lazy("Usage"))
    def usage_link(self, obj: Lease) -> SafeString:
        url = f"{reverse('admin:metering_usagerecord_changelist')}?{urlencode({'q': obj.reference})}"
        return _link(url, _("Usage records reported against it →"))

    # --- actions ---

    def has_cancel_permission(self, request: HttpRequest) -> bool:
        return request.user.has_perm("broker.change_lease")

    def has_failover_permission(self, request: HttpRequest) -> bool:
        return request.user.has_perm("broker.change_lease")

    @admin.action(
        description=gettext_lazy("Cancel (reserved) / request stop (running)"), permissions=["cancel"]
    )
    def cancel_leases(self, request: HttpRequest, queryset: QuerySet[Lease]) -> HttpResponse | None:
        from broker.services.leases import lease_cancel

        if _too_many(request, queryset, _("leases")):
            return None
        leases = list(queryset.select_related("buyer", "cluster").order_by("pk"))
        form = ReasonForm(request.POST if _confirmed(request) else None)
        if _confirmed(request) and form.is_valid():
            reason = form.cleaned_data["reason"].strip()
            actor = _staff_actor(request)
            cancelled: list[str] = []
            stopping: list[str] = []
            for lease in leases:
                try:
                    done = lease_cancel(lease_id=lease.pk, actor=actor, reason=f"{reason} (staff, admin)")
                except DomainError as exc:
                    messages.warning(
                        request,
                        _("Lease %(lease)s: %(message)s") % {"lease": lease.pk, "message": exc.message},
                    )
                    continue
                (cancelled if done.state == LeaseState.CANCELLED else stopping).append(str(lease.pk))
                self.log_change(request, lease, f"{done.get_state_display()}: {reason}")
            if cancelled:
                messages.success(
                    request,
                    _("Cancelled %(n)d lease(s): %(leases)s.")
                    % {"n": len(cancelled), "leases": ", ".join(cancelled)},
                )
            if stopping:
                messages.success(
                    request,
                    _("Asked the operator to stop %(n)d lease(s): %(leases)s.")
                    % {"n": len(stopping), "leases": ", ".join(stopping)},
                )
            return None
        rows = [
            [
                _lease_link(lease.pk),
                lease.buyer.slug,
                lease.cluster.cpi,
                lease.cards,
                _window(lease.start_at, lease.end_at),
                lease.get_state_display(),
                _lease_cancel_outcome(lease),
            ]
            for lease in leases
        ]
        return _confirm_page(
            self,
            request,
            action="cancel_leases",
            title=_("Cancel or stop these leases?"),
            intro=[
                _(
                    "A reserved lease is cancelled and its cards released at once; its job goes back to open, "
                    "so the buyer may quote it again (cancel the job to stop it for good). A running lease is "
                    "asked to stop: the operator's agent stops it and reports its last usage, which is billed."
                ),
                _("A lease already stopping or ended is refused by the service and reported."),
            ],
            headers=[
                _("Lease"),
                _("Buyer"),
                _("Cluster"),
                _("Cards"),
                _("Window"),
                _("State"),
                _("What happens"),
            ],
            rows=rows,
            selected=[lease.pk for lease in leases],
            form=form,
            submit_label=_("Yes, cancel or stop these leases"),
        )

    @admin.action(description=gettext_lazy("Run failover now (all down clusters)"), permissions=["failover"])
    def run_failover(self, request: HttpRequest, queryset: QuerySet[Lease]) -> HttpResponse | None:
        from broker.services.failover import DOWN_STATUSES, LIVE_STATES, leases_fail_over

        if _confirmed(request):
            logger.info("failover run from the admin by %s", request.user)
            try:
                handled = leases_fail_over()
            except OperationalError as exc:
                messages.error(
                    request,
                    _(
                        "Failover hit a transient database error (%(error)s); what it handled is committed. Run it "
                        "again, or let the five-second task finish it."
                    )
                    % {"error": exc},
                )
                return None
            messages.success(
                request, _("Failover ran: %(n)d lease(s) of down clusters handled.") % {"n": handled}
            )
            return None
        down = (
            Lease.objects.filter(state__in=LIVE_STATES, cluster__status__in=DOWN_STATUSES)
            .select_related("buyer", "cluster", "job")
            .order_by("pk")
        )
        shown = list(down[:FAILOVER_ROWS_SHOWN])
        total = down.count() if len(shown) == FAILOVER_ROWS_SHOWN else len(shown)
        rows = [
            [
                _lease_link(lease.pk),
                lease.buyer.slug,
                format_html("{} ({})", lease.cluster.cpi, lease.cluster.get_status_display().lower()),
                lease.cards,
                lease.get_state_display(),
                _("yes") if lease.job.checkpointable else _("no"),
            ]
            for lease in shown
        ]
        first = queryset.order_by("pk").values_list("pk", flat=True).first()
        return _confirm_page(
            self,
            request,
            action="run_failover",
            title=_("Run failover now?"),
            intro=[
                _(
                    "Failover runs every five seconds by itself; this runs it once, now, exactly as the task "
                    "does. It takes over every live lease of an offline or retired cluster, whichever leases "
                    "are selected: each is interrupted, billed up to its last reported usage, and re-placed "
                    "elsewhere for its remaining time when its job allows it (a checkpointable job, or a lease "
                    "that never started); otherwise its job fails and the buyer is told."
                ),
                _("Live leases on down clusters right now: %(n)d.") % {"n": total}
                if total
                else _("There are no live leases on down clusters right now: failover would do nothing."),
            ],
            headers=[_("Lease"), _("Buyer"), _("Cluster"), _("Cards"), _("State"), _("Checkpointable job")],
            rows=rows,
            more=max(total - len(shown), 0),
            selected=[first] if first is not None else [],
            form=None,
            submit_label=_("Yes, run failover now"),
        )


def _lease_cancel_outcome(lease: Lease) -> str:
    if lease.state == LeaseState.RESERVED:
        return _("cancelled, cards released")
    if lease.state == LeaseState.RUNNING:
        return _("asked to stop")
    return _("refused: the lease is %(state)s") % {"state": lease.get_state_display().lower()}


@admin.register(LeaseTransition)
class LeaseTransitionAdmin(
    _DetailJoinsMixin, _IdSearchMixin, _BigTableMixin, _ReadOnlyAdminMixin, admin.ModelAdmin
):
    """The append-only history of every lease: what operators pull (its id is their cursor) and are sent."""

    detail_select_related = ("operator",)
    list_display = ["id", "lease_cell", "from_to", "at_display", "actor", "reason"]
    list_display_links = ["id"]
    list_filter = ["to_state"]
    date_hierarchy = "at"
    id_search_fields = ("lease_id",)
    search_help_text = gettext_lazy("A lease id.")
    fields = readonly_fields = (
        "lease_cell",
        "operator_slug",
        "from_state",
        "to_state",
        "at_display",
        "actor",
        "reason",
        "delivery_link",
    )

    @admin.display(description=gettext_lazy("Lease"), ordering="lease_id")
    def lease_cell(self, obj: LeaseTransition) -> str | SafeString:
        return _lease_link(obj.lease_id)

    @admin.display(description=gettext_lazy("From → to"))
    def from_to(self, obj: LeaseTransition) -> str:
        return f"{obj.from_state or '∅'} → {obj.to_state}"

    @admin.display(description=gettext_lazy("At"), ordering="at")
    def at_display(self, obj: LeaseTransition) -> SafeString:
        return format_html('<span style="white-space:nowrap">{}</span>', _local(obj.at))

    @admin.display(description=gettext_lazy("Actor"))
    def actor(self, obj: LeaseTransition) -> str:
        return obj.actor_label

    @admin.display(description=gettext_lazy("Operator"))
    def operator_slug(self, obj: LeaseTransition) -> str:
        return obj.operator.slug

    @admin.display(description=gettext_lazy("Event delivery"))
    def delivery_link(self, obj: LeaseTransition) -> str | SafeString:
        delivery = LeaseEventDelivery.objects.filter(transition_id=obj.pk).first()
        if delivery is None:
            return "not sent (the operator had no enabled endpoint, or the cluster no URL)"
        return _link(_change_url(LeaseEventDelivery, delivery.pk), delivery.get_status_display())


# --- Operators' endpoints and the lease-event outbox -------------------------------------------------


class OperatorEndpointForm(forms.ModelForm):
    class Meta:
        model = OperatorEndpoint
        fields = ["enabled"]
        help_texts = {
            "enabled": gettext_lazy(
                "Untick to pause POSTing lease events to this operator's clusters (pulling still works; events "
                "falling due meanwhile are given up, and can be retried later). The secret is kept."
            ),
        }

    def clean(self) -> dict[str, Any]:
        cleaned = super().clean() or {}
        if cleaned.get("enabled") and "enabled" in self.changed_data and not self.instance.secret:
            self.add_error(
                "enabled",
                _(
                    "This operator has no signing secret (it disabled lease events itself): it turns them back "
                    "on by rotating its secret through the API."
                ),
            )
        return cleaned


@admin.register(OperatorEndpoint)
class OperatorEndpointAdmin(_DetailJoinsMixin, admin.ModelAdmin):
    """Where lease events are POSTed. The secret is never shown or set here; ``enabled`` goes through
    ``operator_endpoint_enabled_set``."""

    detail_select_related = ("operator",)
    form = OperatorEndpointForm
    list_display = ["operator_slug", "enabled", "masked_secret", "created"]
    list_filter = ["enabled"]
    search_fields = ["operator__slug"]
    list_select_related = ["operator"]
    fields = ["operator", "masked_secret", "enabled", "created", "deliveries_link"]
    readonly_fields = ["operator", "masked_secret", "created", "deliveries_link"]
    created = _timestamp("created_at", gettext_lazy("Created at"))

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False

    def has_delete_permission(self, request: HttpRequest, obj: OperatorEndpoint | None = None) -> bool:
        return False

    @admin.display(description=gettext_lazy("Operator"), ordering="operator__slug")
    def operator_slug(self, obj: OperatorEndpoint) -> str:
        return obj.operator.slug

    @admin.display(description=gettext_lazy("Signing secret"))
    def masked_secret(self, obj: OperatorEndpoint) -> SafeString:
        return format_html('<code style="white-space:nowrap">{}</code>', _mask(obj.secret))

    @admin.display(description=gettext_lazy("Deliveries"))
    def deliveries_link(self, obj: OperatorEndpoint) -> SafeString:
        return _link(_changelist_url(LeaseEventDelivery, operator=obj.operator_id), _("Its lease events →"))

    def save_model(
        self, request: HttpRequest, obj: OperatorEndpoint, form: forms.ModelForm, change: bool
    ) -> None:
        if "enabled" not in form.changed_data:
            return
        try:
            dispatch.operator_endpoint_enabled_set(
                endpoint=obj, enabled=form.cleaned_data["enabled"], actor=_staff_actor(request)
            )
        except DomainError as exc:
            messages.error(request, exc.message)
        obj.refresh_from_db()


class DeliveryOperatorFilter(OperatorFilter):
    field_name = "transition__operator"


@admin.register(LeaseEventDelivery)
class LeaseEventDeliveryAdmin(
    _DetailJoinsMixin, _IdSearchMixin, _BigTableMixin, _ReadOnlyAdminMixin, admin.ModelAdmin
):
    """The lease-event outbox: one row per transition sent to a cluster's endpoint."""

    detail_select_related = ("transition",)
    list_display = [
        "id",
        "transition_cell",
        "url_cell",
        "status_badge",
        "attempts",
        "next_attempt",
        "error_cell",
        "delivered",
    ]
    list_filter = ["status", DeliveryOperatorFilter]
    list_select_related = ["transition"]
    id_search_fields = ("transition__lease_id",)
    search_help_text = gettext_lazy("A lease id.")
    actions = ["retry_now"]
    fields = readonly_fields = (
        "transition_cell",
        "lease_cell",
        "url",
        "status_badge",
        "attempts",
        "next_attempt",
        "last_error",
        "delivered",
    )

    @admin.display(description=gettext_lazy("Transition"), ordering="transition_id")
    def transition_cell(self, obj: LeaseEventDelivery) -> SafeString:
        transition = obj.transition
        return format_html(
            '<a href="{}" style="white-space:nowrap">{}: {} → {}</a>',
            _change_url(LeaseTransition, transition.pk),
            f"lease {transition.lease_id}",
            transition.from_state or "∅",
            transition.to_state,
        )

    @admin.display(description=gettext_lazy("Lease"))
    def lease_cell(self, obj: LeaseEventDelivery) -> str | SafeString:
        return _lease_link(obj.transition.lease_id)

    @admin.display(description=gettext_lazy("URL"))
    def url_cell(self, obj: LeaseEventDelivery) -> SafeString:
        short = obj.url if len(obj.url) <= 48 else f"{obj.url[:47]}…"
        return format_html('<span title="{}">{}</span>', obj.url, short)

    @admin.display(description=gettext_lazy("Status"), ordering="status")
    def status_badge(self, obj: LeaseEventDelivery) -> SafeString:
        return _badge(obj.status, obj.get_status_display(), _DELIVERY_COLOURS)

    @admin.display(description=gettext_lazy("Next attempt"), ordering="next_attempt_at")
    def next_attempt(self, obj: LeaseEventDelivery) -> str:
        return "—" if obj.status != LeaseEventDelivery.Status.PENDING else _local(obj.next_attempt_at)

    @admin.display(description=gettext_lazy("Last error"))
    def error_cell(self, obj: LeaseEventDelivery) -> str | SafeString:
        if not obj.last_error:
            return ""
        short = obj.last_error if len(obj.last_error) <= 60 else f"{obj.last_error[:59]}…"
        return format_html('<span title="{}">{}</span>', obj.last_error, short)

    @admin.display(description=gettext_lazy("Delivered at"), ordering="delivered_at")
    def delivered(self, obj: LeaseEventDelivery) -> str:
        return _local(obj.delivered_at)

    def has_retry_permission(self, request: HttpRequest) -> bool:
        return request.user.has_perm("broker.change_leaseeventdelivery")

    @admin.action(description=gettext_lazy("Retry now (pending and given-up events)"), permissions=["retry"])
    def retry_now(self, request: HttpRequest, queryset: QuerySet[LeaseEventDelivery]) -> None:
        ids = list(queryset.exclude(status=LeaseEventDelivery.Status.DELIVERED).values_list("pk", flat=True))
        made_due = dispatch.lease_event_deliveries_retry(delivery_ids=ids, actor=_staff_actor(request))
        messages.success(
            request,
            _(
                "%(n)d event(s) due now; the delivery task sends them on its next run (every few seconds). "
                "Delivered events were left alone."
            )
            % {"n": made_due},
        )
        paused = (
            Organisation.objects.filter(
                pk__in=queryset.values("transition__operator_id"),
            )
            .exclude(
                pk__in=OperatorEndpoint.objects.filter(enabled=True).exclude(secret="").values("operator_id")
            )
            .order_by("slug")
            .values_list("slug", flat=True)
        )
        if paused:
            messages.warning(
                request,
                _(
                    "Lease events are paused or disabled for %(operators)s: their events will be given up again "
                    "until the endpoint is enabled."
                )
                % {"operators": ", ".join(paused)},
            )


@admin.register(BuyerNotice)
class BuyerNoticeAdmin(
    _DetailJoinsMixin, _IdSearchMixin, _BigTableMixin, _ReadOnlyAdminMixin, admin.ModelAdmin
):
    """What the broker told buyers about their jobs (failover, failure, packs exhausted)."""

    detail_select_related = ("buyer",)
    list_display = ["id", "created", "buyer_slug", "kind", "job_cell", "lease_cell", "message", "read"]
    list_filter = [BuyerFilter, ("read_at", admin.EmptyFieldListFilter)]
    list_select_related = ["buyer"]
    id_search_fields = ("job_id", "lease_id")
    text_search_fields = ("buyer__slug__exact", "kind__exact")
    search_help_text = gettext_lazy(
        "A job or lease id, a buyer's slug, or a notice kind (lease_replaced, …)."
    )
    fields = readonly_fields = ("buyer", "kind", "job_cell", "lease_cell", "message", "created", "read")

    @admin.display(description=gettext_lazy("Created"), ordering="created_at")
    def created(self, obj: BuyerNotice) -> SafeString:
        return format_html('<span style="white-space:nowrap">{}</span>', _local(obj.created_at))

    @admin.display(description=gettext_lazy("Buyer"), ordering="buyer__slug")
    def buyer_slug(self, obj: BuyerNotice) -> str:
        return obj.buyer.slug

    @admin.display(description=gettext_lazy("Job"), ordering="job_id")
    def job_cell(self, obj: BuyerNotice) -> str | SafeString:
        return _job_link(obj.job_id)

    @admin.display(description=gettext_lazy("Lease"), ordering="lease_id")
    def lease_cell(self, obj: BuyerNotice) -> str | SafeString:
        return _lease_link(obj.lease_id)

    @admin.display(description=gettext_lazy("Read at"), ordering="read_at")
    def read(self, obj: BuyerNotice) -> str:
        return "unread" if obj.read_at is None else _local(obj.read_at)


@admin.register(BuyerPreference)
class BuyerPreferenceAdmin(_ReadOnlyAdminMixin, admin.ModelAdmin):
    """Buyers' portal preferences (their home hub). Read-only here: the buyer sets it in the marketplace."""

    list_display = ["buyer", "home_hub", "updated_at"]
    list_select_related = ["buyer", "home_hub"]
    list_filter = [BuyerFilter, "home_hub"]
    search_fields = ["buyer__slug", "buyer__name"]
    fields = readonly_fields = ("buyer", "home_hub", "updated_at")


@admin.register(DrawPending)
class DrawPendingAdmin(_ReadOnlyAdminMixin, admin.ModelAdmin):
    """Each buyer's pending draws per chip: the sum of its live leases' open draw holds, what a quote sets
    aside (broker.services.draw_holds). Read-only: acceptance, rating and the leases' ends keep it."""

    list_display = ["buyer", "draw_class", "open_micros"]
    list_select_related = ["buyer"]
    list_filter = [BuyerFilter]
    search_fields = ["buyer__slug", "buyer__name", "draw_class"]
    fields = readonly_fields = ("buyer", "draw_class", "open_micros")


@admin.register(DrawHold)
class DrawHoldAdmin(_BigTableMixin, _ReadOnlyAdminMixin, admin.ModelAdmin):
    """A lease's pending draw: its expected draw and what rating has posted for it (micro chip card-hours
    × band multiplier); voided when the lease ended. Read-only (broker.services.draw_holds)."""

    ordering = ["-lease_id"]  # the primary key: a hold is its lease's
    list_display = ["lease_id", "buyer", "draw_class", "expected_micros", "posted_micros", "voided_at"]
    list_select_related = ["buyer"]
    list_filter = [BuyerFilter]
    search_fields = ["buyer__slug", "draw_class"]
    fields = readonly_fields = (
        "lease",
        "buyer",
        "draw_class",
        "expected_micros",
        "posted_micros",
        "created_at",
        "voided_at",
    )


@admin.register(ClusterReliability)
class ClusterReliabilityAdmin(_ReadOnlyAdminMixin, admin.ModelAdmin):
    """Each cluster's reliability score with the inputs it was computed from (broker.services.reliability).
    Read-only: the hourly beat recomputes every row from the lease records."""

    list_display = [
        "cluster",
        "reliability_percent",
        "interruptions_per_1000_card_hours",
        "sold_card_seconds",
        "delivered_card_seconds",
        "interruptions",
        "computed_at",
    ]
    list_select_related = ["cluster"]
    search_fields = ["cluster__cpi"]
    ordering = ["reliability_percent", "cluster_id"]
    fields = readonly_fields = (
        "cluster",
        "reliability_percent",
        "interruptions_per_1000_card_hours",
        "window_start_at",
        "computed_at",
        "sold_card_seconds",
        "delivered_card_seconds",
        "card_hours",
        "interruptions",
        "prior_card_hours",
        "prior_percent",
    )
    actions = ["recompute"]

    @admin.action(description=gettext_lazy("Recompute every score now"), permissions=["view"])
    def recompute(self, request: HttpRequest, queryset: QuerySet[ClusterReliability]) -> None:
        count = reliability.cluster_reliability_refresh()
        self.message_user(
            request, _("%(n)d reliability scores recomputed.") % {"n": count}, level=messages.SUCCESS
        )


@admin.register(SlaAssessment)
class SlaAssessmentAdmin(_ReadOnlyAdminMixin, admin.ModelAdmin):
    """One row per ended lease whose card states a service level: what was lost, what was excluded, and
    whether a credit note followed (broker.services.sla)."""

    list_display = [
        "lease",
        "assessed_at",
        "outcome",
        "availability_percent",
        "lost_seconds",
        "excluded_buyer_seconds",
        "excluded_maintenance_seconds",
        "credit",
    ]
    list_filter = ["outcome", "assessed_at"]
    search_fields = ["lease__id"]
    list_select_related = ["lease", "credit"]


# Budgets and caps register their own admins (broker/budgets/admin.py).
from broker.budgets import admin as _budgets_admin  # noqa: E402, F401
