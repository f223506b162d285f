"""Reads for the buyers' marketplace and the staff dashboard, and the buyer's home-hub preference."""

from __future__ import annotations

from core.models import Organisation
from broker.models import BuyerPreference, Job


def buyer_home_hub(*, buyer: Organisation) -> str | None:
    """The code of ``buyer``'s home hub: its stored preference, else the origin hub of its latest job,
    else None."""
    code = BuyerPreference.objects.filter(buyer=buyer).values_list("home_hub__code", flat=True).first()
    if code is not None:
        return code
    return Job.objects.filter(buyer=buyer).order_by("-created_at", "-id").values_list(
        "origin_hub__code", flat=True
    ).first()
