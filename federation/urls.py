"""Portal URLs of federation: the operator's fleet import."""

from federation.views import urlpatterns

__all__ = ["urlpatterns"]
