"""Metering and billing (tariffs, price cards, packs, ledger, usage): built in the metering issue."""
