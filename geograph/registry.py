"""The method registry: the collector of every method's :class:`~geograph.spec.MethodSpec`.

A method declares itself in one place: the ``SPEC`` of its folder's ``spec.py``
(``geograph/methods/<name>/``), or an object an installed distribution names in the
``geograph.methods`` entry-point group (``name = "package.module:SPEC"``). The registry lists the
folders of :mod:`geograph.methods` (by their ``order``) and then the plugins (by entry-point name)
the first time it is read, and everything that offers the methods reads it: the server
(``geograph serve --method``), the benchmark (``geograph bench run``), the text-first API, the
framework integrations, the exports (``geograph.Maniscope``, ``geograph.functional.maniscope_scores``), the method pages
and the tests' parametrisation.

A plugin that cannot be used (its import fails, it names no valid :class:`MethodSpec`, or its name
is taken) is skipped with one warning line on the ``geograph.registry`` logger naming its
distribution and the reason; every other method keeps working.

Example:
    >>> from geograph.registry import METHODS, get
    >>> sorted(METHODS)
    ['dense', 'g3', 'iso', 'maniscope', 'ricci']
    >>> spec = get("maniscope")
    >>> spec.kind, spec.module.__name__, spec.defaults()
    ('reranker', 'Maniscope', {'k': 5, 'alpha': 0.3, 'early_stop': True})
    >>> spec.param("alpha").describe()
    'a float in [0, 1]'
"""

from __future__ import annotations

import importlib
import importlib.metadata
import logging
import pkgutil
import re
import threading
from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING, Any

import geograph.methods
from geograph import spec as _spec
from geograph.spec import Kind, MethodSpec, Param, linear_relevance

__all__ = [
    "Param",
    "MethodSpec",
    "METHODS",
    "RERANKERS",
    "RETRIEVERS",
    "ENTRY_POINT_GROUP",
    "get",
    "names",
    "linear_relevance",
    "method_classes",
    "lazy_exports",
]

log = logging.getLogger("geograph.registry")

#: the entry-point group an installed distribution registers its methods in
ENTRY_POINT_GROUP = "geograph.methods"
_NAME = re.compile(r"[a-z][a-z0-9_]*")

if TYPE_CHECKING:
    #: every registered method by name (the built-in folders in their order, then the plugins)
    METHODS: dict[str, MethodSpec]
    #: the rerankers' names, in registration order
    RERANKERS: tuple[str, ...]
    #: the retrievers' names, in registration order
    RETRIEVERS: tuple[str, ...]

_table: dict[str, MethodSpec] | None = None
_partial: dict[str, MethodSpec] | None = None  # the built-in methods while the plugins load
_lock = threading.RLock()


def _builtin() -> list[MethodSpec]:
    """The ``SPEC`` of every folder of :mod:`geograph.methods`, by ``order`` (then name)."""
    specs = []
    for info in pkgutil.iter_modules(geograph.methods.__path__, f"{geograph.methods.__name__}."):
        if info.ispkg:
            spec = importlib.import_module(f"{info.name}.spec").SPEC
            if not isinstance(spec, MethodSpec):
                raise TypeError(f"{info.name}.spec.SPEC is a {type(spec).__name__}, not a MethodSpec")
            specs.append(spec)
    return sorted(specs, key=lambda s: (s.order, s.name))


def _invalid(spec: object, taken: dict[str, MethodSpec]) -> str | None:
    """Why ``spec`` cannot be registered next to ``taken``, or ``None``."""
    if not isinstance(spec, MethodSpec):
        return f"names a {type(spec).__name__}, not a geograph.spec.MethodSpec"
    if not isinstance(spec.name, str) or not _NAME.fullmatch(spec.name):
        return f"method name {spec.name!r} is not lower-case letters, digits and '_'"
    if spec.name in taken:
        owner = taken[spec.name].module.__module__
        return f"method name {spec.name!r} is taken (by {owner})"
    if spec.kind not in ("reranker", "retriever"):
        return f"method {spec.name}: kind must be 'reranker' or 'retriever', got {spec.kind!r}"
    if not (isinstance(spec.module, type) and callable(spec.build)):
        return f"method {spec.name}: module must be a class and build a callable"
    if spec.kind == "reranker" and spec.score_range is None:
        return f"method {spec.name}: a reranker needs a score_range"
    if spec.bench_command is not None and not (":" in str(spec.bench_command) and spec.bench_summary):
        return f"method {spec.name}: bench_command must be 'module:function', with a bench_summary"
    return None


def _plugins(taken: dict[str, MethodSpec]) -> list[MethodSpec]:
    """The valid specs of the ``geograph.methods`` entry points, by entry-point name; one warning per bad one."""
    specs = []
    points = sorted(importlib.metadata.entry_points(group=ENTRY_POINT_GROUP), key=lambda ep: (ep.name, ep.value))
    for ep in points:
        dist = ep.dist.name if ep.dist is not None else "an unknown distribution"
        try:
            spec = ep.load()
        except Exception as e:  # a plugin's own failure must not stop geograph
            first = str(e).splitlines()[0] if str(e) else ""
            reason: str | None = f"{type(e).__name__}: {first}" if first else type(e).__name__
        else:
            reason = _invalid(spec, taken)
        if reason is not None:
            log.warning("geograph: skipped the method plugin %r of distribution %s: %s", ep.name, dist, reason)
            continue
        specs.append(spec)
        taken[spec.name] = spec
    return specs


def _methods() -> dict[str, MethodSpec]:
    """The table, collected on first use. While the plugins load, a read (a plugin's own
    ``from geograph.rerankers import Maniscope``) sees the built-in methods."""
    global _table, _partial
    if _table is not None:
        return _table
    with _lock:  # another thread waits for the whole table; the loading thread re-enters
        if _table is not None:
            return _table
        if _partial is not None:
            return _partial
        _partial = {s.name: s for s in _builtin()}
        try:
            table = dict(_partial)
            table.update({s.name: s for s in _plugins(dict(table))})
            _table = table
        finally:
            _partial = None
        return _table


def _registered() -> tuple[MethodSpec, ...]:
    return tuple(_methods().values())


_spec._registered = _registered


def __getattr__(name: str) -> Any:
    if name == "METHODS":
        return _methods()
    if name == "RERANKERS":
        return names(kind="reranker")
    if name == "RETRIEVERS":
        return names(kind="retriever")
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted(set(globals()) | {"METHODS", "RERANKERS", "RETRIEVERS"})


def names(*, kind: Kind | None = None, baseline: bool | None = None, with_graph: bool = False) -> tuple[str, ...]:
    """Registered names, optionally only one ``kind``, only (non-)baselines, or only those with a saved graph.

    Example:
        >>> names(kind="retriever", baseline=False)
        ('iso', 'g3')
    """
    return tuple(
        s.name
        for s in _methods().values()
        if (kind is None or s.kind == kind)
        and (baseline is None or s.baseline == baseline)
        and (not with_graph or s.graph is not None)
    )


def get(name: str) -> MethodSpec:
    """The spec of method ``name``, or a one-line ``ValueError`` listing the registered ones."""
    table = _methods()
    try:
        return table[name]
    except (KeyError, TypeError):
        raise ValueError(f"method must be one of {', '.join(table)}, got {name!r}") from None


def method_classes(kind: Kind | None = None) -> dict[str, Any]:
    """The Module class of every registered method (of ``kind``), by class name: what ``geograph``,
    ``geograph.rerankers`` and ``geograph.retrievers`` export (the first registered of two
    same-named classes wins)."""
    found: dict[str, Any] = {}
    for spec in _methods().values():
        if kind is None or spec.kind == kind:
            found.setdefault(spec.module.__name__, spec.module)
    return found


def lazy_exports(
    module: str, table: Callable[[], dict[str, Any]], static: list[str], own: Callable[[], Iterable[str]]
) -> tuple[Callable[[str], Any], Callable[[], list[str]]]:
    """A package's ``__getattr__`` and ``__dir__`` over the names ``table()`` gives (read from the
    registry on each use, so a package that exports methods loads the registry only when one is
    asked for); its ``__all__`` is ``static`` then the table's other names.

    Example:
        >>> getattr_, dir_ = lazy_exports("pkg", lambda: {"Maniscope": 1}, ["x"], lambda: ["x"])
        >>> getattr_("__all__"), getattr_("Maniscope"), dir_()
        (['x', 'Maniscope'], 1, ['Maniscope', 'x'])
    """

    def getattr_(name: str) -> Any:
        if name == "__all__":
            return static + [n for n in table() if n not in static]
        found = table()
        if name in found:
            return found[name]
        raise AttributeError(f"module {module!r} has no attribute {name!r}")

    def dir_() -> list[str]:
        return sorted(set(own()) | set(table()))

    return getattr_, dir_
