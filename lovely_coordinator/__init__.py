"""lovely-coordinator: fair, cancellation-safe scheduling between AI agents and model providers.

The top level is the agent coordinator (CONTRACT §1). Lanes live in
:mod:`lovely_coordinator.lanes`, turn queues in :mod:`lovely_coordinator.turns`, and the
Redis/Valkey backed primitives in :mod:`lovely_coordinator.redis`.
"""

from ._agents.coordinator import AGENT_COORDINATOR_VERSION as AGENT_COORDINATOR_VERSION
from ._agents.coordinator import AgentCoordinator as AgentCoordinator
from ._agents.coordinator import create_agent_coordinator as create_agent_coordinator
from ._agents.instruments import Instrument as Instrument
from ._agents.permits import AgentPermit as AgentPermit
from ._agents.permits import AgentReservation as AgentReservation
from ._agents.permits import current_permit as current_permit
from ._agents.process_global import get_agent_coordinator as get_agent_coordinator
from ._agents.process_global import get_bash_coordinator as get_bash_coordinator
from ._agents.requests import ModelRequest as ModelRequest
from ._base.config import CoordinatorConfig as CoordinatorConfig
from ._base.errors import AdmissionTimeoutError as AdmissionTimeoutError
from ._base.errors import CoordinatorBusyError as CoordinatorBusyError
from ._base.errors import CoordinatorError as CoordinatorError
from ._base.errors import IncompatibleCoordinatorError as IncompatibleCoordinatorError
from ._base.errors import InvalidArgumentError as InvalidArgumentError
from ._base.errors import InvalidArgumentTypeError as InvalidArgumentTypeError
from ._base.errors import PermitReleasedError as PermitReleasedError
from ._base.errors import ReservationCancelledError as ReservationCancelledError
from ._base.errors import ReservationUsedError as ReservationUsedError
from ._base.errors import TupleSuspendedError as TupleSuspendedError
from ._base.errors import UsageError as UsageError
from ._base.types import CoordinatorStatistics as CoordinatorStatistics
from ._base.types import ModelTuple as ModelTuple
from ._base.types import ModelTupleLike as ModelTupleLike
from ._base.types import ParentNotification as ParentNotification
from ._base.types import ResidentAgent as ResidentAgent
from ._base.types import SessionContext as SessionContext
from ._base.types import TupleStatistics as TupleStatistics
from ._base.types import as_model_tuple as as_model_tuple

__all__ = [
    "AGENT_COORDINATOR_VERSION",
    "AdmissionTimeoutError",
    "AgentCoordinator",
    "AgentPermit",
    "AgentReservation",
    "CoordinatorBusyError",
    "CoordinatorConfig",
    "CoordinatorError",
    "CoordinatorStatistics",
    "IncompatibleCoordinatorError",
    "Instrument",
    "InvalidArgumentError",
    "InvalidArgumentTypeError",
    "ModelRequest",
    "ModelTuple",
    "ModelTupleLike",
    "ParentNotification",
    "PermitReleasedError",
    "ReservationCancelledError",
    "ReservationUsedError",
    "ResidentAgent",
    "SessionContext",
    "TupleStatistics",
    "TupleSuspendedError",
    "UsageError",
    "as_model_tuple",
    "create_agent_coordinator",
    "current_permit",
    "get_agent_coordinator",
    "get_bash_coordinator",
]
