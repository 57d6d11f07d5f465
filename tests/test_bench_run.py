"""``geograph bench run`` on the smoke config, the paired bootstrap, and ``geograph bench gpu`` dry-run."""

import json
from pathlib import Path

import pytest
import torch

pytest.importorskip("yaml")  # the bench extra reads its YAML config

from geograph.bench import run as bench_run  # noqa: E402
from geograph.evaluation import evaluate, paired_bootstrap  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
SMOKE = ROOT / "configs" / "bench" / "smoke.yaml"


@pytest.fixture(scope="module")
def smoke(tmp_path_factory):
    out = tmp_path_factory.mktemp("bench")
    cfg = bench_run.load_config(SMOKE)
    cfg["out"] = str(out)
    results = bench_run.run(cfg, progress=False)
    return results, bench_run.write(results, out)


@pytest.mark.slow
def test_smoke_run_has_every_method_and_writes_outputs(smoke):
    from geograph.data import DEMO_PATH, load_beir

    results, paths = smoke
    ds = results["datasets"]["demo"]
    n = len(load_beir(DEMO_PATH, "test").queries)
    assert ds["queries_tuned"] == n // 2 and ds["queries_reported"] == n - n // 2
    labels = set(ds["methods"])
    assert labels == {
        "dense",
        "BM25",
        "Maniscope",
        "Ricci-Filtration",
        "ISO-RAG",
        "ISO-RAG + f_theta",
        "G3RAG",
        "Ricci-Filtration -> Maniscope",
    }
    assert results["environment"]["threads"] == torch.get_num_threads()
    for label, row in ds["methods"].items():
        sp = row["speed"]
        assert 0 < sp["B1_ms_min"] <= sp["B1_ms"] <= sp["B1_ms_max"]
        assert 0 < sp["Bbatch_ms_min"] <= sp["Bbatch_ms"] <= sp["Bbatch_ms_max"]
        assert sp["B1_repeats"] == sp["Bbatch_repeats"] == 2  # the smoke config's repeat (min_time 0)
        assert set(row["metrics"]) == {"nDCG@10", "Recall@5", "HitAns@5"}
        if label != "dense":
            ci = row["vs_dense"]["nDCG@10"]
            assert ci["low"] <= ci["diff"] <= ci["high"] and ci["queries"] == ds["queries_reported"]
        if label in ("dense", "BM25"):
            assert "reference_ms" not in sp
        else:
            # every method's reference ran in the same run and returned the same top-k
            assert sp["reference_ms_min"] <= sp["reference_ms"] <= sp["reference_ms_max"]
            assert sp["speedup_Bbatch_min"] <= sp["speedup_Bbatch"] <= sp["speedup_Bbatch_max"]
            assert sp["reference_top_k_identical"] == 1.0, label
    assert ds["methods"]["BM25"]["params"] in ({"k1": 1.2, "b": 0.75}, {"k1": 1.5, "b": 0.75})
    assert json.loads(paths["json"].read_text())["datasets"]["demo"]["primary"] == "nDCG@10"
    md = paths["md"].read_text()
    assert all(f"| {label} |" in md for label in labels) and "HitAns@5" in md
    assert paths["png"].read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_bm25_and_hit_answer_rows_recomputed_independently(smoke):
    """The BM25 row's metrics and the dense row's HitAns@5, recomputed from the texts with
    bm25s' own retrieve and a plain substring count, equal the table's."""
    import bm25s

    from geograph.bench.common import tuning_split
    from geograph.data import DEMO_PATH, Encoder
    from geograph.evaluation import evaluate

    results, _ = smoke
    row = results["datasets"]["demo"]["methods"]["BM25"]
    sp = tuning_split("demo", DEMO_PATH, Encoder(progress=False))
    rep = sp.report
    k1, b = row["params"]["k1"], row["params"]["b"]
    retriever = bm25s.BM25(k1=k1, b=b)
    retriever.index(bm25s.tokenize(rep.passages(), stopwords="en", show_progress=False), show_progress=False)
    docs, scores = retriever.retrieve(
        bm25s.tokenize(rep.queries, stopwords="en", show_progress=False), k=10, show_progress=False, sorted=True
    )
    run = [[rep.doc_ids[i] for i in r] for r in docs.tolist()]
    want = evaluate(run, rep.qrels_list(), ["nDCG@10", "Recall@5"])
    assert row["metrics"]["nDCG@10"] == pytest.approx(want["nDCG@10"], abs=0.02)  # ties may order differently
    assert row["metrics"]["Recall@5"] == pytest.approx(want["Recall@5"], abs=0.05)
    # HitAns@5 of dense by a plain count
    fields = rep.query_fields
    text = dict(zip(rep.doc_ids, rep.passages()))
    dense = torch.nn.functional.normalize(sp.report_q, dim=1) @ torch.nn.functional.normalize(sp.corpus, dim=1).T
    top = dense.topk(5, dim=1).indices.tolist()
    hits = []
    for qid, ids in zip(rep.query_ids, top):
        ans = [a for a in [fields[qid].get("answer")] + list(fields[qid].get("answer_aliases") or []) if a]
        hits.append(any(a.lower() in text[rep.doc_ids[i]].lower() for a in ans for i in ids))
    got = results["datasets"]["demo"]["methods"]["dense"]["metrics"]["HitAns@5"]
    assert got == pytest.approx(sum(hits) / len(hits), abs=1.5 / len(hits))  # normalisation may differ on one


def test_tuned_values_are_the_best_on_the_tuning_split_only(smoke):
    """The chosen Maniscope k is the argmax of nDCG@10 over the grid on the tuning queries."""
    from geograph import Maniscope
    from geograph.bench.common import tuning_split
    from geograph.data import DEMO_PATH, Encoder
    from geograph.pipeline import dense_candidates, run_ids

    results, _ = smoke
    row = results["datasets"]["demo"]["methods"]["Maniscope"]
    sp = tuning_split("demo", DEMO_PATH, Encoder(progress=False))
    cands = dense_candidates(sp.corpus, sp.tune_q, 10).indices
    got = {}
    for k in (3, 5):
        out = Maniscope(k=k, alpha=0.3)(sp.tune_q, sp.corpus[cands])
        res = evaluate(run_ids(sp.tune, cands.gather(1, out.order)), sp.tune.qrels_list(), ["nDCG@10", "Recall@5"])
        got[k] = (res["nDCG@10"], res["Recall@5"])
    best = max(got, key=lambda k: (got[k], -k))  # Recall@5 breaks ties, then the first grid point
    assert row["params"]["k"] == best
    assert row["tuning"]["nDCG@10"] == pytest.approx(got[best][0])


def test_chain_is_ricci_then_maniscope_on_the_kept_set(smoke):
    from geograph import Maniscope, RicciFiltration

    g = torch.Generator().manual_seed(0)
    corpus = torch.nn.functional.normalize(torch.randn(40, 16, generator=g), dim=1)
    q = torch.nn.functional.normalize(torch.randn(3, 16, generator=g), dim=1)
    cands = torch.stack([torch.randperm(40, generator=g)[:12] for _ in range(3)])
    ctx = bench_run.Context("x", None, 12, cands, cands)
    ctx.split = type("S", (), {"corpus": corpus})()
    chain = bench_run.chain_ranker(
        [bench_run.METHODS["ricci"].ranker(ctx, {}, {}), bench_run.METHODS["maniscope"].ranker(ctx, {"k": 3}, {})]
    )
    idx, scores = chain(q, cands)
    rf = RicciFiltration()(q, corpus[cands])
    for b in range(3):
        kept = cands[b][rf.keep[b]]
        man = Maniscope(k=3)(q[b : b + 1], corpus[kept][None])
        want = kept[man.order[0]]
        assert idx[b][torch.isfinite(scores[b])].tolist() == want.tolist()


def test_config_errors(tmp_path):
    def bad(text, match):
        path = tmp_path / "c.yaml"
        path.write_text(text)
        with pytest.raises(SystemExit, match=match):
            bench_run.load_config(path)

    bad("colour: red\n", "unknown keys")
    bad("methods: {splade: {}}\n", "unknown methods")
    bad("speed: {repeats: 3}\n", "unknown speed keys")
    bad("methods: {iso: {}, ricci: {}}\nchains: [[ricci, iso]]\n", "chain")
    bad("metrics: [nDCG@10]\ndatasets: [{name: demo, primary: Recall@5}]\n", "primary metric")
    with pytest.raises(SystemExit, match="not a BEIR-format folder"):
        bench_run.dataset_root({"path": str(tmp_path)})


def test_paired_bootstrap():
    a = torch.tensor([0.5, 0.2, 0.9, 0.4, 0.7])
    same = paired_bootstrap(a, a, samples=500)
    assert same["diff"] == same["low"] == same["high"] == 0.0
    shifted = paired_bootstrap(a + 0.1, a, samples=500)  # a constant gain: a zero-width interval at it
    assert shifted["low"] == pytest.approx(0.1) and shifted["high"] == pytest.approx(0.1)
    g = torch.Generator().manual_seed(1)
    base = torch.rand(200, generator=g, dtype=torch.float64)
    better = base + 0.05 + 0.1 * torch.randn(200, generator=g, dtype=torch.float64)
    r = paired_bootstrap(better, base, samples=4000, seed=3)
    assert 0 < r["low"] < r["diff"] < r["high"] and r["p_le_0"] < 0.01
    # paired: the between-query spread cancels, so the interval is the one of the differences
    d = better - base
    half = 1.96 * d.std() / len(d) ** 0.5
    assert (r["high"] - r["low"]) / 2 == pytest.approx(float(half), rel=0.15)
    assert paired_bootstrap(better, base, samples=4000, seed=3) == r  # reproducible
    with pytest.raises(ValueError, match="same non-zero number"):
        paired_bootstrap(a, a[:3])
    with pytest.raises(ValueError, match="level"):
        paired_bootstrap(a, a, level=1.5)


def test_speed_warms_up_and_repeats():
    """Every timing is warmed up and repeated; the reference's passes likewise (call counts, no wall time)."""
    calls = {"ours": 0, "ref": 0}

    def ranker(q, c):
        calls["ours"] += 1
        return c, torch.zeros(c.shape, dtype=torch.float64)

    def reference(q, c):
        calls["ref"] += 1
        return c.numpy()

    q = torch.randn(6, 4)
    c = torch.arange(18).view(6, 3)
    cfg = {"batch": 4, "single": 2, "repeat": 5, "min_time": None, "reference_repeat": 5, "reference_min_time": None}
    out = bench_run.speed(ranker, reference, q, c, cfg, ref_queries=3, k=3)
    # B=batch: 1 warm-up + 5; B=1: (1 + 5) x 2 queries; one more call for the agreement check
    assert calls["ours"] == 6 + 12 + 1
    assert calls["ref"] == 1 + 5 * 3  # the first-query warm-up, then 5 passes over 3 queries
    assert out["B1_repeats"] == out["Bbatch_repeats"] == out["reference_repeats"] == 5
    assert out["reference_top_k_identical"] == 1.0
    for key in ("B1_ms", "Bbatch_ms", "reference_ms", "speedup_B1", "speedup_Bbatch"):
        assert out[f"{key}_min"] <= out[key] <= out[f"{key}_max"]


def test_time_calls_min_time_stops_after_three():
    from geograph.bench.common import time_calls

    n = []
    t = time_calls(lambda: n.append(1), repeat=50, warmup=2, min_time=0.0)
    assert len(n) == 2 + 3 and t["repeat"] == 3
    n.clear()
    assert time_calls(lambda: n.append(1), repeat=4, warmup=0)["repeat"] == 4 and len(n) == 4


@pytest.mark.slow
def test_gpu_script_dry_run_on_cpu(tmp_path, capsys):
    """The GPU script's plumbing on CPU (CPU against CPU is no parity evidence: that is the
    device run's job, so only the report's shape is checked here)."""
    from geograph.bench import gpu

    out = tmp_path / "gpu.json"
    assert (
        gpu.main(
            [
                "--device",
                "cpu",
                "--sizes",
                "1",
                "2",
                "--corpus",
                "300",
                "--repeat",
                "1",
                "--parity-queries",
                "2",
                "--kernel-batch",
                "2",
                "--out",
                str(out),
            ]
        )
        == 0
    )
    got = json.loads(out.read_text())
    assert set(got["kernels_max_abs_diff"]) >= {"shortest_paths", "personalized_pagerank", "gain_transition"}
    assert all(isinstance(v, float) for v in got["kernels_max_abs_diff"].values())
    assert len(got["modules"]) == 5 and all("identical_rows" in row for row in got["modules"].values())
    if not torch.cuda.is_available():
        assert gpu.main(["--device", "cuda"]) == 2
        assert "CUDA is not available" in capsys.readouterr().out


def test_bench_ricci_flow_seam_is_the_one_the_module_calls(monkeypatch):
    """`geograph bench ricci` records the Sinkhorn certificate by wrapping
    ``geograph.methods.ricci.functional.ricci_flow`` (it once wrapped a name the module no longer called:
    AttributeError after the functional twins moved the flow call)."""
    import inspect

    import geograph.methods.ricci.command as bench_ricci
    import geograph.methods.ricci.functional as ricci_module
    from geograph import RicciFiltration

    assert "import geograph.methods.ricci.functional as ricci_functional" in inspect.getsource(
        bench_ricci.bench_dataset
    )
    calls = []
    flow = ricci_module.ricci_flow
    monkeypatch.setattr(ricci_module, "ricci_flow", lambda *a, **kw: calls.append(1) or flow(*a, **kw))
    g = torch.Generator().manual_seed(0)
    q = torch.nn.functional.normalize(torch.randn(2, 8, generator=g), dim=1)
    docs = torch.nn.functional.normalize(torch.randn(2, 5, 8, generator=g), dim=-1)
    RicciFiltration(solver="exact", iterations=2)(q, docs)
    assert calls == [1]
