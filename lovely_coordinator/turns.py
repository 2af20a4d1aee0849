"""Per-conversation turn queues (CONTRACT §3).

A conversation may run only one turn at a time, whichever door the turn came through (a
WebSocket message, an HTTP post, a second browser tab, a system turn). A
:class:`TurnRegistry` queues each conversation's turns in order, caps how many may wait,
and drains gracefully; with a :class:`Locker` each turn also holds a cross-replica lease
and runs with its fencing token::

    async with TurnRegistry() as turns:
        position = turns.submit("conv-1", Job(run))   # 0 = started, else place in line
        result = await turns.run("conv-1", run)      # submit and wait

Double texting follows LangGraph: ``multitask="enqueue"`` (default), ``"reject"``,
``"interrupt"`` and ``"replace_queued"``; :data:`Multitask` is their ``Literal`` type, for
code that passes a mode along. A custom :class:`Locker` returns :class:`Lease` objects
whose ``lost`` has the :class:`LeaseSignal` shape (an :class:`anyio.Event` has it).
:meth:`TurnRegistry.statistics` returns a :class:`TurnStatistics` snapshot.

A turn's outcome is recorded on its :class:`Job` (``job.result`` or ``job.error``):
whatever the turn raises, of any kind, fails that turn alone, and a stop that lands while
it runs (``interrupt``, a lost lease, shutdown) decides its outcome however it then ends.
Misuse that cannot work (submitting before entering the registry, entering it twice, a
turn waiting for a later turn of its own conversation) raises
:class:`~lovely_coordinator.UsageError`.
"""

from ._base.errors import ConversationBusyError as ConversationBusyError
from ._base.errors import CoordinationUnavailableError as CoordinationUnavailableError
from ._base.errors import DrainingError as DrainingError
from ._base.errors import LeaseLostError as LeaseLostError
from ._base.errors import QueueFullError as QueueFullError
from ._base.errors import TurnDropped as TurnDropped
from ._base.errors import TurnInterrupted as TurnInterrupted
from ._turns.job import Job as Job
from ._turns.queues import TurnRegistry as TurnRegistry
from ._turns.state import Multitask as Multitask
from ._turns.state import TurnStatistics as TurnStatistics
from ._turns.types import DEFAULT_MAX_QUEUED as DEFAULT_MAX_QUEUED
from ._turns.types import Lease as Lease
from ._turns.types import LeaseSignal as LeaseSignal
from ._turns.types import Locker as Locker

__all__ = [
    "ConversationBusyError",
    "CoordinationUnavailableError",
    "DEFAULT_MAX_QUEUED",
    "DrainingError",
    "Job",
    "Lease",
    "LeaseLostError",
    "LeaseSignal",
    "Locker",
    "Multitask",
    "QueueFullError",
    "TurnDropped",
    "TurnInterrupted",
    "TurnRegistry",
    "TurnStatistics",
]
