"""Doctest collection (``--doctest-modules``) imports every module of the package. The framework
integrations import their framework at module level (they subclass its classes), so the ones
whose framework is not installed are left out here; tests/test_integrations.py requires them
(and fails under ``CI=true`` without them)."""

import importlib.util

FRAMEWORKS = {"langchain": "langchain_core", "llamaindex": "llama_index", "haystack": "haystack"}

collect_ignore = [
    f"geograph/integrations/{name}.py" for name, pkg in FRAMEWORKS.items() if importlib.util.find_spec(pkg) is None
]

# geograph.serve imports pydantic (from LitServe) at module level: the `serve` extra.
if importlib.util.find_spec("litserve") is None:
    collect_ignore.append("geograph/serve")

# geograph.train (f_theta training) imports Lightning at module level: the `train` extra.
if importlib.util.find_spec("lightning") is None or importlib.util.find_spec("jsonargparse") is None:
    collect_ignore.append("geograph/train")
