"""Objects shared by every copy of the library in the process.

A process may hold two copies of this package (a vendored one, a reloaded one). They
share the process-global coordinator (``_agents/process_global.py``), so they must also
share what its users meet through it: the context variables that say which permit (and which model
request) the running code is under. Each such object is published once per process under
a name and a version on a sentinel module in ``sys.modules``; a later copy of the same
version finds and uses the published object instead of building its own. (The exception
classes are shared the same way, by ``errors.py``, which cannot import this module's
helpers before its own classes exist.)
"""

from __future__ import annotations

import sys
import types
from collections.abc import Callable
from typing import Final, TypeVar, cast

__all__ = ["process_wide"]

T = TypeVar("T")

SENTINEL_KEY: Final = "__lovely_coordinator_process_global_shared__"


def process_wide(name: str, version: int, build: Callable[[], T]) -> T:
    """The process's one ``name`` object of this ``version``, built by the first caller.

    Race-free without a lock: the sentinel is published with ``dict.setdefault`` and each
    object with ``dict.setdefault`` on it, both atomic, so concurrent first calls (two
    threads, two copies) agree on one winner.
    """
    sentinel = sys.modules.get(SENTINEL_KEY)
    if sentinel is None:
        fresh = types.ModuleType(SENTINEL_KEY, "Objects shared by copies of lovely-coordinator.")
        fresh.objects = {}  # type: ignore[attr-defined]
        sentinel = sys.modules.setdefault(SENTINEL_KEY, fresh)
    objects = getattr(sentinel, "objects", None)
    if not isinstance(objects, dict):  # not ours: share nothing rather than break
        return build()
    return cast(T, objects.setdefault((name, version), build()))
