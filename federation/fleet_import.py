"""Bulk onboarding: import a fleet inventory CSV into one operator's clusters and islands.

An inventory has one row per node (server) with its accelerator model and card count. Columns are found by
their header (case-insensitive, surrounding blanks ignored); other columns (cpu_num, memory_mib, ...) are
ignored:

=========  ===========================================  =========================================
role       header names                                 required
=========  ===========================================  =========================================
model      gpu_model, model, accelerator                yes
cards      gpu_capacity_num, gpu, cards, gpus           yes
node       node_name, sn, node, hostname                yes
hub        hub                                          column or option; a row's value wins
site       site                                         column or option; a row's value wins
cluster    cluster                                      no: a row's value overrides the derived name
island     island                                       no: if present, every row names its island
fabric     fabric                                       no: a row's value overrides the default
=========  ===========================================  =========================================

Rules:

- **Model** matches an Accelerator's slug or any of its aliases, case-insensitively. A model the catalog
  does not know is the row error ``unknown_model``, unless ``allow_unknown_models`` is set: then one catalog
  entry per model is created with ``spec_status = unknown``, no figures at all, vendor "Unknown", the
  spelling as alias, PCIe as default fabric (the weakest claim) and a ``source`` naming the import. Figures
  are never invented.
- **Cards** are a whole number 0..MAX_CARDS_PER_NODE. A node with 0 cards (a CPU node in the inventory) is
  *skipped with a warning* (``zero_cards``), not an error: inventories list every server and an operator
  should not have to pre-filter them. Its node name still counts for duplicate detection; its model is not
  checked.
- **Clusters**: one per (hub, site, model), unless a cluster column names it. The cluster segment is derived
  deterministically from [prefix-]<site>-<model>: lowercase ASCII, runs of other characters become one
  hyphen, the chip's vendor prefix is dropped from its slug (``zhongwei-a800-sxm4-80gb``); a site with no
  ASCII letters or digits becomes ``site-<6 hex of its SHA-1>``; a name over 32 characters keeps its model
  and gets its [prefix-]site part shortened and 6 hex of the SHA-1 of the full name appended
  (``cu-ulanqab-h800-sxm5-80gb-1a2b3c``; if the model alone is too long, the whole name is cut to 25).
  The same site and model give the same name in every import. One cluster name must not mean two models
  or two sites in one hub (``cluster_conflict``).
- **Islands**: nodes of one cluster are grouped in file order into islands of at most ``nodes_per_island``
  nodes, named ``isl-001``, ``isl-002``... The default, 32 nodes, is one InfiniBand/RoCE leaf-spine pod (the
  32-node scalable unit of a DGX SuperPOD: 256 GPUs under one set of rail-optimised leaf switches), the
  largest group that can honestly be offered as one high-bandwidth domain without knowing the topology.
  Rows that name a fabric are grouped apart from rows that do not. With an island column, the islands are
  exactly the named groups. An island's cards are the sum of its nodes' cards.
- **Fabric** of an island: the row's fabric column, else the ``fabric`` option, else the chip's
  ``default_fabric`` — except that NVLink and HCCS only span the cards of one node, so an island of several
  nodes of such chips is joined by its scale-out network: InfiniBand for NVLink chips (HGX/DGX pods),
  RoCE for HCCS chips (Ascend clusters). A one-node island keeps the chip's fabric.
- **Identifiers**: ``cpi:<operator>:<hub>:<cluster>`` and ``...:<island>``. A cluster that already exists
  for this operator with the same site, accelerator and islands (name, cards, fabric) is reported
  ``unchanged`` and nothing is written for it; one that exists but differs is ``cluster_differs``; an
  identifier issued before to a resource that is not this cluster is ``identifier_taken``. Identifiers are
  never reused.
- **All or nothing**: every bad row is reported by its 1-based line number (the header is line 1; blank
  lines count, a quoted field spanning lines counts from its first line) with a stable code and the
  field, and nothing is written if any row is bad. Row errors are reported together; the comparison
  with the database runs only on a file without row errors (a partial file would compare wrongly).
- **Set-based**: a fixed number of queries however long the file (bulk_create of issued identifiers,
  accelerators, clusters, islands and status-history rows), all in one transaction. Imports of one
  operator are serialised by a row lock on the operator. New clusters are active with K2 = K1, like a
  registration: they go offline after missed heartbeats until the operator's agent beats.

Row error codes (stable, public): bad_encoding, bad_csv, empty_file, missing_column, ambiguous_column,
too_many_rows, bad_field_count, missing_value, value_too_long, unknown_model, accelerator_ambiguous,
bad_card_count, unknown_hub, invalid_segment, bad_fabric, duplicate_node, cluster_conflict, island_conflict,
too_many_islands, identifier_taken, cluster_differs. Warning codes: zero_cards, cluster_retired, no_nodes.
"""

from __future__ import annotations

import csv
import hashlib
import io
import re
import unicodedata
from collections import defaultdict
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any, NoReturn

from django.conf import settings
from django.db import IntegrityError, transaction
from django.utils import timezone
from django.utils.translation import gettext as _
from django.utils.translation import ngettext

from core.errors import ConflictError, InvalidInputError, PermissionDeniedError
from core.models import Organisation
from core.types import Actor
from federation import identifiers
from federation.errors import (
    AcceleratorAmbiguousError,
    FleetImportError,
    IdentifierOperatorMismatchError,
    IdentifierTakenError,
    UnknownAcceleratorError,
)
from federation.models import (
    Accelerator,
    Cluster,
    ClusterStatus,
    ClusterStatusChange,
    Fabric,
    Hub,
    Island,
    IssuedIdentifier,
)
from federation.selectors import accelerator_resolve, accelerator_spelling_index

DEFAULT_NODES_PER_ISLAND = 32
MAX_NODES_PER_ISLAND = 4096
# A guard against typos ("800" for "8") and overflow, generous enough for a supernode listed as one row.
MAX_CARDS_PER_NODE = 1024
# How many errors (and warnings) are listed; the total is always given.
MAX_LISTED_ISSUES = 1000
# Upload size bound used by the API: CARDHOUR_FLEET_IMPORT_MAX_ROWS rows of this many bytes.
MAX_BYTES_PER_ROW = 256
MAX_PREFIX_LENGTH = 16
STATUS_REASON = "fleet import"
ISLAND_NAME_FORMAT = "isl-{:03d}"
UNKNOWN_VENDOR = "Unknown"

# Identifier lookups are chunked so that no IN list outgrows a backend's parameter limit.
_IN_CHUNK = 5000
_BATCH = 1000

COLUMNS: dict[str, tuple[str, ...]] = {
    "model": ("gpu_model", "model", "accelerator"),
    "cards": ("gpu_capacity_num", "gpu", "cards", "gpus"),
    "node": ("node_name", "sn", "node", "hostname"),
    "hub": ("hub",),
    "site": ("site",),
    "cluster": ("cluster",),
    "island": ("island",),
    "fabric": ("fabric",),
}
REQUIRED_COLUMNS = ("model", "cards", "node")

# NVLink and HCCS join the cards of one node; several nodes are joined by the scale-out network.
SCALE_OUT_FABRIC: dict[str, str] = {Fabric.NVLINK: Fabric.INFINIBAND, Fabric.HCCS: Fabric.ROCE}

_FABRICS: dict[str, str] = {
    **{value.lower(): value for value in Fabric.values},
    **{str(label).lower(): value for value, label in Fabric.choices},
}
_CARDS_RE = re.compile(r"^[0-9]+$")
_NOT_SLUG_RE = re.compile(r"[^a-z0-9]+")


# --- Results ----------------------------------------------------------------------------------------


@dataclass(frozen=True)
class FleetImportIssue:
    """One error or warning. ``line`` is the 1-based line in the file (header = 1), None for the file."""

    line: int | None
    code: str
    message: str
    field: str | None = None
    candidates: tuple[str, ...] = ()  # accelerator_ambiguous: the slugs the model could be

    def as_dict(self) -> dict[str, Any]:
        row: dict[str, Any] = {
            "line": self.line,
            "code": self.code,
            "message": self.message,
            "field": self.field,
        }
        if self.candidates:
            row["candidates"] = list(self.candidates)
        return row


@dataclass(frozen=True)
class FleetImportModelTotal:
    accelerator: str
    nodes: int
    cards: int
    islands: int
    clusters: int


@dataclass(frozen=True)
class FleetImportClusterSummary:
    cpi: str
    hub: str
    site: str
    accelerator: str
    outcome: str  # "created" or "unchanged"
    nodes: int
    cards: int
    islands: int


@dataclass(frozen=True)
class FleetImportResult:
    """What an import did (or, with ``dry_run``, would do). Counts cover every node in the file, in new
    and unchanged clusters alike; ``skipped_nodes`` are the 0-card rows."""

    operator: str
    dry_run: bool
    rows: int
    nodes: int
    cards: int
    skipped_nodes: int
    clusters_created: int
    clusters_unchanged: int
    islands_created: int
    islands_unchanged: int
    models: tuple[FleetImportModelTotal, ...]
    clusters: tuple[FleetImportClusterSummary, ...]
    accelerators_created: tuple[str, ...]
    warnings: tuple[FleetImportIssue, ...]
    warning_count: int


# --- Working state ----------------------------------------------------------------------------------


@dataclass(eq=False)
class _Chip:
    """A catalog accelerator, or one this import would create (``accelerator`` None until written)."""

    slug: str
    vendor: str
    model: str
    default_fabric: str
    accelerator: Accelerator | None
    aliases: list[str] = field(default_factory=list)

    @property
    def is_new(self) -> bool:
        return self.accelerator is None or self.accelerator.pk is None


@dataclass(eq=False)
class _Node:
    line: int
    name: str
    cards: int
    chip: _Chip
    hub: str
    site: str
    cluster: str
    island: str | None
    fabric: str | None


@dataclass(eq=False)
class _IslandPlan:
    name: str
    cpi: str
    fabric: str
    cards: int
    nodes: int


@dataclass(eq=False)
class _ClusterPlan:
    cpi: str
    name: str
    hub: str
    site: str
    chip: _Chip
    line: int
    nodes: list[_Node] = field(default_factory=list)
    islands: list[_IslandPlan] = field(default_factory=list)
    existing: Cluster | None = None

    @property
    def cards(self) -> int:
        return sum(island.cards for island in self.islands)


class _Issues:
    def __init__(self) -> None:
        self.items: list[FleetImportIssue] = []

    def add(
        self,
        line: int | None,
        code: str,
        message: str,
        field: str | None = None,
        candidates: Sequence[str] = (),
    ) -> None:
        self.items.append(
            FleetImportIssue(line=line, code=code, message=message, field=field, candidates=tuple(candidates))
        )

    def __bool__(self) -> bool:
        return bool(self.items)

    def listed(self) -> list[FleetImportIssue]:
        return sorted(self.items, key=lambda i: i.line or 0)[:MAX_LISTED_ISSUES]


def _unknown_hub(hub: str, hubs: Iterable[str]) -> str:
    return _("Unknown hub %(hub)r: one of %(hubs)s.") % {"hub": hub, "hubs": ", ".join(hubs)}


def _raise_invalid(issues: _Issues) -> NoReturn:
    count = len(issues.items)
    raise FleetImportError(
        ngettext(
            "The fleet inventory has %(count)d error; nothing was imported.",
            "The fleet inventory has %(count)d errors; nothing was imported.",
            count,
        )
        % {"count": count},
        extra={
            "errors": [issue.as_dict() for issue in issues.listed()],
            "error_count": count,
            "truncated": count > MAX_LISTED_ISSUES,
        },
    )


# --- Naming -----------------------------------------------------------------------------------------


def _digest(value: str, length: int = 6) -> str:
    return hashlib.sha1(value.encode(), usedforsecurity=False).hexdigest()[:length]


def _slug(value: str) -> str:
    ascii_text = unicodedata.normalize("NFKD", value).encode("ascii", "ignore").decode().lower()
    return _NOT_SLUG_RE.sub("-", ascii_text).strip("-")


def cluster_name_derive(*, prefix: str, site: str, accelerator_slug: str, vendor: str) -> str:
    """The cluster segment for (prefix, site, chip): deterministic, always a valid segment (see module doc)."""
    site_part = _slug(site) or f"site-{_digest(site)}"
    vendor_prefix = f"{_slug(vendor)}-"
    model_part = accelerator_slug
    if vendor_prefix != "-" and model_part.startswith(vendor_prefix) and len(model_part) > len(vendor_prefix):
        model_part = model_part[len(vendor_prefix) :]
    head = "-".join(part for part in (prefix, site_part) if part)
    name = f"{head}-{model_part}"
    if len(name) > 32:
        # Keep the model readable and shorten the site; the digest of the full name keeps it unique.
        tail = f"-{model_part}-{_digest(name)}"
        room = 32 - len(tail)
        name = f"{head[:room].rstrip('-')}{tail}" if room >= 4 else f"{name[:25].rstrip('-')}-{_digest(name)}"
    return identifiers.validate_segment(name)


def _new_chip_slug(raw: str, taken: set[str]) -> str:
    slug = _slug(raw)[:64].strip("-") or f"model-{_digest(raw)}"
    if slug in taken:
        slug = f"{slug[:57].rstrip('-')}-{_digest(raw)}"
    return slug


# --- Reading ----------------------------------------------------------------------------------------


def _decode(content: bytes | str) -> str:
    if isinstance(content, str):
        return content.removeprefix("\ufeff")
    try:
        return content.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        issues = _Issues()
        line = content[: exc.start].count(b"\n") + 1
        issues.add(
            line, "bad_encoding", _("The file is not UTF-8 (byte %(byte)d).") % {"byte": exc.start + 1}
        )
        _raise_invalid(issues)


def _records(text: str, issues: _Issues) -> Iterator[tuple[int, list[str]]]:
    """(first line of the record, fields), by physical line even when a quoted field spans lines."""
    reader = csv.reader(io.StringIO(text, newline=""))
    last_line = 0
    while True:
        try:
            record = next(reader)
        except StopIteration:
            return
        except csv.Error as exc:
            issues.add(
                reader.line_num, "bad_csv", _("The file is not valid CSV: %(error)s.") % {"error": exc}
            )
            return
        yield last_line + 1, record
        last_line = reader.line_num


def _header_roles(header: list[str], issues: _Issues) -> dict[str, int]:
    names = [name.strip().lower() for name in header]
    roles: dict[str, int] = {}
    for role, aliases in COLUMNS.items():
        found = [index for index, name in enumerate(names) if name in aliases]
        if len(found) > 1:
            issues.add(
                1,
                "ambiguous_column",
                _("Columns %(columns)s all give the %(role)s; keep one.")
                % {"columns": ", ".join(header[i].strip() for i in found), "role": role},
                role,
            )
        elif found:
            roles[role] = found[0]
    for role in REQUIRED_COLUMNS:
        if role not in roles and not any(issue.field == role for issue in issues.items):
            issues.add(
                1,
                "missing_column",
                _("No %(role)s column: name one of %(names)s.")
                % {"role": role, "names": ", ".join(COLUMNS[role])},
                role,
            )
    return roles


# --- Options ----------------------------------------------------------------------------------------


@dataclass(frozen=True)
class _Options:
    hub: str | None
    site: str
    cluster_prefix: str
    nodes_per_island: int
    fabric: str | None
    allow_unknown_models: bool


def _check_options(
    *,
    actor: Actor,
    operator: Organisation,
    hubs: dict[str, Hub],
    hub: str | None,
    site: str | None,
    cluster_prefix: str,
    nodes_per_island: int,
    fabric: str | None,
    allow_unknown_models: bool,
) -> _Options:
    if actor.organisation is not None and actor.organisation.pk != operator.pk:
        raise IdentifierOperatorMismatchError(
            _("An organisation imports only into its own namespace."),
            extra={"operator": operator.slug},
        )
    if not operator.is_operator:
        raise PermissionDeniedError(
            _("%(operator)s is not an operator.") % {"operator": operator.slug}, code="not_an_operator"
        )
    if operator.is_suspended:
        raise PermissionDeniedError(
            _("%(operator)s is suspended.") % {"operator": operator.slug}, code="organisation_suspended"
        )
    fields: dict[str, list[str]] = {}
    hub = (hub or "").strip().lower() or None
    if hub is not None and hub not in hubs:
        fields["hub"] = [_unknown_hub(hub, hubs)]
    site = (site or "").strip()
    if len(site) > 100:
        fields["site"] = [_("At most 100 characters.")]
    cluster_prefix = (cluster_prefix or "").strip()
    if cluster_prefix and (
        len(cluster_prefix) > MAX_PREFIX_LENGTH or not identifiers.is_valid(f"cpi:{cluster_prefix}")
    ):
        fields["cluster_prefix"] = [
            _("1–%(max)d characters of a–z, 0–9 and inner hyphens.") % {"max": MAX_PREFIX_LENGTH}
        ]
    if not 1 <= nodes_per_island <= MAX_NODES_PER_ISLAND:
        fields["nodes_per_island"] = [_("Between 1 and %(max)d.") % {"max": MAX_NODES_PER_ISLAND}]
    resolved_fabric = None
    if fabric:
        resolved_fabric = _FABRICS.get(fabric.strip().lower())
        if resolved_fabric is None:
            fields["fabric"] = [_("One of %(choices)s.") % {"choices": ", ".join(Fabric.values)}]
    if fields:
        raise InvalidInputError(_("Some import options are invalid."), extra={"fields": fields})
    return _Options(
        hub=hub,
        site=site,
        cluster_prefix=cluster_prefix,
        nodes_per_island=nodes_per_island,
        fabric=resolved_fabric,
        allow_unknown_models=allow_unknown_models,
    )


# --- Parsing rows -----------------------------------------------------------------------------------


class _Catalog:
    """Model spellings → accelerators, plus the entries this import would add."""

    def __init__(self, *, operator: Organisation, source_name: str) -> None:
        accelerators = list(
            Accelerator.objects.only("pk", "slug", "vendor", "model", "aliases", "default_fabric")
        )
        # The same spelling rules as REST registration (federation.selectors.accelerator_resolve).
        self.by_spelling = accelerator_spelling_index(accelerators)
        self.slugs: set[str] = {accelerator.slug for accelerator in accelerators}
        self.chips: dict[int, _Chip] = {}
        self.new_chips: dict[str, _Chip] = {}
        self.operator = operator
        self.source_name = source_name

    def chip_for(self, accelerator: Accelerator) -> _Chip:
        chip = self.chips.get(accelerator.pk)
        if chip is None:
            chip = _Chip(
                slug=accelerator.slug,
                vendor=accelerator.vendor,
                model=accelerator.model,
                default_fabric=accelerator.default_fabric,
                accelerator=accelerator,
            )
            self.chips[accelerator.pk] = chip
        return chip

    def new_chip(self, raw: str) -> _Chip:
        key = raw.lower()
        chip = self.new_chips.get(key)
        if chip is None:
            slug = _new_chip_slug(raw, self.slugs)
            self.slugs.add(slug)
            chip = _Chip(
                slug=slug, vendor=UNKNOWN_VENDOR, model=raw, default_fabric=Fabric.PCIE, accelerator=None
            )
            self.new_chips[key] = chip
        if raw not in chip.aliases:
            chip.aliases.append(raw)
        return chip

    def accelerators_to_create(self, used: set[int]) -> list[tuple[_Chip, Accelerator]]:
        today = f"{timezone.now().date().isoformat()} UTC"
        rows = []
        for chip in self.new_chips.values():
            if id(chip) not in used:
                continue
            source = (
                f"Created by a fleet import of {self.operator.slug} ({self.source_name}) on {today}: the model "
                f"{chip.model!r} is not in the catalog; its figures are not public here, so none are recorded."
            )
            accelerator = Accelerator(
                slug=chip.slug,
                vendor=UNKNOWN_VENDOR,
                model=chip.model[:100],
                aliases=chip.aliases,
                spec_status=Accelerator.SpecStatus.UNKNOWN,
                interconnect="",
                default_fabric=Fabric.PCIE,
                source=source[:300],
            )
            rows.append((chip, accelerator))
        return rows


def _parse_rows(
    *,
    text: str,
    options: _Options,
    hubs: dict[str, Hub],
    catalog: _Catalog,
    issues: _Issues,
    warnings: _Issues,
) -> tuple[list[_Node], int, int]:
    """Validate every row; returns (nodes, data rows, skipped 0-card rows). Errors go to ``issues``."""
    max_rows = settings.CARDHOUR_FLEET_IMPORT_MAX_ROWS
    records = _records(text, issues)
    first = next(records, None)
    if first is None:
        if not issues:
            issues.add(1, "empty_file", _("The file is empty: it needs a header line and one line per node."))
        return [], 0, 0
    header = first[1]
    roles = _header_roles(header, issues)
    # Without a column and without the option every row would lack it: say so once.
    for role, given in (("hub", options.hub), ("site", options.site)):
        if role not in roles and not given:
            issues.add(
                1,
                "missing_column",
                _("No %(role)s column and no %(role)s option: give one.") % {"role": role},
                role,
            )
    if issues:
        return [], 0, 0

    nodes: list[_Node] = []
    seen_nodes: dict[str, int] = {}
    rows = skipped = 0
    width = len(header)
    has_island = "island" in roles

    for line, record in records:
        if not any(cell.strip() for cell in record):
            continue  # a blank line is not a node
        rows += 1
        if rows > max_rows:
            issues.add(
                line, "too_many_rows", _("More than %(max)d rows; split the inventory.") % {"max": max_rows}
            )
            break
        if len(record) != width:
            issues.add(
                line,
                "bad_field_count",
                _("%(fields)d fields; the header has %(width)d.") % {"fields": len(record), "width": width},
            )
            continue

        def cell(role: str, record: list[str] = record) -> str:
            return record[roles[role]].strip() if role in roles else ""

        errors_before = len(issues.items)
        name = cell("node")
        if not name:
            issues.add(line, "missing_value", _("No node name."), "node")
        elif name in seen_nodes:
            issues.add(
                line,
                "duplicate_node",
                _("Node %(name)r is also on line %(line)d.") % {"name": name, "line": seen_nodes[name]},
                "node",
            )
        else:
            seen_nodes[name] = line

        raw_cards = cell("cards")
        cards: int | None = None
        if not _CARDS_RE.match(raw_cards):
            issues.add(
                line,
                "bad_card_count",
                _("Card count %(value)r is not a whole number ≥ 0.") % {"value": raw_cards},
                "cards",
            )
        else:
            cards = int(raw_cards)
            if cards > MAX_CARDS_PER_NODE:
                issues.add(
                    line,
                    "bad_card_count",
                    _("%(cards)d cards in one node (at most %(max)d).")
                    % {"cards": cards, "max": MAX_CARDS_PER_NODE},
                    "cards",
                )
            elif cards == 0:
                skipped += 1
                warnings.add(
                    line, "zero_cards", _("Node %(name)r has no cards; skipped.") % {"name": name}, "cards"
                )
                continue

        chip: _Chip | None = None
        raw_model = cell("model")
        if not raw_model:
            issues.add(line, "missing_value", _("No accelerator model."), "model")
        elif len(raw_model) > 100:
            issues.add(line, "value_too_long", _("The model is longer than 100 characters."), "model")
        else:
            try:
                chip = catalog.chip_for(accelerator_resolve(name=raw_model, index=catalog.by_spelling))
            except AcceleratorAmbiguousError as exc:
                # Never guessed: an SXM5 and a PCIe H100 differ by 31 % in throughput.
                issues.add(line, exc.code, exc.message, "model", candidates=exc.extra["candidates"])
            except UnknownAcceleratorError:
                if options.allow_unknown_models:
                    chip = catalog.new_chip(raw_model)
                else:
                    issues.add(
                        line,
                        "unknown_model",
                        _(
                            "Model %(model)r is not in the accelerator catalog (slug or alias); "
                            "ask for it to be added, or import with allow_unknown_models."
                        )
                        % {"model": raw_model},
                        "model",
                    )

        hub = cell("hub").lower() or options.hub
        if not hub:
            issues.add(line, "missing_value", _("No hub: give a hub column or the hub option."), "hub")
        elif hub not in hubs:
            issues.add(line, "unknown_hub", _unknown_hub(hub, hubs), "hub")

        site = cell("site") or options.site
        if not site:
            issues.add(line, "missing_value", _("No site: give a site column or the site option."), "site")
        elif len(site) > 100:
            issues.add(line, "value_too_long", _("The site is longer than 100 characters."), "site")

        cluster_name = cell("cluster")
        if cluster_name and not identifiers.is_valid(f"cpi:{cluster_name}"):
            issues.add(
                line,
                "invalid_segment",
                _("Cluster %(name)r must be 1–32 characters of a–z, 0–9 and inner hyphens.")
                % {"name": cluster_name},
                "cluster",
            )
        island: str | None = None
        if has_island:
            island = cell("island")
            if not island:
                issues.add(line, "missing_value", _("No island (the file has an island column)."), "island")
            elif not identifiers.is_valid(f"cpi:{island}"):
                issues.add(
                    line,
                    "invalid_segment",
                    _("Island %(name)r must be 1–32 characters of a–z, 0–9 and inner hyphens.")
                    % {"name": island},
                    "island",
                )
        raw_fabric = cell("fabric")
        fabric = _FABRICS.get(raw_fabric.lower()) if raw_fabric else None
        if raw_fabric and fabric is None:
            issues.add(
                line,
                "bad_fabric",
                _("Fabric %(fabric)r is not one of %(choices)s.")
                % {"fabric": raw_fabric, "choices": ", ".join(Fabric.values)},
                "fabric",
            )

        if len(issues.items) > errors_before or chip is None or cards is None or hub is None:
            continue
        if not cluster_name:
            cluster_name = cluster_name_derive(
                prefix=options.cluster_prefix, site=site, accelerator_slug=chip.slug, vendor=chip.vendor
            )
        nodes.append(
            _Node(
                line=line,
                name=name,
                cards=cards,
                chip=chip,
                hub=hub,
                site=site,
                cluster=cluster_name,
                island=island,
                fabric=fabric,
            )
        )
    return nodes, rows, skipped


# --- Planning ---------------------------------------------------------------------------------------


def _island_fabric(*, chip: _Chip, nodes: int, row_fabric: str | None, option_fabric: str | None) -> str:
    if row_fabric:
        return row_fabric
    if option_fabric:
        return option_fabric
    if nodes > 1:
        return SCALE_OUT_FABRIC.get(chip.default_fabric, chip.default_fabric)
    return chip.default_fabric


def _plan_clusters(
    *, nodes: Sequence[_Node], options: _Options, operator: Organisation, issues: _Issues
) -> list[_ClusterPlan]:
    plans: dict[tuple[str, str], _ClusterPlan] = {}
    for node in nodes:
        key = (node.hub, node.cluster)
        plan = plans.get(key)
        if plan is None:
            cpi = f"cpi:{operator.slug}:{node.hub}:{node.cluster}"
            plans[key] = _ClusterPlan(
                cpi=cpi,
                name=node.cluster,
                hub=node.hub,
                site=node.site,
                chip=node.chip,
                line=node.line,
                nodes=[node],
            )
        elif plan.chip is not node.chip:
            issues.add(
                node.line,
                "cluster_conflict",
                _(
                    "%(cpi)s is %(chip)s (line %(line)d) but this node is %(node_chip)s; a cluster has one model."
                )
                % {"cpi": plan.cpi, "chip": plan.chip.slug, "line": plan.line, "node_chip": node.chip.slug},
                "cluster",
            )
        elif plan.site != node.site:
            issues.add(
                node.line,
                "cluster_conflict",
                _(
                    "%(cpi)s is at site %(site)r (line %(line)d) but this node is at %(node_site)r; "
                    "a cluster has one site (name clusters apart with a cluster column)."
                )
                % {"cpi": plan.cpi, "site": plan.site, "line": plan.line, "node_site": node.site},
                "site",
            )
        else:
            plan.nodes.append(node)

    limit = settings.CARDHOUR_MAX_ISLANDS_PER_CLUSTER
    for plan in plans.values():
        groups: dict[Any, list[_Node]] = defaultdict(list)
        for node in plan.nodes:
            groups[node.island if node.island is not None else ("auto", node.fabric)].append(node)
        chunks: list[tuple[str | None, list[_Node]]] = []
        for key, members in groups.items():
            if isinstance(key, str):
                chunks.append((key, members))
            else:
                size = options.nodes_per_island
                chunks.extend((None, members[i : i + size]) for i in range(0, len(members), size))
        if len(chunks) > limit:
            issues.add(
                plan.line,
                "too_many_islands",
                _("%(cpi)s would have %(islands)d islands (at most %(limit)d); raise nodes_per_island.")
                % {"cpi": plan.cpi, "islands": len(chunks), "limit": limit},
                "island",
            )
            continue
        number = 0
        for name, members in chunks:
            fabrics = {node.fabric for node in members}
            if len(fabrics) > 1:
                first = members[0]
                for node in members[1:]:
                    if node.fabric != first.fabric:
                        issues.add(
                            node.line,
                            "island_conflict",
                            _(
                                "Island %(name)s of %(cpi)s has fabric %(fabric)s on line %(line)d but "
                                "%(node_fabric)s here; an island has one fabric."
                            )
                            % {
                                "name": name,
                                "cpi": plan.cpi,
                                "fabric": first.fabric or _("default"),
                                "line": first.line,
                                "node_fabric": node.fabric or _("default"),
                            },
                            "fabric",
                        )
                continue
            if name is None:
                number += 1
                name = ISLAND_NAME_FORMAT.format(number)
            plan.islands.append(
                _IslandPlan(
                    name=name,
                    cpi=f"{plan.cpi}:{name}",
                    fabric=_island_fabric(
                        chip=plan.chip,
                        nodes=len(members),
                        row_fabric=members[0].fabric,
                        option_fabric=options.fabric,
                    ),
                    cards=sum(node.cards for node in members),
                    nodes=len(members),
                )
            )
    return list(plans.values())


def _chunks(values: Sequence[str]) -> Iterator[Sequence[str]]:
    for start in range(0, len(values), _IN_CHUNK):
        yield values[start : start + _IN_CHUNK]


def _compare_with_database(*, plans: Sequence[_ClusterPlan], operator: Organisation, issues: _Issues) -> None:
    """Attach existing clusters; report clusters that differ and identifiers issued to something else."""
    cpis = [plan.cpi for plan in plans]
    existing: dict[str, Cluster] = {}
    for chunk in _chunks(cpis):
        existing.update((c.cpi, c) for c in Cluster.objects.filter(operator=operator, cpi__in=chunk))
    islands_of: dict[int, set[tuple[str, int, str]]] = defaultdict(set)
    ids = [cluster.pk for cluster in existing.values()]
    for start in range(0, len(ids), _IN_CHUNK):
        for cluster_id, name, cards, fabric in Island.objects.filter(
            cluster_id__in=ids[start : start + _IN_CHUNK]
        ).values_list("cluster_id", "name", "cards", "fabric"):
            islands_of[cluster_id].add((name, cards, fabric))

    wanted: list[str] = []
    for plan in plans:
        cluster = existing.get(plan.cpi)
        if cluster is None:
            wanted.append(plan.cpi)
            wanted.extend(island.cpi for island in plan.islands)
            continue
        planned = {(island.name, island.cards, island.fabric) for island in plan.islands}
        have = islands_of[cluster.pk]
        differences = []
        if plan.chip.is_new or cluster.accelerator_id != plan.chip.accelerator.pk:  # type: ignore[union-attr]
            differences.append(_("another accelerator (the file gives %(chip)s)") % {"chip": plan.chip.slug})
        if cluster.site != plan.site:
            differences.append(
                _("site %(site)r (the file gives %(file_site)r)")
                % {"site": cluster.site, "file_site": plan.site}
            )
        if planned != have:
            differences.append(
                _(
                    "%(islands)d islands / %(cards)d cards (the file gives %(file_islands)d / %(file_cards)d, "
                    "or other names or fabrics)"
                )
                % {
                    "islands": len(have),
                    "cards": sum(c for _name, c, _fabric in have),
                    "file_islands": len(planned),
                    "file_cards": plan.cards,
                }
            )
        if differences:
            issues.add(
                plan.line,
                "cluster_differs",
                _(
                    "%(cpi)s already exists with %(differences)s. Change it through the cluster API; an import "
                    "only creates clusters or confirms them unchanged."
                )
                % {"cpi": plan.cpi, "differences": "; ".join(differences)},
                "cluster",
            )
        else:
            plan.existing = cluster

    taken: set[str] = set()
    for chunk in _chunks(wanted):
        taken.update(IssuedIdentifier.objects.filter(cpi__in=chunk).values_list("cpi", flat=True))
    if taken:
        for plan in plans:
            if plan.cpi in existing:
                continue
            mine = [cpi for cpi in [plan.cpi, *(island.cpi for island in plan.islands)] if cpi in taken]
            if mine:
                issues.add(
                    plan.line,
                    "identifier_taken",
                    _(
                        "%(identifiers)s was issued before and identifiers are never reused; name the cluster "
                        "differently (cluster column or prefix)."
                    )
                    % {"identifiers": ", ".join(mine[:5]) + (" ..." if len(mine) > 5 else "")},
                    "cluster",
                )


# --- Writing ----------------------------------------------------------------------------------------


def _write(
    *,
    plans: Sequence[_ClusterPlan],
    catalog: _Catalog,
    hubs: dict[str, Hub],
    actor: Actor,
    operator: Organisation,
) -> list[str]:
    """Insert the new accelerators, identifiers, clusters, islands and history rows. Returns created slugs."""
    new_plans = [plan for plan in plans if plan.existing is None]
    used = {id(plan.chip) for plan in new_plans}
    to_create = catalog.accelerators_to_create(used)
    if to_create:
        try:
            with transaction.atomic():
                Accelerator.objects.bulk_create([accelerator for _, accelerator in to_create])
        except IntegrityError as exc:
            raise ConflictError(
                _("The accelerator catalog changed during the import; retry it."),
                code="fleet_import_conflict",
            ) from exc
        by_slug = {a.slug: a for a in Accelerator.objects.filter(slug__in=[c.slug for c, _ in to_create])}
        for chip, _accelerator in to_create:
            chip.accelerator = by_slug[chip.slug]

    issued = []
    for plan in new_plans:
        issued.append(IssuedIdentifier(cpi=plan.cpi, kind=IssuedIdentifier.Kind.CLUSTER, operator=operator))
        issued.extend(
            IssuedIdentifier(cpi=island.cpi, kind=IssuedIdentifier.Kind.ISLAND, operator=operator)
            for island in plan.islands
        )
    try:
        # The savepoint keeps a PostgreSQL transaction usable when a concurrent import or registration
        # claimed one of these identifiers between the check and this insert.
        with transaction.atomic():
            IssuedIdentifier.objects.bulk_create(issued, batch_size=_BATCH)
    except IntegrityError as exc:
        raise IdentifierTakenError(
            _(
                "An identifier of this import was claimed concurrently; identifiers are never reused. "
                "Retry the import to see which."
            ),
        ) from exc

    clusters = [
        Cluster(
            operator=operator,
            cpi=plan.cpi,
            name=plan.name,
            hub=hubs[plan.hub],
            site=plan.site,
            accelerator=plan.chip.accelerator,
            status=ClusterStatus.ACTIVE,
            total_cards=plan.cards,
            available_cards=plan.cards,
        )
        for plan in new_plans
    ]
    Cluster.objects.bulk_create(clusters, batch_size=_BATCH)
    if any(cluster.pk is None for cluster in clusters):  # a backend that cannot return ids from bulk inserts
        ids: dict[str, int] = {}
        for chunk in _chunks([c.cpi for c in clusters]):
            ids.update(Cluster.objects.filter(cpi__in=chunk).values_list("cpi", "pk"))
        for cluster in clusters:
            cluster.pk = ids[cluster.cpi]

    Island.objects.bulk_create(
        [
            Island(
                cluster=cluster,
                cpi=island.cpi,
                name=island.name,
                cards=island.cards,
                fabric=island.fabric,
                available_cards=island.cards,
            )
            for plan, cluster in zip(new_plans, clusters, strict=True)
            for island in plan.islands
        ],
        batch_size=_BATCH,
    )
    now = timezone.now()
    user = actor.user if actor.user is not None and actor.user.pk else None
    ClusterStatusChange.objects.bulk_create(
        [
            ClusterStatusChange(
                cluster=cluster,
                from_status="",
                to_status=ClusterStatus.ACTIVE,
                changed_at=now,
                actor_user=user,
                actor_token=actor.token,
                actor_label=actor.label[:200],
                reason=STATUS_REASON,
            )
            for cluster in clusters
        ],
        batch_size=_BATCH,
    )
    return [chip.slug for chip, _ in to_create]


# --- The service ------------------------------------------------------------------------------------


@transaction.atomic
def fleet_import(
    *,
    actor: Actor,
    operator: Organisation,
    content: bytes | str,
    hub: str | None = None,
    site: str | None = None,
    cluster_prefix: str = "",
    nodes_per_island: int = DEFAULT_NODES_PER_ISLAND,
    fabric: str | None = None,
    allow_unknown_models: bool = False,
    dry_run: bool = False,
    source_name: str = "upload",
) -> FleetImportResult:
    """Import a fleet inventory CSV (``content``, UTF-8) into ``operator``'s clusters and islands.

    The rules — columns, model matching, cluster naming, island grouping, fabrics, identifiers, 0-card
    nodes — are in the module docstring. ``hub`` and ``site`` apply to rows without their own value;
    ``dry_run`` validates exactly as a real import (database comparison included) and writes nothing.
    New clusters are active with every card available (K2 = K1) and one status-history row "fleet import".

    Concurrent imports for one operator are serialised by a row lock on the operator. Raises
    InvalidInputError (bad options), PermissionDeniedError (not an operator, suspended, or an actor
    of another organisation: the operator is always the caller's), FleetImportError with
    ``extra = {"errors": [{"line", "code", "message", "field"}, ...] (first 1000), "error_count",
    "truncated"}``, IdentifierTakenError or ConflictError when a concurrent write claimed an identifier
    or catalog slug first. Writes nothing on any error.
    """
    # One import per operator at a time: the second waits for the first to commit and then reads its
    # clusters, identifiers and catalog entries (PostgreSQL READ COMMITTED reads per statement), so it
    # reports them unchanged instead of half-seeing them. SQLite serialises whole write transactions.
    Organisation.objects.select_for_update().filter(pk=operator.pk).values_list("pk", flat=True).first()
    # Only hubs the identifier grammar knows can appear in a CPI.
    hubs = {h.code: h for h in Hub.objects.filter(code__in=identifiers.HUB_CODES)}
    options = _check_options(
        actor=actor,
        operator=operator,
        hubs=hubs,
        hub=hub,
        site=site,
        cluster_prefix=cluster_prefix,
        nodes_per_island=nodes_per_island,
        fabric=fabric,
        allow_unknown_models=allow_unknown_models,
    )
    text = _decode(content)
    issues, warnings = _Issues(), _Issues()
    catalog = _Catalog(operator=operator, source_name=source_name[:100])
    nodes, rows, skipped = _parse_rows(
        text=text, options=options, hubs=hubs, catalog=catalog, issues=issues, warnings=warnings
    )
    plans = _plan_clusters(nodes=nodes, options=options, operator=operator, issues=issues)
    if issues:
        _raise_invalid(issues)
    _compare_with_database(plans=plans, operator=operator, issues=issues)
    if issues:
        _raise_invalid(issues)

    if not nodes:
        warnings.add(None, "no_nodes", _("The file lists no node with cards; nothing to import."))
    for plan in plans:
        if plan.existing is not None and plan.existing.status == ClusterStatus.RETIRED:
            warnings.add(
                plan.line,
                "cluster_retired",
                _("%(cpi)s is unchanged but retired.") % {"cpi": plan.cpi},
                "cluster",
            )

    if dry_run:
        used = {id(plan.chip) for plan in plans if plan.existing is None}
        created_slugs = [chip.slug for chip, _ in catalog.accelerators_to_create(used)]
    else:
        created_slugs = _write(plans=plans, catalog=catalog, hubs=hubs, actor=actor, operator=operator)
    return _result(
        operator=operator,
        dry_run=dry_run,
        plans=plans,
        rows=rows,
        skipped=skipped,
        accelerators_created=created_slugs,
        warnings=warnings,
    )


def _result(
    *,
    operator: Organisation,
    dry_run: bool,
    plans: Sequence[_ClusterPlan],
    rows: int,
    skipped: int,
    accelerators_created: Sequence[str],
    warnings: _Issues,
) -> FleetImportResult:
    totals: dict[str, dict[str, int]] = {}
    summaries = []
    for plan in plans:
        nodes = len(plan.nodes)
        entry = totals.setdefault(plan.chip.slug, {"nodes": 0, "cards": 0, "islands": 0, "clusters": 0})
        entry["nodes"] += nodes
        entry["cards"] += plan.cards
        entry["islands"] += len(plan.islands)
        entry["clusters"] += 1
        summaries.append(
            FleetImportClusterSummary(
                cpi=plan.cpi,
                hub=plan.hub,
                site=plan.site,
                accelerator=plan.chip.slug,
                outcome="unchanged" if plan.existing is not None else "created",
                nodes=nodes,
                cards=plan.cards,
                islands=len(plan.islands),
            )
        )
    created = [plan for plan in plans if plan.existing is None]
    unchanged = [plan for plan in plans if plan.existing is not None]
    return FleetImportResult(
        operator=operator.slug,
        dry_run=dry_run,
        rows=rows,
        nodes=sum(len(plan.nodes) for plan in plans),
        cards=sum(plan.cards for plan in plans),
        skipped_nodes=skipped,
        clusters_created=len(created),
        clusters_unchanged=len(unchanged),
        islands_created=sum(len(plan.islands) for plan in created),
        islands_unchanged=sum(len(plan.islands) for plan in unchanged),
        models=tuple(
            FleetImportModelTotal(accelerator=slug, **values) for slug, values in sorted(totals.items())
        ),
        clusters=tuple(sorted(summaries, key=lambda s: s.cpi)),
        accelerators_created=tuple(accelerators_created),
        warnings=tuple(warnings.listed()),
        warning_count=len(warnings.items),
    )
