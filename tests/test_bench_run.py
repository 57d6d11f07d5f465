"""``geograph bench run`` on the smoke config, the paired bootstrap, and ``geograph bench gpu`` dry-run."""
import json
from pathlib import Path

import pytest
import torch

from geograph.bench import run as bench_run
from geograph.metrics import evaluate, paired_bootstrap

ROOT = Path(__file__).resolve().parents[1]
SMOKE = ROOT / "configs" / "bench" / "smoke.yaml"


@pytest.fixture(scope="module")
def smoke(tmp_path_factory):
    out = tmp_path_factory.mktemp("bench")
    cfg = bench_run.load_config(SMOKE)
    cfg["out"] = str(out)
    results = bench_run.run(cfg, progress=False)
    return results, bench_run.write(results, out)


def test_smoke_run_has_every_method_and_writes_outputs(smoke):
    results, paths = smoke
    ds = results["datasets"]["demo"]
    assert ds["queries_tuned"] == 6 and ds["queries_reported"] == 6
    labels = set(ds["methods"])
    assert labels == {"dense", "Maniscope", "Ricci-Filtration", "ISO-RAG", "ISO-RAG + f_theta", "G3RAG",
                      "Ricci-Filtration -> Maniscope"}
    for label, row in ds["methods"].items():
        sp = row["speed"]
        assert sp["B1_ms"] > 0 and sp["Bbatch_ms"] > 0
        if label != "dense":
            ci = row["vs_dense"]["nDCG@10"]
            assert ci["low"] <= ci["diff"] <= ci["high"] and ci["queries"] == 6
            # every method's reference ran in the same run and returned the same top-k
            assert sp["reference_ms"] > 0 and sp["reference_top_k_identical"] == 1.0, label
    assert json.loads(paths["json"].read_text())["datasets"]["demo"]["primary"] == "nDCG@10"
    md = paths["md"].read_text()
    assert all(f"| {label} |" in md for label in labels)
    assert paths["png"].read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_tuned_values_are_the_best_on_the_tuning_split_only(smoke):
    """The chosen Maniscope k is the argmax of nDCG@10 over the grid on the tuning queries."""
    from geograph import Maniscope
    from geograph.data import Encoder
    from geograph.bench.common import tuning_split
    from geograph.data import DEMO_PATH
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
    chain = bench_run.chain_ranker([bench_run.METHODS["ricci"].ranker(ctx, {}, {}),
                                    bench_run.METHODS["maniscope"].ranker(ctx, {"k": 3}, {})])
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
    bad("methods: {bm25: {}}\n", "unknown methods")
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


def test_gpu_script_dry_run_on_cpu(tmp_path, capsys):
    from geograph.bench import gpu

    out = tmp_path / "gpu.json"
    assert gpu.main(["--device", "cpu", "--sizes", "1", "2", "--corpus", "300", "--repeat", "1",
                     "--parity-queries", "2", "--kernel-batch", "2", "--out", str(out)]) == 0
    got = json.loads(out.read_text())
    assert set(got["kernels_max_abs_diff"]) >= {"shortest_paths", "personalized_pagerank", "gain_transition"}
    assert all(v == 0.0 for v in got["kernels_max_abs_diff"].values())
    assert all(row["identical_rows"] == 1.0 for row in got["modules"].values())
    assert len(got["modules"]) == 5
    if not torch.cuda.is_available():
        assert gpu.main(["--device", "cuda"]) == 2
        assert "CUDA is not available" in capsys.readouterr().out
