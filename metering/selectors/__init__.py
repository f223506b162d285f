"""Every non-trivial metering read, one module per area."""
