"""The module a ``geograph serve`` worker runs, built from the method, its parameters and artefacts.

Everything method-specific is read from the method registry (:mod:`geograph.registry`): the
servable methods, the module class, the ``params`` a configuration may set and their bounds
(:meth:`~geograph.registry.MethodSpec.check_params`), how the module is built over the corpus
(:meth:`~geograph.registry.MethodSpec.create`), the bounds on ``k``, the score range that ``/v1``
and ``/v2/rerank`` map onto [0, 1], and what a worker warms up before it reports ready. This
module adds only what is the server's own: reading the saved artefacts a configuration names
(``graph``: a directory written by :meth:`geograph.CorpusGraph.save_pretrained` or
:meth:`geograph.G3Graph.save_pretrained`; ``projection``: a directory written by
:meth:`geograph.PoincareProjection.save_pretrained`) and checking them against the corpus (its
passage ids and embeddings) and the encoder in use, refused with one line naming both sides
when they were made with another.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any, TypeVar

from geograph import registry

if TYPE_CHECKING:
    from torch import Tensor, nn

_T = TypeVar("_T")

#: every servable method (all registered ones)
METHODS = registry.names()
#: the methods with a ``/rerank`` endpoint
RERANKERS = registry.RERANKERS
#: methods that run geograph's numba kernels (the exact OT solver of the Ricci flow): their
#: workers compile or load them (:func:`geograph.functional.warmup`) before reporting ready
KERNEL_METHODS = tuple(s.name for s in registry.METHODS.values() if "numba" in s.warmup)


def method_class(method: str) -> type:
    """The module class that serves ``method``."""
    return registry.get(method).module


def method_params(method: str) -> tuple[str, ...]:
    """The ``params`` keys ``method`` accepts (build parameters first).

    Example:
        >>> method_params("maniscope")
        ('k', 'alpha', 'early_stop')
    """
    return registry.get(method).param_names()


def __getattr__(name: str) -> dict[str, tuple[str, ...]]:
    if name == "PARAMS":  # the former hand-written table, now the registry's
        return {m: method_params(m) for m in METHODS}
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def check_params(
    method: str, params: dict[str, Any], *, graph: str | None = None, projection: str | None = None
) -> None:
    """Raise ``ValueError`` on a parameter or artefact the method does not take (one line):
    :meth:`~geograph.spec.MethodSpec.check`, the check (and wording) of :meth:`~geograph.spec.MethodSpec.create`.

    Example:
        >>> check_params("maniscope", {"k": 3})
        >>> try:
        ...     check_params("maniscope", {"beta": 0.4})
        ... except ValueError as e:
        ...     print(e)
        params: unknown key 'beta' for method maniscope (allowed: k, alpha, early_stop)
    """
    registry.get(method).check(params, graph=None if graph is None else f"graph: {graph}", projection=projection)


def build_model(
    method: str,
    corpus: Tensor,
    params: dict[str, Any] | None = None,
    *,
    graph: str | None = None,
    projection: str | None = None,
    ids: Sequence[str] | None = None,
    encoder: Any = None,
) -> nn.Module:
    """The module for ``method`` over ``corpus (V, D)`` (on the corpus's device).

    ``ids`` (the corpus's passage ids) and ``encoder`` (its :class:`~geograph.artefacts.EncoderIdentity`
    or ``Encoder``) are checked against a saved ``graph``'s and ``projection``'s manifests.

    Raises:
        ValueError: a bad parameter (the registry's or the module's message), an artefact that
            cannot be read or does not match the corpus (ids, embeddings, size or dimension) or
            the encoder.
    """
    params = dict(params or {})
    check_params(method, params, graph=graph, projection=projection)
    spec = registry.get(method)
    loaded = None
    if graph is not None:
        loaded = _load(
            spec.graph.from_pretrained,  # type: ignore[union-attr]
            graph,
            "graph",
            corpus=_corpus(ids, corpus),
            encoder=encoder,
        )
        _match(loaded.embeddings.shape, *corpus.shape, graph)  # type: ignore[call-arg]  # corpus is (V, D)
    proj = None
    if projection is not None:
        from geograph.projection import PoincareProjection

        proj = _load(PoincareProjection.from_pretrained, projection, "projection", encoder=encoder)
        if proj.in_dim != corpus.shape[1]:
            raise ValueError(
                f"projection: {projection} takes {proj.in_dim}-dimensional inputs, the corpus has {corpus.shape[1]}"
            )
    return spec.create(corpus if spec.kind == "retriever" else None, params, graph=loaded, projection=proj)


def _corpus(ids: Sequence[str] | None, corpus: Tensor) -> Tensor | tuple[list[str], Tensor]:
    cpu = corpus.cpu()
    return cpu if ids is None else (list(ids), cpu)


def _load(loader: Callable[..., _T], path: str, what: str, **checks: Any) -> _T:
    from geograph.artefacts import ArtefactMismatch

    try:
        return loader(path, **checks)
    except ArtefactMismatch as e:  # made with another encoder, over another corpus, in another format
        raise ValueError(f"{what}: {str(e).splitlines()[0]}") from e
    except Exception as e:  # noqa: BLE001 - any unreadable artefact is a one-line start error
        raise ValueError(f"{what}: cannot read {path}: {str(e).splitlines()[0] if str(e) else type(e).__name__}") from e


def _match(shape: Sequence[int], v: int, d: int, path: str) -> None:
    if tuple(shape) != (v, d):
        raise ValueError(f"graph: {path} holds {shape[0]} x {shape[1]} embeddings, the corpus is {v} x {d}")


def k_bounds(method: str, model: nn.Module, num_docs: int) -> tuple[int, int | None, str]:
    """``(k_min, k_max, why)`` the module accepts on ``/retrieve`` (rerankers: bounded by the pool)."""
    spec = registry.get(method)
    return spec.k_range(model, num_docs) if spec.k_range is not None else (1, None, "")


def score_bounds(method: str, model: nn.Module) -> tuple[float, float]:
    """``(lo, hi)``: the range of a reranker's scores, which ``/v1`` and ``/v2/rerank`` map onto [0, 1]
    (the registry's :attr:`~geograph.registry.MethodSpec.score_range`, as :class:`geograph.Ranker`'s relevance).

    Example:
        >>> from geograph.rerankers import Maniscope
        >>> score_bounds("maniscope", Maniscope(alpha=0.3))
        (-0.3, 1.0)
    """
    spec = registry.get(method)
    if spec.score_range is None:
        raise ValueError(f"method must be one of {', '.join(RERANKERS)}, got {method!r}")
    return spec.score_range(model)
