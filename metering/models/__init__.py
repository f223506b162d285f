"""Metering models: tariffs and price cards, packs and Stripe, the ledger, usage, statements."""

from metering.models.billing import (
    BillingCloseRun,
    Invoice,
    InvoiceLine,
    Settlement,
    SettlementLine,
    StatementDocument,
)
from metering.models.ledger import (
    CNY_UNIT,
    AccountKind,
    LedgerAccount,
    LedgerEntry,
    LedgerTransfer,
    TransferKind,
    card_hour_unit,
)
from metering.models.packs import (
    STANDARD_CLASS,
    BillingProfile,
    Pack,
    PackOrder,
    PackProduct,
    PackRefund,
    StripeEvent,
    pack_class_key,
)
from metering.models.reconciliation import ReconciliationRun
from metering.models.tariffs import (
    ALL_MONTHS,
    ALL_WEEKDAYS,
    MINUTES_PER_DAY,
    Band,
    PriceCard,
    Tariff,
    TariffBand,
    TariffVersion,
    TariffWindow,
)
from metering.models.usage import BuyerExhaustion, RatedSegment, UsageRecord

__all__ = [
    "ALL_MONTHS",
    "ALL_WEEKDAYS",
    "CNY_UNIT",
    "MINUTES_PER_DAY",
    "STANDARD_CLASS",
    "AccountKind",
    "Band",
    "BillingCloseRun",
    "BillingProfile",
    "BuyerExhaustion",
    "Invoice",
    "InvoiceLine",
    "LedgerAccount",
    "LedgerEntry",
    "LedgerTransfer",
    "Pack",
    "PackOrder",
    "PackProduct",
    "PackRefund",
    "PriceCard",
    "RatedSegment",
    "ReconciliationRun",
    "Settlement",
    "SettlementLine",
    "StatementDocument",
    "StripeEvent",
    "Tariff",
    "TariffBand",
    "TariffVersion",
    "TariffWindow",
    "TransferKind",
    "UsageRecord",
    "card_hour_unit",
    "pack_class_key",
]
