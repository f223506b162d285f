"""factory_boy factories shared by every app's tests."""

from __future__ import annotations

import factory
from django.contrib.auth import get_user_model

from core.models import Membership, Organisation
from core.types import Actor
from federation import services
from federation.models import Accelerator, Cluster, Hub
from federation.types import IslandSpec


class UserFactory(factory.django.DjangoModelFactory):
    class Meta:
        model = get_user_model()
        django_get_or_create = ("username",)

    username = factory.Sequence(lambda n: f"user{n}")
    email = factory.LazyAttribute(lambda u: f"{u.username}@example.com")
    password = factory.django.Password("correct-horse-battery")


class OrganisationFactory(factory.django.DjangoModelFactory):
    class Meta:
        model = Organisation
        django_get_or_create = ("slug",)

    slug = factory.Sequence(lambda n: f"org{n}")
    name = factory.LazyAttribute(lambda o: f"Organisation {o.slug}")


class OperatorFactory(OrganisationFactory):
    is_operator = True


class BuyerFactory(OrganisationFactory):
    is_buyer = True


class MembershipFactory(factory.django.DjangoModelFactory):
    class Meta:
        model = Membership

    organisation = factory.SubFactory(OperatorFactory)
    user = factory.SubFactory(UserFactory)
    role = Membership.Role.OWNER


def make_cluster(
    *,
    operator: Organisation,
    hub: str = "nx",
    name: str = "zw-ai01",
    accelerator: str = "nvidia-a800-sxm4-80gb",
    islands: list[tuple[str, int]] | None = None,
    fabric: str = "infiniband",
    site: str = "Zhongwei",
    endpoint_url: str = "https://agent.example.com/cardhour",
) -> Cluster:
    """Register a cluster through the real service (so identifiers, totals and history are right)."""
    specs = [
        IslandSpec(name=n, cards=c, fabric=fabric) for n, c in (islands or [("isl-01", 64), ("isl-02", 32)])
    ]
    return services.cluster_register(
        actor=Actor(organisation=operator, system_label="test"),
        operator=operator,
        cpi=f"cpi:{operator.slug}:{hub}:{name}",
        site=site,
        accelerator_slug=accelerator,
        islands=specs,
        endpoint_url=endpoint_url,
    )


def hub(code: str) -> Hub:
    return Hub.objects.get(code=code)


def accelerator(slug: str) -> Accelerator:
    return Accelerator.objects.get(slug=slug)
