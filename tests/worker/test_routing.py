"""The pure routing rules: cooldowns, the route plan, slots and which endpoint a job may start on."""

from __future__ import annotations

import pytest

from worker.routing import CooldownPolicy, CooldownTable, SlotTable, Step, pick, plan_route

POLICY = CooldownPolicy(after_failures=3, failure_cooldown_s=30.0, max_cooldown_s=300.0)


def test_retry_after_on_429_cools_the_endpoint_for_that_long() -> None:
    table = CooldownTable(POLICY)
    assert table.failed("a", now=100.0, category="rate_limited", retry_after_s=7.0) == 107.0
    assert table.cooling_until("a", 106.9) == 107.0
    assert table.cooling_until("a", 107.0) is None


def test_retry_after_on_503_cools_the_endpoint() -> None:
    table = CooldownTable(POLICY)
    assert table.failed("a", now=0.0, category="upstream_overloaded", retry_after_s=2.0) == 2.0


def test_retry_after_is_capped_at_max_cooldown() -> None:
    table = CooldownTable(POLICY)
    assert table.failed("a", now=0.0, category="rate_limited", retry_after_s=10_000.0) == 300.0


@pytest.mark.parametrize("retry_after", [None, 0.0])
def test_one_refusal_without_retry_after_does_not_cool(retry_after: float | None) -> None:
    table = CooldownTable(POLICY)
    assert table.failed("a", now=0.0, category="rate_limited", retry_after_s=retry_after) is None
    assert table.cooling_until("a", 0.0) is None


def test_retry_after_of_other_categories_does_not_cool() -> None:
    table = CooldownTable(POLICY)
    assert table.failed("a", now=0.0, category="upstream_error", retry_after_s=5.0) is None


def test_failures_in_a_row_cool_the_endpoint_at_the_threshold() -> None:
    table = CooldownTable(POLICY)
    assert table.failed("a", now=0.0, category="transport", retry_after_s=None) is None
    assert table.failed("a", now=1.0, category="timeout", retry_after_s=None) is None
    assert table.failed("a", now=2.0, category="upstream_error", retry_after_s=None) == 32.0
    assert table.failures("a") == 0  # counting starts again after the cooldown


def test_success_clears_the_count_and_the_cooldown() -> None:
    table = CooldownTable(POLICY)
    table.failed("a", now=0.0, category="transport", retry_after_s=None)
    table.failed("a", now=0.0, category="transport", retry_after_s=None)
    table.succeeded("a")
    assert table.failures("a") == 0
    assert table.failed("a", now=0.0, category="transport", retry_after_s=None) is None
    table.failed("b", now=0.0, category="rate_limited", retry_after_s=9.0)
    table.succeeded("b")
    assert table.cooling_until("b", 1.0) is None


def test_zero_after_failures_never_cools_for_failures() -> None:
    table = CooldownTable(CooldownPolicy(after_failures=0))
    for _ in range(10):
        assert table.failed("a", now=0.0, category="transport", retry_after_s=None) is None


def test_a_shorter_second_cooldown_keeps_the_longer_first() -> None:
    table = CooldownTable(POLICY)
    table.failed("a", now=0.0, category="rate_limited", retry_after_s=60.0)
    assert table.failed("a", now=1.0, category="rate_limited", retry_after_s=2.0) == 60.0
    assert table.cooling_until("a", 30.0) == 60.0


def test_plan_keeps_route_order_when_nothing_cools() -> None:
    assert plan_route(["a", "b", "c"], CooldownTable(), 5.0) == [Step("a"), Step("b"), Step("c")]


def test_plan_skips_a_cooling_endpoint_while_others_remain_and_keeps_it_last() -> None:
    table = CooldownTable(POLICY)
    table.failed("a", now=0.0, category="rate_limited", retry_after_s=10.0)
    assert plan_route(["a", "b", "c"], table, 1.0) == [Step("b"), Step("c"), Step("a", 10.0)]


def test_plan_orders_cooling_endpoints_by_the_end_of_their_cooldown() -> None:
    table = CooldownTable(POLICY)
    table.failed("a", now=0.0, category="rate_limited", retry_after_s=20.0)
    table.failed("b", now=0.0, category="rate_limited", retry_after_s=5.0)
    assert plan_route(["a", "b"], table, 1.0) == [Step("b", 5.0), Step("a", 20.0)]


def test_plan_uses_a_cooled_endpoint_again_once_its_cooldown_ended() -> None:
    table = CooldownTable(POLICY)
    table.failed("a", now=0.0, category="rate_limited", retry_after_s=10.0)
    assert plan_route(["a", "b"], table, 10.0) == [Step("a"), Step("b")]


def test_plan_leaves_out_tried_endpoints() -> None:
    assert plan_route(["a", "b", "c"], CooldownTable(), 0.0, tried=["a", "c"]) == [Step("b")]
    assert plan_route(["a"], CooldownTable(), 0.0, tried=["a"]) == []


def test_slots_count_against_the_limit_and_unlisted_endpoints_have_none() -> None:
    slots = SlotTable({"a": 2, "b": None})
    slots.take("a")
    assert slots.free("a")
    slots.take("a")
    assert not slots.free("a")
    assert slots.in_use("a") == 2
    slots.give("a")
    assert slots.free("a")
    for _ in range(1000):
        slots.take("b")
        slots.take("c")
    assert slots.free("b")
    assert slots.free("c")


def test_pick_takes_the_first_step_when_it_has_a_slot() -> None:
    assert pick([Step("a"), Step("b")], SlotTable({"a": 1}), "wait") == "a"


def test_pick_falls_back_to_the_next_step_with_a_free_slot() -> None:
    slots = SlotTable({"a": 1, "b": 1})
    slots.take("a")
    assert pick([Step("a"), Step("b"), Step("c")], slots, "fallback") == "b"
    slots.take("b")
    assert pick([Step("a"), Step("b"), Step("c")], slots, "fallback") == "c"


def test_pick_waits_when_the_route_says_wait() -> None:
    slots = SlotTable({"a": 1})
    slots.take("a")
    assert pick([Step("a"), Step("b")], slots, "wait") is None


def test_pick_waits_when_no_step_has_a_free_slot() -> None:
    slots = SlotTable({"a": 1, "b": 1})
    slots.take("a")
    slots.take("b")
    assert pick([Step("a"), Step("b")], slots, "fallback") is None


def test_pick_prefers_waiting_for_a_full_endpoint_to_a_cooling_one() -> None:
    slots = SlotTable({"a": 1})
    slots.take("a")
    assert pick([Step("a"), Step("b", 9.0)], slots, "fallback") is None
    assert pick([Step("a", 3.0), Step("b", 9.0)], slots, "fallback") == "b"
