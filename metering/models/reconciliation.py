"""The outcome of each ledger reconciliation, kept so the staff dashboard can show the last one."""

from __future__ import annotations

from django.db import models
from django.utils.translation import gettext_lazy as _


class ReconciliationRun(models.Model):
    """One run of ``metering.services.maintenance.ledger_reconcile``: when, whether the ledger was clean,
    and the breaches found (``[{"code", "message", "count"}, ...]``; samples stay in the log)."""

    checked_at = models.DateTimeField()
    ok = models.BooleanField()
    breaches = models.JSONField(default=list, blank=True, help_text=_("Code, message and row count of each."))

    class Meta:
        ordering = ["-checked_at", "-id"]
        indexes = [models.Index(fields=["-checked_at"], name="reconciliation_run_checked")]

    def __str__(self) -> str:
        return f"reconciliation at {self.checked_at.isoformat()}: {'ok' if self.ok else 'breaches'}"
