"""Bulk onboarding (federation.fleet_import): good imports, a table of bad rows by line number and code,
idempotent and differing re-imports, unknown models, the command, and the REST endpoint."""

from __future__ import annotations

from io import StringIO
from pathlib import Path
from typing import Any

import pytest
from django.core.files.uploadedfile import SimpleUploadedFile
from django.core.management import CommandError, call_command

from core.errors import InvalidInputError, PermissionDeniedError
from core.models import Organisation
from core.types import Actor
from federation.errors import FleetImportError
from federation.fleet_import import FleetImportResult, cluster_name_derive, fleet_import
from federation.models import Accelerator, Cluster, ClusterStatusChange, Island, IssuedIdentifier
from tests.factories import BuyerFactory, OperatorFactory, make_cluster

pytestmark = pytest.mark.django_db

# The endpoint's own URLconf, until the lead includes federation.api.fleet under /api/v1/.
URL = "/api/v1/fleet-imports"

HEADER = "gpu_model,gpu_capacity_num,cpu_num,node_name\n"
# 5 A800 nodes of 8 cards and 3 A10 nodes of 1 card, interleaved as real inventories are.
GOOD = HEADER + (
    "A800-SXM4-80GB,8,128,n1\n"
    "A10,1,64,n2\n"
    "a800-sxm4-80gb,8,128,n3\n"  # aliases match case-insensitively
    "A800-SXM4-80GB,8,128,n4\n"
    "A10,1,64,n5\n"
    "nvidia-a800-sxm4-80gb,8,128,n6\n"  # so does the slug
    "A800 SXM4 80GB,8,128,n7\n"  # the model name as the datasheet spells it
    "A10,1,64,n8\n"
)
A800_CPI = "cpi:cucc:nx:zhongwei-a800-sxm4-80gb"
A10_CPI = "cpi:cucc:nx:zhongwei-a10"


def run(operator: Organisation, content: bytes | str, **options: Any) -> FleetImportResult:
    options.setdefault("hub", "nx")
    options.setdefault("site", "Zhongwei")
    return fleet_import(
        actor=Actor(organisation=operator, system_label="test"), operator=operator, content=content, **options
    )


def counts() -> tuple[int, int, int, int, int]:
    return (
        Cluster.objects.count(),
        Island.objects.count(),
        IssuedIdentifier.objects.count(),
        ClusterStatusChange.objects.count(),
        Accelerator.objects.count(),
    )


def islands_of(cpi: str) -> list[tuple[str, int, str, int]]:
    return list(
        Island.objects.filter(cluster__cpi=cpi)
        .order_by("name")
        .values_list("name", "cards", "fabric", "available_cards")
    )


def errors_of(excinfo: pytest.ExceptionInfo[FleetImportError]) -> list[tuple[int | None, str]]:
    return [(error["line"], error["code"]) for error in excinfo.value.extra["errors"]]


# --- Good imports -------------------------------------------------------------------------------------


def test_good_import_creates_exact_clusters_islands_and_history(operator):
    result = run(operator, GOOD, nodes_per_island=2)

    assert (result.nodes, result.cards, result.rows, result.skipped_nodes) == (8, 43, 8, 0)
    assert (result.clusters_created, result.clusters_unchanged) == (2, 0)
    assert result.islands_created == 5
    assert {(m.accelerator, m.nodes, m.cards, m.islands, m.clusters) for m in result.models} == {
        ("nvidia-a800-sxm4-80gb", 5, 40, 3, 1),
        ("nvidia-a10", 3, 3, 2, 1),
    }
    assert [(c.cpi, c.outcome, c.cards, c.islands) for c in result.clusters] == [
        (A10_CPI, "created", 3, 2),
        (A800_CPI, "created", 40, 3),
    ]
    # NVLink chips: several nodes are joined by InfiniBand; a one-node island keeps NVLink.
    assert islands_of(A800_CPI) == [
        ("isl-001", 16, "infiniband", 16),
        ("isl-002", 16, "infiniband", 16),
        ("isl-003", 8, "nvlink", 8),
    ]
    assert islands_of(A10_CPI) == [("isl-001", 2, "pcie", 2), ("isl-002", 1, "pcie", 1)]
    cluster = Cluster.objects.select_related("hub", "accelerator").get(cpi=A800_CPI)
    assert (cluster.operator_id, cluster.hub.code, cluster.site, cluster.name) == (
        operator.pk,
        "nx",
        "Zhongwei",
        "zhongwei-a800-sxm4-80gb",
    )
    assert (cluster.status, cluster.total_cards, cluster.available_cards) == ("active", 40, 40)
    assert IssuedIdentifier.objects.filter(operator=operator).count() == 2 + 5
    changes = ClusterStatusChange.objects.filter(cluster__operator=operator)
    assert sorted(changes.values_list("from_status", "to_status", "reason", "actor_label")) == [
        ("", "active", "fleet import", "test"),
        ("", "active", "fleet import", "test"),
    ]


def test_default_island_is_32_nodes_in_file_order(operator):
    rows = "".join(f"H800-SXM5-80GB,8,128,node-{i}\n" for i in range(70))
    run(operator, HEADER + rows)

    assert islands_of("cpi:cucc:nx:zhongwei-h800-sxm5-80gb") == [
        ("isl-001", 256, "infiniband", 256),
        ("isl-002", 256, "infiniband", 256),
        ("isl-003", 48, "infiniband", 48),
    ]


def test_columns_override_options_per_row(operator):
    content = (
        "Node,Model,GPUs,Hub,Site,Fabric,cluster\n"  # other header names and case
        "a,H800-SXM5-80GB,8,gba,Shaoguan,,\n"
        "b,H800-SXM5-80GB,8,gba,Shaoguan,,\n"
        "c,H800-SXM5-80GB,8,,,roce,\n"  # falls back to the options (nx, Zhongwei), own fabric
        "d,910B3,8,gz,Gui'an,,ga-ascend\n"
        "e,910B3,8,gz,Gui'an,,ga-ascend\n"
    )
    result = run(operator, content, cluster_prefix="cu")

    assert sorted(c.cpi for c in result.clusters) == [
        "cpi:cucc:gba:cu-shaoguan-h800-sxm5-80gb",
        "cpi:cucc:gz:ga-ascend",
        "cpi:cucc:nx:cu-zhongwei-h800-sxm5-80gb",
    ]
    assert islands_of("cpi:cucc:nx:cu-zhongwei-h800-sxm5-80gb") == [("isl-001", 8, "roce", 8)]
    # HCCS chips: several nodes are joined by RoCE.
    assert islands_of("cpi:cucc:gz:ga-ascend") == [("isl-001", 16, "roce", 16)]
    assert Cluster.objects.get(cpi="cpi:cucc:gz:ga-ascend").site == "Gui'an"


def test_island_column_names_islands_and_fabric_option_applies(operator):
    content = "model,cards,hostname,island\nH800-SXM5-80GB,8,a,pod-a\nH800-SXM5-80GB,8,b,pod-b\nH800-SXM5-80GB,8,c,pod-a\n"
    run(operator, content, fabric="roce", nodes_per_island=1)

    assert islands_of("cpi:cucc:nx:zhongwei-h800-sxm5-80gb") == [
        ("pod-a", 16, "roce", 16),
        ("pod-b", 8, "roce", 8),
    ]


def test_zero_card_nodes_are_skipped_with_a_warning(operator):
    content = HEADER + "A10,1,64,n1\n,0,64,cpu-node\nA10,0,64,n3\n"

    result = run(operator, content)

    assert (result.nodes, result.cards, result.skipped_nodes, result.rows) == (1, 1, 2, 3)
    assert [(w.line, w.code) for w in result.warnings] == [(3, "zero_cards"), (4, "zero_cards")]


def test_cluster_names_are_deterministic_valid_segments():
    short = cluster_name_derive(
        prefix="", site="Zhongwei", accelerator_slug="nvidia-a800-sxm4-80gb", vendor="NVIDIA"
    )
    assert short == "zhongwei-a800-sxm4-80gb"
    long_site = "Ulanqab Jining District Data Centre Park"
    first = cluster_name_derive(
        prefix="cu", site=long_site, accelerator_slug="nvidia-h800-sxm5-80gb", vendor="NVIDIA"
    )
    again = cluster_name_derive(
        prefix="cu", site=long_site, accelerator_slug="nvidia-h800-sxm5-80gb", vendor="NVIDIA"
    )
    other = cluster_name_derive(prefix="cu", site=long_site, accelerator_slug="nvidia-h20", vendor="NVIDIA")
    assert first == again and first != other
    assert len(first) == 32 and first.startswith("cu-ulanqab-h800-sxm5-80gb-")
    assert other.startswith("cu-ulanqab-jining-dis-h20-")
    chinese = cluster_name_derive(prefix="", site="中卫", accelerator_slug="nvidia-a10", vendor="NVIDIA")
    assert chinese.startswith("site-") and chinese.endswith("-a10")


# --- Bad rows: reported by line, nothing written ------------------------------------------------------


BAD_ROWS = [
    pytest.param(HEADER + "A10,1,64,n1\nX9,8,64,n2\n", {}, [(3, "unknown_model")], id="unknown_model"),
    pytest.param(HEADER + "A10,eight,64,n1\n", {}, [(2, "bad_card_count")], id="cards-not-a-number"),
    pytest.param(HEADER + "A10,-1,64,n1\n", {}, [(2, "bad_card_count")], id="cards-negative"),
    pytest.param(HEADER + "A10,1.5,64,n1\n", {}, [(2, "bad_card_count")], id="cards-fraction"),
    pytest.param(HEADER + "A10,100000,64,n1\n", {}, [(2, "bad_card_count")], id="cards-too-many"),
    pytest.param(
        "gpu_model,gpu_capacity_num,cpu_num\nA10,1,64\n", {}, [(1, "missing_column")], id="no-node-column"
    ),
    pytest.param("hostname,gpus\nn1,1\n", {}, [(1, "missing_column")], id="no-model-column"),
    pytest.param(
        "model,gpu_model,gpu,sn\nA10,A10,1,n1\n", {}, [(1, "ambiguous_column")], id="ambiguous_column"
    ),
    pytest.param(
        "model,gpu,sn,hub\nA10,1,n1,nx\nA10,1,n2,xx\n", {}, [(3, "unknown_hub")], id="unknown_hub-column"
    ),
    pytest.param(HEADER + "A10,1,64,n1\n", {"hub": None}, [(1, "missing_column")], id="no-hub"),
    pytest.param(HEADER + "A10,1,64,n1\n", {"site": ""}, [(1, "missing_column")], id="no-site"),
    pytest.param(
        "model,gpu,sn,hub,site\nA10,1,n1,,\n",
        {"hub": None, "site": None},
        [(2, "missing_value"), (2, "missing_value")],
        id="blank-hub-and-site-cells-without-options",
    ),
    pytest.param("model,gpu,sn\nA10,1," + "x" * 200_000 + "\n", {}, [(2, "bad_csv")], id="bad_csv"),
    pytest.param(
        "model,gpu,sn,cluster\nA10,1,n1,ZW_AI01\nA10,1,n2,-zw\n",
        {},
        [(2, "invalid_segment"), (3, "invalid_segment")],
        id="invalid_segment-cluster",
    ),
    pytest.param(
        "model,gpu,sn,island\nA10,1,n1,isl:1\n", {}, [(2, "invalid_segment")], id="invalid_segment-island"
    ),
    pytest.param(
        HEADER + "A10,1,64,n1\nA10,1,64,n2\nA10,1,64,n1\n", {}, [(4, "duplicate_node")], id="duplicate_node"
    ),
    pytest.param(HEADER + "A10,1,64,\n", {}, [(2, "missing_value")], id="no-node-name"),
    pytest.param(HEADER + ",1,64,n1\n", {}, [(2, "missing_value")], id="no-model"),
    pytest.param(
        HEADER + "A10,1,64,n1,extra\nA10,1\n",
        {},
        [(2, "bad_field_count"), (3, "bad_field_count")],
        id="bad_field_count",
    ),
    pytest.param("model,gpu,sn,fabric\nA10,1,n1,ethernet\n", {}, [(2, "bad_fabric")], id="bad_fabric"),
    pytest.param(HEADER + "A10,1,64,n1\n", {"site": "x" * 101}, None, id="site-option-too-long"),
    pytest.param(
        "model,gpu,sn,site\nA10,1,n1," + "x" * 101 + "\n", {}, [(2, "value_too_long")], id="site-too-long"
    ),
    pytest.param(
        "model,gpu,sn,cluster\nA10,1,n1,zw\nH800-SXM5-80GB,8,n2,zw\n",
        {},
        [(3, "cluster_conflict")],
        id="cluster-two-models",
    ),
    pytest.param(
        "model,gpu,sn,site\nA10,1,n1,Zhongwei\nA10,1,n2,zhongwei\n",
        {},
        [(3, "cluster_conflict")],
        id="cluster-two-sites-one-name",
    ),
    pytest.param(
        "model,gpu,sn,island,fabric\nH800-SXM5-80GB,8,n1,pod,infiniband\nH800-SXM5-80GB,8,n2,pod,roce\n",
        {},
        [(3, "island_conflict")],
        id="island-two-fabrics",
    ),
    pytest.param("", {}, [(1, "empty_file")], id="empty_file"),
    pytest.param(
        b"gpu_model,gpus,sn\nA10,1,n1\nA1\xff0,1,n2\n", {}, [(3, "bad_encoding")], id="bad_encoding"
    ),
    pytest.param(
        # Blank lines and a quoted field spanning two lines still give physical line numbers.
        HEADER + '\nA10,1,64,"n\n1"\n\nX9,1,64,n2\nA10,x,64,n3\n',
        {},
        [(6, "unknown_model"), (7, "bad_card_count")],
        id="line-numbers-are-physical",
    ),
    pytest.param(
        HEADER + "X9,zero,64,n1\n",
        {},
        [(2, "bad_card_count"), (2, "unknown_model")],
        id="every-error-of-a-row",
    ),
]


@pytest.mark.parametrize(("content", "options", "expected"), BAD_ROWS)
def test_bad_rows_are_reported_by_line_and_nothing_is_written(operator, content, options, expected):
    make_cluster(operator=operator)  # something already there must stay exactly as it is
    before = counts()

    if expected is None:
        with pytest.raises(InvalidInputError):
            run(operator, content, **options)
    else:
        with pytest.raises(FleetImportError) as excinfo:
            run(operator, content, **options)
        assert excinfo.value.code == "fleet_import_invalid"
        assert sorted(errors_of(excinfo)) == sorted(expected)
        assert excinfo.value.extra["error_count"] == len(expected)
        assert all(error["message"] for error in excinfo.value.extra["errors"])
    assert counts() == before


def test_bad_rows_anywhere_block_the_good_ones(operator):
    content = GOOD + "X9,8,128,n99\n"

    with pytest.raises(FleetImportError) as excinfo:
        run(operator, content)

    assert errors_of(excinfo) == [(10, "unknown_model")]
    assert counts()[:4] == (0, 0, 0, 0)


def test_too_many_rows(operator, settings):
    settings.CARDHOUR_FLEET_IMPORT_MAX_ROWS = 2
    with pytest.raises(FleetImportError) as excinfo:
        run(operator, GOOD)
    assert errors_of(excinfo) == [(4, "too_many_rows")]


def test_too_many_islands(operator, settings):
    settings.CARDHOUR_MAX_ISLANDS_PER_CLUSTER = 2
    with pytest.raises(FleetImportError) as excinfo:
        run(operator, GOOD, nodes_per_island=1)
    assert errors_of(excinfo) == [(2, "too_many_islands"), (3, "too_many_islands")]


def test_errors_are_capped_with_a_total(operator):
    content = HEADER + "".join(f"X9,1,1,n{i}\n" for i in range(1500))

    with pytest.raises(FleetImportError) as excinfo:
        run(operator, content)

    extra = excinfo.value.extra
    assert (len(extra["errors"]), extra["error_count"], extra["truncated"]) == (1000, 1500, True)
    assert extra["errors"][0]["line"] == 2 and extra["errors"][-1]["line"] == 1001


@pytest.mark.parametrize(
    ("options", "field"),
    [
        ({"hub": "zz"}, "hub"),
        ({"nodes_per_island": 0}, "nodes_per_island"),
        ({"fabric": "ethernet"}, "fabric"),
        ({"cluster_prefix": "Bad_Prefix"}, "cluster_prefix"),
    ],
)
def test_bad_options(operator, options, field):
    with pytest.raises(InvalidInputError) as excinfo:
        run(operator, GOOD, **options)
    assert field in excinfo.value.extra["fields"]
    assert counts()[:4] == (0, 0, 0, 0)


# --- Re-imports and identifiers -----------------------------------------------------------------------


def test_reimport_of_the_same_file_is_unchanged_and_writes_nothing(operator):
    run(operator, GOOD, nodes_per_island=2)
    before = counts()

    again = run(operator, GOOD, nodes_per_island=2)

    assert (again.clusters_created, again.clusters_unchanged, again.islands_created) == (0, 2, 0)
    assert again.islands_unchanged == 5 and again.cards == 43
    assert {c.outcome for c in again.clusters} == {"unchanged"}
    assert counts() == before


def test_reimport_adds_new_clusters_and_keeps_existing_ones(operator):
    run(operator, HEADER + "A10,1,64,n1\n")

    result = run(operator, HEADER + "A10,1,64,n1\nH800-SXM5-80GB,8,128,n2\n")

    assert sorted((c.cpi, c.outcome) for c in result.clusters) == [
        (A10_CPI, "unchanged"),
        ("cpi:cucc:nx:zhongwei-h800-sxm5-80gb", "created"),
    ]
    assert Cluster.objects.count() == 2


@pytest.mark.parametrize(
    ("content", "options"),
    [
        pytest.param(GOOD + "A800-SXM4-80GB,8,128,n9\n", {"nodes_per_island": 2}, id="more-nodes"),
        pytest.param(GOOD, {"nodes_per_island": 3}, id="other-grouping"),
        pytest.param(GOOD, {"nodes_per_island": 2, "fabric": "roce"}, id="other-fabric"),
    ],
)
def test_reimport_that_differs_is_rejected_and_writes_nothing(operator, content, options):
    run(operator, GOOD, nodes_per_island=2)
    before = counts()

    with pytest.raises(FleetImportError) as excinfo:
        run(operator, content + "H800-SXM5-80GB,8,128,n50\n", **options)

    assert "cluster_differs" in {code for _, code in errors_of(excinfo)}
    assert (2, "cluster_differs") in errors_of(excinfo)  # the first A800 row
    assert counts() == before
    assert not Cluster.objects.filter(cpi="cpi:cucc:nx:zhongwei-h800-sxm5-80gb").exists()


def test_existing_cluster_with_another_site_differs(operator):
    make_cluster(
        operator=operator,
        name="zhongwei-a10",
        accelerator="nvidia-a10",
        islands=[("isl-001", 1)],
        fabric="pcie",
        site="Elsewhere",
    )
    with pytest.raises(FleetImportError) as excinfo:
        run(operator, HEADER + "A10,1,64,n1\n")
    assert errors_of(excinfo) == [(2, "cluster_differs")]


def test_registered_cluster_identical_to_the_import_is_unchanged(operator):
    make_cluster(
        operator=operator,
        name="zhongwei-a10",
        accelerator="nvidia-a10",
        islands=[("isl-001", 2)],
        fabric="pcie",
        site="Zhongwei",
    )
    result = run(operator, HEADER + "A10,1,64,n1\nA10,1,64,n2\n")
    assert (result.clusters_created, result.clusters_unchanged) == (0, 1)


def test_identifier_issued_before_is_never_reused(operator):
    # A cluster removed by hand leaves its identifiers issued.
    IssuedIdentifier.objects.create(cpi=f"{A10_CPI}:isl-001", kind="island", operator=operator)
    before = counts()

    with pytest.raises(FleetImportError) as excinfo:
        run(operator, GOOD)

    assert errors_of(excinfo) == [(3, "identifier_taken")]
    assert counts() == before


def test_retired_unchanged_cluster_is_reported(operator):
    run(operator, HEADER + "A10,1,64,n1\n")
    Cluster.objects.update(status="retired")
    result = run(operator, HEADER + "A10,1,64,n1\n")
    assert [(w.line, w.code) for w in result.warnings] == [(2, "cluster_retired")]


# --- Unknown models -----------------------------------------------------------------------------------


def test_unknown_model_is_an_error_without_the_flag(operator):
    before = counts()
    with pytest.raises(FleetImportError) as excinfo:
        run(operator, HEADER + "GPU-series-1,4,192,0\nGPU-series-1,1,192,1\n")
    assert errors_of(excinfo) == [(2, "unknown_model"), (3, "unknown_model")]
    assert counts() == before


def test_unknown_model_with_the_flag_creates_an_honest_catalog_entry(operator):
    content = HEADER + "GPU-series-1,4,192,0\ngpu-series-1,1,192,1\nA10,1,64,2\n"

    result = run(operator, content, allow_unknown_models=True)

    assert result.accelerators_created == ("gpu-series-1",)
    chip = Accelerator.objects.get(slug="gpu-series-1")
    assert chip.spec_status == "unknown"
    assert (chip.dense_fp16_tflops, chip.memory_gb, chip.memory_bandwidth_gbps) == (None, None, None)
    assert chip.vendor == "Unknown" and chip.model == "GPU-series-1"
    assert sorted(chip.aliases) == ["GPU-series-1", "gpu-series-1"]
    assert "fleet import" in chip.source and "cucc" in chip.source
    assert islands_of("cpi:cucc:nx:zhongwei-gpu-series-1") == [("isl-001", 5, "pcie", 5)]

    # The entry now matches by alias: a re-import without the flag is unchanged and creates nothing.
    again = run(operator, content)
    assert (again.clusters_unchanged, again.accelerators_created) == (2, ())
    assert Accelerator.objects.filter(slug__startswith="gpu-series-1").count() == 1


# --- Dry run and authorisation ------------------------------------------------------------------------


def test_dry_run_reports_and_writes_nothing(operator):
    before = counts()

    result = run(
        operator,
        HEADER + "GPU-series-2,8,1,a\nH800-SXM5-80GB,8,1,b\n",
        allow_unknown_models=True,
        dry_run=True,
    )

    assert result.dry_run
    assert (result.clusters_created, result.cards, result.accelerators_created) == (2, 16, ("gpu-series-2",))
    assert counts() == before


def test_an_organisation_imports_only_into_its_own_namespace(operator, other_operator):
    with pytest.raises(PermissionDeniedError):
        fleet_import(
            actor=Actor(organisation=other_operator),
            operator=operator,
            content=GOOD,
            hub="nx",
            site="Zhongwei",
        )
    assert counts()[:4] == (0, 0, 0, 0)


def test_a_non_operator_cannot_import(db):
    buyer = BuyerFactory(slug="buyer1")
    with pytest.raises(PermissionDeniedError) as excinfo:
        run(buyer, GOOD)
    assert excinfo.value.code == "not_an_operator"


def test_same_file_for_two_operators_gives_two_namespaces(operator, other_operator):
    run(operator, GOOD)
    result = run(other_operator, GOOD)
    assert result.clusters_created == 2
    assert Cluster.objects.filter(cpi__startswith="cpi:cmcc:nx:").count() == 2


# --- The management command ---------------------------------------------------------------------------


def test_command_imports_and_prints_a_summary(operator, tmp_path: Path):
    inventory = tmp_path / "fleet.csv"
    inventory.write_text(GOOD)
    out = StringIO()

    call_command(
        "import_fleet",
        str(inventory),
        operator="cucc",
        hub="nx",
        site="Zhongwei",
        nodes_per_island=2,
        stdout=out,
    )

    assert "Imported 8 nodes, 43 cards for cucc" in out.getvalue()
    assert f"created   {A800_CPI}  40 cards in 3 islands" in out.getvalue()
    assert Cluster.objects.count() == 2
    assert ClusterStatusChange.objects.filter(actor_label="manage.py import_fleet").count() == 2


def test_command_reports_bad_lines_and_fails(operator, tmp_path: Path):
    inventory = tmp_path / "fleet.csv"
    inventory.write_text(HEADER + "A10,1,64,n1\nX9,1,64,n2\n")
    err = StringIO()

    with pytest.raises(CommandError):
        call_command("import_fleet", str(inventory), operator="cucc", hub="nx", site="Zhongwei", stderr=err)

    assert "line 3: unknown_model:" in err.getvalue()
    assert Cluster.objects.count() == 0


def test_command_dry_run_json(operator, tmp_path: Path):
    inventory = tmp_path / "fleet.csv"
    inventory.write_text(GOOD)
    out = StringIO()
    call_command(
        "import_fleet",
        str(inventory),
        operator="cucc",
        hub="nx",
        site="Zhongwei",
        dry_run=True,
        json=True,
        stdout=out,
    )
    assert '"clusters_created": 2' in out.getvalue()
    assert Cluster.objects.count() == 0


# --- REST ---------------------------------------------------------------------------------------------


def upload(content: str | bytes, name: str = "fleet.csv") -> SimpleUploadedFile:
    return SimpleUploadedFile(name, content.encode() if isinstance(content, str) else content, "text/csv")


def test_api_multipart_upload_as_operator(api, operator):
    response = api.post(
        URL,
        {"file": upload(GOOD), "hub": "nx", "site": "Zhongwei", "nodes_per_island": "2"},
        format="multipart",
    )

    assert response.status_code == 201, response.json()
    data = response.json()
    assert (data["operator"], data["nodes"], data["cards"], data["clusters_created"]) == ("cucc", 8, 43, 2)
    assert [c["cpi"] for c in data["clusters"]] == [A10_CPI, A800_CPI]
    assert data["warnings"] == [] and data["dry_run"] is False
    change = ClusterStatusChange.objects.filter(cluster__cpi=A800_CPI).get()
    assert change.actor_token is not None and change.reason == "fleet import"


def test_api_csv_body_with_query_options(api):
    response = api.generic(
        "POST", f"{URL}?hub=gba&site=Shaoguan&nodes_per_island=4", GOOD.encode(), content_type="text/csv"
    )

    assert response.status_code == 201, response.json()
    assert {c["cpi"] for c in response.json()["clusters"]} == {
        "cpi:cucc:gba:shaoguan-a10",
        "cpi:cucc:gba:shaoguan-a800-sxm4-80gb",
    }


def test_api_dry_run_answers_200_and_writes_nothing(api):
    response = api.post(
        URL, {"file": upload(GOOD), "hub": "nx", "site": "Zhongwei", "dry_run": "true"}, format="multipart"
    )

    assert response.status_code == 200, response.json()
    assert response.json()["dry_run"] is True and response.json()["clusters_created"] == 2
    assert counts()[:4] == (0, 0, 0, 0)


def test_api_bad_rows_answer_400_with_lines(api):
    response = api.post(
        URL, {"file": upload(GOOD + "X9,1,1,n9\n"), "hub": "nx", "site": "Zhongwei"}, format="multipart"
    )

    assert response.status_code == 400
    body = response.json()
    assert body["code"] == "fleet_import_invalid"
    assert body["extra"]["errors"] == [
        {
            "line": 10,
            "code": "unknown_model",
            "message": body["extra"]["errors"][0]["message"],
            "field": "model",
        }
    ]
    assert counts()[:4] == (0, 0, 0, 0)


@pytest.mark.parametrize(
    ("data", "field"),
    [
        ({"hub": "nx"}, "file"),
        ({"file": "not-a-file", "hub": "nx"}, "file"),
        ({"hub": "zz"}, "hub"),
        ({"nodes_per_island": "0"}, "nodes_per_island"),
        ({"fabric": "ethernet"}, "fabric"),
    ],
)
def test_api_bad_options_answer_400(api, data, field):
    payload = {"file": upload(GOOD), "site": "Zhongwei", **data}
    if field == "file" and data.get("file") is None:
        payload.pop("file")
    response = api.post(URL, payload, format="multipart")
    assert response.status_code == 400
    assert response.json()["code"] == "invalid"
    assert field in response.json()["extra"]["fields"]


def test_api_other_content_types_are_415(api):
    response = api.post(URL, {"hub": "nx"}, format="json")
    assert response.status_code == 415


def test_api_non_operator_organisation_is_403(token_client):
    client = token_client(BuyerFactory(slug="buyer1"))
    response = client.post(URL, {"file": upload(GOOD), "hub": "nx", "site": "Zhongwei"}, format="multipart")
    assert response.status_code == 403
    assert response.json()["code"] == "not_an_operator"
    assert counts()[:4] == (0, 0, 0, 0)


def test_api_read_only_token_is_403(operator, token_client):
    client = token_client(operator, scope="read_only")
    response = client.post(URL, {"file": upload(GOOD), "hub": "nx", "site": "Zhongwei"}, format="multipart")
    assert response.status_code == 403
    assert counts()[:4] == (0, 0, 0, 0)


def test_api_anonymous_is_401(client):
    response = client.post(URL, {"file": upload(GOOD)})
    assert response.status_code == 401


def test_api_operator_is_always_the_caller(api, operator, other_operator, token_client):
    # An "operator" option or column is not a way into another namespace: it is ignored.
    content = "model,gpu,sn,operator\nA10,1,n1,cmcc\n"
    response = api.post(
        f"{URL}?operator=cmcc",
        {"file": upload(content), "hub": "nx", "site": "Zhongwei", "operator": "cmcc"},
        format="multipart",
    )

    assert response.status_code == 201, response.json()
    assert response.json()["operator"] == "cucc"
    assert Cluster.objects.get().operator == operator
    assert not Cluster.objects.filter(operator=other_operator).exists()
    # The other operator importing the same file gets its own clusters, not a clash.
    third = token_client(OperatorFactory(slug="ctcc"))
    response = third.post(URL, {"file": upload(content), "hub": "nx", "site": "Zhongwei"}, format="multipart")
    assert response.status_code == 201
    assert response.json()["clusters"][0]["cpi"] == "cpi:ctcc:nx:zhongwei-a10"


def test_command_prints_at_most_50_errors_and_a_count_by_code(operator, tmp_path: Path):
    inventory = tmp_path / "fleet.csv"
    inventory.write_text(HEADER + "".join(f"X9,1,1,n{i}\n" for i in range(60)) + "A10,x,1,m\n")
    err = StringIO()

    with pytest.raises(CommandError):
        call_command("import_fleet", str(inventory), operator="cucc", hub="nx", site="Zhongwei", stderr=err)

    lines = err.getvalue().splitlines()
    assert len(lines) == 51
    assert lines[-1].startswith("... 61 errors in all; of the first 61: unknown_model 60, bad_card_count 1.")


# --- Races (PostgreSQL) -------------------------------------------------------------------------------


@pytest.mark.postgres
@pytest.mark.django_db(transaction=True)
def test_concurrent_imports_of_one_file_have_one_winner_and_no_half_import():
    import threading

    from django.db import connection

    operator = OperatorFactory(slug="cucc")
    content = GOOD + "GPU-series-9,8,1,n-x\n"
    barrier = threading.Barrier(4)
    outcomes: list[object] = [None] * 4

    def work(index: int) -> None:
        try:
            barrier.wait()
            outcomes[index] = run(operator, content, nodes_per_island=2, allow_unknown_models=True)
        except Exception as exc:
            outcomes[index] = exc
        finally:
            connection.close()

    threads = [threading.Thread(target=work, args=(i,)) for i in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=60)

    # Imports of one operator are serialised: the first creates, the others find it all unchanged.
    assert all(isinstance(o, FleetImportResult) for o in outcomes), outcomes
    created = sorted((r.clusters_created, r.clusters_unchanged) for r in outcomes)  # type: ignore[union-attr]
    assert created == [(0, 3), (0, 3), (0, 3), (3, 0)]
    assert Cluster.objects.count() == 3
    assert Island.objects.count() == 6
    assert IssuedIdentifier.objects.count() == 3 + 6
    assert Accelerator.objects.filter(slug="gpu-series-9").count() == 1
