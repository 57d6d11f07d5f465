"""Data: BEIR-format loaders, the shipped demo corpus and the embedding cache."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from geograph._lazy import lazy_getattr
from geograph.data.beir import BEIRError, Dataset, check_beir, load_beir, load_corpus

if TYPE_CHECKING:
    from geograph.data.cache import (
        DEFAULT_MODEL_NAME,
        EmbeddingCache,
        Encoder,
        EncoderUnavailable,
        cache_dir,
        check_model,
        default_model_path,
    )

#: the encoder and the embedding cache (:mod:`geograph.data.cache`, which loads torch) are
#: imported on first use, so that a command that only resolves a corpus path does not load it
_CACHE_NAMES = (
    "DEFAULT_MODEL_NAME",
    "EmbeddingCache",
    "Encoder",
    "EncoderUnavailable",
    "cache_dir",
    "check_model",
    "default_model_path",
)
__getattr__ = lazy_getattr(__name__, dict.fromkeys(_CACHE_NAMES, "geograph.data.cache"), globals())


#: The small demo corpus shipped with the package (BEIR layout, split ``test``).
DEMO_PATH = Path(__file__).parent / "demo"

#: The corpora shipped with the package, by the name a command takes in place of a folder.
SHIPPED_CORPORA = {"demo": DEMO_PATH}


def corpus_path(value: str | Path) -> Path:
    """A corpus argument (``--corpus``, ``--data``) as a path: an existing file or folder as
    given, else the shipped corpus it names (``demo``, also written ``geograph/data/demo`` as
    in a source tree), else ``value`` as given, for the caller's "no such folder" error.

    Every command that takes a corpus folder resolves it here, so ``--corpus demo`` works from
    any directory with the installed package.

    Example:
        >>> corpus_path("demo") == DEMO_PATH
        True
        >>> corpus_path("no/such/folder").as_posix()
        'no/such/folder'
    """
    path = Path(value).expanduser()
    if path.exists():
        return path
    name = Path(value).as_posix().removeprefix("geograph/data/")
    return SHIPPED_CORPORA.get(name, path)


def load_demo() -> Dataset:
    """The shipped demo corpus (111 passages, 42 queries; see ``geograph/data/demo/README.md``).

    Twelve single-topic questions over six topics, and thirty two-hop bridge questions whose
    second passage shares only an entity with the first (a query field ``part`` tells them
    apart; bridge questions carry their ``answer``).

    Example:
        >>> data = load_demo()
        >>> len(data.doc_ids), len(data.queries), data.query_fields["m01"]["part"]
        (111, 42, 'multi-hop')
    """
    return load_beir(DEMO_PATH, split="test")


__all__ = [
    "Dataset",
    "load_beir",
    "load_corpus",
    "check_beir",
    "BEIRError",
    "load_demo",
    "DEMO_PATH",
    "SHIPPED_CORPORA",
    "corpus_path",
    "EmbeddingCache",
    "Encoder",
    "EncoderUnavailable",
    "check_model",
    "cache_dir",
    "default_model_path",
    "DEFAULT_MODEL_NAME",
]
