"""The fleet import page: upload a CSV, all or nothing, per-line errors, dry run, size limit
(federation.views, federation.forms)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, cast

import pytest
from django.contrib.auth.models import User
from django.core.files.uploadedfile import SimpleUploadedFile
from django.test import Client
from django.urls import reverse

from core.models import Organisation
from federation.forms import MAX_UPLOAD_BYTES
from federation.models import Accelerator, Cluster, Island
from federation.views import TEMPLATE_CSV
from tests.factories import MembershipFactory, UserFactory

pytestmark = pytest.mark.django_db

URL = "/operator/fleet-import/"

BAD_CSV = (
    "node_name,gpu_model,gpu_capacity_num,hub,site\n"
    "n1,A800-SXM4-80GB,8,nx,Zhongwei\n"
    "n2,X9000,8,nx,Zhongwei\n"
    "n3,A800-SXM4-80GB,eight,nx,Zhongwei\n"
    "n1,A800-SXM4-80GB,8,mars,Zhongwei\n"
)


def _upload(content: str | bytes, name: str = "fleet.csv") -> SimpleUploadedFile:
    data = content.encode() if isinstance(content, str) else content
    return SimpleUploadedFile(name, data, content_type="text/csv")


def _post(client: Client, content: str | bytes, **options: object) -> Any:
    data: dict[str, object] = {"file": _upload(content), "nodes_per_island": 32, **options}
    return client.post(URL, data)


def test_url_names() -> None:
    assert reverse("operator-fleet-import") == URL
    assert reverse("operator-fleet-import-template") == "/operator/fleet-import/template.csv"


def test_page_explains_the_format(operator_client: Client, east_operator: Organisation) -> None:
    response = operator_client.get(URL)
    assert response.status_code == 200
    body = response.content.decode()
    for header in ("gpu_model", "gpu_capacity_num", "node_name", "hostname", "island", "fabric"):
        assert header in body
    assert "nvidia-a800-sxm4-80gb" in body  # the catalogue's models are listed
    assert reverse("operator-fleet-import-template") in body
    assert 'enctype="multipart/form-data"' in body


def test_anonymous_buyer_and_viewer(
    client: Client, buyer_client: Client, login: Callable[[User], Client], east_operator: Organisation
) -> None:
    assert client.get(URL).status_code == 302
    assert buyer_client.get(URL).status_code == 403
    assert buyer_client.get(reverse("operator-fleet-import-template")).status_code == 403
    viewer = cast(User, UserFactory(username="victor"))
    MembershipFactory(user=viewer, organisation=east_operator, role="viewer")
    viewer_client = login(viewer)
    page = viewer_client.get(URL)
    assert page.status_code == 200
    assert "read only" in page.content.decode()
    assert _post(viewer_client, TEMPLATE_CSV).status_code == 403
    assert not Cluster.objects.exists()


def test_template_csv_downloads(operator_client: Client, east_operator: Organisation) -> None:
    response = operator_client.get(reverse("operator-fleet-import-template"))
    assert response.status_code == 200
    assert response["Content-Type"].startswith("text/csv")
    assert "attachment" in response["Content-Disposition"]
    assert response.content.decode().splitlines()[0] == "node_name,gpu_model,gpu_capacity_num,hub,site,fabric"


def test_a_good_csv_creates_clusters_and_shows_the_summary_once(
    operator_client: Client, east_operator: Organisation
) -> None:
    response = _post(operator_client, TEMPLATE_CSV)

    assert response.status_code == 302
    assert response["Location"] == URL
    clusters = {c.cpi: c for c in Cluster.objects.filter(operator=east_operator)}
    assert set(clusters) == {"cpi:ctyun:nx:zhongwei-a800-sxm4-80gb", "cpi:ctyun:nx:zhongwei-ascend-910b3"}
    a800 = clusters["cpi:ctyun:nx:zhongwei-a800-sxm4-80gb"]
    assert (a800.total_cards, a800.available_cards, a800.site) == (16, 16, "Zhongwei")
    assert list(Island.objects.filter(cluster=a800).values_list("name", "cards", "fabric")) == [
        ("isl-001", 16, "infiniband")
    ]
    ascend = clusters["cpi:ctyun:nx:zhongwei-ascend-910b3"]
    assert list(Island.objects.filter(cluster=ascend).values_list("name", "cards", "fabric")) == [
        ("isl-001", 16, "roce")
    ]

    page = operator_client.get(URL)
    body = page.content.decode()
    result = page.context["result"]
    assert (
        result["clusters_created"],
        result["islands_created"],
        result["cards"],
        result["skipped_nodes"],
    ) == (
        2,
        2,
        32,
        1,
    )
    assert "Imported: 2 clusters created, 0 unchanged." in body
    assert reverse("operator-cluster-detail", args=["cpi:ctyun:nx:zhongwei-a800-sxm4-80gb"]) in body
    assert operator_client.get(URL).context["result"] is None  # shown once

    again = _post(operator_client, TEMPLATE_CSV)  # the same file again changes nothing
    assert again.status_code == 302
    assert operator_client.get(URL).context["result"]["clusters_unchanged"] == 2
    assert Cluster.objects.filter(operator=east_operator).count() == 2


def test_a_dry_run_writes_nothing(operator_client: Client, east_operator: Organisation) -> None:
    response = _post(operator_client, TEMPLATE_CSV, dry_run="on", cluster_prefix="ct")
    assert response.status_code == 302
    assert not Cluster.objects.exists()
    page = operator_client.get(URL)
    result = page.context["result"]
    assert result["dry_run"] is True
    assert result["clusters_created"] == 2
    assert [c["cpi"] for c in result["clusters"]] == [
        "cpi:ctyun:nx:ct-zhongwei-a800-sxm4-80gb",
        "cpi:ctyun:nx:ct-zhongwei-ascend-910b3",
    ]
    assert "Dry run" in page.content.decode()


def test_a_bad_csv_lists_every_bad_line_and_creates_nothing(
    operator_client: Client, east_operator: Organisation
) -> None:
    response = _post(operator_client, BAD_CSV)

    assert response.status_code == 200
    assert not Cluster.objects.exists()
    errors = [(e["line"], e["field"], e["code"]) for e in response.context["errors"]]
    assert errors == [
        (3, "model", "unknown_model"),
        (4, "cards", "bad_card_count"),
        (5, "node", "duplicate_node"),
        (5, "hub", "unknown_hub"),
    ]
    assert response.context["error_count"] == 4
    body = response.content.decode()
    assert "4 errors in the file" in body
    assert "<code>unknown_model</code>" in body
    assert "nothing was imported" in body


def test_unknown_models_can_be_added_on_request(operator_client: Client, east_operator: Organisation) -> None:
    csv = "hostname,model,gpus\nh1,X9000,4\n"
    response = _post(operator_client, csv, hub="gz", site="Gui'an", allow_unknown_models="on")
    assert response.status_code == 302
    accelerator = Accelerator.objects.get(slug="x9000")
    assert accelerator.spec_status == "unknown" and accelerator.dense_fp16_tflops is None
    assert Cluster.objects.get(operator=east_operator).cpi == "cpi:ctyun:gz:gui-an-x9000"


def test_missing_hub_is_reported_on_the_header_line(
    operator_client: Client, east_operator: Organisation
) -> None:
    response = _post(operator_client, "hostname,model,gpus\nh1,A800-SXM4-80GB,8\n", site="Wuhu")
    assert response.status_code == 200
    assert [(e["line"], e["code"], e["field"]) for e in response.context["errors"]] == [
        (1, "missing_column", "hub")
    ]


def test_an_oversize_file_is_refused_beside_the_field(
    operator_client: Client, east_operator: Organisation
) -> None:
    row = "n{},A800-SXM4-80GB,8,nx,Zhongwei\n"
    lines = ["node_name,gpu_model,gpu_capacity_num,hub,site\n"]
    size = len(lines[0])
    i = 0
    while size <= MAX_UPLOAD_BYTES:
        lines.append(row.format(i))
        size += len(lines[-1])
        i += 1
    response = _post(operator_client, "".join(lines))
    assert response.status_code == 200
    form = response.context["form"]
    assert form.errors["file"][0].startswith("The file is 2.0 MB; the portal takes at most 2 MB.")
    assert "has-error" in response.content.decode()
    assert not Cluster.objects.exists()


def test_bad_options_are_errors_beside_their_fields(
    operator_client: Client, east_operator: Organisation
) -> None:
    response = _post(operator_client, TEMPLATE_CSV, cluster_prefix="Bad_Prefix", nodes_per_island=0)
    assert response.status_code == 200
    form = response.context["form"]
    assert set(form.errors) == {"cluster_prefix", "nodes_per_island"}
    assert not Cluster.objects.exists()


def test_a_file_that_is_not_utf8_is_a_line_error(
    operator_client: Client, east_operator: Organisation
) -> None:
    content = "node_name,gpu_model,gpu_capacity_num,hub,site\nn1,A800-SXM4-80GB,8,nx,中卫\n".encode("gbk")
    response = _post(operator_client, content)
    assert response.status_code == 200
    assert [(e["line"], e["code"]) for e in response.context["errors"]] == [(2, "bad_encoding")]


def test_the_page_costs_a_fixed_number_of_queries(
    operator_client: Client, east_operator: Organisation, django_assert_max_num_queries: Callable[..., Any]
) -> None:
    rows = "".join(f"n{i},A800-SXM4-80GB,8,nx,Site{i % 20}\n" for i in range(400))
    with django_assert_max_num_queries(40):
        response = _post(operator_client, "node_name,gpu_model,gpu_capacity_num,hub,site\n" + rows)
    assert response.status_code == 302
    assert Cluster.objects.filter(operator=east_operator).count() == 20
