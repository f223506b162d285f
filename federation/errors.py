"""Federation's closed set of failures. Codes are public API."""

from core.errors import ConflictError, InvalidInputError, NotFoundError, PermissionDeniedError


class InvalidIdentifierError(InvalidInputError):
    code = "invalid_identifier"


class IdentifierOperatorMismatchError(PermissionDeniedError):
    code = "identifier_operator_mismatch"


class IdentifierTakenError(ConflictError):
    code = "identifier_taken"


class UnknownAcceleratorError(InvalidInputError):
    code = "unknown_accelerator"


class AcceleratorAmbiguousError(InvalidInputError):
    """A model name that is an alias of several catalog models; ``extra["candidates"]`` lists their slugs."""

    code = "accelerator_ambiguous"


class UnknownHubError(InvalidInputError):
    code = "unknown_hub"


class UnknownIslandError(InvalidInputError):
    code = "unknown_island"


class ClusterNotFoundError(NotFoundError):
    code = "cluster_not_found"


class IslandNotFoundError(NotFoundError):
    code = "island_not_found"


class IdentifierNotFoundError(NotFoundError):
    code = "identifier_not_found"


class ClusterRetiredError(ConflictError):
    code = "cluster_retired"


class InvalidStatusTransitionError(ConflictError):
    code = "invalid_status_transition"


class InvalidHeartbeatError(InvalidInputError):
    code = "invalid_heartbeat"


class FleetImportError(InvalidInputError):
    """A fleet inventory with bad rows; ``extra["errors"]`` lists them by line number."""

    code = "fleet_import_invalid"


class LatencySourceNotOperatedError(PermissionDeniedError):
    """An operator's agent reported a latency from a hub where the operator runs no cluster."""

    code = "latency_source_not_operated"


class MaintenanceInvalidError(InvalidInputError):
    code = "maintenance_invalid"
