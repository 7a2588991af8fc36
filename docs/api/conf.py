"""Sphinx configuration of shoal's API reference (built by scripts/build-api-docs).

The pages document what a user imports; the text comes from the docstrings, so the
reference cannot drift from the code.  The markdown guides in docs/ teach; this
reference is the one place that lists every public name with its signature.
"""

from __future__ import annotations

import sys
from pathlib import Path

from sphinx.ext.napoleon import Config as NapoleonConfig
from sphinx.ext.napoleon.docstring import GoogleDocstring, NumpyDocstring

# Import the checkout this file belongs to, not whichever shoal is installed.
sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

project = "shoal"
author = "the shoal developers"
copyright = "the shoal developers"

extensions = [
    "sphinx.ext.autodoc",
    "sphinx.ext.doctest",
    "sphinx.ext.viewcode",
]

# Members in the order the source defines them; annotations stay in the signatures
# (the docstrings describe parameters in prose, so a separate parameter list would
# repeat only the types), shortened to the last name.  __all__ is the list of what a
# module exports: autodoc respects it, so a name is documented exactly when it is
# public; undoc-members adds enum values and dataclass fields.
autodoc_member_order = "bysource"
autodoc_typehints = "signature"
autodoc_typehints_format = "short"
autodoc_default_options = {
    "members": True,
    "show-inheritance": True,
    "undoc-members": True,
}
# Cross-references to names outside the documented set (numpy, concurrent.futures,
# private modules) are not warnings: the reference documents shoal's names.
nitpicky = False

html_theme = "alabaster"
html_title = "shoal API reference"
exclude_patterns = ["_build"]


# shoal's docstrings are reStructuredText prose.  A method that overrides one of the
# standard library's or joblib's without a docstring of its own inherits theirs
# (``Future.result``: concurrent.futures' Google-style "Args:/Returns:" sections;
# ``ShoalBackend.submit``: joblib's numpy-style ones), which only napoleon reads.  Napoleon
# runs on those inherited docstrings alone: on shoal's own it would misread a property's
# "what: more" first line as "type: description".
_NAPOLEON = NapoleonConfig(napoleon_use_rtype=False)


def _read_inherited_sections(app, what, name, obj, options, lines):
    if what not in ("method", "function", "class") or not lines:
        return
    if getattr(obj, "__doc__", None) is not None:
        return  # written here: plain reStructuredText
    text = str(NumpyDocstring(str(GoogleDocstring(lines, _NAPOLEON)).splitlines(), _NAPOLEON))
    lines[:] = text.splitlines()


def setup(app):
    app.connect("autodoc-process-docstring", _read_inherited_sections)
