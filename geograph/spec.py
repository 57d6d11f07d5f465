"""The declaration of a method: :class:`MethodSpec` and its :class:`Param` s.

A method folder (``geograph/methods/<name>/spec.py``) or an installed plugin defines one
:class:`MethodSpec` named ``SPEC``; :mod:`geograph.registry` collects them. This module sits below
the method folders, so it imports none of them.

Example:
    >>> from geograph.spec import Param
    >>> Param("alpha", float, **UNIT).describe()
    'a float in [0, 1]'
"""

from __future__ import annotations

import importlib
import inspect
import math
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, Literal, TypedDict

from torch import Tensor, nn

# the argument checks a method's functions and Modules raise with (public here, for plugins)
from geograph._checks import check_candidates, check_unit_interval

__all__ = [
    "Kind",
    "Param",
    "MethodSpec",
    "RankerReference",
    "check_values",
    "check_candidates",
    "check_unit_interval",
    "listing",
    "linear_relevance",
    "Bounds",
    "UNIT",
    "POS_INT",
]

Kind = Literal["reranker", "retriever"]
#: a method's slow reference for one query, as its benchmark factory (:attr:`MethodSpec.reference`)
#: returns it: ``(query (D,), candidate indices (M,))`` -> the corpus indices the method returns, best first
RankerReference = Callable[[Tensor, Any], Any]
_NO_DEFAULT = inspect.Parameter.empty


@dataclass(frozen=True)
class Param:
    """One parameter a configuration may set, with the values it accepts.

    Attributes:
        name: the keyword (a constructor argument, or a build parameter of the corpus structure).
        type: ``int``, ``float``, ``bool``, ``str`` or ``tuple`` (a ``(lo, hi)`` pair of floats).
        low, high: bounds of a number (``None``: unbounded on that side).
        low_open, high_open: whether ``low`` / ``high`` themselves are excluded.
        choices: the accepted strings (of a ``str`` parameter, or besides the numbers of an ``int``
            parameter, e.g. ``nprobe``: an integer or ``"auto"``).
        optional: ``None`` is accepted as well.
        default: the default of a parameter that is not a constructor argument (a build parameter);
            constructor arguments take theirs from the signature (:meth:`MethodSpec.defaults`).
        doc: one line on what it does.
    """

    name: str
    type: type
    low: float | None = None
    high: float | None = None
    low_open: bool = False
    high_open: bool = False
    choices: tuple[str, ...] | None = None
    optional: bool = False
    default: Any = _NO_DEFAULT
    doc: str = ""

    def describe(self) -> str:
        """The accepted values in words, as error messages and docs print them.

        Example:
            >>> Param("k", int, low=1).describe(), Param("step", float, low=0, high=1, low_open=True).describe()
            ('an integer >= 1', 'a float in (0, 1]')
        """
        if self.type is str:
            text = f"one of {', '.join(self.choices or ())}"
        elif self.type is bool:
            text = "true or false"
        elif self.type is tuple:
            text = "a pair [lo, hi] with -1 <= lo < hi <= 1"
        else:
            noun = "an integer" if self.type is int else "a float"
            lo, hi = _num(self.low), _num(self.high)
            if self.low is not None and self.high is not None:
                text = f"{noun} in {'(' if self.low_open else '['}{lo}, {hi}{')' if self.high_open else ']'}"
            elif self.low is not None:
                text = f"{noun} {'>' if self.low_open else '>='} {lo}"
            elif self.high is not None:
                text = f"{noun} {'<' if self.high_open else '<='} {hi}"
            else:
                text = f"a finite {noun[2:] if noun.startswith('a ') else noun[3:]}"
        if self.choices is not None and self.type is not str:
            text = f"{text} or one of {', '.join(self.choices)}"
        return f"{text} or null" if self.optional else text

    def accepts(self, value: Any) -> bool:
        """Whether ``value`` is one of the accepted values (type and bounds).

        Example:
            >>> p = Param("alpha", float, low=0, high=1)
            >>> p.accepts(0.5), p.accepts(1.5), p.accepts(float("nan")), p.accepts(True)
            (True, False, False, False)
        """
        if value is None:
            return self.optional
        if isinstance(value, str) or self.type is str:
            return isinstance(value, str) and value in (self.choices or ())
        if self.type is bool:
            return isinstance(value, bool)
        if self.type is tuple:
            try:
                lo, hi = (float(x) for x in value)
            except (TypeError, ValueError):
                return False
            return -1.0 <= lo < hi <= 1.0
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            return False
        if self.type is int and not isinstance(value, int):
            return False
        x = float(value)
        if not math.isfinite(x):
            return False
        if self.low is not None and (x <= self.low if self.low_open else x < self.low):
            return False
        return not (self.high is not None and (x >= self.high if self.high_open else x > self.high))

    def check(self, value: Any, where: str | None = "params") -> Any:
        """``value`` if accepted (a ``float`` parameter's number as a float), else a one-line
        ``ValueError`` naming the parameter and its range, after ``where`` and a colon when given.

        The one check of a parameter: the registry's (:meth:`MethodSpec.check_params`, so the
        server's configuration and :meth:`MethodSpec.create`) and a method's own options
        (:func:`check_values`) raise in this one wording.

        Example:
            >>> try:
            ...     Param("k", int, low=1).check(0)
            ... except ValueError as e:
            ...     print(e)
            params: k must be an integer >= 1, got 0
        """
        if not self.accepts(value):
            prefix = "" if where is None else f"{where}: "
            raise ValueError(f"{prefix}{self.name} must be {self.describe()}, got {value!r}")
        if self.type is float and isinstance(value, int):
            return float(value)
        return value


def check_values(params: Iterable[Param], values: Mapping[str, Any], where: str | None = None) -> dict[str, Any]:
    """``values`` checked by their :class:`Param` s (:meth:`Param.check`, in the order of ``params``),
    the floats as ``float``: the check of a method's options, in the registry's wording.

    Example:
        >>> check_values((Param("k", int, low=1), Param("alpha", float, **UNIT)), {"alpha": 1, "k": 3})
        {'k': 3, 'alpha': 1.0}
    """
    return {p.name: p.check(values[p.name], where) for p in params if p.name in values}


def _num(x: float | None) -> str:
    return "inf" if x is not None and math.isinf(x) else f"{x:g}" if x is not None else ""


@dataclass(frozen=True)
class MethodSpec:
    """Everything the applications need to know about one method.

    Attributes:
        name: the key (``geograph serve --method NAME``, ``Ranker(NAME)``, bench configs).
        label: the name tables print.
        kind: ``"reranker"`` (``module(query (B, D), docs (B, N, D), mask)`` -> ``RerankOutput``) or
            ``"retriever"`` (``module(query (B, D), k)`` -> ``RetrievalOutput`` over a corpus).
        module: the :class:`~torch.nn.Module` class.
        functional: its functional twin (returns what the module returns), ``None`` for a baseline.
        paper: the paper by title and arXiv id or venue (``None`` for a baseline).
        params: the constructor parameters a configuration may set, with their bounds.
        build_params: parameters of the corpus structure a retriever builds at start (fixed by a
            saved graph: a configuration that names a graph may not set them).
        not_params: keyword-only constructor arguments a configuration cannot hold (a callable, an
            artefact given by its own key).
        graph: the saved artefact type a retriever may load instead of building (``None``: none).
        projection: whether a trained :class:`~geograph.PoincareProjection` may be given.
        warmup: what a server worker prepares before it reports ready (``"numba"``: the compiled
            exact transport kernels, :func:`geograph.functional.warmup`).
        score_range: ``module -> (lo, hi)``, the range of a reranker's scores.
        k_range: ``(module, corpus size) -> (k_min, k_max or None, why)`` of a retriever's ``k``.
        build: ``(corpus (V, D), params, graph, projection) -> module`` on the corpus's device.
        reference: ``"module:function"`` of the slow reference the benchmark times (``None``: none); a
            module starting with ``.`` is relative to the method's package (the folder of
            :attr:`module`), e.g. ``".bench:ranker_reference"``. The function is called as
            ``factory(corpus (V, D), params, cfg, cache, **artefacts)`` with a grid point's parameters,
            the method's section of the benchmark's configuration (``k``, ...), a dict kept per data
            set for work done once, and (a trained row) ``projection=``; it returns a
            :data:`RankerReference`.
        reference_name: the reference's name in the benchmark's table.
        bench_model: ``"module:function"`` (relative as :attr:`reference`) building the module of one
            grid point for the benchmark, ``(corpus, params, cfg, cache, projection)`` -> module, where
            work shared by grid points (a corpus graph) is kept in ``cache``; ``None``: :meth:`create`
            with the grid point's parameters.
        bench_command: ``"module:function"`` (relative as :attr:`reference`) of the method's own
            benchmark, ``geograph bench NAME`` (``None``: none): ``main(argv) -> exit status``, parsing
            its own options (``".command:main"``: the folder's ``command.py``, the one module of a
            folder that may import the applications it measures with; nothing in the folder imports it).
        bench_summary: its one line in ``geograph bench --help``.
        max_candidates: a reranker's largest candidate list when the server's ``max_candidates`` is
            ``auto`` (``None``: the server's default), for a method whose work grows fast with it.
        baseline: a comparison row (dense), not one of the geometric methods.
        about: what the method does and its formula, in a few lines of Markdown (its page under
            ``docs/methods/`` is generated from the entry: ``python -m geograph.commands.method_pages``).
        example: one line of Python with the method, as its page shows it.
        exports: the functions (and result types) ``geograph.functional`` re-exports under their
            ``__name__``: the functional twin and the helpers a user may call.
        order: the position among the built-in methods (their folders are listed by it; an installed
            plugin's method follows the built-in ones whatever its order).
    """

    name: str
    label: str
    kind: Kind
    module: type[nn.Module]
    functional: Callable[..., Any] | None
    paper: str | None
    params: tuple[Param, ...]
    build: Callable[..., nn.Module]
    build_params: tuple[Param, ...] = ()
    not_params: tuple[str, ...] = ()
    graph: type[nn.Module] | None = None
    projection: bool = False
    warmup: tuple[str, ...] = ()
    score_range: Callable[[nn.Module], tuple[float, float]] | None = None
    k_range: Callable[[nn.Module, int], tuple[int, int | None, str]] | None = None
    reference: str | None = None
    reference_name: str | None = None
    bench_model: str | None = None
    bench_command: str | None = None
    bench_summary: str = ""
    max_candidates: int | None = None
    baseline: bool = False
    about: str = ""
    example: str = ""
    exports: tuple[Callable[..., Any] | type, ...] = ()
    order: int = 0
    _by_name: dict[str, Param] = field(default_factory=dict, init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        self._by_name.update({p.name: p for p in self.params + self.build_params})

    @property
    def is_reranker(self) -> bool:
        return self.kind == "reranker"

    def param(self, name: str) -> Param:
        """The declaration of parameter ``name`` (``KeyError`` if the method has none)."""
        return self._by_name[name]

    def param_names(self) -> tuple[str, ...]:
        """Every key a configuration's ``params`` may hold: build parameters first, then the constructor's."""
        return tuple(p.name for p in self.build_params + self.params)

    def defaults(self) -> dict[str, Any]:
        """The default of every parameter: the constructor's signature, and the build parameters' own.

        Example:
            >>> from geograph.registry import get
            >>> get("iso").defaults()["knn"], get("iso").defaults()["beta"]
            (10, 0.4)
        """
        sig = inspect.signature(self.module.__init__).parameters
        out = {}
        for p in self.build_params + self.params:
            out[p.name] = sig[p.name].default if p.name in sig else p.default
        return out

    def check_params(self, params: Mapping[str, Any], *, graph: object | None = None, where: str = "params") -> None:
        """Raise a one-line ``ValueError`` on an unknown key, a value out of bounds, or a build
        parameter next to a saved ``graph`` (whose build fixed it). Relations between parameters
        (e.g. ``max_nodes >= m``) are the module's own check.

        Example:
            >>> from geograph.registry import get
            >>> try:
            ...     get("maniscope").check_params({"beta": 0.4})
            ... except ValueError as e:
            ...     print(e)
            params: unknown key 'beta' for method maniscope (allowed: k, alpha, early_stop)
        """
        allowed = self.param_names()
        for key, value in params.items():
            if key not in allowed:
                raise ValueError(f"{where}: unknown key {key!r} for method {self.name} (allowed: {', '.join(allowed)})")
            if graph is not None and any(p.name == key for p in self.build_params):
                raise ValueError(f"{where}: {key} is fixed by the saved graph ({graph}); remove it")
            self._by_name[key].check(value, where)

    def check(
        self,
        params: Mapping[str, Any],
        *,
        graph: object | None = None,
        projection: object | None = None,
        where: str = "params",
    ) -> None:
        """The one check of a configuration, the server's and :meth:`create`'s: :meth:`check_params`
        (``graph`` named as fixing the build parameters), then :meth:`check_artefacts`."""
        self.check_params(params, graph=graph, where=where)
        self.check_artefacts(graph=graph, projection=projection)

    def check_artefacts(self, *, graph: object | None = None, projection: object | None = None) -> None:
        """Raise a one-line ``ValueError`` when a saved ``graph`` or a trained ``projection`` is
        given to a method that takes none (the server's configuration check and :meth:`create`).

        Example:
            >>> from geograph.registry import get
            >>> try:
            ...     get("maniscope").check_artefacts(graph="runs/graph")
            ... except ValueError as e:
            ...     print(e)
            graph applies to iso and g3, not maniscope
        """
        if graph is not None and self.graph is None:
            raise ValueError(f"graph applies to {listing(s.name for s in _registered() if s.graph)}, not {self.name}")
        if projection is not None and not self.projection:
            with_projection = listing(s.name for s in _registered() if s.projection)
            raise ValueError(f"projection applies to {with_projection}, not {self.name}")

    def create(
        self,
        corpus: Tensor | None = None,
        params: Mapping[str, Any] | None = None,
        *,
        graph: nn.Module | None = None,
        projection: nn.Module | None = None,
    ) -> nn.Module:
        """The module with ``params`` (checked first); a retriever over ``corpus (V, D)`` or a loaded ``graph``.

        Example:
            >>> from geograph.registry import get
            >>> get("maniscope").create(params={"k": 3})
            Maniscope(k=3, alpha=0.3)
        """
        params = dict(params or {})
        self.check(params, graph=graph, projection=projection)
        # (self.graph is not None here: check_artefacts raised for a method without one)
        if graph is not None and not isinstance(graph, self.graph):  # type: ignore[arg-type]
            raise ValueError(
                f"graph: method {self.name} takes a {self.graph.__name__}, got {type(graph).__name__}"  # type: ignore[union-attr]
            )
        if self.kind == "retriever" and corpus is None and graph is None:
            raise ValueError(f"method {self.name} retrieves from a corpus: give corpus (V, D) embeddings or a graph")
        return self.build(corpus, params, graph, projection)

    def load(self, path: str) -> Any:
        """The object named by ``"module:attribute"`` (:attr:`reference`, :attr:`bench_model`,
        :attr:`bench_command`), a module starting with ``.`` relative to the method's package.

        Example:
            >>> from geograph.registry import get
            >>> get("maniscope").load(".bench:ranker_reference").__module__
            'geograph.methods.maniscope.bench'
        """
        module, _, attr = path.partition(":")
        package = self.module.__module__.rpartition(".")[0]
        return getattr(importlib.import_module(module, package if module.startswith(".") else None), attr)

    def relevance(self, scores: Tensor, module: nn.Module) -> Tensor:
        """A reranker's ``scores`` mapped linearly from :attr:`score_range` onto [0, 1] (clamped
        against rounding); ``-inf`` (dropped or padded) maps to 0.

        Example:
            >>> import torch
            >>> from geograph.registry import get
            >>> spec = get("maniscope")
            >>> spec.relevance(torch.tensor([-0.3, 0.35, 1.0]), spec.create(params={"alpha": 0.3})).tolist()
            [0.0, 0.5, 1.0]
        """
        if self.score_range is None:
            raise ValueError(f"method {self.name} is a {self.kind}: it has no score range")
        return linear_relevance(scores, *self.score_range(module))


def linear_relevance(scores: Tensor, lo: float, hi: float) -> Tensor:
    """``scores`` mapped linearly from ``[lo, hi]`` onto [0, 1], clamped against rounding (``-inf``: 0):
    the one relevance mapping of :class:`geograph.Ranker` and of the server's rerank endpoints."""
    return ((scores - lo) / (hi - lo)).clamp(0.0, 1.0)


class Bounds(TypedDict, total=False):
    """Bounds shared by several :class:`Param` declarations (``Param("alpha", float, **UNIT)``)."""

    low: float
    high: float


#: a number in [0, 1]
UNIT: Bounds = dict(low=0.0, high=1.0)
#: an integer >= 1
POS_INT: Bounds = dict(low=1)


def _no_peers() -> tuple[MethodSpec, ...]:
    return ()


#: the registered specs, in order: set by :mod:`geograph.registry` (its error messages list them)
_registered: Callable[[], tuple[MethodSpec, ...]] = _no_peers


def listing(names: Iterable[str]) -> str:
    """``a``, ``a and b``, ``a, b and c``: names as the one-line errors list them."""
    items = list(names)
    return " and ".join(items) if len(items) < 3 else f"{', '.join(items[:-1])} and {items[-1]}"
