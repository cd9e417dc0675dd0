"""The package's structure: fork callbacks in layer order, no import cycles, a cheap import."""

from __future__ import annotations

import ast
from pathlib import Path
from typing import Any

import pytest

import timeoutcore
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


# --- import structure -----------------------------------------------------------------------

PACKAGE = Path(timeoutcore.__file__).parent


def _module_name(path: Path) -> str:
    parts = ["timeoutcore", *path.relative_to(PACKAGE).with_suffix("").parts]
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def import_graph() -> dict[str, set[str]]:
    """Module -> the package modules it imports, at module level or inside functions."""
    modules = {_module_name(p): p for p in PACKAGE.rglob("*.py")}
    compiled = {f"timeoutcore.{p.name.split('.')[0]}" for p in PACKAGE.glob("*.so")}
    graph: dict[str, set[str]] = {}
    for name, path in modules.items():
        package = name if path.name == "__init__.py" else name.rpartition(".")[0]
        edges: set[str] = set()
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            targets: list[str] = []
            if isinstance(node, ast.Import):
                targets = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
                    base = ".".join(anchor + ([node.module] if node.module else []))
                targets = [f"{base}.{alias.name}" for alias in node.names]
                if node.module:
                    targets.append(base)
            for target in targets:
                while target and target not in modules and target not in compiled:
                    target = target.rpartition(".")[0]
                if target in compiled:
                    continue
                if target and target != name:
                    edges.add(target)
        graph[name] = edges
    return graph


def test_the_package_has_no_import_cycles() -> None:
    graph = import_graph()
    done: set[str] = set()

    def visit(module: str, path: list[str]) -> None:
        if module in path:
            cycle = path[path.index(module):] + [module]
            pytest.fail("import cycle: " + " -> ".join(cycle))
        if module in done:
            return
        for dep in sorted(graph[module]):
            visit(dep, path + [module])
        done.add(module)

    for module in sorted(graph):
        visit(module, [])


def test_lower_layers_do_not_import_the_features() -> None:
    graph = import_graph()
    core = ["_validate", "_fork", "errors", "_engine_api", "_fallback", "_native", "_engine",
            "_status", "_hooks", "scope", "blocking"]
    features = {"soft", "results", "policy", "metrics", "executor", "subprocess", "cli",
                "bench", "contrib", "contrib.celery", "contrib.redis"}
    for name in core:
        deps = {d.removeprefix("timeoutcore.") for d in graph[f"timeoutcore.{name}"]}
        assert not deps & features, (name, deps & features)
