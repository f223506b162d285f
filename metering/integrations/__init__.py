"""Metering's gateways to outside services. Each module here is the only one that imports its client
library, and hands the rest of metering plain frozen dataclasses."""
