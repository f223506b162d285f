"""The job form: a job's constraints as the portal asks for them, turned into broker.services.jobs.JobInput,
and the service's per-field faults put back beside the form's fields."""

from __future__ import annotations

import uuid
from collections.abc import Iterable, Mapping
from datetime import datetime, timedelta
from typing import Any, cast

from django import forms
from django.conf import settings
from django.http import QueryDict
from django.utils import timezone
from django.utils.dateparse import parse_datetime
from django.utils.translation import gettext_lazy as _

from broker.models import Gang, Job, Preference
from broker.services.jobs import JobInput
from federation.models import Fabric
from federation.selectors import accelerator_list, hub_list

DATETIME_LOCAL = "%Y-%m-%dT%H:%M"
SIZE_CARDS = "cards"
SIZE_STANDARD = "standard"

# Where each service field's faults are shown on the form. The duration is asked as hours and minutes;
# its faults go under the hours (the template shows them once for the pair).
SERVICE_FIELDS: dict[str, str] = {
    "name": "name",
    "cards": "cards",
    "standard_cards": "standard_cards",
    "accelerators": "accelerators",
    "min_fp16_tflops": "min_fp16_tflops",
    "min_memory_gb": "min_memory_gb",
    "fabrics": "fabrics",
    "gang": "gang",
    "origin_hub": "origin_hub",
    "latency_budget_ms": "latency_budget_ms",
    "earliest_start_at": "earliest_start_at",
    "deadline_at": "deadline_at",
    "duration_seconds": "duration_hours",
    "max_price_per_card_hour": "max_price_per_card_hour",
    "checkpointable": "checkpointable",
    "preference": "preference",
    "price_weight": "price_weight",
    "cluster": "cluster",
    "min_reliability": "min_reliability",
}

# The service's fault codes in the buyer's language; a code not listed shows the service's own message.
FAULT_MESSAGES: dict[str, Any] = {
    "cards_or_standard_cards": _("Give the number of cards or of standard cards."),
    "cards_not_positive": _("The number of cards must be positive."),
    "too_many_cards": _("That is more cards than any job may ask for."),
    "duration_not_positive": _("The duration must be longer than zero."),
    "latency_budget_not_positive": _("The latency budget must be positive."),
    "deadline_before_end": _("The deadline is before the earliest start plus the duration."),
    "window_beyond_horizon": _(
        "The deadline is too far ahead: a job may end at most %(days)d days from now."
    ),
    "unknown_hub": _("No such hub."),
    "unknown_accelerator": _("No chip model %(slugs)s."),
    "unknown_fabric": _("No such fabric."),
    "unknown_gang": _("Choose how the cards may be placed."),
    "unknown_preference": _("Choose a preference."),
    "price_weight_range": _("The price weight is between 0 and 1."),
    "price_cap_not_positive": _("The price cap must be positive."),
    "start_in_past": _("The earliest start is in the past."),
    "unknown_cluster": _("No cluster with this identifier is listed on the market."),
    "min_reliability_range": _("The minimum reliability is a percentage between 0 and 100."),
}


# The fields a link may set on the form (a suggestion's changes, by the API's names): an empty value clears.
PREFILL_FIELDS = (
    "cards",
    "accelerators",
    "min_fp16_tflops",
    "min_memory_gb",
    "fabrics",
    "gang",
    "latency_budget_ms",
    "deadline_at",
    "max_price_per_card_hour",
    "cluster",
    "min_reliability",
)


def _parse_local(value: str) -> datetime | None:
    """A ``datetime-local`` value (local time) or an ISO time with its offset, as an aware time; None
    when malformed."""
    try:
        parsed = parse_datetime(value)
    except ValueError:
        return None
    if parsed is None:
        return None
    return parsed if timezone.is_aware(parsed) else timezone.make_aware(parsed)


def job_initial(job: Job, *, now: datetime) -> dict[str, Any]:
    """The job form's values for a copy of ``job``. A window still ahead is kept as it is; a window that
    has begun starts now (as soon as possible) and keeps its length, up to the planning horizon."""
    horizon = now + timedelta(days=settings.CARDHOUR_PLANNING_HORIZON_DAYS)
    if job.earliest_start_at >= now:
        start, deadline = job.earliest_start_at, job.deadline_at
    else:
        start, deadline = now, now + (job.deadline_at - job.earliest_start_at)
    hours, rest = divmod(job.duration_seconds, 3600)
    return {
        "name": str(_("%(name)s (copy)")) % {"name": job.name},
        "size_kind": SIZE_STANDARD if job.standard_cards is not None else SIZE_CARDS,
        "cards": job.cards,
        "standard_cards": job.standard_cards,
        "accelerators": list(job.accelerators or []),
        "min_fp16_tflops": job.min_fp16_tflops,
        "min_memory_gb": job.min_memory_gb,
        "fabrics": list(job.fabrics or []),
        "gang": job.gang,
        "origin_hub": job.origin_hub.code,
        "latency_budget_ms": job.latency_budget_ms,
        "earliest_start_at": start,
        "start_shown": _local_minute(start) if start == now else "",
        "deadline_at": min(deadline, horizon),
        "duration_hours": hours,
        "duration_minutes": rest // 60,
        "max_price_per_card_hour": job.max_price_per_card_hour,
        "checkpointable": job.checkpointable,
        "preference": job.preference,
        "price_weight": job.price_weight if job.preference == Preference.WEIGHTED else None,
        "cluster": job.cluster.cpi if job.cluster is not None else "",
        "min_reliability": job.min_reliability,
    }


class DateTimeLocalInput(forms.DateTimeInput):
    input_type = "datetime-local"

    def __init__(self, attrs: dict[str, Any] | None = None) -> None:
        super().__init__(attrs=attrs, format=DATETIME_LOCAL)


def _local_minute(value: datetime) -> str:
    return timezone.localtime(value).strftime(DATETIME_LOCAL)


class ChipsField(forms.MultipleChoiceField):
    """Chip slugs: offered as checkboxes, but checked by the service (an unknown slug, say from an old
    marketplace link, is reported with the job's other faults rather than alone)."""

    def valid_value(self, value: Any) -> bool:
        return True


class JobForm(forms.Form):
    """Place a job. Field rules beyond types (positive duration, a deadline after the start, known chips)
    are the service's: its faults are added to the matching fields by :meth:`add_service_errors`."""

    # Most fields are optional only in combination (cards or standard cards; a chip or figures), so the
    # labels carry no "(optional)" marker (templates/portal/_field.html); the help texts say what empty means.
    optional_marker = False

    name = forms.CharField(
        label=_("Name"),
        max_length=200,
        required=False,
        help_text=_("For your own lists; a name is made up from the time when left empty."),
    )
    size_kind = forms.ChoiceField(
        label=_("What to count"),
        choices=[
            (SIZE_CARDS, _("Cards of one chip model")),
            (
                SIZE_STANDARD,
                _("Standard cards (400 dense FP16 TFLOPS each; any chip, counted by its factor)"),
            ),
        ],
        initial=SIZE_CARDS,
        widget=forms.RadioSelect,
    )
    cards = forms.IntegerField(label=_("Cards"), required=False, min_value=-(2**31), max_value=2**31 - 1)
    standard_cards = forms.DecimalField(
        label=_("Standard cards"), required=False, max_digits=12, decimal_places=4
    )
    accelerators = ChipsField(
        label=_("Allowed chips"),
        required=False,
        widget=forms.CheckboxSelectMultiple,
        help_text=_("None ticked: any chip that meets the figures below."),
    )
    min_fp16_tflops = forms.DecimalField(
        label=_("Minimum dense FP16 TFLOPS per card"), required=False, max_digits=10, decimal_places=3
    )
    min_memory_gb = forms.DecimalField(
        label=_("Minimum memory per card (GB)"), required=False, max_digits=8, decimal_places=1
    )
    fabrics = forms.MultipleChoiceField(
        label=_("Allowed fabrics"),
        required=False,
        choices=Fabric.choices,
        widget=forms.CheckboxSelectMultiple,
        help_text=_("None ticked: any fabric."),
    )
    gang = forms.ChoiceField(
        label=_("Placement"),
        choices=[
            (Gang.ISLAND, _("All cards in one island (training)")),
            (Gang.CLUSTER, _("May span the islands of one cluster")),
        ],
        initial=Gang.ISLAND,
        widget=forms.RadioSelect,
    )
    origin_hub = forms.ChoiceField(
        label=_("Origin hub"), help_text=_("Where the job's data and users are; latency is measured from it.")
    )
    latency_budget_ms = forms.IntegerField(
        label=_("Latency budget (ms)"), initial=50, min_value=-(2**31), max_value=2**31 - 1
    )
    earliest_start_at = forms.DateTimeField(
        label=_("Earliest start"),
        input_formats=[DATETIME_LOCAL, "%Y-%m-%dT%H:%M:%S"],
        widget=DateTimeLocalInput(),
        help_text=_("Left as it is: as soon as possible."),
    )
    start_shown = forms.CharField(required=False, widget=forms.HiddenInput)
    deadline_at = forms.DateTimeField(
        label=_("Deadline"),
        input_formats=[DATETIME_LOCAL, "%Y-%m-%dT%H:%M:%S"],
        widget=DateTimeLocalInput(),
        help_text=_("The run must end by then."),
    )
    duration_hours = forms.IntegerField(label=_("Hours"), min_value=0, max_value=10_000, initial=2)
    duration_minutes = forms.IntegerField(label=_("Minutes"), min_value=0, max_value=59, initial=0)
    max_price_per_card_hour = forms.DecimalField(
        label=_("Price cap (CNY per card-hour)"),
        required=False,
        max_digits=12,
        decimal_places=4,
        help_text=_("The most you will pay on average; per standard card-hour for standard cards."),
    )
    checkpointable = forms.BooleanField(
        label=_("Checkpointable (may be moved to another cluster if one fails)"), required=False
    )
    preference = forms.ChoiceField(
        label=_("Rank quotes by"),
        choices=[
            (Preference.PRICE, _("Price (latency breaks ties)")),
            (Preference.LATENCY, _("Latency (price breaks ties)")),
            (Preference.WEIGHTED, _("A blend of price and latency")),
            (
                Preference.ADJUSTED,
                _("Price less the expected SLA credit, at each cluster's reliability (latency breaks ties)"),
            ),
        ],
        initial=Preference.PRICE,
        widget=forms.RadioSelect,
    )
    price_weight = forms.DecimalField(
        label=_("Weight of price"),
        required=False,
        max_digits=4,
        decimal_places=3,
        help_text=_("For a blend: 1 = price only, 0 = latency only."),
    )
    cluster = forms.CharField(
        label=_("Only on cluster"),
        required=False,
        max_length=120,
        help_text=_(
            "A cluster's identifier (cpi:operator:hub:name): only its islands are quoted, and the job is "
            "not moved elsewhere if it fails. Empty: any cluster."
        ),
    )
    min_reliability = forms.DecimalField(
        label=_("Minimum reliability (%)"),
        required=False,
        max_digits=6,
        decimal_places=3,
        help_text=_(
            "Only clusters whose reliability score is at least this: the card-time delivered out of the "
            "card-time sold over 30 days, with a prior of %(percent)s %% for new clusters. Empty: any."
        ),
    )
    idempotency_key = forms.CharField(max_length=200, widget=forms.HiddenInput)

    def __init__(self, *args: Any, now: datetime | None = None, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        now = (now or timezone.now()).replace(second=0, microsecond=0)
        chips = accelerator_list().order_by("vendor", "model").values_list("slug", "vendor", "model")
        self._chips = [(slug, f"{vendor} {model}") for slug, vendor, model in chips]
        cast(forms.ChoiceField, self.fields["accelerators"]).choices = self._chips
        cast(forms.ChoiceField, self.fields["origin_hub"]).choices = [
            (code, f"{code} — {name}") for code, name in hub_list().values_list("code", "name")
        ]
        self.fields["min_reliability"].help_text = str(self.fields["min_reliability"].help_text) % {
            "percent": settings.CARDHOUR_RELIABILITY_PRIOR_PERCENT
        }
        if not self.is_bound:
            self.initial.setdefault("earliest_start_at", now)
            self.initial.setdefault("start_shown", _local_minute(now))
            self.initial.setdefault("deadline_at", now + timedelta(hours=24))
            self.initial.setdefault("idempotency_key", uuid.uuid4().hex)

    @classmethod
    def prefill(
        cls, query: QueryDict, *, origin_hub: str, job: Job | None = None, now: datetime | None = None
    ) -> dict[str, Any]:
        """Initial values: a copy of ``job`` (``?from_job=<id>``, "Place a similar job"), a marketplace
        link (``?accelerator=<slug>&origin_hub=<code>&cluster=<cpi>``), and the fields a suggestion
        changes (any of PREFILL_FIELDS; an empty value clears the field)."""
        now = (now or timezone.now()).replace(second=0, microsecond=0)
        initial: dict[str, Any] = {"origin_hub": origin_hub}
        if job is not None:
            initial.update(job_initial(job, now=now))
        if query.get("origin_hub"):
            initial["origin_hub"] = query["origin_hub"]
        if query.get("accelerator"):
            initial["accelerators"] = [query["accelerator"]]
            initial["size_kind"] = SIZE_CARDS
        for name in PREFILL_FIELDS:
            if name not in query:
                continue
            if name in ("accelerators", "fabrics"):
                initial[name] = [value for value in query.getlist(name) if value]
            elif name == "deadline_at":
                deadline = _parse_local(str(query.get(name, "")))
                if deadline is not None:
                    initial[name] = deadline
            else:
                initial[name] = query[name] or None
        if initial.get("cards") is not None:
            initial["size_kind"] = SIZE_CARDS
        return initial

    def job_input(self) -> JobInput:
        """The cleaned form as the service's input. A start left as shown means "as soon as possible"
        (so a form opened a while ago is not refused for a start that has since passed)."""
        data = self.cleaned_data
        start: datetime = data["earliest_start_at"]
        asap = bool(data.get("start_shown")) and self.data.get(
            self.add_prefix("earliest_start_at")
        ) == data.get("start_shown")
        standard = data["size_kind"] == SIZE_STANDARD
        name = data.get("name") or str(_("Job of %(time)s")) % {
            "time": timezone.localtime(timezone.now()).strftime("%Y-%m-%d %H:%M")
        }
        return JobInput(
            name=name,
            origin_hub=data["origin_hub"],
            latency_budget_ms=data["latency_budget_ms"],
            deadline_at=data["deadline_at"],
            duration_seconds=data["duration_hours"] * 3600 + data["duration_minutes"] * 60,
            cards=None if standard else data.get("cards"),
            standard_cards=data.get("standard_cards") if standard else None,
            accelerators=tuple(data.get("accelerators") or ()),
            min_fp16_tflops=data.get("min_fp16_tflops"),
            min_memory_gb=data.get("min_memory_gb"),
            fabrics=tuple(data.get("fabrics") or ()),
            gang=data["gang"],
            earliest_start_at=None if asap else start,
            max_price_per_card_hour=data.get("max_price_per_card_hour"),
            checkpointable=bool(data.get("checkpointable")),
            preference=data["preference"],
            price_weight=data.get("price_weight"),
            cluster=(data.get("cluster") or "").strip(),
            min_reliability=data.get("min_reliability"),
            idempotency_key=data["idempotency_key"],
        )

    def add_service_errors(self, faults: Iterable[Mapping[str, str]]) -> None:
        """Put each ``{field, code, message}`` of a JobInvalidError beside its form field."""
        standard = self.cleaned_data.get("size_kind") == SIZE_STANDARD
        known = {value for value, _label in self._chips}
        unknown = [slug for slug in self.cleaned_data.get("accelerators", []) if slug not in known]
        for fault in faults:
            field = SERVICE_FIELDS.get(fault.get("field", ""))
            if fault.get("code") == "cards_or_standard_cards":
                field = "standard_cards" if standard else "cards"
            message = str(FAULT_MESSAGES.get(fault.get("code", ""), fault.get("message", "")))
            if fault.get("code") == "window_beyond_horizon":
                message %= {"days": settings.CARDHOUR_PLANNING_HORIZON_DAYS}
            elif fault.get("code") == "unknown_accelerator":
                message %= {"slugs": ", ".join(unknown)}
            if field is not None and field in self.fields:
                if field not in self.errors or message not in self.errors[field]:
                    self.add_error(field, message)
            else:
                self.add_error(None, message)

    def fresh_key(self) -> None:
        """Give the re-rendered form a new idempotency key (its old one already placed a job)."""
        data = QueryDict(mutable=True)
        data.update(self.data)
        data[self.add_prefix("idempotency_key")] = uuid.uuid4().hex
        self.data = data
