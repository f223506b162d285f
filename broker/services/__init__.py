"""Broker writes, one module per entity: jobs, quotes, leases, dispatch (operators), failover, events."""
