"""Key names: one object's keys in one hash slot, two objects' keys never the same."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st
from redis.crc import key_slot

from lovely_coordinator._redis.keys import escape, object_base, unescape

KINDS = ("conv", "pool", "log")
texts = st.text(alphabet=st.sampled_from("ab{}%:7BD25 \x00é"), max_size=8)


def parse(key: str) -> tuple[str, str, str]:
    """(prefix, tag, part) of a key: well-defined because a key has one raw brace pair."""
    assert key.count("{") == 1
    assert key.count("}") == 1
    prefix, _, rest = key.partition("{")
    tag, _, part = rest.partition("}")
    return unescape(prefix), tag, part


@given(texts)
def test_escape_is_reversible_and_brace_free(text: str) -> None:
    escaped = escape(text)
    assert "{" not in escaped
    assert "}" not in escaped
    assert unescape(escaped) == text


@given(
    st.tuples(texts, st.sampled_from(KINDS), texts), st.tuples(texts, st.sampled_from(KINDS), texts)
)
def test_different_objects_never_share_a_key(
    a: tuple[str, str, str], b: tuple[str, str, str]
) -> None:
    key_a = f"{object_base(*a)}:fence"
    key_b = f"{object_base(*b)}:fence"
    assert (key_a == key_b) == (a == b)
    prefix, tag, _ = parse(key_a)
    kind, _, name = tag.partition(":")
    assert (prefix, kind, unescape(name)) == a


@given(texts, st.sampled_from(KINDS), texts)
def test_every_key_of_an_object_is_in_one_hash_slot(prefix: str, kind: str, name: str) -> None:
    base = object_base(prefix, kind, name)
    slots = {key_slot(f"{base}:{part}".encode()) for part in ("lock", "fence", "quiet", "x:1")}
    assert len(slots) == 1


def test_the_examples_of_issue_12() -> None:
    # A prefix with a hash tag no longer puts every object in one slot, nor clashes.
    assert object_base("app:{t}:", "conv", "x") == "app:%7Bt%7D:{conv:x}"
    assert object_base("app:", "conv", "t}:{x") == "app:{conv:t%7D:%7Bx}"
    # A locker's conversation "pool:q" and the pool "q": different tags.
    assert object_base("lovely:", "conv", "pool:q") == "lovely:{conv:pool:q}"
    assert object_base("lovely:", "pool", "q") == "lovely:{pool:q}"
    assert object_base("lovely:", "gates") == "lovely:{gates}"
