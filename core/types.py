"""Types every app shares."""

from __future__ import annotations

from dataclasses import dataclass

from django.contrib.auth.models import User

from core.models import ApiToken, Organisation


@dataclass(frozen=True)
class Actor:
    """Who performs a write: an organisation, through a person (``user``) or a machine (``token``), or the
    platform itself (both None, e.g. the heartbeat monitor). Services record it in audit rows."""

    organisation: Organisation | None
    user: User | None = None
    token: ApiToken | None = None
    can_write: bool = True
    system_label: str = ""

    @property
    def label(self) -> str:
        if self.token is not None:
            return f"token {self.token.name} (chk_{self.token.prefix}_…)"
        if self.user is not None:
            return f"user {self.user.get_username()}"
        return self.system_label or "system"

    @classmethod
    def system(cls, label: str) -> Actor:
        return cls(organisation=None, system_label=label)


@dataclass(frozen=True)
class RequestActor(Actor):
    """An actor that came through the API or portal: always acts for an organisation."""

    organisation: Organisation
