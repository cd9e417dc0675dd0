"""Bad input gets a clear error that names the argument, and leaves nothing armed."""

from __future__ import annotations

import math
import time
from typing import Any

import pytest

import timeoutcore


@pytest.mark.parametrize(
    "value, error, words",
    [
        (0, ValueError, "positive"),
        (-1, ValueError, "positive"),
        (math.nan, ValueError, "finite"),
        (math.inf, ValueError, "finite"),
        (-math.inf, ValueError, "finite"),
        ("1", TypeError, "number of seconds"),
        (True, TypeError, "number of seconds"),
        (b"1", TypeError, "number of seconds"),
        (1e12, ValueError, "too large"),
    ],
)
def test_bad_seconds(api: Any, value: Any, error: type, words: str) -> None:
    with pytest.raises(error, match=words) as info:
        api.thread_deadline(value)
    assert "seconds" in str(info.value)
    assert api.current_scope() is None and api.remaining() is None


@pytest.mark.parametrize("when", [math.nan, math.inf, "soon", None, False])
def test_bad_absolute_deadline(api: Any, when: Any) -> None:
    with pytest.raises((TypeError, ValueError), match="when|deadline|seconds"):
        api.thread_deadline_at(when) if when is not None else api.thread_deadline(
            1, deadline=1.0
        )
    assert api.current_scope() is None


def test_bad_label(api: Any) -> None:
    with pytest.raises(TypeError, match="label"):
        api.thread_deadline(1, label=3)


def test_bad_reschedule_leaves_the_deadline(api: Any) -> None:
    with api.thread_deadline(5) as scope:
        before = scope.when()
        with pytest.raises(ValueError, match="when"):
            scope.reschedule(math.nan)
        with pytest.raises(TypeError, match="when"):
            scope.reschedule("later")
        assert scope.when() == before


def test_bad_sleep(api: Any) -> None:
    for bad, err in [(-1, ValueError), (math.nan, ValueError), ("1", TypeError), (None, TypeError)]:
        with pytest.raises(err):
            api.sleep(bad)


def test_nothing_armed_after_bad_input_in_a_scope() -> None:
    with pytest.raises(ValueError):
        with timeoutcore.thread_deadline(-1):
            pass
    assert timeoutcore.current_scope() is None
    t0 = time.monotonic()
    timeoutcore.sleep(0.02)  # would end early if a deadline were armed
    assert time.monotonic() - t0 >= 0.02


def test_decorating_a_non_callable(api: Any) -> None:
    with pytest.raises(TypeError, match="callable"):
        api.thread_deadline(1)(42)
