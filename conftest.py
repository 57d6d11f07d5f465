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


# doctests that run an optional package (skipped where it is missing; tests/conftest.py fails a
# missing package under CI=true, where every extra is installed)
DOCTEST_NEEDS = {
    "geograph.knn.ivf_join.ivf_self_topk": "faiss",
    "geograph.retrievers.bm25.BM25Retriever": "bm25s",
    "geograph.ranking": "sentence_transformers",  # the default encoder (the text extra)
}


def pytest_collection_modifyitems(config, items):
    import pytest

    for item in items:
        pkg = DOCTEST_NEEDS.get(item.name)
        if pkg is not None and importlib.util.find_spec(pkg) is None:
            item.add_marker(pytest.mark.skip(reason=f"the doctest needs {pkg} (an extra)"))
