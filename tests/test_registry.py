"""The method registry agrees with the modules it declares: parameters, defaults, bounds, builds, score ranges."""

import inspect
import math
from types import SimpleNamespace

import pytest
import torch

from geograph import registry
from geograph.registry import METHODS, Param

CORPUS = torch.nn.functional.normalize(torch.randn(40, 8, generator=torch.Generator().manual_seed(0)), dim=1)

#: parameters that a probe value needs a companion for (relations the module checks between them)
COMPANIONS = {
    ("iso", "max_nodes"): {"m": 1},
    ("iso", "m"): {"max_nodes": 1000},
    ("g3", "seeds"): {"candidates": 40},
    ("g3", "candidates"): {"seeds": 1},
}
#: values the module accepts at a bound that a corpus of 40 passages cannot take
CORPUS_LIMITS = {("g3", "candidates"): 40, ("dense", "recall_k"): 20}


def build(spec, params):
    """The module's own constructor (through the entry's build, without the registry's check)."""
    corpus = CORPUS if spec.kind == "retriever" else None
    return spec.build(corpus, params, None, None)


def probes(p: Param):
    """(rejected values, accepted values) at and around the declared bounds."""
    if p.type is bool:
        return [1, "yes"], [True, False]
    if p.type is str:
        return ["bogus", 3], list(p.choices)
    if p.type is tuple:
        return [(0.5, 0.2), (0.1,), "x", (-1.5, 0.5)], [(0.1, 0.7), (-1.0, 1.0)]
    bad, good = [float("nan"), float("inf"), "1", True], []
    step = 1 if p.type is int else 1e-6
    if p.type is int:
        bad.append(1.5)
    for bound, open_, sign in ((p.low, p.low_open, -1), (p.high, p.high_open, 1)):
        if bound is None:
            continue
        bad.append(bound if open_ else bound + sign * step)
        good.append(bound - sign * step if open_ else bound)
    if p.low is None and p.high is None:
        good += [-2.5, 0.0, 3.0] if p.type is float else [0, 7]
    if p.type is int:
        good = [int(g) for g in good]
    if p.choices and p.type is not str:
        bad.append("bogus")
        good += list(p.choices)
    if p.optional:
        good.append(None)
    return bad, good


def test_every_keyword_argument_is_declared():
    for spec in METHODS.values():
        sig = inspect.signature(spec.module.__init__)
        kwonly = {n for n, q in sig.parameters.items() if q.kind is q.KEYWORD_ONLY}
        declared = {p.name for p in spec.params} | {p.name for p in spec.build_params if p.name in kwonly}
        assert declared | set(spec.not_params) == kwonly, spec.name
        assert not declared & set(spec.not_params), spec.name
        for p in spec.build_params:  # a build parameter outside the signature carries its own default
            assert (p.name in kwonly) == (p.default is inspect.Parameter.empty), (spec.name, p.name)


def test_defaults_are_accepted_and_read_from_the_signature():
    for spec in METHODS.values():
        sig = inspect.signature(spec.module.__init__).parameters
        for name, value in spec.defaults().items():
            assert spec.param(name).accepts(value), (spec.name, name, value)
            if name in sig:
                assert value == sig[name].default
        spec.check_params(spec.defaults())


@pytest.mark.parametrize("name", ["iso", "ricci"])
def test_one_wording_for_a_bad_parameter(name):
    """A method whose options are checked by its declared parameters refuses a bad value in one line,
    the same from the server's configuration check, the module and its function."""
    from geograph.serve.models import check_params

    spec = METHODS[name]
    q, docs = CORPUS[:2], CORPUS[2:8].expand(2, 6, 8)
    function = {
        "ricci": lambda **kw: spec.functional(q, docs, **kw),
        "iso": lambda **kw: spec.functional(
            q,
            CORPUS,
            torch.zeros(41, dtype=torch.long),
            CORPUS[:0, 0].long(),
            CORPUS[:0, 0].long(),
            1,
            max_degree=0,
            **kw,
        ),
    }[name]
    checked = 0
    for p in spec.params:
        for value in probes(p)[0]:
            with pytest.raises(ValueError) as served:
                check_params(name, {p.name: value})
            line = str(served.value)
            assert line == f"params: {p.name} must be {p.describe()}, got {value!r}"
            with pytest.raises(ValueError) as built:
                build(spec, {**COMPANIONS.get((name, p.name), {}), p.name: value})
            assert f"params: {built.value}" == line
            if p.name not in ("beta", "p"):  # used offline: the retriever's, not iso_retrieve's
                with pytest.raises(ValueError) as called:
                    function(**{p.name: value})
                assert f"params: {called.value}" == line
            checked += 1
    assert checked >= 4 * len(spec.params)


@pytest.mark.parametrize("name", list(METHODS))
def test_declared_bounds_are_the_modules_own(name):
    """Every value the registry rejects, the module's constructor rejects too, and the values the
    registry accepts at its bounds build a module: the two checks cannot drift apart."""
    spec = METHODS[name]
    drift = []
    for p in spec.params + spec.build_params:
        bad, good = probes(p)
        companion = COMPANIONS.get((name, p.name), {})
        for value in bad:
            assert not p.accepts(value), (name, p.name, value)
            with pytest.raises(ValueError, match=p.name):
                spec.check_params({p.name: value})
            if p.name not in inspect.signature(spec.module.__init__).parameters:
                continue  # a build parameter of the entry (iso's knn): the registry's check is its only one
            try:
                build(spec, {**companion, p.name: value})
                drift.append(f"the module accepts {p.name}={value!r}, the registry does not")
            except (ValueError, TypeError):
                pass
        for value in good:
            if isinstance(value, float) and not math.isfinite(value):
                continue
            value = min(value, CORPUS_LIMITS.get((name, p.name), value)) if isinstance(value, int) else value
            assert p.accepts(value), (name, p.name, value)
            try:
                build(spec, {**companion, p.name: value})
            except (ValueError, TypeError) as e:
                drift.append(f"the module rejects {p.name}={value!r}, the registry accepts it: {e}")
    assert not drift, "\n".join(drift)


def test_create_checks_before_building():
    with pytest.raises(ValueError, match="unknown key 'beta' for method maniscope"):
        registry.get("maniscope").create(params={"beta": 0.4})
    with pytest.raises(ValueError, match="alpha must be a float in \\[0, 1\\], got 2"):
        registry.get("maniscope").create(params={"alpha": 2})
    with pytest.raises(ValueError, match="give corpus"):
        registry.get("iso").create()
    with pytest.raises(ValueError, match="graph applies to iso and g3, not maniscope"):
        registry.get("maniscope").create(graph=object())
    with pytest.raises(ValueError, match=f"method must be one of {', '.join(METHODS)}, got 'foo'"):
        registry.get("foo")


@pytest.mark.parametrize("name", list(METHODS))
def test_one_wording_for_artefacts_a_method_does_not_take(name):
    """The server's configuration check and ``create`` refuse a graph or projection in one wording."""
    from geograph.serve.models import check_params

    spec = registry.get(name)
    with_graph = [s.name for s in METHODS.values() if s.graph is not None]
    with_projection = [s.name for s in METHODS.values() if s.projection]
    cases = [] if spec.graph is not None else [("graph", with_graph)]
    cases += [] if spec.projection else [("projection", with_projection)]
    for what, names in cases:
        listed = " and ".join(names) if len(names) < 3 else ", ".join(names[:-1]) + " and " + names[-1]
        message = f"{what} applies to {listed}, not {name}"
        with pytest.raises(ValueError) as served:
            check_params(name, {}, **{what: "runs/saved"})
        with pytest.raises(ValueError) as created:
            spec.create(CORPUS, **{what: object()})
        assert str(served.value) == str(created.value) == message


def test_build_parameters_are_fixed_by_a_saved_graph():
    graph = registry.get("g3").create(CORPUS).graph
    with pytest.raises(ValueError, match="beta is fixed by the saved graph"):
        registry.get("g3").create(CORPUS, {"beta": 0.7}, graph=graph)
    model = registry.get("g3").create(CORPUS, {"seeds": 3}, graph=graph)
    assert model.graph is graph and model.seeds == 3


def test_created_modules_answer_like_direct_construction():
    from geograph import CorpusGraph, G3Retriever, ISORetriever, Maniscope, RicciFiltration

    q = CORPUS[:3]
    docs = CORPUS[torch.arange(12).reshape(3, 4)]
    for name, direct in (("maniscope", Maniscope(k=2)), ("ricci", RicciFiltration(percentile=40.0))):
        got = registry.get(name).create(params={"k": 2} if name == "maniscope" else {"percentile": 40.0})
        a, b = got(q, docs), direct(q, docs)
        assert torch.equal(a.scores, b.scores) and torch.equal(a.order, b.order)
    iso = registry.get("iso").create(CORPUS, {"knn": 4, "m": 2})
    ref = ISORetriever(CorpusGraph.from_knn(CORPUS, 4), m=2)
    assert torch.equal(iso(q, 5).indices, ref(q, 5).indices)
    g3 = registry.get("g3").create(CORPUS, {"band": [0.0, 0.9], "max_degree": 6})
    ref = G3Retriever(CORPUS, band=(0.0, 0.9), max_degree=6)
    assert torch.equal(g3(q, 5).indices, ref(q, 5).indices)


def test_relevance_maps_the_score_range_onto_the_unit_interval():
    spec = registry.get("maniscope")
    model = spec.create(params={"alpha": 0.25})
    scores = torch.tensor([-0.25, 0.375, 1.0, 1.0 + 1e-7, -float("inf")])
    got = spec.relevance(scores, model)
    want = [0.0, 0.5, 1.0, 1.0, 0.0]  # (s + alpha) / (1 + alpha), clamped
    assert got.tolist() == pytest.approx(want, abs=1e-7)
    ricci = registry.get("ricci")
    assert ricci.relevance(torch.tensor([-1.0, 0.0, 0.5]), ricci.create()).tolist() == [0.0, 0.5, 0.75]
    with pytest.raises(ValueError, match="no score range"):
        registry.get("iso").relevance(scores, None)


def test_score_ranges_bound_the_modules_scores():
    """Scores of random candidate sets lie inside the declared range (the relevance needs no clamp but rounding)."""
    g = torch.Generator().manual_seed(1)
    q = torch.nn.functional.normalize(torch.randn(16, 6, generator=g), dim=1)
    docs = torch.nn.functional.normalize(torch.randn(16, 12, 6, generator=g), dim=2)
    for name in registry.RERANKERS:
        spec = registry.get(name)
        model = spec.create()
        lo, hi = spec.score_range(model)
        s = model(q, docs).scores
        s = s[torch.isfinite(s)]
        assert s.numel() and float(s.min()) >= lo - 1e-6 and float(s.max()) <= hi + 1e-6, name


def test_names_and_kinds():
    # the published methods in their order (a method added later comes after them)
    assert registry.RERANKERS[:2] == ("maniscope", "ricci")
    assert registry.RETRIEVERS[:3] == ("iso", "g3", "dense")
    assert registry.names(baseline=False)[:4] == ("maniscope", "ricci", "iso", "g3")
    assert set(registry.RERANKERS) | set(registry.RETRIEVERS) == set(METHODS)
    assert {"iso", "g3"} <= set(registry.names(with_graph=True))
    for spec in METHODS.values():
        assert (spec.score_range is None) == (spec.kind == "retriever")
        assert (spec.k_range is None) == (spec.kind == "reranker")
        assert (spec.functional is None) == spec.baseline == (spec.paper is None)


class _EntryPoint:
    """An entry point of the ``geograph.methods`` group as importlib.metadata gives it."""

    def __init__(self, name, dist, load):
        self.name, self.value, self.dist, self._load = name, f"{dist}:SPEC", SimpleNamespace(name=dist), load

    def load(self):
        return self._load()


def test_plugins_register_after_the_built_in_methods_and_broken_ones_warn_once(monkeypatch, caplog):
    from dataclasses import replace

    def missing():
        raise ModuleNotFoundError("No module named 'scipyy'")

    wide = replace(registry.get("maniscope"), name="wide")
    points = [
        _EntryPoint("a_missing", "dist-missing", missing),
        _EntryPoint("b_wrong", "dist-wrong", lambda: 42),
        _EntryPoint("c_taken", "dist-taken", lambda: registry.get("ricci")),
        _EntryPoint("d_bad_name", "dist-bad-name", lambda: replace(wide, name="Bad Name")),
        _EntryPoint("e_wide", "dist-wide", lambda: wide),
    ]
    monkeypatch.setattr(registry.importlib.metadata, "entry_points", lambda group: points)
    monkeypatch.setattr(registry, "_table", None)
    with caplog.at_level("WARNING", logger="geograph.registry"):
        assert registry.names() == (*(s.name for s in registry._builtin()), "wide")  # every folder, then plugins
        registry.get("wide")
    lines = [r.getMessage() for r in caplog.records]
    assert len(lines) == 4 and all(len(line.splitlines()) == 1 for line in lines)
    for dist, reason in [
        ("dist-missing", "ModuleNotFoundError: No module named 'scipyy'"),
        ("dist-wrong", "names a int, not a geograph.spec.MethodSpec"),
        ("dist-taken", "method name 'ricci' is taken"),
        ("dist-bad-name", "method name 'Bad Name' is not lower-case"),
    ]:
        (line,) = [line for line in lines if f"distribution {dist}:" in line]
        assert reason in line, line
    assert registry.get("wide").create(params={"k": 3}).k == 3


def test_the_servers_method_lists_come_from_the_specs():
    pytest.importorskip("pydantic")
    from geograph.serve import config

    assert config.AUTO_MAX_CANDIDATES == {s.name: s.max_candidates for s in METHODS.values() if s.max_candidates}
    assert config.AUTO_MAX_CANDIDATES == {"ricci": 100}  # Ricci-Filtration's, as released
