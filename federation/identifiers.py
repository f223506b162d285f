"""Compute identifiers (CPI): the standardized, stable names of operators' resources.

Grammar (ABNF-like; every segment lowercase)::

    cpi       = "cpi:" operator [ ":" hub [ ":" cluster [ ":" island ] ] ]
    operator  = segment            ; the operator organisation's slug
    hub       = "jjj" / "yrd" / "gba" / "cy" / "nmg" / "gz" / "gs" / "nx" / "ext"
    cluster   = segment
    island    = segment
    segment   = alnum [ *30( alnum / "-" ) alnum ]   ; 1–32 characters, no leading/trailing hyphen
    alnum     = %x61-7A / %x30-39                      ; a–z, 0–9

A *full* identifier names a cluster (4 segments) or an island (5 segments); shorter ones are prefixes
used for hierarchical resolution. Identifiers are case-sensitive: upper case is rejected, not folded,
so one resource has exactly one spelling. Once issued an identifier is never reused, even after its
resource is retired (federation.models.IssuedIdentifier).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from enum import IntEnum

from django.utils.translation import gettext as _

SCHEME = "cpi"
SEGMENT_PATTERN = r"[a-z0-9](?:[a-z0-9-]{0,30}[a-z0-9])?"
_SEGMENT_RE = re.compile(SEGMENT_PATTERN)
MAX_LENGTH = len(SCHEME) + 4 * (1 + 32)

# The eight national computing hubs of East Data West Computing, plus `ext` for anything else.
HUB_CODES = ("jjj", "yrd", "gba", "cy", "nmg", "gz", "gs", "nx", "ext")

# The grammar as anchored regular expressions (ECMA-262 compatible), for the OpenAPI schema.
_HUB_PATTERN = "(?:" + "|".join(HUB_CODES) + ")"
SEGMENT_REGEX = f"^{SEGMENT_PATTERN}$"
CLUSTER_CPI_REGEX = f"^{SCHEME}:{SEGMENT_PATTERN}:{_HUB_PATTERN}:{SEGMENT_PATTERN}$"
CPI_REGEX = f"^{SCHEME}:{SEGMENT_PATTERN}(?::{_HUB_PATTERN}(?::{SEGMENT_PATTERN}(?::{SEGMENT_PATTERN})?)?)?$"


class Level(IntEnum):
    OPERATOR = 1
    HUB = 2
    CLUSTER = 3
    ISLAND = 4


class IdentifierError(ValueError):
    """A string that is not a compute identifier. ``reason`` is a stable code."""

    def __init__(self, value: str, reason: str, detail: str):
        super().__init__(
            _("%(value)r is not a compute identifier: %(detail)s") % {"value": value, "detail": detail}
        )
        self.value = value
        self.reason = reason
        self.detail = detail


@dataclass(frozen=True)
class ComputeIdentifier:
    operator: str
    hub: str | None = None
    cluster: str | None = None
    island: str | None = None

    def __post_init__(self) -> None:
        segments = [self.operator, self.hub, self.cluster, self.island]
        seen_none = False
        for segment in segments:
            if segment is None:
                seen_none = True
            elif seen_none:
                raise IdentifierError(str(segments), "gap", "a segment follows a missing one")

    @property
    def level(self) -> Level:
        if self.island is not None:
            return Level.ISLAND
        if self.cluster is not None:
            return Level.CLUSTER
        if self.hub is not None:
            return Level.HUB
        return Level.OPERATOR

    @property
    def cluster_identifier(self) -> ComputeIdentifier:
        """The identifier of the cluster this one names or lies in (levels CLUSTER and ISLAND)."""
        if self.level < Level.CLUSTER:
            raise IdentifierError(str(self), "not_a_cluster", "it names no cluster")
        return ComputeIdentifier(self.operator, self.hub, self.cluster)

    def child(self, segment: str) -> ComputeIdentifier:
        """The identifier one level down, e.g. an island of this cluster. Validates ``segment``."""
        validate_segment(segment)
        if self.hub is None:
            return parse(f"{self}:{segment}")
        if self.cluster is None:
            return ComputeIdentifier(self.operator, self.hub, segment)
        if self.island is None:
            return ComputeIdentifier(self.operator, self.hub, self.cluster, segment)
        raise IdentifierError(str(self), "too_deep", "an island has no children")

    def __str__(self) -> str:
        return format_identifier(self)


def validate_segment(segment: str, *, what: str = "segment") -> str:
    if not isinstance(segment, str) or not _SEGMENT_RE.fullmatch(segment):
        raise IdentifierError(
            segment,
            "invalid_segment",
            _("%(what)s must be 1–32 characters of a–z, 0–9 and inner hyphens") % {"what": what},
        )
    return segment


def parse(value: str) -> ComputeIdentifier:
    """Parse ``value``; raises IdentifierError with a reason code on anything off-grammar."""
    if not isinstance(value, str):
        raise IdentifierError(repr(value), "not_a_string", _("not a string"))
    if len(value) > MAX_LENGTH:
        raise IdentifierError(value, "too_long", _("longer than %(max)d characters") % {"max": MAX_LENGTH})
    parts = value.split(":")
    if parts[0] != SCHEME:
        raise IdentifierError(value, "bad_scheme", _("must start with '%(scheme)s:'") % {"scheme": SCHEME})
    segments = parts[1:]
    if not 1 <= len(segments) <= 4:
        raise IdentifierError(value, "bad_length", _("needs 1 to 4 segments after 'cpi:'"))
    names = ("operator", "hub", "cluster", "island")
    for name, segment in zip(names, segments, strict=False):
        try:
            validate_segment(segment, what=name)
        except IdentifierError as exc:
            raise IdentifierError(
                value,
                "invalid_segment",
                _("%(name)s segment %(segment)r: %(detail)s")
                % {"name": name, "segment": segment, "detail": exc.detail},
            ) from None
    if len(segments) >= 2 and segments[1] not in HUB_CODES:
        raise IdentifierError(
            value, "unknown_hub", _("hub must be one of %(hubs)s") % {"hubs": ", ".join(HUB_CODES)}
        )
    padded: list[str | None] = [*segments, None, None, None]
    return ComputeIdentifier(segments[0], padded[1], padded[2], padded[3])


def format_identifier(identifier: ComputeIdentifier) -> str:
    segments = [identifier.operator, identifier.hub, identifier.cluster, identifier.island]
    return ":".join([SCHEME, *[s for s in segments if s is not None]])


def is_segment(value: str) -> bool:
    """``value`` is one segment (what validate_segment accepts), without building its error."""
    return isinstance(value, str) and _SEGMENT_RE.fullmatch(value) is not None


def is_valid(value: str) -> bool:
    try:
        parse(value)
    except IdentifierError:
        return False
    return True
