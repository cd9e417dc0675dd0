"""Sphinx configuration of the documentation site (MyST Markdown pages, the furo theme).

Build: ``nox -s docs``, which runs
``sphinx-build -W --keep-going -n -b html docs docs/_build/html`` against the *installed*
package (autodoc imports it; the reference pages are its docstrings).

Rules the build enforces (``-W``: any warning fails it):

- ``nitpicky``: every cross-reference to a ``timeoutcore`` name must resolve. References to
  other projects are not checked: intersphinx is off, so the build needs no network, and a
  link to the standard library is plain text rather than a guess.
- A link to a page that does not exist is a warning (MyST), so links are checked offline.
- ``_ext/timeoutcore_docs.py`` fails the build when a public name of ``timeoutcore`` has no
  reference entry, renders the benchmark tables from ``benchmarks/results/*.json``, the CLI's
  help and the changelog's unreleased fragments.
"""

from __future__ import annotations

import sys
from pathlib import Path

import timeoutcore

DOCS = Path(__file__).resolve().parent
sys.path.insert(0, str(DOCS / "_ext"))

project = "timeoutcore"
author = "timeoutcore developers"
copyright = "timeoutcore developers"  # noqa: A001 -- Sphinx's name for the footer line
release = version = timeoutcore.__version__

extensions = [
    "myst_parser",
    "sphinx.ext.autodoc",
    "timeoutcore_docs",
]

source_suffix = {".md": "markdown", ".rst": "restructuredtext"}
root_doc = "index"
exclude_patterns = ["_build", "_ext", "Thumbs.db", ".DS_Store"]

myst_enable_extensions = ["colon_fence", "deflist"]
# `[text](page.md#a-heading)` links: anchors for headings down to level 3.
myst_heading_anchors = 3

nitpicky = True
# Only this project's names are checked (see the module docstring): without intersphinx a
# reference to `threading.Lock` or `pydantic.BaseModel` cannot resolve, offline or not.
# Inside timeoutcore, what the reference does not document on purpose: private modules and
# names (a signature's base class or alias), type variables, and modules (a page documents
# the names users import, not the module a name lives in).
nitpick_ignore_regex = [
    (r"py:.*", r"(?!timeoutcore\b).*"),
    (r"py:.*", r"timeoutcore(\.\w+)*\._\w+.*"),
    (r"py:.*", r"timeoutcore(\.\w+)*\.[A-Z]"),
    (r"py:mod", r"timeoutcore(\.\w+)*"),
]

autodoc_member_order = "bysource"
autodoc_typehints = "signature"
# pydantic's own class attributes carry pydantic's docstrings, not ours.
autodoc_default_options = {
    "members": True,
    "exclude-members": "model_config, model_fields, model_computed_fields",
}

html_theme = "furo"
html_title = f"timeoutcore {release}"
pygments_style = "friendly"

# The integrations' frameworks are not installed for the docs build (it stays quick); their
# modules are documented from stand-ins of those imports.
autodoc_mock_imports = ["celery", "redis", "anyio", "django", "pytest", "dramatiq", "rq", "huey"]
