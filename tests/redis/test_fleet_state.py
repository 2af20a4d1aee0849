"""The fleet's pure parts: tuple tags, known settings, the local share (no server)."""

from __future__ import annotations

import math

import pytest

from lovely_coordinator import ModelTuple
from lovely_coordinator._redis.fleet_state import Known, Setting, Share, tag_of, tuple_of

GPT = ModelTuple("openai", "gpt-4o")


@pytest.mark.parametrize(
    "t",
    [GPT, ModelTuple("a:b", "c"), ModelTuple("a", "b:c"), ModelTuple("{x}", "% y z")],
)
def test_tags_read_back_and_never_collide(t: ModelTuple) -> None:
    tag = tag_of(t)
    assert tuple_of(tag) == t
    assert tag.count(":") == 1
    assert not {"{", "}", " "} & set(tag)
    assert tag_of(ModelTuple("a:b", "c")) != tag_of(ModelTuple("a", "b:c"))


def test_known_settings_never_keep_an_empty_one() -> None:
    known = Known()
    known.put(GPT, Setting(limit=2))
    assert known.governs(GPT)
    assert known.get(GPT).limit == 2
    known.put(GPT, Setting())
    assert not known.governs(GPT)
    assert known.get(GPT).empty


def test_the_local_share_of_a_limit_and_budgets() -> None:
    share = Share()
    share.members = 2
    setting = Setting(requests_per_minute=120, tokens_per_minute=1200, limit=3)
    # The share of the limit: 3 // 2 = 1 in flight.
    assert share.try_admit(GPT, setting, 100, now=0.0) == 0
    assert share.try_admit(GPT, setting, 100, now=0.0) == math.inf
    share.settle(GPT, -50)  # used 50 of its 100
    share.release(GPT)
    assert share.in_flight(GPT) == 0
    # Tokens: a share of 600 a minute (10 a second); 550 left, a call of 600 waits 5 s.
    assert share.try_admit(GPT, setting, 600, now=0.0) == pytest.approx(5.0)
    assert share.try_admit(GPT, setting, 600, now=5.0) == 0
    share.release(GPT)
    # Requests: a share of 60 a minute (1 a second): spent, the next one waits a second.
    admitted = 2
    while (wait := share.try_admit(GPT, Setting(requests_per_minute=120), 0, now=5.0)) == 0:
        admitted += 1
        share.release(GPT)
    assert wait == pytest.approx(1.0)
    assert admitted == 61  # 60, one spent at 0 s, refilled by 5 s
    charges = share.take_charges()
    assert charges == {GPT: (61, 650)}  # 100 settled at 50, and 600
    assert share.take_charges() == {}
    assert share.in_flight(ModelTuple("other", "m")) == 0
    share.settle(ModelTuple("other", "m"), 5)  # nothing known: nothing to do
    share.release(ModelTuple("other", "m"))
