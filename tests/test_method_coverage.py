"""Every registered method is served, benched and documented, each read from its registry entry."""

import typing
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
import torch

from conftest import require
from geograph.registry import METHODS, get

ROOT = Path(__file__).resolve().parents[1]
CORPUS = torch.nn.functional.normalize(torch.randn(50, 8, generator=torch.Generator().manual_seed(3)), dim=1)


@pytest.mark.parametrize("name", list(METHODS))
def test_served(name):
    require("litserve")
    from geograph.serve.config import ServeConfig
    from geograph.serve.models import KERNEL_METHODS, RERANKERS, build_model, k_bounds, score_bounds

    spec = get(name)
    assert name in typing.get_args(ServeConfig.model_fields["method"].annotation)
    model = build_model(name, CORPUS)
    assert type(model) is spec.module
    assert (name in RERANKERS) == spec.is_reranker and (name in KERNEL_METHODS) == ("numba" in spec.warmup)
    if spec.is_reranker:
        assert score_bounds(name, model) == spec.score_range(model)
        assert k_bounds(name, model, 50) == (1, None, "")
    else:
        assert k_bounds(name, model, 50) == spec.k_range(model, 50)
        out = model(CORPUS[:2], k_bounds(name, model, 50)[0])
        assert out.indices.shape[0] == 2


def _context():
    from geograph.bench.run.methods import Context

    return Context("t", SimpleNamespace(corpus=CORPUS), 12, None, None)


@pytest.mark.parametrize("name", list(METHODS))
def test_benched_with_the_registry_reference(name, monkeypatch):
    import importlib

    from geograph.bench.run.methods import LABELS
    from geograph.bench.run.methods import METHODS as BENCH

    spec = get(name)
    assert LABELS[name] == spec.label
    if spec.baseline:  # the dense row of every table (bench.run.protocol), no reference
        assert spec.reference is None
        return
    method = BENCH[name]
    assert method.spec is spec and method.reference_name == spec.reference_name
    assert method.kind == ("rerank" if spec.is_reranker else "retrieve")
    if spec.reference is None:  # a method without a slow reference: timed alone
        assert method.reference(_context(), {}, {"k": 5}) is None
        return
    factory = spec.load(spec.reference)
    # the reference lives in the method's folder
    assert callable(factory) and factory.__module__.startswith(spec.module.__module__.rpartition(".")[0] + ".")
    # the bench's reference is the registry's factory: replace it and the bench calls the replacement
    seen = []
    module, _, attr = spec.reference.partition(":")
    ref_module = importlib.import_module(module, spec.module.__module__.rpartition(".")[0])
    monkeypatch.setattr(ref_module, attr, lambda *a, **kw: seen.append(a[:3]) or "marker")
    assert method.reference(_context(), {}, {"k": 5}) == "marker" and seen and seen[0][0] is CORPUS


@pytest.mark.parametrize("name", ["maniscope", "ricci", "iso", "g3"])
def test_reference_and_ranker_agree_on_one_query(name):
    """The bench's ranker and its reference (from the registry) return the same top-k on a query."""
    if name == "ricci":
        require("GraphRicciCurvature")
    from geograph.bench.run.methods import METHODS as BENCH

    ctx, cfg = _context(), {"k": 5}
    q = CORPUS[:2] + 0.05
    cands = torch.stack([torch.randperm(50, generator=torch.Generator().manual_seed(i))[:12] for i in range(2)])
    idx, scores = BENCH[name].ranker(ctx, {}, cfg)(q, cands)
    ref = BENCH[name].reference(ctx, {}, cfg)
    for i in range(2):
        got = idx[i][torch.isfinite(scores[i])].tolist()[:5]
        assert got == np.asarray(ref(q[i], cands[i].numpy())).tolist()[:5], (name, i)


@pytest.mark.parametrize("name", list(METHODS))
def test_documented(name):
    """The method's page exists, names its module and paper, and carries the parameter table the site
    build fills from the registry (so its defaults and bounds cannot go stale)."""
    from geograph.commands.method_pages import directive

    spec = get(name)
    page = ROOT / "docs" / "methods" / f"{name}.md"
    assert page.is_file(), f"{page} is missing: run python -m geograph.commands.method_pages"
    text = page.read_text()
    assert directive(name) in text, f"{page} has no parameter table: add {directive(name)!r}"
    assert spec.module.__name__ in text, (name, spec.module.__name__)
    flat = " ".join(text.replace("*", "").split())  # the page wraps the title over lines
    assert spec.paper is None or spec.paper.split(",")[0].split(":")[-1].strip() in flat, (name, spec.paper)


def test_method_pages_generates_a_missing_page(tmp_path):
    """A new method's first page is generated from its entry; an existing page is never overwritten."""
    from geograph.commands.method_pages import directive, main

    (tmp_path / "maniscope.md").write_text("# hand-written\n")
    assert main([str(tmp_path)]) == 0
    assert (tmp_path / "maniscope.md").read_text() == "# hand-written\n"
    for name in METHODS:
        assert directive(name) in (tmp_path / f"{name}.md").read_text() or name == "maniscope"
    assert main([str(tmp_path), "--check"]) == 1  # the hand-written page lacks the table


def test_method_pages_help_writes_nothing(tmp_path, monkeypatch, capsys):
    """``--help`` prints the usage and exits; it is not taken for the output folder."""
    from geograph.commands.method_pages import main

    monkeypatch.chdir(tmp_path)
    with pytest.raises(SystemExit) as exit_:
        main(["--help"])
    assert exit_.value.code == 0
    assert "docs_dir" in capsys.readouterr().out
    assert list(tmp_path.iterdir()) == []
