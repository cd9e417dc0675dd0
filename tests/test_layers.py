"""The package's structure: fork callbacks in layer order, no import cycles, a cheap import."""

from __future__ import annotations

import ast
import os
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

import pytest
from conftest import needs_gil

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
            "_status", "_stop", "_hooks", "scope", "blocking", "_process_tree", "patch", "_patch_socket",
            "_patch_subprocess"]
    features = {"soft", "results", "policy", "metrics", "executor", "subprocess", "cli",
                "bench", "contrib", "contrib.celery", "contrib.redis"}
    for name in core:
        deps = {d.removeprefix("timeoutcore.") for d in graph[f"timeoutcore.{name}"]}
        assert not deps & features, (name, deps & features)


# --- import cost ----------------------------------------------------------------------------

HEAVY = ("pydantic", "orjson", "logging", "ssl")


def _python(code: str, engine: str = "auto") -> None:
    env = dict(os.environ, TIMEOUTCORE_ENGINE=engine)
    # From a scratch folder: `-c` puts the current directory first on sys.path, and the
    # source tree has no build for this interpreter where nox installs the package (with a
    # GIL "auto" then quietly tested the fallback engine; free-threaded, it failed).
    proc = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True,
                          text=True, timeout=60, cwd=tempfile.gettempdir())
    assert proc.returncode == 0, proc.stderr


@pytest.mark.parametrize("engine", ["auto", pytest.param("fallback", marks=needs_gil)])
def test_import_and_a_plain_block_load_no_heavy_module(engine: str) -> None:
    _python(
        "import sys, timeoutcore\n"
        "with timeoutcore.thread_deadline(1):\n"
        "    pass\n"
        f"loaded = [m for m in {HEAVY!r} if m in sys.modules]\n"
        "assert not loaded, loaded\n",
        engine,
    )


def test_the_features_load_what_they_need_when_used() -> None:
    _python(
        "import sys, timeoutcore\n"
        "with timeoutcore.thread_deadline(1) as scope:\n"
        "    pass\n"
        "assert 'pydantic' not in sys.modules\n"
        "assert scope.result.status == 'completed'\n"
        "assert 'pydantic' in sys.modules and 'timeoutcore._json' in sys.modules\n"
    )
    _python(
        "import sys, timeoutcore\n"
        "m = timeoutcore.metrics.enable()\n"
        "with timeoutcore.thread_deadline(1, label='x'):\n"
        "    pass\n"
        "assert m.snapshot()['by_status'] == {'completed': 1}\n"
        "assert 'pydantic' not in sys.modules and 'orjson' not in sys.modules\n"
        "assert m.snapshot_json() and 'timeoutcore._json' in sys.modules\n"
    )
    _python(
        "import sys, timeoutcore\n"
        "assert timeoutcore.DeadlinePolicy(limit=1).limit == 1\n"
        "assert 'pydantic' in sys.modules\n"
    )


def test_lazy_names_are_listed_and_importable() -> None:
    names = set(dir(timeoutcore))
    assert set(timeoutcore.__all__) <= names
    for name in timeoutcore.__all__:
        assert getattr(timeoutcore, name) is not None
    with pytest.raises(AttributeError, match="no attribute 'nope'"):
        timeoutcore.nope  # noqa: B018


def test_patch_is_the_function_after_its_module_was_imported() -> None:
    import importlib

    module = importlib.import_module("timeoutcore.patch")
    assert callable(timeoutcore.patch) and timeoutcore.patch is module.patch
