"""Data: BEIR-format loaders, the shipped demo corpus and the embedding cache."""
from pathlib import Path

from geograph.data.beir import Dataset, load_beir
from geograph.data.cache import DEFAULT_MODEL_NAME, EmbeddingCache, Encoder, cache_dir, default_model_path

#: The small demo corpus shipped with the package (BEIR layout, split ``test``).
DEMO_PATH = Path(__file__).parent / "demo"


def load_demo() -> Dataset:
    """The shipped demo corpus: a few dozen passages over a handful of topics, with queries."""
    return load_beir(DEMO_PATH, split="test")


__all__ = ["Dataset", "load_beir", "load_demo", "DEMO_PATH", "EmbeddingCache", "Encoder",
           "cache_dir", "default_model_path", "DEFAULT_MODEL_NAME"]
