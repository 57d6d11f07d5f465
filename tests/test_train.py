import re
import sys
from pathlib import Path

import networkx as nx
import numpy as np
import pytest
import torch

pytest.importorskip("lightning")
import lightning as L  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from train.data import hard_negatives  # noqa: E402
from train.module import ExportProjection  # noqa: E402

from geograph import CorpusGraph, ISORetriever, PoincareProjection  # noqa: E402
from train import GraphDataModule, PoincareModule, TripletDataset, TripletSampler, triplet_loader  # noqa: E402
from train.__main__ import main as cli_main  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
CONFIG = str(ROOT / "configs" / "iso_poincare.yaml")


def scale_free_graph(n=300, seed=0, dim=16):
    g = nx.barabasi_albert_graph(n, 2, seed=seed)
    rng = np.random.default_rng(seed)
    # embeddings that carry the graph: each node plus the sum of its neighbours' random
    # vectors (neighbours look alike, hubs aggregate many: what an encoder of linked text sees)
    x = rng.standard_normal((n, dim))
    a = nx.to_numpy_array(g)
    x = x + a @ x
    ei = torch.tensor(list(g.edges), dtype=torch.long).T
    return CorpusGraph.from_edge_index(torch.from_numpy(x).float(), ei)


def spearman(a, b):
    from scipy.stats import spearmanr

    return spearmanr(a, b).statistic


def triplet_accuracy(projection, graph, triplets):
    with torch.no_grad():
        z = projection(graph.embeddings)
        u, v, w = triplets.unbind(1)
        return float((projection.distance(z[u], z[v]) < projection.distance(z[u], z[w])).float().mean())


def test_hard_negatives_are_not_neighbours():
    graph = scale_free_graph(60)
    hard = hard_negatives(graph, 4)
    keys = set(map(tuple, graph.edge_index.T.tolist()))
    for u in range(60):
        for w in hard[u].tolist():
            assert w == -1 or (w != u and (u, w) not in keys)


def test_triplets_are_valid_and_deterministic():
    graph = scale_free_graph(80)
    ds = TripletDataset(graph, hard=hard_negatives(graph, 4), seed=3)
    keys = set(map(tuple, graph.edge_index.T.tolist()))
    items = torch.stack([ds[i] for i in range(len(ds))])
    assert all((u, v) in keys for u, v, _ in items.tolist())
    assert np.mean([(u, w) not in keys and u != w for u, _, w in items.tolist()]) > 0.97
    again = torch.stack([ds[i] for i in range(len(ds))])
    assert torch.equal(items, again)
    with pytest.raises(ValueError, match="no edges"):
        TripletDataset(CorpusGraph.from_edge_index(torch.randn(4, 3), torch.zeros(2, 0, dtype=torch.long)))


def test_training_puts_hubs_near_origin_and_beats_untrained(tmp_path):
    torch.manual_seed(0)
    graph = scale_free_graph(300)
    graph.save(tmp_path / "g")
    dm = GraphDataModule(str(tmp_path / "g"), batch_size=128, hard_negatives=4, val_fraction=0.2)
    model = PoincareModule(in_dim=dm.dim, out_dim=8, hidden=64, lr=1e-2, radial_weight=10.0)
    dm.setup()
    val = torch.stack([dm.full[(0, i)] for i in dm.val_idx])
    before = triplet_accuracy(model.projection, graph, val)
    norm_before = model.projection(graph.embeddings).norm(dim=1).detach()
    trainer = L.Trainer(
        max_epochs=20,
        accelerator="cpu",
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
    )
    trainer.fit(model, datamodule=dm)
    model.eval()
    after = triplet_accuracy(model.projection, graph, val)
    norm = model.projection(graph.embeddings).norm(dim=1).detach()
    deg = graph.degree().numpy()
    rho = spearman(norm.numpy(), deg)
    assert rho < -0.5, rho
    assert rho < spearman(norm_before.numpy(), deg)
    assert after > before, (before, after)


def test_cli_trains_a_saved_graph_and_exports_into_the_run_dir(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)  # the config's relative runs/ paths land here, not in the checkout
    graph = scale_free_graph(50)
    graph.save(tmp_path / "g")
    args = [
        "fit",
        "--config",
        CONFIG,
        "--data.corpus=null",
        "--data.knn=null",
        f"--data.graph_dir={tmp_path / 'g'}",
        "--data.batch_size=32",
        "--data.hard_negatives=2",
        "--model.out_dim=4",
        "--model.hidden=8",
        "--trainer.max_epochs=1",
        "--trainer.accelerator=cpu",
        "--trainer.devices=1",
        "--trainer.enable_progress_bar=false",
    ]
    cli_main(args)
    cli_main(args)  # a second run exports next to its own logs, never over the first run's file
    out = capsys.readouterr().out
    exported = re.findall(r"f_theta exported to (\S+)", out)
    assert len(exported) == 2 and exported[0] != exported[1], out
    for path, version in zip(exported, ("version_0", "version_1")):
        assert Path(path).parent.name == version and (Path(path) / "manifest.json").is_file()
        proj = PoincareProjection.load(path)
        assert proj.in_dim == 16 and proj.out_dim == 4
    iso = ISORetriever(graph, projection=PoincareProjection.load(exported[1]), m=2, L=5, max_nodes=10)
    assert torch.isfinite(iso(graph.embeddings[:3], 3).scores).all()


def test_export_never_replaces_a_file(tmp_path):
    first = tmp_path / "projection.pt"
    assert ExportProjection.free_name(first) == first
    first.write_bytes(b"x")
    assert ExportProjection.free_name(first) == tmp_path / "projection-1.pt"
    (tmp_path / "projection-1.pt").write_bytes(b"y")
    assert ExportProjection.free_name(first) == tmp_path / "projection-2.pt"


def test_the_corpus_is_not_a_buffer():
    graph = scale_free_graph(40)
    model = PoincareModule(in_dim=16, out_dim=4, hidden=8)
    model.attach(graph)
    # DDP broadcasts every buffer on every step; the (V, D) corpus must not be one
    assert all(b.shape[0] != graph.num_nodes for b in model.buffers())
    assert set(model.state_dict()) == {f"projection.{k}" for k in model.projection.state_dict()}


# -- negatives re-drawn every epoch, the same in every worker and process layout --------------


def _epoch_triplets(loader, epoch):
    loader.sampler.set_epoch(epoch)
    return torch.cat(list(loader))


def test_every_epoch_draws_new_negatives():
    graph = scale_free_graph(120)
    ds = TripletDataset(graph, hard=hard_negatives(graph, 4), seed=1)
    loader = triplet_loader(ds, batch_size=64, seed=1)
    e0, e0_again, e1 = _epoch_triplets(loader, 0), _epoch_triplets(loader, 0), _epoch_triplets(loader, 1)
    assert torch.equal(e0, e0_again)
    key = lambda t: sorted(map(tuple, t.tolist()))  # noqa: E731
    assert key(e0) != key(e1)
    # same positives every epoch, different negatives for a good share of them
    pos0 = {(u, v): w for u, v, w in e0.tolist()}
    pos1 = {(u, v): w for u, v, w in e1.tolist()}
    assert pos0.keys() == pos1.keys() == set(map(tuple, graph.edge_index.T.tolist()))
    assert np.mean([pos0[k] != pos1[k] for k in pos0]) > 0.5


@pytest.mark.parametrize("workers", [0, 2])
def test_any_worker_or_rank_layout_gives_the_same_triplets(workers):
    graph = scale_free_graph(80)
    ds = TripletDataset(graph, hard=hard_negatives(graph, 4), seed=5)
    items = list(range(0, len(ds), 2))  # a train subset
    for epoch in (0, 3):
        single = TripletSampler(items, seed=5)
        single.set_epoch(epoch)
        reference = {i: ds[(e, i)] for e, i in single}
        # the draw is a function of (seed, epoch, item) only: recompute it from scratch
        fresh = TripletDataset(graph, hard=hard_negatives(graph, 4), seed=5)
        fresh.set_epoch(epoch)
        assert all(torch.equal(fresh[i], t) for i, t in reference.items())
        got = {}
        for rank in (0, 1):
            sampler = TripletSampler(items, seed=5, num_replicas=2, rank=rank)
            sampler.set_epoch(epoch)
            loader = torch.utils.data.DataLoader(ds, batch_size=16, sampler=sampler, num_workers=workers)
            batches = torch.cat(list(loader))
            for (e, i), t in zip(list(sampler), batches):
                assert e == epoch
                got[i] = t
        assert got.keys() == reference.keys()
        assert all(torch.equal(got[i], reference[i]) for i in reference)


class _Recorder(PoincareModule):
    def on_train_epoch_start(self):
        self.seen = getattr(self, "seen", []) + [[]]

    def training_step(self, batch, batch_idx):
        self.seen[-1].append(batch.clone())
        return super().training_step(batch, batch_idx)


@pytest.mark.parametrize("workers", [0, 2])
def test_lightning_redraws_negatives_each_epoch(tmp_path, workers):
    graph = scale_free_graph(60)
    graph.save(tmp_path / "g")
    epochs = {}
    for w in sorted({0, workers}):
        dm = GraphDataModule(str(tmp_path / "g"), batch_size=32, hard_negatives=2, num_workers=w, seed=2)
        model = _Recorder(in_dim=dm.dim, out_dim=4, hidden=8)
        trainer = L.Trainer(
            max_epochs=2,
            accelerator="cpu",
            logger=False,
            enable_checkpointing=False,
            enable_progress_bar=False,
            enable_model_summary=False,
            num_sanity_val_steps=0,
        )
        trainer.fit(model, datamodule=dm)
        epochs[w] = [sorted(map(tuple, torch.cat(e).tolist())) for e in model.seen]
    e0, e1 = epochs[workers]
    assert e0 != e1 and sorted((u, v) for u, v, _ in e0) == sorted((u, v) for u, v, _ in e1)
    assert epochs[workers] == epochs[0]


# -- a real graph ------------------------------------------------------------------------------


def test_training_improves_validation_accuracy_on_a_real_graph():
    """k-NN graph over real SciFact passage embeddings (MiniLM, tests/data); held-out edges with
    negatives drawn once, accuracy = share of triplets with d(u, v) < d(u, w)."""
    docs = np.load(ROOT / "tests" / "data" / "scifact_candidates.npz")["docs"].astype(np.float32).reshape(-1, 384)
    docs = np.unique(docs, axis=0)[:600]
    graph = CorpusGraph.from_knn(torch.from_numpy(docs), 5)
    torch.manual_seed(0)
    ds = TripletDataset(graph, hard=hard_negatives(graph, 8), seed=0)
    perm = torch.randperm(len(ds), generator=torch.Generator().manual_seed(0)).tolist()
    n_val = len(ds) // 10
    val = torch.stack(ds.__getitems__([(0, i) for i in perm[:n_val]]))
    model = PoincareModule(in_dim=384, out_dim=16, hidden=128, lr=1e-2)
    model.attach(graph)
    before = triplet_accuracy(model.projection, graph, val)
    loader = triplet_loader(ds, perm[n_val:], batch_size=256, seed=0)
    trainer = L.Trainer(
        max_epochs=6,
        accelerator="cpu",
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
    )
    trainer.fit(model, train_dataloaders=loader)
    model.eval()
    after = triplet_accuracy(model.projection, graph, val)
    assert after > before + 0.05, (before, after)


# -- as shipped --------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def demo_cache(tmp_path_factory):
    pytest.importorskip("sentence_transformers")
    return tmp_path_factory.mktemp("geograph-cache")


def test_shipped_config_trains_on_the_demo_corpus(tmp_path, monkeypatch, capsys, demo_cache):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("GEOGRAPH_CACHE", str(demo_cache))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    cli_main(["fit", "--config", CONFIG])  # no overrides
    out = capsys.readouterr().out
    assert "built from demo and cached" in out
    path = Path(re.search(r"f_theta exported to (\S+)", out).group(1))
    assert path == Path("runs/iso_poincare/lightning_logs/version_0/projection")
    metrics = (tmp_path / path.parent / "metrics.csv").read_text().splitlines()
    header = metrics[0].split(",")
    acc = [
        float(row.split(",")[header.index("val/accuracy")])
        for row in metrics[1:]
        if row.split(",")[header.index("val/accuracy")]
    ]
    assert len(acc) == 20 and max(acc[1:]) > acc[0]
    graph = CorpusGraph.load(next((demo_cache / "graphs").iterdir()))
    assert graph.num_nodes == 111 and graph.name == "knn10"
    iso = ISORetriever(graph, projection=PoincareProjection.load(tmp_path / path))
    assert torch.isfinite(iso(graph.embeddings[:2], 5).scores).all()


@pytest.mark.slow
@pytest.mark.integration
def test_ddp_two_processes_train_export_and_load(tmp_path, demo_cache):
    """The multi-process path of the README for real: gloo, two CPU processes, one epoch."""
    import os
    import socket
    import subprocess

    with socket.socket() as sock:  # a port of our own: other test processes may run DDP beside us
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    env = {
        **os.environ,
        "GEOGRAPH_CACHE": str(demo_cache),
        "HF_HUB_OFFLINE": "1",
        "MASTER_PORT": str(port),
        "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]),
    }
    cmd = [
        sys.executable,
        "-m",
        "train",
        "fit",
        "--config",
        CONFIG,
        "--trainer.strategy=ddp",
        "--trainer.accelerator=cpu",
        "--trainer.devices=2",
        "--trainer.max_epochs=1",
        "--data.batch_size=128",
        "--trainer.enable_progress_bar=false",
    ]
    res = subprocess.run(cmd, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
    assert res.returncode == 0, res.stderr[-3000:]
    assert (
        "distributed_backend=gloo" in res.stderr + res.stdout
        and "All distributed processes registered" in res.stderr + res.stdout
    )
    exported = re.findall(r"f_theta exported to (\S+)", res.stdout)
    assert len(exported) == 1, res.stdout  # rank 0 only
    proj = PoincareProjection.load(tmp_path / exported[0])
    graph = CorpusGraph.load(next((demo_cache / "graphs").iterdir()))
    iso = ISORetriever(graph, projection=proj)
    assert torch.isfinite(iso(graph.embeddings[:2], 5).scores).all()


@pytest.mark.parametrize(
    "args, text",
    [
        (
            ["--data.corpus=null", "--data.knn=null", "--data.graph_dir=graphs/nowhere"],
            "data.graph_dir: graphs/nowhere is not a saved CorpusGraph",
        ),
        (["--data.corpus=nowhere"], "data.corpus: nowhere: no such folder"),
        (["--data.split=dev"], "data.split:"),
        (["--data.knn=500"], "data.knn: knn must be an integer in [1, 111)"),
        (["--data.knn=null"], "give exactly one graph recipe"),
        (["--data.graph_dir=g"], "give either data.graph_dir"),
    ],
)
def test_cli_data_mistakes_are_one_line(tmp_path, monkeypatch, capsys, args, text):
    monkeypatch.chdir(tmp_path)
    from geograph.data import Encoder

    monkeypatch.setattr(Encoder, "encode", lambda self, texts: pytest.fail("embedded before validating"))
    with pytest.raises(SystemExit) as exc:
        cli_main(["fit", "--config", CONFIG, *args])
    assert exc.value.code == 2
    err = [line for line in capsys.readouterr().err.splitlines() if "error" in line]
    assert len(err) == 1 and text in err[0], err
