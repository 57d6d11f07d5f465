"""Sphinx configuration of the geograph site: ``make docs`` builds it to ``docs/_build/html``
with warnings as errors (``-W``, nitpicky: every cross-reference must resolve)."""

import importlib.util
import sys
from pathlib import Path

DOCS = Path(__file__).resolve().parent
ROOT = DOCS.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(DOCS / "_ext"))

import geograph  # noqa: E402

project = "geograph"
author = "the geograph authors"
copyright = "the geograph authors, MIT license"
release = version = geograph.__version__

extensions = [
    "sphinx.ext.autodoc",
    "sphinx.ext.napoleon",
    "sphinx.ext.mathjax",
    "myst_parser",
    "geograph_docs",
]
source_suffix = {".md": "markdown", ".rst": "restructuredtext"}
exclude_patterns = ["_build", "bench/*.md", "Thumbs.db", ".DS_Store"]
# pages other files include, not documents of their own
exclude_patterns += ["changelog-source.md"]

myst_enable_extensions = ["dollarmath", "amsmath", "colon_fence", "deflist"]
myst_heading_anchors = 3
# text as written: no "--" turned into an en dash (`--text-cache-size` stays a flag), no curly quotes
smartquotes = False

autodoc_default_options = {"members": True, "undoc-members": False, "show-inheritance": False}
autodoc_member_order = "bysource"
autodoc_typehints = "description"
# types into the Args of a docstring, not a second list of parameters the docstring does not describe
autodoc_typehints_description_target = "documented"
autodoc_typehints_format = "short"
autodoc_preserve_defaults = True
autodoc_mock_imports: list[str] = []
napoleon_google_docstring = True
napoleon_numpy_docstring = False
napoleon_use_rtype = False
napoleon_attr_annotations = True
# a docstring's Attributes section becomes fields of its class: autodoc documents the attributes themselves
napoleon_use_ivar = True

nitpicky = True
# names of other libraries whose inventories are not fetched (the build needs no network), and
# typing constructs autodoc spells out
nitpick_ignore_regex = [
    (r"py:.*", r"(torch|numpy|np|nn|ot|scipy|networkx|ray|faiss|litserve|fastapi|pydantic|lightning|geoopt)(\..*)?"),
    (r"py:.*", r"(langchain_core|llama_index|haystack|sentence_transformers|jsonargparse|starlette)(\..*)?"),
    (r"py:class", r"(Tensor|Module|Parameter|Path|PathLike|Callable|Sequence|Mapping|Iterable|Iterator|Any)"),
    (r"py:class", r"SentenceTransformer"),
    (r"py:class", r"(collections\.abc|typing|pathlib|os|argparse|concurrent\.futures|dataclasses|enum)\..*"),
    (r"py:class", r"(Literal|Kind|T|optional|callable|array-like|dtype|device|torch.device)"),
    (r"py:.*", r"(float|int|bool|str|tuple|list|dict|None|type|object|bytes|Exception|ValueError)"),
    # pydantic's field constraints as autodoc prints them, and pydantic / framework base classes
    (r"py:class", r"(annotated_types\..*|(ge|gt|le|lt)=.*|SecretStr|BaseModel|Document|inspect\._empty)"),
    # "band, beta, max_degree: ..." in an Args section: napoleon reads the names as types
    (r"py:class", r"(band|beta)"),
]

html_theme = "furo"
html_title = f"geograph {version}"
html_static_path = ["_static"]
html_css_files = ["geograph.css"]
html_show_sourcelink = False
pygments_style = "friendly"
pygments_dark_style = "monokai"
# Math renders without network: MathJax 3.2.2 ships inside the package sphinx-mathjax-offline (the `docs`
# extra), whose static folder is copied to _build/html/_static/mathjax (its Sphinx extension is not used: it
# would set the CHTML build, whose web fonts browsers refuse to load from file:// pages in another folder).
# The SVG build has its glyphs inside the script. MyST marks the pages ignored and the `math` containers
# processed, so MathJax typesets only what Sphinx wrapped as math.
_mathjax = importlib.util.find_spec("sphinx-mathjax-offline")
if _mathjax is None or _mathjax.origin is None:
    raise ImportError("the docs need sphinx-mathjax-offline (MathJax): pip install 'geograph-rag[docs]'")
html_static_path.append(str(Path(_mathjax.origin).parent / "static"))
mathjax_path = "mathjax/tex-svg.js"
mathjax3_config = {"options": {"processHtmlClass": "tex2jax_process|mathjax_process|math|output_area"}}
