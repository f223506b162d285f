"""Organisations and memberships through core.services: slugs share the identifier segment grammar, a
taken slug is a conflict that writes nothing, roles can be changed, suspension is idempotent."""

from __future__ import annotations

import pytest
from django.core.exceptions import ValidationError
from django.db import IntegrityError, transaction

from core.errors import ConflictError, InvalidInputError
from core.models import Membership, Organisation
from core.services import membership_set, organisation_create, organisation_reinstate, organisation_suspend
from tests.factories import UserFactory

pytestmark = pytest.mark.django_db


def test_create_organisation_with_owner() -> None:
    owner = UserFactory(username="founder")

    organisation = organisation_create(
        slug="aliyun", name="Alibaba Cloud", is_operator=True, is_buyer=True, owner=owner
    )

    organisation.refresh_from_db()
    assert organisation.slug == "aliyun"
    assert organisation.name == "Alibaba Cloud"
    assert (organisation.is_operator, organisation.is_buyer, organisation.is_platform) == (True, True, False)
    assert organisation.suspended_at is None
    assert organisation.is_suspended is False
    assert str(organisation) == "Alibaba Cloud (aliyun)"
    membership = Membership.objects.get(organisation=organisation)
    assert membership.user == owner
    assert membership.role == Membership.Role.OWNER
    assert membership.can_write is True


def test_create_organisation_without_owner_has_no_members() -> None:
    organisation = organisation_create(slug="acme", name="Acme", is_buyer=True)

    assert organisation.is_buyer is True
    assert organisation.is_operator is False
    assert not Membership.objects.filter(organisation=organisation).exists()


def test_taken_slug_is_a_conflict_and_writes_nothing(operator: Organisation) -> None:
    owner = UserFactory(username="late")
    organisations_before = Organisation.objects.count()
    memberships_before = Membership.objects.count()

    with pytest.raises(ConflictError) as excinfo:
        organisation_create(slug="cucc", name="Impostor", is_platform=True, owner=owner)

    assert excinfo.value.code == "slug_taken"
    assert excinfo.value.http_status == 409
    assert excinfo.value.extra == {"slug": "cucc"}
    assert excinfo.value.message == "The organisation slug 'cucc' is taken."
    assert Organisation.objects.count() == organisations_before
    assert Membership.objects.count() == memberships_before
    name = operator.name
    operator.refresh_from_db()
    assert operator.name == name
    assert operator.is_platform is False


def test_a_conflict_leaves_the_surrounding_transaction_usable(operator: Organisation) -> None:
    with transaction.atomic():
        with pytest.raises(ConflictError):
            organisation_create(slug="cucc", name="Again")
        created = organisation_create(slug="ctcc", name="China Telecom", is_operator=True)

    assert Organisation.objects.filter(pk=created.pk).exists()
    assert Organisation.objects.filter(slug__in=["cucc", "ctcc"]).count() == 2
    assert not Organisation.objects.filter(name="Again").exists()


def test_the_database_enforces_unique_slugs(operator: Organisation) -> None:
    with pytest.raises(IntegrityError), transaction.atomic():
        Organisation.objects.create(slug="cucc", name="Duplicate")


@pytest.mark.parametrize(
    "slug",
    [
        "",
        "Cucc",
        "CUCC",
        "-cucc",
        "cucc-",
        "-",
        "cu_cc",
        "cu cc",
        " cucc",
        "cucc ",
        "cu.cc",
        "cu:cc",
        "cücc",
        "联通",
        "a" * 33,
        "acme\n",
        "acme\x00",
    ],
)
def test_invalid_slug_is_a_validation_error_and_writes_nothing(slug: str) -> None:
    owner = UserFactory(username="someone")
    organisations_before = Organisation.objects.count()

    with pytest.raises(ValidationError) as excinfo:
        organisation_create(slug=slug, name="Bad slug", owner=owner)

    assert set(excinfo.value.message_dict) == {"slug"}
    assert Organisation.objects.count() == organisations_before
    assert not Membership.objects.filter(user=owner).exists()


def test_invalid_slug_error_code() -> None:
    with pytest.raises(ValidationError) as excinfo:
        organisation_create(slug="Bad", name="Bad")

    assert [e.code for e in excinfo.value.error_dict["slug"]] == ["invalid_slug"]


@pytest.mark.parametrize("slug", ["a", "7", "a-b", "a--b", "sugon", "a" * 32, "0x-9z"])
def test_valid_slugs_are_accepted(slug: str) -> None:
    assert organisation_create(slug=slug, name="Fine").slug == slug


def test_empty_name_is_a_validation_error() -> None:
    with pytest.raises(ValidationError) as excinfo:
        organisation_create(slug="noname", name="")

    assert set(excinfo.value.message_dict) == {"name"}
    assert not Organisation.objects.filter(slug="noname").exists()


# --- memberships -------------------------------------------------------------------------------------


def test_membership_set_adds_then_changes_the_role(operator: Organisation) -> None:
    user = UserFactory(username="zhang")

    added = membership_set(organisation=operator, user=user, role=Membership.Role.MEMBER)
    changed = membership_set(organisation=operator, user=user, role=Membership.Role.VIEWER)

    assert changed.pk == added.pk
    assert Membership.objects.filter(organisation=operator, user=user).count() == 1
    stored = Membership.objects.get(pk=added.pk)
    assert stored.role == Membership.Role.VIEWER
    assert stored.can_write is False
    assert str(stored) == "zhang @ cucc (viewer)"

    membership_set(organisation=operator, user=user, role=Membership.Role.ADMIN)
    stored.refresh_from_db()
    assert stored.role == Membership.Role.ADMIN
    assert stored.can_write is True


def test_membership_set_in_two_organisations_keeps_them_apart(
    operator: Organisation, other_operator: Organisation
) -> None:
    user = UserFactory(username="wang")

    membership_set(organisation=operator, user=user, role="owner")
    membership_set(organisation=other_operator, user=user, role="viewer")

    roles = dict(Membership.objects.filter(user=user).values_list("organisation__slug", "role"))
    assert roles == {"cucc": "owner", "cmcc": "viewer"}


@pytest.mark.parametrize("role", ["superuser", "", "OWNER", "Viewer"])
def test_membership_set_rejects_unknown_roles_and_changes_nothing(operator: Organisation, role: str) -> None:
    user = UserFactory(username="chen")
    membership = membership_set(organisation=operator, user=user, role="member")

    with pytest.raises(InvalidInputError) as excinfo:
        membership_set(organisation=operator, user=user, role=role)

    assert excinfo.value.code == "invalid_role"
    assert excinfo.value.extra == {"role": role}
    membership.refresh_from_db()
    assert membership.role == "member"
    assert Membership.objects.filter(user=user).count() == 1


def test_membership_set_rejects_an_unknown_role_for_a_new_member(operator: Organisation) -> None:
    user = UserFactory(username="liu")

    with pytest.raises(InvalidInputError):
        membership_set(organisation=operator, user=user, role="root")

    assert not Membership.objects.filter(user=user).exists()


def test_roles_that_can_write() -> None:
    assert {role: Membership(role=role).can_write for role in Membership.Role.values} == {
        "owner": True,
        "admin": True,
        "member": True,
        "viewer": False,
    }


# --- suspension --------------------------------------------------------------------------------------


def test_suspend_is_idempotent_and_keeps_the_first_reason(operator: Organisation) -> None:
    first = organisation_suspend(organisation=operator, reason="unpaid")
    second = organisation_suspend(organisation=operator, reason="something else")

    operator.refresh_from_db()
    assert operator.is_suspended is True
    assert operator.suspended_at == first.suspended_at == second.suspended_at
    assert operator.suspension_reason == "unpaid"


def test_reinstate_clears_the_suspension(operator: Organisation) -> None:
    organisation_suspend(organisation=operator, reason="unpaid")

    organisation_reinstate(organisation=operator)

    operator.refresh_from_db()
    assert operator.suspended_at is None
    assert operator.suspension_reason == ""
    assert operator.is_suspended is False
