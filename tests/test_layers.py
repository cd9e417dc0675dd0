"""The package's structure: fork callbacks in layer order, no import cycles, a cheap import."""

from __future__ import annotations

from typing import Any

import pytest

from timeoutcore import _fork


def test_fork_callbacks_run_by_layer_then_in_registration_order(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(_fork, "_phases", {p: [] for p in _fork._phases})
    calls: list[str] = []
    for layer, name in [(_fork.CONTRIB, "redis"), (_fork.FEATURE, "soft"),
                        (_fork.ENGINE, "engine"), (_fork.FEATURE, "soft-2")]:
        _fork.register(layer, before=lambda n=name: calls.append(f"before {n}"),
                       after_in_child=lambda n=name: calls.append(f"child {n}"))
    _fork._run("before")
    _fork._run("after_in_child")
    order = ["engine", "soft", "soft-2", "redis"]
    assert calls == [f"before {n}" for n in order] + [f"child {n}" for n in order]


def test_a_failing_fork_callback_does_not_stop_the_others(
    monkeypatch: pytest.MonkeyPatch, capsys: Any
) -> None:
    monkeypatch.setattr(_fork, "_phases", {p: [] for p in _fork._phases})
    calls: list[str] = []

    def broken() -> None:
        raise RuntimeError("boom")

    _fork.register(_fork.ENGINE, after_in_child=broken)
    _fork.register(_fork.FEATURE, after_in_child=lambda: calls.append("soft"))
    _fork._run("after_in_child")
    assert calls == ["soft"]
    assert "boom" in capsys.readouterr().err
