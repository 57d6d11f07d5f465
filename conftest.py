"""Doctest collection (``--doctest-modules``) imports every module of the package. The framework
integrations import their framework at module level (they subclass its classes), so the ones
whose framework is not installed are left out here; tests/test_integrations.py requires them
(and fails under ``CI=true`` without them)."""
import importlib.util

FRAMEWORKS = {"langchain": "langchain_core", "llamaindex": "llama_index", "haystack": "haystack"}

collect_ignore = [f"geograph/integrations/{name}.py" for name, pkg in FRAMEWORKS.items()
                  if importlib.util.find_spec(pkg) is None]
