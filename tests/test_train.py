import sys
from pathlib import Path

import networkx as nx
import numpy as np
import pytest
import torch

pytest.importorskip("lightning")
import lightning as L  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from geograph import CorpusGraph, ISORetriever, PoincareProjection  # noqa: E402
from train import GraphDataModule, PoincareModule, TripletDataset  # noqa: E402
from train.__main__ import main as cli_main  # noqa: E402
from train.data import hard_negatives  # noqa: E402


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
    val = torch.stack([dm.val_set[i] for i in range(len(dm.val_set))])
    before = triplet_accuracy(model.projection, graph, val)
    norm_before = model.projection(graph.embeddings).norm(dim=1).detach()
    trainer = L.Trainer(max_epochs=20, accelerator="cpu", logger=False, enable_checkpointing=False,
                        enable_progress_bar=False, enable_model_summary=False)
    trainer.fit(model, datamodule=dm)
    model.eval()
    after = triplet_accuracy(model.projection, graph, val)
    norm = model.projection(graph.embeddings).norm(dim=1).detach()
    deg = graph.degree().numpy()
    rho = spearman(norm.numpy(), deg)
    assert rho < -0.5, rho
    assert rho < spearman(norm_before.numpy(), deg)
    assert after > before, (before, after)


def test_cli_one_epoch_exports_a_loadable_projection(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # the config's relative runs/ paths land here, not in the checkout
    graph = scale_free_graph(50)
    graph.save(tmp_path / "g")
    export = tmp_path / "projection.pt"
    cli_main([
        "fit", "--config", str(Path(__file__).resolve().parents[1] / "configs" / "iso_poincare.yaml"),
        f"--data.graph_dir={tmp_path / 'g'}", "--data.batch_size=32", "--data.hard_negatives=2",
        "--model.out_dim=4", "--model.hidden=8", "--trainer.max_epochs=1", "--trainer.accelerator=cpu",
        "--trainer.devices=1", f"--trainer.default_root_dir={tmp_path / 'run'}",
        "--trainer.enable_progress_bar=false", "--trainer.logger=false",
        f"--trainer.callbacks+=train.module.ExportProjection", f"--trainer.callbacks.path={export}",
    ])
    proj = PoincareProjection.load(export)
    assert proj.in_dim == 16 and proj.out_dim == 4
    iso = ISORetriever(graph, projection=proj, m=2, L=5, max_nodes=10)
    assert torch.isfinite(iso(graph.embeddings[:3], 3).scores).all()
