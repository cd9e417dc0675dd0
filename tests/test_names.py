"""One name per concept: the hard limit is ``limit`` (soft: ``soft_limit``), the event is
"expired". The new spellings work everywhere; the older ones (``hard``/``soft``,
``fired_at``) keep working as aliases."""

from __future__ import annotations

import sys
from typing import Any

import pydantic
import pytest
from conftest import spin_forever

from timeoutcore import DeadlineExceeded, DeadlinePolicy, PolicyTable, cli, run


def test_thread_deadline_takes_soft_limit_and_its_alias_soft(api: Any) -> None:
    assert api.thread_deadline(1, soft_limit=0.5).soft_limit == 0.5
    assert api.thread_deadline(1, soft=0.5).soft_limit == 0.5
    with pytest.raises(TypeError, match="soft_limit or its alias soft"):
        api.thread_deadline(1, soft_limit=0.5, soft=0.5)
    with pytest.raises(ValueError, match="soft_limit must be a positive"):
        api.thread_deadline(1, soft_limit=0)


def test_decorator_keeps_the_soft_limit_spelling(api: Any) -> None:
    @api.thread_deadline(5, soft_limit=1)
    def fn() -> Any:
        return api.current_scope().soft_limit

    assert fn() == 1


def test_expired_at_is_when_the_deadline_expired(api: Any) -> None:
    scope = api.thread_deadline(0.02)
    assert scope.expired_at is None
    with pytest.raises(DeadlineExceeded):
        with scope:
            spin_forever()
    assert scope.expired() and scope.expired_at is not None
    assert scope.expired_at == scope.fired_at  # the older name
    assert scope.entered_at < scope.expired_at <= scope.exited_at


def test_policy_takes_limit_and_soft_limit_and_the_old_keys() -> None:
    new = DeadlinePolicy(limit=2, soft_limit=1)
    old = DeadlinePolicy(hard=2, soft=1)
    assert new == old
    assert (new.limit, new.soft_limit) == (2, 1) and (new.hard, new.soft) == (2, 1)
    assert DeadlinePolicy.model_validate({"limit": 3}).limit == 3
    assert new.model_dump()["hard"] == 2  # serialised as before


def test_policy_refuses_both_spellings_of_one_limit() -> None:
    with pytest.raises(pydantic.ValidationError):
        DeadlinePolicy(limit=2, hard=3)


def test_policy_table_from_env_reads_limit_and_soft_limit() -> None:
    env = {"TIMEOUTCORE_POLICY__RESIZE__LIMIT": "2", "TIMEOUTCORE_POLICY__RESIZE__SOFT_LIMIT": "1",
           "TIMEOUTCORE_POLICY__DEFAULT__HARD": "30"}
    table = PolicyTable.from_env(env)
    assert (table.get("resize").limit, table.get("resize").soft_limit) == (2, 1)
    assert table.get("other").limit == 30


def test_run_takes_limit_and_soft_limit() -> None:
    result = run([sys.executable, "-c", "pass"], limit=10, soft_limit=5)
    assert result.status == "completed"
    assert (result.limit, result.soft_limit) == (10, 5) and (result.hard, result.soft) == (10, 5)


def test_run_refuses_both_spellings_and_needs_a_limit() -> None:
    with pytest.raises(TypeError, match="limit or its alias hard"):
        run(["true"], limit=1, hard=1)
    with pytest.raises(TypeError, match="needs the hard limit"):
        run(["true"])


@pytest.mark.parametrize("flags", [["--limit", "2", "--soft-limit", "1"],
                                   ["--hard", "2", "--soft", "1"]])
def test_cli_run_takes_limit_and_the_old_flags(flags: list[str]) -> None:
    args = cli.build_parser().parse_args(["run", *flags, "--", "true"])
    assert (args.hard, args.soft) == (2.0, 1.0)
