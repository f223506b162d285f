"""A buyer's portal preferences: its home hub (where its work comes from)."""

from __future__ import annotations

import logging

from django.db import transaction
from django.utils.translation import gettext as _

from broker.models import BuyerPreference
from core.errors import PermissionDeniedError
from core.models import Organisation
from core.types import Actor
from federation.errors import UnknownHubError
from federation.models import Hub

logger = logging.getLogger("cardhour.broker")


@transaction.atomic
def buyer_home_hub_set(*, buyer: Organisation, hub_code: str, actor: Actor) -> BuyerPreference:
    """Make ``hub_code`` ``buyer``'s home hub: the marketplace measures latency from it and the job form
    starts a job's origin hub there. Another buyer's preference is never touched.

    Raises UnknownHubError (``extra["fields"]["home_hub"]``) for a hub that does not exist, and
    PermissionDeniedError when ``actor`` may not write for ``buyer``.
    """
    if not actor.can_write or (actor.organisation is not None and actor.organisation.pk != buyer.pk):
        raise PermissionDeniedError(_("This actor may not change the buyer's preferences."))
    hub = Hub.objects.filter(code=hub_code).first()
    if hub is None:
        message = _("Unknown hub %(hub)r.") % {"hub": hub_code}
        raise UnknownHubError(message, extra={"hub": hub_code, "fields": {"home_hub": [message]}})
    preference, _created = BuyerPreference.objects.update_or_create(buyer=buyer, defaults={"home_hub": hub})
    logger.info("buyer %s home hub set to %s by %s", buyer.slug, hub.code, actor.label)
    return preference
