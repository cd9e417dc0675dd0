"""Sphinx extension of the timeoutcore docs: what is generated at build time, and one check.

Directives (usable from MyST pages as ```{name} fences):

- ``benchmark-results``: every ``benchmarks/results/*.json`` as tables (and, when matplotlib
  is importable at build time, a chart of the latency percentiles it holds). Nothing is
  typed by hand: a figure on the Performance page is a value of a committed result file,
  next to the file's own record of where and how it was measured. A file of a shape the
  renderer does not know still renders -- every scalar somewhere in it becomes a cell.
- ``cli-help``: ``timeoutcore --help`` and each subcommand's, from the parser the console
  script uses (``timeoutcore.cli.build_parser``), so the reference cannot drift from it.
- ``towncrier-draft``: the unreleased changelog fragments (``changes/``), rendered by
  towncrier exactly as a release would write them into CHANGELOG.md.

Check: a public name of ``timeoutcore`` (its ``__all__``) without an entry in the reference
is a warning, so the ``-W`` build fails until the reference documents it.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

from docutils import nodes
from docutils.statemachine import StringList
from sphinx.application import Sphinx
from sphinx.environment import BuildEnvironment
from sphinx.util import logging
from sphinx.util.docutils import SphinxDirective

ROOT = Path(__file__).resolve().parents[2]
RESULTS = ROOT / "benchmarks" / "results"

logger = logging.getLogger(__name__)

Scalar = str | int | float | bool | None


def _is_scalar(value: Any) -> bool:
    return value is None or isinstance(value, (str, int, float, bool))


def _cell(value: Any) -> str:
    if isinstance(value, bool):
        return "yes" if value else "no"
    if value is None:
        return "–"
    if isinstance(value, float):
        return f"{value:g}"
    if isinstance(value, list):
        return ", ".join(_cell(v) for v in value)
    return str(value)


def _flatten(value: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    """Nested objects as dotted keys; lists of scalars stay one cell."""
    out: dict[str, Any] = {}
    for key, item in value.items():
        name = f"{prefix}{key}"
        if isinstance(item, dict):
            out.update(_flatten(item, f"{name}."))
        elif isinstance(item, list) and not all(_is_scalar(v) for v in item):
            out[name] = json.dumps(item)
        else:
            out[name] = item
    return out


def _table(header: list[str], rows: list[list[str]]) -> nodes.table:
    table = nodes.table(classes=["benchmark-table"])
    group = nodes.tgroup(cols=len(header))
    table += group
    for _ in header:
        group += nodes.colspec(colwidth=1)
    thead = nodes.thead()
    group += thead
    thead += _row(header)
    tbody = nodes.tbody()
    group += tbody
    for row in rows:
        tbody += _row(row)
    return table


def _row(cells: list[str]) -> nodes.row:
    row = nodes.row()
    for text in cells:
        entry = nodes.entry()
        entry += nodes.paragraph(text=text)
        row += entry
    return row


#: Keys that say where and how a file was measured (shown above its tables, not in them).
META_KEYS = ("environment", "schema", "mode", "command", "python", "machine", "server",
             "date", "host", "cpus", "commit", "engine", "load")

#: A list this long is raw samples: drawn (where matplotlib is), not printed in a cell.
SAMPLES_MIN = 7

Row = tuple[str, dict[str, Any]]


def _is_samples(value: Any) -> bool:
    return (isinstance(value, list) and len(value) >= SAMPLES_MIN
            and all(_is_scalar(v) for v in value))


def _label(entry: dict[str, Any]) -> str:
    """A row's name from its short text fields; ``x`` is left out where ``x_title`` (or,
    for ``method``, ``title``) says the same for people."""
    names = []
    for key, value in entry.items():
        if not isinstance(value, str) or key == "note" or len(value) > 40:
            continue  # a sentence (an error, a note) is for the table, not a name
        if f"{key}_title" in entry or (key == "method" and "title" in entry):
            continue
        names.append(value)
    return " / ".join(names) or "?"


def _table_of(rows: list[Row], first: str | None) -> nodes.table:
    """One row per entry; raw-sample columns are left out (they are in the file)."""
    columns = list(dict.fromkeys(c for _, fields in rows for c in fields
                                 if not any(_is_samples(f.get(c)) for _, f in rows)))
    header = ([first] if first else []) + columns
    body = [([name] if first else []) + [_cell(fields.get(c)) for c in columns]
            for name, fields in rows]
    return _table(header, body)


def _render_file(path: Path) -> tuple[list[nodes.Node], list[tuple[str, list[Row]]]]:
    """The tables of one result file, and its groups of rows to draw."""
    data = json.loads(path.read_text(encoding="utf-8"))
    out: list[nodes.Node] = [nodes.rubric(text=path.name)]
    if not isinstance(data, dict):
        data = {"results": data}
    meta: dict[str, Any] = {}
    measured: dict[str, dict[str, Any]] = {}
    lists: dict[str, list[dict[str, Any]]] = {}
    for key, value in data.items():
        if key == "environment" and isinstance(value, dict):
            meta.update(_flatten(value))
        elif _is_scalar(value) or (isinstance(value, list) and all(_is_scalar(v) for v in value)):
            meta[key] = value
        elif isinstance(value, dict):
            measured[key] = _flatten(value)
        elif isinstance(value, list) and all(isinstance(v, dict) for v in value):
            lists[key] = [_flatten(v) for v in value]
        else:
            meta[key] = json.dumps(value)
    if meta:
        items = nodes.bullet_list()
        for key in sorted(meta, key=lambda k: (k not in META_KEYS, k)):
            item = nodes.list_item()
            para = nodes.paragraph()
            para += nodes.strong(text=f"{key}: ")
            para += nodes.literal(text=_cell(meta[key]))
            item += para
            items += item
        out.append(items)
    drawn: list[tuple[str, list[Row]]] = []
    # Measurements with the same fields share one table: one row each.
    groups: dict[tuple[str, ...], list[Row]] = {}
    for name, fields in measured.items():
        groups.setdefault(tuple(fields), []).append((name, fields))
    for rows in groups.values():
        out.append(_table_of(rows, "measurement"))
    # One chart for the file's latency measurements, whichever table they are in.
    latencies = [(name, f) for name, f in measured.items()
                 if "p50_ms" in f and ("p90_ms" in f or "p99_ms" in f)]
    if latencies:
        drawn.append((path.name, latencies))
    for name, entries in lists.items():
        rows = [(_label(entry), entry) for entry in entries]
        out.append(nodes.paragraph(text=f"{name}:"))
        out.append(_table_of(rows, None))
        drawn.append((f"{path.name}: {name}", rows))
    return out, drawn


def _chart(title: str, rows: list[Row]) -> nodes.Node | None:
    """An inline SVG of the rows' latencies: a box per row where the file holds the raw
    samples (``*samples_ms``), else bars of the p50/p90/p99 it holds. None without
    matplotlib, or when the rows hold neither."""
    def number(v: Any) -> bool:
        return isinstance(v, (int, float)) and not isinstance(v, bool) and v > 0

    samples = []
    for name, f in rows:
        raw = next((f[k] for k in f if k.endswith("samples_ms")), None)
        if isinstance(raw, list):  # null, or anything else, draws nothing
            samples.append((name, [v for v in raw if number(v)]))
    samples = [(name, values) for name, values in samples if values]
    keys = [k for k in ("p50_ms", "p90_ms", "p99_ms")
            if all(number(f.get(k)) for _, f in rows)]
    if not ("p50_ms" in keys and len(keys) > 1):
        # A cost per operation (``per_block_ns``, ``cost_us``...) shared by every row.
        keys = [k for k in rows[0][1] if k.endswith(("_ns", "_us"))
                and all(number(f.get(k)) for _, f in rows)][:1]
    if not samples and (not keys or len(rows) < 2):
        return None
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return None
    import io

    count = len(samples) if samples else len(rows)
    fig, ax = plt.subplots(figsize=(8, 1 + 0.32 * count * (1 if samples else len(keys) / 2)))
    if samples:
        data = [values for _, values in samples]
        # boxplot's keywords for the orientation and the labels changed in matplotlib
        # 3.9-3.11: the newer one where it exists, and the labels set apart.
        try:
            ax.boxplot(data, orientation="horizontal", whis=(0, 100))
        except TypeError:
            ax.boxplot(data, vert=False, whis=(0, 100))
        ax.set_yticks(range(1, len(samples) + 1), [name for name, _ in samples])
        ax.set_xlabel("ms (log scale; whiskers: min and max)")
    else:
        height = 0.8 / len(keys)
        for i, key in enumerate(keys):
            ax.barh([j + i * height for j in range(len(rows))], [f[key] for _, f in rows],
                    height=height, label=key.removesuffix("_ms"))
        ax.set_yticks([j + height * (len(keys) - 1) / 2 for j in range(len(rows))],
                      [name for name, _ in rows])
        if len(keys) > 1:
            ax.legend()
        unit = keys[0].rsplit("_", 1)[1].replace("us", "µs")
        ax.set_xlabel(f"{keys[0] if len(keys) == 1 else unit} (log scale)")
    ax.invert_yaxis()
    ax.set_xscale("log")
    ax.set_title(title)
    fig.tight_layout()
    buf = io.StringIO()
    fig.savefig(buf, format="svg", metadata={"Date": None})
    plt.close(fig)
    svg = buf.getvalue()
    return nodes.raw("", svg[svg.index("<svg"):], format="html")


class BenchmarkResults(SphinxDirective):
    """``{benchmark-results}``: every result file, or the ones named as arguments."""

    optional_arguments = 50

    def run(self) -> list[nodes.Node]:
        names = self.arguments or sorted(p.name for p in RESULTS.glob("*.json"))
        out: list[nodes.Node] = []
        for name in names:
            path = RESULTS / name
            self.env.note_dependency(str(path))
            if not path.exists():
                logger.warning("benchmark-results: no result file %s", path.name,
                               location=self.get_location())
                continue
            tables, drawn = _render_file(path)
            out.extend(tables)
            for title, rows in drawn:
                chart = _chart(title, rows)
                if chart is not None:
                    out.append(chart)
        return out


class CliHelp(SphinxDirective):
    """``{cli-help}``: the console script's help, and each subcommand's."""

    def run(self) -> list[nodes.Node]:
        from timeoutcore import cli

        parser = cli.build_parser()
        parser.prog = "timeoutcore"
        out: list[nodes.Node] = [nodes.literal_block(text=parser.format_help().rstrip(), language="text")]
        for action in parser._subparsers._group_actions if parser._subparsers else []:
            for name, sub in getattr(action, "choices", {}).items():
                out.append(nodes.rubric(text=f"timeoutcore {name}"))
                out.append(nodes.literal_block(text=sub.format_help().rstrip(), language="text"))
        return out


class TowncrierDraft(SphinxDirective):
    """``{towncrier-draft}``: the fragments not yet in a release, as Markdown."""

    def run(self) -> list[nodes.Node]:
        import timeoutcore

        for fragment in (ROOT / "changes").glob("*.md"):
            self.env.note_dependency(str(fragment))
        proc = subprocess.run(
            [sys.executable, "-m", "towncrier", "build", "--draft", "--config",
             str(ROOT / "towncrier.toml"), "--dir", str(ROOT),
             "--version", timeoutcore.__version__, "--date", "unreleased"],
            capture_output=True, text=True, check=False,
        )
        # The draft goes to stdout, towncrier's progress lines to stderr.
        if proc.returncode != 0:
            logger.warning("towncrier --draft failed: %s", (proc.stderr or proc.stdout).strip(),
                           location=self.get_location())
            return []
        text = proc.stdout.strip("\n")
        container = nodes.container()
        self.state.nested_parse(StringList(text.splitlines(), source="changes/"),
                                self.content_offset, container)
        return container.children


def check_reference(app: Sphinx, env: BuildEnvironment) -> None:
    """Every name of ``timeoutcore.__all__`` has a reference entry."""
    import timeoutcore

    domain = env.get_domain("py")
    documented = {name for name, *_ in domain.get_objects()}
    missing = [n for n in timeoutcore.__all__ if f"timeoutcore.{n}" not in documented]
    if missing:
        logger.warning("public names without a reference entry: %s", ", ".join(missing))


def resolve_reexports(app: Sphinx, env: BuildEnvironment, node: Any, contnode: Any) -> Any:
    """A reference to a timeoutcore name that the role's own look-up missed:

    - ``timeoutcore.scope.DeadlineScope`` (a signature's annotation) -> the entry of
      ``timeoutcore.DeadlineScope``, the name users import;
    - a role of another kind than the entry (``:func:`thread_deadline``` names a class
      that is called like a function) -> the entry, whatever its kind.
    """
    import timeoutcore

    target = node.get("reftarget", "")
    if node.get("refdomain") != "py" or not target.startswith("timeoutcore."):
        return None
    short = target.rsplit(".", 1)[-1]
    if short in timeoutcore.__all__:
        target = f"timeoutcore.{short}"
    domain = env.get_domain("py")
    found = domain.resolve_any_xref(env, node["refdoc"], app.builder, target, node, contnode)
    return found[0][1] if found else None


def setup(app: Sphinx) -> dict[str, Any]:
    app.add_directive("benchmark-results", BenchmarkResults)
    app.add_directive("cli-help", CliHelp)
    app.add_directive("towncrier-draft", TowncrierDraft)
    app.connect("env-check-consistency", check_reference)
    app.connect("missing-reference", resolve_reexports)
    return {"parallel_read_safe": True, "parallel_write_safe": True}
