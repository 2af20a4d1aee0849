"""Key and channel names: one object's keys together, different objects' keys apart.

Every key of an object (a conversation's lease, a permit pool, a gate set, a fenced log)
has the shape::

    <escaped prefix>{<kind>:<escaped name>}:<part>      (or {<kind>} for the gate set)

where escaping percent-encodes ``%``, ``{`` and ``}``. So a key holds exactly one raw
``{`` and one raw ``}``, and reads back unambiguously: the prefix is what precedes the
brace, the kind and name are what it encloses, the part is what follows. Two different
objects therefore never share a key, whatever their prefixes, names or ids contain
(braces included), and the kind keeps a locker's conversation ``pool:q`` (``{conv:pool:q}``)
apart from the pool ``q`` (``{pool:q}``) of the same prefix. The braces are also a Redis
Cluster hash tag: each object's keys hash to one slot, as its scripts need.

Channels follow the same shape, so they are kept apart the same way.
"""

from __future__ import annotations

import re
from typing import Final

__all__ = ["FRESH_BOOT_KEY", "escape", "object_base", "unescape"]

# The one key outside every object: set by whoever starts a server that is known to hold
# no grants (see boot.py). It is only ever read with a plain GET, never by a script.
FRESH_BOOT_KEY: Final = "lovely-coordinator:fresh-boot"


def escape(text: str) -> str:
    """``text`` with ``%``, ``{`` and ``}`` percent-encoded (reversible, brace-free)."""
    return text.replace("%", "%25").replace("{", "%7B").replace("}", "%7D")


_ESCAPED: Final = re.compile("%(25|7B|7D)")
_PLAIN: Final = {"25": "%", "7B": "{", "7D": "}"}


def unescape(text: str) -> str:
    """The inverse of :func:`escape` (one left-to-right pass)."""
    return _ESCAPED.sub(lambda match: _PLAIN[match.group(1)], text)


def object_base(prefix: str, kind: str, name: str | None = None) -> str:
    """``<escaped prefix>{<kind>:<escaped name>}``: what every key of one object starts with.

    ``kind`` is a fixed word of the library (no ``:``, no braces); ``name`` is the user's
    id, escaped here. Without a name the object is one per prefix (the gate set).
    """
    tag = kind if name is None else f"{kind}:{escape(name)}"
    return f"{escape(prefix)}{{{tag}}}"
