"""Policies: validation with clear messages, tables from dict / JSON / environment."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import pytest
from conftest import spin_forever
from pydantic import ValidationError

import timeoutcore
from timeoutcore import DeadlineExceeded, DeadlinePolicy, PolicyTable


@pytest.mark.parametrize(
    "fields, words",
    [
        ({"hard": 0}, "positive"),
        ({"hard": -1}, "positive"),
        ({"hard": math.nan}, "finite"),
        ({"hard": math.inf}, "finite"),
        ({"hard": 1, "soft": 1}, "less than"),
        ({"hard": 1, "soft": 2}, "less than"),
        ({"hard": 1, "soft": 0}, "positive"),
        ({"hard": "soon"}, "hard"),
        ({}, "hard"),
        ({"hard": 1, "colour": "red"}, "colour"),
        ({"hard": 1, "soft_raise": "maybe"}, "soft_raise"),
    ],
)
def test_bad_policies_are_rejected_clearly(fields: dict[str, Any], words: str) -> None:
    with pytest.raises(ValidationError, match=words):
        DeadlinePolicy(**fields)


def test_policy_makes_scopes() -> None:
    policy = DeadlinePolicy(hard=0.02, soft=0.01, label="p")
    with pytest.raises(DeadlineExceeded) as info:
        with policy.scope() as scope:
            spin_forever()
    assert info.value.label == "p" and scope.soft_limit == 0.01


def test_table_from_dict_with_default() -> None:
    table = PolicyTable.from_dict({"default": {"hard": 30}, "resize": {"hard": 2, "soft": 1}})
    assert table.get("resize").soft == 1
    assert table.get("RESIZE").hard == 2
    assert table.get("anything").hard == 30
    assert table.scope("resize").label == "resize"
    assert PolicyTable.from_dict({"a": {"hard": 1}}).default is None
    with pytest.raises(KeyError, match="no deadline policy"):
        PolicyTable.from_dict({"a": {"hard": 1}}).get("b")


def test_table_from_json(tmp_path: Path) -> None:
    path = tmp_path / "policies.json"
    path.write_text(json.dumps({"default": {"hard": 5}, "io": {"hard": 1, "soft_raise": False}}))
    table = PolicyTable.from_json(path)
    assert table.names() == ["io"] and table.get("x").hard == 5
    path.write_text("[1, 2]")
    with pytest.raises(ValueError, match="JSON object"):
        PolicyTable.from_json(path)


def test_table_from_environment() -> None:
    env = {
        "TIMEOUTCORE_POLICY__RESIZE__HARD": "2.5",
        "TIMEOUTCORE_POLICY__RESIZE__SOFT": "1",
        "TIMEOUTCORE_POLICY__RESIZE__SOFT_RAISE": "true",
        "TIMEOUTCORE_POLICY__DEFAULT__HARD": "60",
        "UNRELATED": "x",
    }
    table = PolicyTable.from_env(env)
    p = table.get("resize")
    assert (p.hard, p.soft, p.soft_raise) == (2.5, 1.0, True)
    assert table.get("other").hard == 60
    with pytest.raises(ValueError, match="invalid policy"):
        PolicyTable.from_env({"TIMEOUTCORE_POLICY__X__HARD": "-1"})
    with pytest.raises(ValueError, match="JOB"):
        PolicyTable.from_env({"TIMEOUTCORE_POLICY__HARD": "1"})


def test_from_policy_on_thread_deadline(monkeypatch: pytest.MonkeyPatch) -> None:
    table = PolicyTable.from_dict({"quick": {"hard": 0.02}})
    timeoutcore.set_policy_table(table)
    try:
        with pytest.raises(DeadlineExceeded) as info:
            with timeoutcore.thread_deadline.from_policy("quick"):
                spin_forever()
        assert info.value.label == "quick"
        scope = timeoutcore.thread_deadline.from_policy(DeadlinePolicy(hard=3))
        assert scope.limit == 3
    finally:
        timeoutcore.set_policy_table(None)
    monkeypatch.setenv("TIMEOUTCORE_POLICY__ENVJOB__HARD", "4")
    assert timeoutcore.thread_deadline.from_policy("envjob").limit == 4
    timeoutcore.set_policy_table(None)
