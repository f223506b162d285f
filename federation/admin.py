"""The federation back office: hubs and their latency matrix, the chip catalog, clusters, islands and
their append-only history.

Decisions, so the next person does not have to rediscover them:

- **Clusters are not added or deleted here.** Operators register them over the API
  (``federation.services.cluster_register``), which validates the identifier against the operator, issues
  identifiers for good and records the first status change. A cluster is never deleted: it is retired,
  and its identifiers stay issued. Staff may change only its site and dispatch endpoint (through
  ``cluster_update``) and its status, with the actions below (through ``cluster_status_set``), so every
  change lands in the status history with the staff user and a reason. The ``status`` field itself is
  read-only on the form.
- **Islands are read-only.** K1 (cards) and fabric are the operator's declaration, K2 and unhealthy cards
  come from heartbeats; staff who need capacity out of the market drain or take the cluster offline.
- **History is append-only.** ``IssuedIdentifier`` and ``ClusterStatusChange`` cannot be added, changed or
  deleted from the admin.
- **Latencies change through ``hub_latency_record``.** The matrix is seeded complete (every ordered pair),
  so rows are not added or deleted; the change form takes a measurement (milliseconds, when it was
  measured, and whether the reverse pair gets it too) and hands it to the same service as the API.
- **Hubs are reference data** (they come with a data migration, together with their latency rows): their
  names and order can be edited, their code cannot, and none are added or deleted here.
- **Standard-card definitions are versioned.** A new version may be added with an effective time in the
  future; a version that is already in force (or was) is frozen apart from its note, so nothing changes
  retroactively. A version not yet in force may still be corrected or deleted. There is no service for
  this yet, so the admin form is the one write path (and enforces the rules above).
- **The accelerator catalog** can be extended and corrected (figures, aliases, source), never deleted;
  slugs, which operators register clusters with, never change. A figure that is not public stays empty
  and shows as "unknown", and the standard-card factor is computed against the definition in force.
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import datetime
from decimal import Decimal
from typing import Any
from urllib.parse import urlencode

from django import forms
from django.conf import settings
from django.contrib import admin, messages
from django.contrib.admin.helpers import ActionForm
from django.contrib.admin.widgets import AdminSplitDateTime
from django.db.models import Count, QuerySet
from django.forms.models import BaseInlineFormSet
from django.http import HttpRequest, HttpResponse
from django.urls import reverse
from django.utils import timezone
from django.utils.html import format_html
from django.utils.safestring import SafeString
from django.utils.translation import gettext as _
from django.utils.translation import gettext_lazy

from core.errors import DomainError
from core.types import Actor
from federation import selectors, services
from federation.models import (
    Accelerator,
    Cluster,
    ClusterMaintenance,
    ClusterStatus,
    ClusterStatusChange,
    Health,
    Hub,
    HubLatency,
    Island,
    IssuedIdentifier,
    StandardCard,
)
from federation.types import LatencyMeasurement

# Inlines on the cluster page show the most recent rows only; a cluster may have thousands of islands
# (fleet imports) or of status changes (a flapping agent). The full lists are one click away.
INLINE_ROW_LIMIT = 50

_NOT_PUBLISHED = gettext_lazy("The vendor has not published this figure; we do not invent numbers.")


def _unknown_spec() -> SafeString:
    return format_html(
        '<strong style="color:#b45309" title="{}">{}</strong>', _NOT_PUBLISHED, _("unknown — not public")
    )


# The short marker for list columns; the tooltip says why.
def _unknown() -> SafeString:
    return format_html('<strong style="color:#b45309" title="{}">{}</strong>', _NOT_PUBLISHED, _("unknown"))


_HEALTH_COLOURS: dict[str, str] = {
    Health.OK: "#15803d",
    Health.DEGRADED: "#b45309",
    Health.CRITICAL: "#b91c1c",
    Health.UNKNOWN: "#6b7280",
}
_STATUS_COLOURS: dict[str, str] = {
    ClusterStatus.ACTIVE: "#15803d",
    ClusterStatus.DRAINING: "#b45309",
    ClusterStatus.OFFLINE: "#b91c1c",
    ClusterStatus.RETIRED: "#6b7280",
}


def human_duration(seconds: float) -> str:
    """A short human duration: ``42 s``, ``5 min 3 s``, ``2 h 5 min``, ``3 d 4 h``."""
    seconds = max(int(seconds), 0)
    days, rest = divmod(seconds, 86_400)
    hours, rest = divmod(rest, 3_600)
    minutes, secs = divmod(rest, 60)
    if days:
        return f"{days} d {hours} h" if hours else f"{days} d"
    if hours:
        return f"{hours} h {minutes} min" if minutes else f"{hours} h"
    if minutes:
        return f"{minutes} min {secs} s" if secs else f"{minutes} min"
    return f"{secs} s"


def _figure(value: Decimal | None) -> str | SafeString:
    """A catalog figure without trailing zeros, or the unknown marker (never an invented number)."""
    return _unknown() if value is None else f"{value.normalize():f}"


def _local(at: datetime) -> str:
    """A timestamp to the second in the site's time zone (history needs the seconds)."""
    return f"{timezone.localtime(at):%Y-%m-%d %H:%M:%S}"


def _staff_actor(request: HttpRequest) -> Actor:
    return Actor(organisation=None, user=request.user if request.user.is_authenticated else None)


def _changelist_url(model: type[Any], **params: object) -> str:
    url = reverse(f"admin:{model._meta.app_label}_{model._meta.model_name}_changelist")
    return f"{url}?{urlencode(params)}" if params else url


class _ReadOnlyAdminMixin:
    """View-only: history and other rows written by services alone."""

    def has_add_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def has_delete_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False


class _WideChangelistMixin:
    """Hides the admin's navigation sidebar on federation changelists: their tables have more columns than
    fit beside both the navigation and the filter sidebar on a 1280-pixel screen. The breadcrumbs still
    navigate. (If the whole site drops the sidebar, ``admin.site.enable_nav_sidebar = False``, this goes.)"""

    def changelist_view(
        self, request: HttpRequest, extra_context: dict[str, Any] | None = None
    ) -> HttpResponse:
        return super().changelist_view(  # type: ignore[misc]
            request, extra_context={"is_nav_sidebar_enabled": False, **(extra_context or {})}
        )


class _LimitedInlineFormSet(BaseInlineFormSet):
    """Shows at most INLINE_ROW_LIMIT rows of the (already ordered) inline queryset."""

    def get_queryset(self) -> QuerySet[Any]:
        if not hasattr(self, "_limited_queryset"):
            self._limited_queryset = super().get_queryset()[:INLINE_ROW_LIMIT]
        return self._limited_queryset


# --- Hubs and latencies ----------------------------------------------------------------------------


class HubLatencyInline(_ReadOnlyAdminMixin, admin.TabularInline):
    model = HubLatency
    fk_name = "source"
    verbose_name = "latency from this hub"
    verbose_name_plural = "latencies from this hub (edit them under Hub latencies)"
    fields = readonly_fields = ("target", "latency_ms", "origin", "measured_at")
    extra = 0

    def get_queryset(self, request: HttpRequest) -> QuerySet[HubLatency]:
        return super().get_queryset(request).select_related("source", "target")


@admin.register(Hub)
class HubAdmin(_WideChangelistMixin, admin.ModelAdmin):
    list_display = ["code", "name", "chinese_name", "region", "sort_order", "cluster_count"]
    list_display_links = ["code", "name"]
    list_filter = ["region"]
    search_fields = ["code", "name", "name_zh"]
    readonly_fields = ["code"]
    inlines = [HubLatencyInline]

    def get_queryset(self, request: HttpRequest) -> QuerySet[Hub]:
        return super().get_queryset(request).annotate(cluster_count=Count("clusters"))

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False

    def has_delete_permission(self, request: HttpRequest, obj: Hub | None = None) -> bool:
        return False

    @admin.display(description=gettext_lazy("Name (中文)"), ordering="name_zh")
    def chinese_name(self, obj: Hub) -> str:
        return obj.name_zh

    @admin.display(description=gettext_lazy("Clusters"), ordering="cluster_count")
    def cluster_count(self, obj: Hub) -> int:
        return getattr(obj, "cluster_count", 0)


class HubLatencyForm(forms.ModelForm):
    """A measurement of one hub pair, stored through ``hub_latency_record`` like one posted to the API."""

    measured_at = forms.SplitDateTimeField(
        widget=AdminSplitDateTime,
        initial=timezone.now,
        help_text=gettext_lazy("When it was measured. A measurement older than the stored one is ignored."),
    )
    also_reverse = forms.BooleanField(
        required=False,
        initial=True,
        label=gettext_lazy("Also set the reverse pair"),
        help_text=gettext_lazy("Target → source gets it too."),
    )

    class Meta:
        model = HubLatency
        fields = ["latency_ms", "measured_at"]

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        # A new measurement is taken now; the stored one's time is shown separately.
        self.initial["measured_at"] = timezone.now()


@admin.register(HubLatency)
class HubLatencyAdmin(_WideChangelistMixin, admin.ModelAdmin):
    form = HubLatencyForm
    list_display = ["pair", "latency_ms", "origin", "measured", "updated_at"]
    list_filter = ["origin", "source", "target"]
    search_fields = ["source__code", "target__code"]
    list_select_related = ["source", "target"]
    readonly_fields = ["source", "target", "origin", "stored_measured_at", "updated_at"]
    fields = [
        "source",
        "target",
        "origin",
        "stored_measured_at",
        "latency_ms",
        "measured_at",
        "also_reverse",
        "updated_at",
    ]

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False

    def has_delete_permission(self, request: HttpRequest, obj: HubLatency | None = None) -> bool:
        return False

    @admin.display(description=gettext_lazy("Stored value measured at"))
    def stored_measured_at(self, obj: HubLatency) -> str:
        return "never (policy tier seed)" if obj.measured_at is None else _local(obj.measured_at)

    @admin.display(description=gettext_lazy("Pair"), ordering="source__sort_order")
    def pair(self, obj: HubLatency) -> SafeString:
        return format_html(
            '<span style="white-space:nowrap" title="{} → {}">{} → {}</span>',
            obj.source.name,
            obj.target.name,
            obj.source.code,
            obj.target.code,
        )

    @admin.display(description=gettext_lazy("Measured at"), ordering="measured_at")
    def measured(self, obj: HubLatency) -> str:
        return "—" if obj.measured_at is None else _local(obj.measured_at)

    def save_model(self, request: HttpRequest, obj: HubLatency, form: forms.ModelForm, change: bool) -> None:
        measured_at: datetime = form.cleaned_data["measured_at"]
        stored = HubLatency.objects.get(pk=obj.pk)
        services.hub_latency_record(
            measurements=[
                LatencyMeasurement(
                    source=obj.source.code,
                    target=obj.target.code,
                    latency_ms=form.cleaned_data["latency_ms"],
                    measured_at=measured_at,
                )
            ],
            symmetric=bool(form.cleaned_data.get("also_reverse")),
        )
        if stored.measured_at is not None and measured_at < stored.measured_at:
            messages.warning(
                request,
                _("Not stored: the latency on record was measured later (%(at)s).")
                % {"at": f"{stored.measured_at:%Y-%m-%d %H:%M}"},
            )
        obj.refresh_from_db()


# --- Standard card and the accelerator catalog -----------------------------------------------------


class StandardCardForm(forms.ModelForm):
    class Meta:
        model = StandardCard
        fields = ["version", "dense_fp16_tflops", "effective_from", "note"]

    def clean(self) -> dict[str, Any]:
        cleaned = super().clean() or {}
        effective_from = cleaned.get("effective_from")
        if effective_from is not None and effective_from <= timezone.now():
            self.add_error(
                "effective_from", _("A definition takes effect in the future, never retroactively.")
            )
        version = cleaned.get("version")
        if self.instance.pk is None and version is not None:
            newest = StandardCard.objects.order_by("-version").values_list("version", flat=True).first()
            if newest is not None and version <= newest:
                self.add_error(
                    "version", _("Versions only go up: the newest is v%(newest)s.") % {"newest": newest}
                )
        return cleaned


@admin.register(StandardCard)
class StandardCardAdmin(_WideChangelistMixin, admin.ModelAdmin):
    form = StandardCardForm

    def get_list_display(self, request: HttpRequest) -> list[str | Callable[[Any], str | bool]]:
        current = selectors.standard_card_current()
        now = timezone.now()

        @admin.display(description=gettext_lazy("State"))
        def state(obj: StandardCard) -> str:
            if obj.pk == current.pk:
                return "in force"
            return "scheduled" if obj.effective_from > now else "superseded"

        return ["version", "dense_fp16_tflops", "effective_from", state, "note"]

    def _is_frozen(self, obj: StandardCard | None) -> bool:
        return obj is not None and obj.effective_from <= timezone.now()

    def get_readonly_fields(self, request: HttpRequest, obj: StandardCard | None = None) -> list[str]:
        if obj is None:
            return []
        if self._is_frozen(obj):
            return ["version", "dense_fp16_tflops", "effective_from"]
        return ["version"]

    def get_form(
        self, request: HttpRequest, obj: StandardCard | None = None, change: bool = False, **kwargs: Any
    ) -> type[forms.ModelForm]:
        if self._is_frozen(obj):
            # Only the note is editable: the base form's clean() must not judge the frozen fields.
            kwargs["form"] = forms.ModelForm
        return super().get_form(request, obj, change, **kwargs)

    def has_delete_permission(self, request: HttpRequest, obj: StandardCard | None = None) -> bool:
        return obj is not None and not self._is_frozen(obj) and super().has_delete_permission(request, obj)


class AcceleratorForm(forms.ModelForm):
    class Meta:
        model = Accelerator
        fields = [
            "slug",
            "vendor",
            "model",
            "aliases",
            "spec_status",
            "dense_fp16_tflops",
            "memory_gb",
            "memory_bandwidth_gbps",
            "interconnect",
            "default_fabric",
            "source",
        ]
        labels = {
            "dense_fp16_tflops": gettext_lazy("Dense FP16 TFLOPS"),
            "memory_gb": gettext_lazy("Memory (GB)"),
            "memory_bandwidth_gbps": gettext_lazy("Memory bandwidth (GB/s)"),
        }
        widgets = {
            "interconnect": forms.TextInput(attrs={"size": 80}),
            "source": forms.TextInput(attrs={"size": 80}),
        }

    def clean(self) -> dict[str, Any]:
        cleaned = super().clean() or {}
        if cleaned.get("spec_status") == Accelerator.SpecStatus.UNKNOWN and cleaned.get("dense_fp16_tflops"):
            self.add_error("spec_status", "A model with a published FP16 figure is not 'unknown'.")
        return cleaned


@admin.register(Accelerator)
class AcceleratorAdmin(_WideChangelistMixin, admin.ModelAdmin):
    """The catalog. Figures are published specifications or empty ("unknown — not public").

    The standard-card factor is computed against the standard-card definition in force; the column header
    names that definition. Slugs are what operators register clusters with, so they never change.
    """

    form = AcceleratorForm
    list_filter = ["vendor", "spec_status", "default_fabric"]
    search_fields = ["slug", "vendor", "model", "aliases"]
    readonly_fields = ["standard_card_factor", "created_at"]
    fieldsets = [
        (None, {"fields": ["slug", "vendor", "model", "aliases"]}),
        (
            gettext_lazy("Specification"),
            {
                "fields": [
                    "spec_status",
                    "dense_fp16_tflops",
                    "standard_card_factor",
                    "memory_gb",
                    "memory_bandwidth_gbps",
                    "interconnect",
                    "default_fabric",
                    "source",
                ]
            },
        ),
        (None, {"fields": ["created_at"]}),
    ]

    def get_queryset(self, request: HttpRequest) -> QuerySet[Accelerator]:
        return super().get_queryset(request).annotate(cluster_count=Count("clusters"))

    def get_list_display(self, request: HttpRequest) -> list[str | Callable[[Any], str | bool]]:
        standard = selectors.standard_card_current()

        @admin.display(
            description=_("Std-card factor (÷ %(tflops)s, v%(version)s)")
            % {"tflops": f"{standard.dense_fp16_tflops.normalize():f}", "version": standard.version}
        )
        def factor(obj: Accelerator) -> str | SafeString:
            value = selectors.standard_card_factor(tflops=obj.dense_fp16_tflops, standard=standard)
            return _figure(value)

        return ["name_and_slug", "tflops", factor, "memory", "bandwidth", "default_fabric", "cluster_count"]

    def get_readonly_fields(self, request: HttpRequest, obj: Accelerator | None = None) -> list[str]:
        fields = list(super().get_readonly_fields(request, obj))
        return [*fields, "slug"] if obj is not None else fields

    def has_delete_permission(self, request: HttpRequest, obj: Accelerator | None = None) -> bool:
        return False

    @admin.display(description=gettext_lazy("Accelerator"), ordering="vendor")
    def name_and_slug(self, obj: Accelerator) -> SafeString:
        return format_html('{}<br><small style="white-space:nowrap">{}</small>', obj, obj.slug)

    @admin.display(description=gettext_lazy("Dense FP16 TFLOPS"), ordering="dense_fp16_tflops")
    def tflops(self, obj: Accelerator) -> str | SafeString:
        return _figure(obj.dense_fp16_tflops)

    @admin.display(description=gettext_lazy("Memory GB"), ordering="memory_gb")
    def memory(self, obj: Accelerator) -> str | SafeString:
        return _figure(obj.memory_gb)

    @admin.display(description=gettext_lazy("Bandwidth GB/s"), ordering="memory_bandwidth_gbps")
    def bandwidth(self, obj: Accelerator) -> str | SafeString:
        return _figure(obj.memory_bandwidth_gbps)

    @admin.display(description=gettext_lazy("Clusters"), ordering="cluster_count")
    def cluster_count(self, obj: Accelerator) -> int:
        return getattr(obj, "cluster_count", 0)

    @admin.display(description=gettext_lazy("Standard-card factor"))
    def standard_card_factor(self, obj: Accelerator) -> str | SafeString:
        if obj.pk is None:
            return "—"
        standard = selectors.standard_card_current()
        value = selectors.standard_card_factor(tflops=obj.dense_fp16_tflops, standard=standard)
        if value is None:
            return _unknown_spec()
        return f"{value} (against standard card v{standard.version}, {standard.dense_fp16_tflops} TFLOPS)"


# --- Clusters and islands --------------------------------------------------------------------------


class IslandInline(_ReadOnlyAdminMixin, admin.TabularInline):
    model = Island
    formset = _LimitedInlineFormSet
    fields = readonly_fields = (
        "name",
        "cpi",
        "fabric",
        "cards",
        "available_cards",
        "unhealthy_cards",
        "reported_at",
    )
    ordering = ["name"]
    extra = 0
    show_change_link = True
    verbose_name_plural = f"islands (first {INLINE_ROW_LIMIT} by name)"


class ClusterStatusChangeInline(_ReadOnlyAdminMixin, admin.TabularInline):
    model = ClusterStatusChange
    formset = _LimitedInlineFormSet
    fields = readonly_fields = ("changed", "from_status", "to_status", "actor_label", "reason")
    ordering = ["-changed_at", "-pk"]
    extra = 0
    verbose_name_plural = f"status history (latest {INLINE_ROW_LIMIT})"

    @admin.display(description=gettext_lazy("Changed at"))
    def changed(self, obj: ClusterStatusChange) -> str:
        return _local(obj.changed_at)


class ClusterActionForm(ActionForm):
    reason = forms.CharField(
        required=False,
        max_length=400,
        label=gettext_lazy("Reason"),
        help_text=gettext_lazy("Recorded in the status history with your name."),
        widget=forms.TextInput(
            attrs={"size": 40, "placeholder": gettext_lazy("reason (required for status changes)")}
        ),
    )


class ClusterForm(forms.ModelForm):
    class Meta:
        model = Cluster
        fields = ["site", "endpoint_url"]
        labels = {"endpoint_url": gettext_lazy("Dispatch endpoint URL")}

    def clean(self) -> dict[str, Any]:
        cleaned = super().clean() or {}
        if self.changed_data and self.instance.status == ClusterStatus.RETIRED:
            raise forms.ValidationError(_("A retired cluster cannot change."))
        return cleaned


@admin.register(Cluster)
class ClusterAdmin(_WideChangelistMixin, admin.ModelAdmin):
    """Clusters as operators registered them. See the module docstring: no adding or deleting here;
    site and endpoint go through ``cluster_update``, status through the actions and ``cluster_status_set``."""

    form = ClusterForm
    action_form = ClusterActionForm
    actions = ["mark_draining", "take_offline", "reactivate", "take_offline_missed_heartbeats"]
    list_display = [
        "cpi_cell",
        "operator_slug",
        "hub_code",
        "chip",
        "status_badge",
        "health_badge",
        "cards_k1",
        "cards_k2",
        "last_heartbeat",
    ]
    list_filter = [
        "status",
        "health",
        "offline_cause",
        "hub",
        "accelerator__vendor",
        ("accelerator", admin.RelatedOnlyFieldListFilter),
        ("operator", admin.RelatedOnlyFieldListFilter),
    ]
    search_fields = ["cpi", "site", "operator__slug", "operator__name"]
    list_select_related = ["operator", "hub", "accelerator"]
    date_hierarchy = "registered_at"
    inlines = [IslandInline, ClusterStatusChangeInline]
    readonly_fields = [
        "compute_identifier",
        "operator",
        "hub",
        "name",
        "accelerator",
        "status",
        "offline_cause",
        "status_before_offline",
        "health",
        "history_link",
        "cards_k1",
        "cards_k2",
        "islands_link",
        "last_heartbeat_at",
        "heartbeat_age",
        "last_heartbeat_sent_at",
        "registered_at",
        "updated_at",
    ]
    fieldsets = [
        (
            gettext_lazy("Identity"),
            {
                "fields": [
                    "compute_identifier",
                    "operator",
                    "hub",
                    "name",
                    "accelerator",
                    "site",
                    "endpoint_url",
                ]
            },
        ),
        (
            gettext_lazy("Status (change it with the actions on the cluster list)"),
            {"fields": ["status", "offline_cause", "status_before_offline", "health", "history_link"]},
        ),
        (gettext_lazy("Capacity"), {"fields": ["cards_k1", "cards_k2", "islands_link"]}),
        (
            gettext_lazy("Heartbeats"),
            {"fields": ["last_heartbeat_at", "heartbeat_age", "last_heartbeat_sent_at"]},
        ),
        (None, {"fields": ["registered_at", "updated_at"]}),
    ]

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False

    def has_delete_permission(self, request: HttpRequest, obj: Cluster | None = None) -> bool:
        return False

    def get_readonly_fields(self, request: HttpRequest, obj: Cluster | None = None) -> list[str]:
        fields = list(super().get_readonly_fields(request, obj))
        if obj is not None and obj.status == ClusterStatus.RETIRED:
            fields += ["site", "endpoint_url"]
        return fields

    def save_model(self, request: HttpRequest, obj: Cluster, form: forms.ModelForm, change: bool) -> None:
        changed = set(form.changed_data)
        if not changed & {"site", "endpoint_url"}:
            return
        services.cluster_update(
            actor=_staff_actor(request),
            cluster=obj,
            site=form.cleaned_data["site"] if "site" in changed else None,
            endpoint_url=form.cleaned_data["endpoint_url"] if "endpoint_url" in changed else None,
        )
        obj.refresh_from_db()

    # --- columns and read-only fields ---

    @admin.display(description=gettext_lazy("CPI"), ordering="cpi")
    def cpi_cell(self, obj: Cluster) -> SafeString:
        return format_html('<span style="white-space:nowrap">{}</span>', obj.cpi)

    @admin.display(description=gettext_lazy("Compute identifier (CPI)"))
    def compute_identifier(self, obj: Cluster) -> str:
        return obj.cpi

    @admin.display(description=gettext_lazy("Operator"), ordering="operator__slug")
    def operator_slug(self, obj: Cluster) -> str:
        return obj.operator.slug

    @admin.display(description=gettext_lazy("Chip"), ordering="accelerator__model")
    def chip(self, obj: Cluster) -> SafeString:
        return format_html('<span title="{}">{}</span>', obj.accelerator, obj.accelerator.model)

    @admin.display(description=gettext_lazy("Health"), ordering="health")
    def health_badge(self, obj: Cluster) -> SafeString:
        return format_html(
            '<span style="color:{}" title="{}">{}</span>',
            _HEALTH_COLOURS.get(obj.health, "inherit"),
            obj.get_health_display(),
            obj.health,
        )

    @admin.display(description=gettext_lazy("Cards (K1)"), ordering="total_cards")
    def cards_k1(self, obj: Cluster) -> int:
        return obj.total_cards

    @admin.display(description=gettext_lazy("Free (K2)"), ordering="available_cards")
    def cards_k2(self, obj: Cluster) -> int:
        return obj.available_cards

    @admin.display(description=gettext_lazy("Last heartbeat"), ordering="-last_heartbeat_at")
    def last_heartbeat(self, obj: Cluster) -> str | SafeString:
        if obj.last_heartbeat_at is None:
            return "never"
        return format_html(
            '<span style="white-space:nowrap">{} ago</span><br><small style="white-space:nowrap">{}</small>',
            self.heartbeat_age(obj),
            _local(obj.last_heartbeat_at),
        )

    @admin.display(description=gettext_lazy("Hub"), ordering="hub__sort_order")
    def hub_code(self, obj: Cluster) -> str:
        return obj.hub.code

    @admin.display(description=gettext_lazy("Status"), ordering="status")
    def status_badge(self, obj: Cluster) -> SafeString:
        label = obj.get_status_display()
        if obj.status == ClusterStatus.OFFLINE and obj.offline_cause:
            label = f"{label} ({obj.get_offline_cause_display().lower()})"
        return format_html(
            '<span style="color:{};font-weight:600">{}</span>',
            _STATUS_COLOURS.get(obj.status, "inherit"),
            label,
        )

    @admin.display(description=gettext_lazy("Heartbeat age"), ordering="-last_heartbeat_at")
    def heartbeat_age(self, obj: Cluster) -> str | SafeString:
        if obj.last_heartbeat_at is None:
            return "never"
        age = (timezone.now() - obj.last_heartbeat_at).total_seconds()
        text = human_duration(age)
        late_after = settings.CARDHOUR_HEARTBEAT_INTERVAL_SECONDS * settings.CARDHOUR_HEARTBEAT_MISSED_LIMIT
        if age > late_after:
            return format_html(
                '<span style="color:#b91c1c" title="more than {} s">{}</span>', late_after, text
            )
        return text

    @admin.display(description=gettext_lazy("Status history"))
    def history_link(self, obj: Cluster) -> SafeString:
        count = obj.status_changes.count()
        return format_html(
            '<a href="{}">All {} status change(s) →</a>',
            _changelist_url(ClusterStatusChange, cluster__id__exact=obj.pk),
            count,
        )

    @admin.display(description=gettext_lazy("Islands"))
    def islands_link(self, obj: Cluster) -> SafeString:
        count = obj.islands.count()
        return format_html(
            '<a href="{}">All {} island(s) →</a>', _changelist_url(Island, cluster__id__exact=obj.pk), count
        )

    # --- status actions: every change through cluster_status_set, with who and why ---

    def _set_status(
        self, request: HttpRequest, queryset: QuerySet[Cluster], *, status: str, verb: str, done_label: str
    ) -> None:
        reason = (request.POST.get("reason") or "").strip()
        if not reason:
            messages.error(
                request,
                _("Give a reason to %(verb)s: it is recorded in the status history.") % {"verb": verb},
            )
            return
        actor = _staff_actor(request)
        done: list[str] = []
        unchanged: list[str] = []
        failed: list[str] = []
        for cluster in queryset.order_by("cpi"):
            if cluster.status == status:
                unchanged.append(cluster.cpi)
                continue
            try:
                services.cluster_status_set(
                    actor=actor, cluster=cluster, status=status, reason=f"{reason} (staff, admin)"
                )
            except DomainError as exc:
                failed.append(f"{cluster.cpi}: {exc.message}")
            else:
                done.append(cluster.cpi)
        if done:
            messages.success(request, _("%(done)s: %(n)d cluster(s).") % {"done": done_label, "n": len(done)})
        if unchanged:
            messages.info(
                request,
                _("Already %(status)s: %(clusters)s.")
                % {"status": ClusterStatus(status).label, "clusters": ", ".join(unchanged)},
            )
        for line in failed:
            messages.warning(request, line)

    @admin.action(description=gettext_lazy("Mark draining (no new leases)"))
    def mark_draining(self, request: HttpRequest, queryset: QuerySet[Cluster]) -> None:
        self._set_status(
            request,
            queryset,
            status=ClusterStatus.DRAINING,
            verb=_("mark draining"),
            done_label=_("Marked draining"),
        )

    @admin.action(description=gettext_lazy("Take offline (staff)"))
    def take_offline(self, request: HttpRequest, queryset: QuerySet[Cluster]) -> None:
        self._set_status(
            request,
            queryset,
            status=ClusterStatus.OFFLINE,
            verb=_("take offline"),
            done_label=_("Taken offline"),
        )

    def changelist_view(
        self, request: HttpRequest, extra_context: dict[str, Any] | None = None
    ) -> HttpResponse:
        if request.method == "GET":
            assessment = selectors.heartbeat_monitor_assess()
            if assessment.holding:
                messages.error(
                    request,
                    _(
                        "The heartbeat monitor is holding: %(missing)d of %(clusters)d clusters are missing "
                        "heartbeats across most of the fleet at once, which looks like the platform failing "
                        "to read them rather than the clusters failing. No cluster is taken offline (so no "
                        "lease is failed over) until heartbeats return. If the clusters really are down, "
                        "select them and use “Take offline for missed heartbeats”."
                    )
                    % {"missing": assessment.missing, "clusters": assessment.clusters},
                )
        return super().changelist_view(request, extra_context)

    @admin.action(
        description=gettext_lazy("Take offline for missed heartbeats (overrides the monitor's hold)")
    )
    def take_offline_missed_heartbeats(self, request: HttpRequest, queryset: QuerySet[Cluster]) -> None:
        """Staff's override of the mass-miss hold: the selected clusters that are overdue go offline as the
        monitor would take them (back with their next heartbeat), recorded under the staff member's name."""
        reason = (request.POST.get("reason") or "").strip()
        if not reason:
            messages.error(
                request,
                _("Give a reason to override the heartbeat monitor: it is recorded in the status history."),
            )
            return
        taken = services.clusters_mark_missed_heartbeats(
            override=_staff_actor(request),
            override_reason=f"{reason} (staff, admin)",
            cluster_ids=list(queryset.values_list("pk", flat=True)),
        )
        if taken:
            messages.success(
                request,
                _("Taken offline for missed heartbeats: %(n)d cluster(s); their leases are failed over.")
                % {"n": len(taken)},
            )
        skipped = queryset.count() - len(taken)
        if skipped:
            messages.info(
                request,
                _("%(n)d selected cluster(s) were not taken offline: not active or draining, or not overdue.")
                % {"n": skipped},
            )

    @admin.action(description=gettext_lazy("Reactivate"))
    def reactivate(self, request: HttpRequest, queryset: QuerySet[Cluster]) -> None:
        self._set_status(
            request, queryset, status=ClusterStatus.ACTIVE, verb=_("reactivate"), done_label=_("Reactivated")
        )


@admin.register(Island)
class IslandAdmin(_WideChangelistMixin, _ReadOnlyAdminMixin, admin.ModelAdmin):
    list_display = ["cpi", "cluster", "fabric", "cards", "available_cards", "unhealthy_cards", "reported_at"]
    list_filter = ["fabric", "cluster__hub", "cluster__status"]
    search_fields = ["cpi", "cluster__cpi"]
    list_select_related = ["cluster"]
    show_full_result_count = False


@admin.register(IssuedIdentifier)
class IssuedIdentifierAdmin(_WideChangelistMixin, _ReadOnlyAdminMixin, admin.ModelAdmin):
    """Every identifier ever issued; never reused, so never edited or deleted."""

    list_display = ["cpi", "kind", "operator", "issued_at"]
    list_filter = ["kind", ("operator", admin.RelatedOnlyFieldListFilter)]
    search_fields = ["cpi", "operator__slug"]
    list_select_related = ["operator"]
    date_hierarchy = "issued_at"
    show_full_result_count = False


class ActorKindFilter(admin.SimpleListFilter):
    title = gettext_lazy("actor")
    parameter_name = "actor"

    def lookups(self, request: HttpRequest, model_admin: admin.ModelAdmin) -> list[tuple[str, str]]:
        return [("user", "a person (staff or member)"), ("token", "an API token"), ("system", "the platform")]

    def queryset(self, request: HttpRequest, queryset: QuerySet[Any]) -> QuerySet[Any]:
        if self.value() == "user":
            return queryset.filter(actor_user__isnull=False)
        if self.value() == "token":
            return queryset.filter(actor_token__isnull=False)
        if self.value() == "system":
            return queryset.filter(actor_user__isnull=True, actor_token__isnull=True)
        return queryset


@admin.register(ClusterStatusChange)
class ClusterStatusChangeAdmin(_WideChangelistMixin, _ReadOnlyAdminMixin, admin.ModelAdmin):
    """The append-only status history: who (user, token or the heartbeat monitor), when and why."""

    list_display = ["changed", "cluster", "from_status", "to_status", "actor_label", "reason"]
    list_filter = ["to_status", "from_status", ActorKindFilter]
    search_fields = ["cluster__cpi", "actor_label", "reason"]
    list_select_related = ["cluster"]
    date_hierarchy = "changed_at"
    show_full_result_count = False

    @admin.display(description=gettext_lazy("Changed at"), ordering="changed_at")
    def changed(self, obj: ClusterStatusChange) -> SafeString:
        return format_html('<span style="white-space:nowrap">{}</span>', _local(obj.changed_at))


@admin.register(ClusterMaintenance)
class ClusterMaintenanceAdmin(_WideChangelistMixin, _ReadOnlyAdminMixin, admin.ModelAdmin):
    """Maintenance operators announced (API ``/clusters/<cpi>/maintenance``): append-only, as recorded. It
    excludes lost time from a lease's SLA only if announced CARDHOUR_SLA_MAINTENANCE_NOTICE_HOURS ahead and
    before the lease was accepted."""

    list_display = [
        "cluster",
        "starts_at",
        "ends_at",
        "announced_at",
        "notice_hours",
        "announced_by",
        "reason",
    ]
    list_filter = ["starts_at"]
    search_fields = ["cluster__cpi", "reason", "announced_by"]
    list_select_related = ["cluster"]
    date_hierarchy = "starts_at"

    @admin.display(description=gettext_lazy("Notice (hours)"))
    def notice_hours(self, obj: ClusterMaintenance) -> str:
        return f"{(obj.starts_at - obj.announced_at).total_seconds() / 3600:.1f}"
