"""Every metering write, one module per area."""
