"""Compute identifier grammar: tables of valid and invalid identifiers, levels, navigation, and
Hypothesis properties (format ∘ parse is the identity both ways; parse fails only with IdentifierError).

The strategies and the oracle regex below are written from the grammar in the module docstring, not
from federation.identifiers' own pattern, so a broken pattern is not mirrored by its tests."""

from __future__ import annotations

import re

import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from federation.identifiers import (
    HUB_CODES,
    MAX_LENGTH,
    ComputeIdentifier,
    IdentifierError,
    Level,
    format_identifier,
    is_valid,
    parse,
    validate_segment,
)

ALNUM = "abcdefghijklmnopqrstuvwxyz0123456789"
_ORACLE_SEGMENT = r"[a-z0-9](?:[a-z0-9-]{0,30}[a-z0-9])?"
_ORACLE_HUB = "|".join(["jjj", "yrd", "gba", "cy", "nmg", "gz", "gs", "nx", "ext"])
ORACLE = re.compile(
    rf"cpi:{_ORACLE_SEGMENT}(?::(?:{_ORACLE_HUB})(?::{_ORACLE_SEGMENT}(?::{_ORACLE_SEGMENT})?)?)?"
)

SEG32 = "a" * 30 + "z9"


def test_hub_codes_are_the_eight_national_hubs_plus_ext() -> None:
    assert HUB_CODES == ("jjj", "yrd", "gba", "cy", "nmg", "gz", "gs", "nx", "ext")
    assert MAX_LENGTH == 135


# --- valid table --------------------------------------------------------------------------------------

VALID = [
    ("cpi:cucc", ComputeIdentifier("cucc"), Level.OPERATOR),
    ("cpi:cucc:nx", ComputeIdentifier("cucc", "nx"), Level.HUB),
    ("cpi:cucc:nx:zw-ai01", ComputeIdentifier("cucc", "nx", "zw-ai01"), Level.CLUSTER),
    ("cpi:cucc:nx:zw-ai01:isl-03", ComputeIdentifier("cucc", "nx", "zw-ai01", "isl-03"), Level.ISLAND),
    ("cpi:a", ComputeIdentifier("a"), Level.OPERATOR),
    ("cpi:7", ComputeIdentifier("7"), Level.OPERATOR),
    ("cpi:a-b", ComputeIdentifier("a-b"), Level.OPERATOR),
    ("cpi:a--b", ComputeIdentifier("a--b"), Level.OPERATOR),
    ("cpi:0:ext:0:0", ComputeIdentifier("0", "ext", "0", "0"), Level.ISLAND),
    ("cpi:aliyun:gba:sz-h800-7:0001", ComputeIdentifier("aliyun", "gba", "sz-h800-7", "0001"), Level.ISLAND),
    (f"cpi:{SEG32}", ComputeIdentifier(SEG32), Level.OPERATOR),
    (
        f"cpi:{SEG32}:jjj:{SEG32}:{SEG32}",
        ComputeIdentifier(SEG32, "jjj", SEG32, SEG32),
        Level.ISLAND,
    ),
] + [(f"cpi:cmcc:{hub}", ComputeIdentifier("cmcc", hub), Level.HUB) for hub in HUB_CODES]


@pytest.mark.parametrize(("value", "expected", "level"), VALID, ids=[v[0][:40] for v in VALID])
def test_valid_identifiers_parse_to_exact_parts_and_level(
    value: str, expected: ComputeIdentifier, level: Level
) -> None:
    parsed = parse(value)

    assert parsed == expected
    assert parsed.level is level
    assert str(parsed) == value
    assert format_identifier(parsed) == value
    assert is_valid(value) is True


# --- invalid table ------------------------------------------------------------------------------------

INVALID = [
    # scheme
    ("", "bad_scheme"),
    ("cucc:nx", "bad_scheme"),
    ("CPI:cucc", "bad_scheme"),
    ("Cpi:cucc", "bad_scheme"),
    ("urn:cpi:cucc", "bad_scheme"),
    (" cpi:cucc", "bad_scheme"),
    ("cpi-cucc", "bad_scheme"),
    ("cpi", "bad_length"),
    # number of segments
    ("cpi:cucc:nx:zw-ai01:isl-03:x", "bad_length"),
    ("cpi:a:nx:b:c:d:e", "bad_length"),
    ("cpi:cucc:nx:zw-ai01:isl-03:", "bad_length"),
    # empty segments
    ("cpi:", "invalid_segment"),
    ("cpi:cucc:", "invalid_segment"),
    ("cpi:cucc:nx:", "invalid_segment"),
    ("cpi:cucc:nx:zw-ai01:", "invalid_segment"),
    ("cpi::nx", "invalid_segment"),
    ("cpi:cucc::zw-ai01", "invalid_segment"),
    ("cpi:cucc:nx::isl-03", "invalid_segment"),
    # upper case is rejected, not folded
    ("cpi:Cucc", "invalid_segment"),
    ("cpi:CUCC:nx", "invalid_segment"),
    ("cpi:cucc:NX", "invalid_segment"),
    ("cpi:cucc:nx:ZW-ai01", "invalid_segment"),
    ("cpi:cucc:nx:zw-ai01:Isl-03", "invalid_segment"),
    # hyphens at the edges
    ("cpi:-cucc", "invalid_segment"),
    ("cpi:cucc-", "invalid_segment"),
    ("cpi:-", "invalid_segment"),
    ("cpi:cucc:nx:-zw", "invalid_segment"),
    ("cpi:cucc:nx:zw-ai01:isl-03-", "invalid_segment"),
    # length of a segment
    ("cpi:" + "a" * 33, "invalid_segment"),
    ("cpi:cucc:nx:" + "b" * 33, "invalid_segment"),
    ("cpi:cucc:nx:zw:" + "c" * 33, "invalid_segment"),
    # characters outside a-z, 0-9, hyphen
    ("cpi:cu_cc", "invalid_segment"),
    ("cpi:cu.cc", "invalid_segment"),
    ("cpi:cucc/nx", "invalid_segment"),
    ("cpi:cucc:nx:zw+ai01", "invalid_segment"),
    # unicode look-alikes
    ("cpi:cücc", "invalid_segment"),
    ("cpi:ｃucc", "invalid_segment"),  # full-width c
    ("cpi:cucc:nx:zw\u2010ai01", "invalid_segment"),  # unicode hyphen
    ("cpi:cucc:nx:zw-ai０1", "invalid_segment"),  # full-width zero
    ("cpi:联通", "invalid_segment"),
    ("cpi:cucc:nx:zw-ai01:ı", "invalid_segment"),  # dotless i
    # whitespace
    ("cpi: cucc", "invalid_segment"),
    ("cpi:cucc ", "invalid_segment"),
    ("cpi:cu cc", "invalid_segment"),
    ("cpi:cucc\t", "invalid_segment"),
    ("cpi:cucc:nx:zw-ai01\r", "invalid_segment"),
    ("cpi:\ncucc", "invalid_segment"),
    ("cpi:cucc\x00", "invalid_segment"),
    # ``$`` would match before a trailing newline; the grammar must not.
    ("cpi:cucc\n", "invalid_segment"),
    ("cpi:cucc:nx:zw-ai01\n", "invalid_segment"),
    ("cpi:cucc:nx:zw-ai01:isl-03\n", "invalid_segment"),
    # hubs
    ("cpi:cucc:xx", "unknown_hub"),
    ("cpi:cucc:beijing:zw", "unknown_hub"),
    ("cpi:cucc:nx1", "unknown_hub"),
    ("cpi:cucc:zw-ai01:isl-03", "unknown_hub"),
    # overall length is checked first
    ("cpi:" + "a" * (MAX_LENGTH - 3), "too_long"),
    ("x" * (MAX_LENGTH + 1), "too_long"),
    ("cpi:cucc:nx:" + ":".join(["a" * 32] * 5), "too_long"),
]


@pytest.mark.parametrize(("value", "reason"), INVALID)
def test_invalid_identifiers_are_rejected_with_a_reason(value: str, reason: str) -> None:
    with pytest.raises(IdentifierError) as excinfo:
        parse(value)

    assert excinfo.value.reason == reason
    assert excinfo.value.value == value
    assert isinstance(excinfo.value, ValueError)
    assert is_valid(value) is False


def test_longest_possible_identifier_is_within_max_length() -> None:
    value = f"cpi:{SEG32}:jjj:{SEG32}:{SEG32}"
    assert len(value) == 106 < MAX_LENGTH
    assert is_valid(value)


@pytest.mark.parametrize("value", [None, 42, b"cpi:cucc", ["cpi", "cucc"]])
def test_parse_rejects_non_strings(value: object) -> None:
    with pytest.raises(IdentifierError) as excinfo:
        parse(value)  # type: ignore[arg-type]

    assert excinfo.value.reason == "not_a_string"


def test_error_message_names_the_value_and_the_segment() -> None:
    with pytest.raises(IdentifierError) as excinfo:
        parse("cpi:cucc:nx:ZW")

    assert excinfo.value.detail.startswith("cluster segment 'ZW'")
    assert str(excinfo.value).startswith("'cpi:cucc:nx:ZW' is not a compute identifier: cluster segment")


# --- validate_segment ---------------------------------------------------------------------------------


@pytest.mark.parametrize("segment", ["a", "0", "isl-03", "a--b", SEG32])
def test_validate_segment_accepts_and_returns_good_segments(segment: str) -> None:
    assert validate_segment(segment) == segment


@pytest.mark.parametrize("segment", ["", "-a", "a-", "A", "a b", "a:b", "a_b", "a" * 33, "é"])
def test_validate_segment_rejects_bad_segments(segment: str) -> None:
    with pytest.raises(IdentifierError) as excinfo:
        validate_segment(segment, what="island")

    assert excinfo.value.reason == "invalid_segment"
    assert excinfo.value.detail.startswith("island must be")


def test_validate_segment_rejects_a_trailing_newline() -> None:
    with pytest.raises(IdentifierError):
        validate_segment("isl-03\n")


# --- levels and navigation ----------------------------------------------------------------------------


def test_level_order() -> None:
    assert Level.OPERATOR < Level.HUB < Level.CLUSTER < Level.ISLAND
    assert [int(level) for level in Level] == [1, 2, 3, 4]


@pytest.mark.parametrize(
    ("parts", "message"),
    [
        (("cucc", None, "zw-ai01"), "gap"),
        (("cucc", None, None, "isl-03"), "gap"),
        (("cucc", "nx", None, "isl-03"), "gap"),
    ],
)
def test_identifier_with_a_gap_cannot_be_built(parts: tuple[str | None, ...], message: str) -> None:
    with pytest.raises(IdentifierError) as excinfo:
        ComputeIdentifier(*parts)  # type: ignore[arg-type]

    assert excinfo.value.reason == message


def test_cluster_identifier_of_an_island_and_of_a_cluster() -> None:
    island = parse("cpi:cucc:nx:zw-ai01:isl-03")
    cluster = parse("cpi:cucc:nx:zw-ai01")

    assert island.cluster_identifier == cluster
    assert str(island.cluster_identifier) == "cpi:cucc:nx:zw-ai01"
    assert cluster.cluster_identifier == cluster
    assert cluster.cluster_identifier.level is Level.CLUSTER


@pytest.mark.parametrize("value", ["cpi:cucc", "cpi:cucc:nx"])
def test_cluster_identifier_of_a_prefix_is_an_error(value: str) -> None:
    with pytest.raises(IdentifierError) as excinfo:
        _ = parse(value).cluster_identifier

    assert excinfo.value.reason == "not_a_cluster"


@pytest.mark.parametrize(
    ("parent", "segment", "expected", "level"),
    [
        ("cpi:cucc", "nx", "cpi:cucc:nx", Level.HUB),
        ("cpi:cucc", "ext", "cpi:cucc:ext", Level.HUB),
        ("cpi:cucc:nx", "zw-ai01", "cpi:cucc:nx:zw-ai01", Level.CLUSTER),
        ("cpi:cucc:nx:zw-ai01", "isl-03", "cpi:cucc:nx:zw-ai01:isl-03", Level.ISLAND),
    ],
)
def test_child_goes_one_level_down(parent: str, segment: str, expected: str, level: Level) -> None:
    child = parse(parent).child(segment)

    assert child == parse(expected)
    assert str(child) == expected
    assert child.level is level


@pytest.mark.parametrize(
    ("parent", "segment", "reason"),
    [
        ("cpi:cucc", "xx", "unknown_hub"),
        ("cpi:cucc", "NX", "invalid_segment"),
        ("cpi:cucc:nx", "", "invalid_segment"),
        ("cpi:cucc:nx", "zw:ai01", "invalid_segment"),
        ("cpi:cucc:nx:zw-ai01", "isl-03-", "invalid_segment"),
        ("cpi:cucc:nx:zw-ai01", "i" * 33, "invalid_segment"),
        ("cpi:cucc:nx:zw-ai01:isl-03", "x", "too_deep"),
    ],
)
def test_child_rejects_bad_segments_and_islands(parent: str, segment: str, reason: str) -> None:
    with pytest.raises(IdentifierError) as excinfo:
        parse(parent).child(segment)

    assert excinfo.value.reason == reason


# --- Hypothesis properties ----------------------------------------------------------------------------

alnum = st.sampled_from(ALNUM)
segments = st.one_of(
    alnum,
    st.builds(lambda a, mid, b: a + mid + b, alnum, st.text(alphabet=ALNUM + "-", max_size=30), alnum),
)
hubs = st.sampled_from(HUB_CODES)


@st.composite
def compute_identifiers(draw: st.DrawFn) -> ComputeIdentifier:
    depth = draw(st.integers(min_value=1, max_value=4))
    parts: list[str | None] = [
        draw(segments),
        draw(hubs) if depth >= 2 else None,
        draw(segments) if depth >= 3 else None,
        draw(segments) if depth >= 4 else None,
    ]
    return ComputeIdentifier(*parts)


# Strings that are often, but not always, identifiers: near misses are where a grammar goes wrong.
noise = st.sampled_from(["", "-", "A", " ", "\n", "\t", "_", ":", "é", "\x00", "ｃ", "a" * 31])
near_segments = st.one_of(
    segments, hubs, st.builds(lambda s, n: s + n, segments, noise), noise, st.text(max_size=4)
)
near_identifiers = st.builds(
    lambda scheme, parts, tail: scheme + ":".join(parts) + tail,
    st.sampled_from(["cpi:", "cpi:", "cpi:", "CPI:", "cpi", "", "cpi::"]),
    st.lists(near_segments, min_size=0, max_size=6),
    st.sampled_from(["", "", "", ":", "\n", " "]),
)


@given(compute_identifiers())
@settings(max_examples=500)
def test_property_parse_of_format_is_identity(identifier: ComputeIdentifier) -> None:
    text = format_identifier(identifier)

    assert str(identifier) == text
    assert parse(text) == identifier
    assert parse(text).level == Level(sum(p is not None for p in [*vars(identifier).values()]))


@given(st.one_of(near_identifiers, compute_identifiers().map(str), st.text()))
@settings(max_examples=1000)
@example("cpi:cucc:nx:zw-ai01:isl-03")
def test_property_format_of_parse_is_identity(value: str) -> None:
    try:
        identifier = parse(value)
    except IdentifierError:
        return
    assert format_identifier(identifier) == value


@given(st.one_of(near_identifiers, compute_identifiers().map(str), st.text()))
@settings(max_examples=1000)
@example("cpi:cucc\n")
def test_property_parse_accepts_exactly_the_grammar(value: str) -> None:
    assert is_valid(value) == (ORACLE.fullmatch(value) is not None)


@given(
    st.one_of(
        st.text(),
        near_identifiers,
        st.binary(),
        st.integers(),
        st.none(),
        st.lists(st.text(max_size=3)),
    )
)
@settings(max_examples=1000)
def test_property_parse_raises_only_identifier_error(value: object) -> None:
    try:
        result = parse(value)  # type: ignore[arg-type]
    except IdentifierError as exc:
        assert exc.reason in {
            "not_a_string",
            "too_long",
            "bad_scheme",
            "bad_length",
            "invalid_segment",
            "unknown_hub",
        }
    else:
        assert isinstance(result, ComputeIdentifier)
        assert isinstance(value, str)
        assert len(value) <= MAX_LENGTH
