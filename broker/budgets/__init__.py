"""Buyers' budgets and caps (issue 16): spend limits per month or per job, pending holds placed at
acceptance, threshold alerts and the hard cap. Kept as one sub-domain package of the broker (models,
selectors, services, API, portal) so it reads as one thing; its models are registered through
broker.models."""
