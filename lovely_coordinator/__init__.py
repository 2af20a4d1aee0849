"""lovely-coordinator: fair, cancellation-safe scheduling between AI agents and model providers.

The top level is the agent coordinator (CONTRACT §1). Lanes live in
:mod:`lovely_coordinator.lanes`, turn queues in :mod:`lovely_coordinator.turns`, and the
Redis/Valkey backed primitives in :mod:`lovely_coordinator.redis`.
"""

from ._config import CoordinatorConfig as CoordinatorConfig
from ._coordinator import AGENT_COORDINATOR_VERSION as AGENT_COORDINATOR_VERSION
from ._coordinator import AgentCoordinator as AgentCoordinator
from ._coordinator import create_agent_coordinator as create_agent_coordinator
from ._errors import AdmissionTimeoutError as AdmissionTimeoutError
from ._errors import CoordinatorBusyError as CoordinatorBusyError
from ._errors import CoordinatorError as CoordinatorError
from ._errors import IncompatibleCoordinatorError as IncompatibleCoordinatorError
from ._errors import InvalidArgumentError as InvalidArgumentError
from ._errors import InvalidArgumentTypeError as InvalidArgumentTypeError
from ._errors import PermitReleasedError as PermitReleasedError
from ._errors import ReservationCancelledError as ReservationCancelledError
from ._errors import ReservationUsedError as ReservationUsedError
from ._errors import TupleSuspendedError as TupleSuspendedError
from ._errors import UsageError as UsageError
from ._global import get_agent_coordinator as get_agent_coordinator
from ._global import get_bash_coordinator as get_bash_coordinator
from ._instruments import Instrument as Instrument
from ._permits import AgentPermit as AgentPermit
from ._permits import AgentReservation as AgentReservation
from ._permits import current_permit as current_permit
from ._requests import ModelRequest as ModelRequest
from ._types import CoordinatorStatistics as CoordinatorStatistics
from ._types import ModelTuple as ModelTuple
from ._types import ModelTupleLike as ModelTupleLike
from ._types import ParentNotification as ParentNotification
from ._types import ResidentAgent as ResidentAgent
from ._types import SessionContext as SessionContext
from ._types import TupleStatistics as TupleStatistics
from ._types import as_model_tuple as as_model_tuple

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
