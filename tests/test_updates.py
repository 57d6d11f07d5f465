"""Adding and removing passages of a CorpusGraph: equal to the rebuild on the final corpus and to numpy."""

import random
from pathlib import Path

import numpy as np
import pytest
import torch

from geograph import CorpusGraph

SCIFACT = Path(__file__).parent / "data" / "scifact_candidates.npz"


def numpy_knn_edges(x: np.ndarray, k: int) -> set:
    """Union of every row's k most cosine-similar other rows (ties: lowest index), by numpy."""
    z = x / np.linalg.norm(x, axis=1, keepdims=True)
    s = z @ z.T
    n = len(z)
    np.fill_diagonal(s, -np.inf)
    k = min(k, n - 1)
    out = set()
    for i in range(n):
        order = np.lexsort((np.arange(n), -s[i]))[:k]
        for j in order:
            out.add((i, int(j)))
            out.add((int(j), i))
    return out


def edge_set(g: CorpusGraph) -> set:
    return set(map(tuple, g.edge_index.T.tolist()))


def scifact_rows() -> torch.Tensor:
    docs = np.load(SCIFACT)["docs"].reshape(-1, 384).astype(np.float32)
    _, first = np.unique(docs, axis=0, return_index=True)
    return torch.from_numpy(docs[np.sort(first)])


def run_sequence(pool: torch.Tensor, start: int, k: int, steps: int, seed: int, ids_kind: str, device, **build):
    """Random adds and removes from a pool of rows; returns the graph and the final rows in order."""
    rnd = random.Random(seed)
    name = (lambda i: f"doc-{i}") if ids_kind == "str" else (lambda i: 1000 + 7 * i)
    pool = pool.to(device)
    graph = CorpusGraph.from_knn(pool[:start], k, **build)
    graph.set_ids([name(i) for i in range(start)])
    current = {name(i): i for i in range(start)}
    nxt = start
    for step in range(steps):
        if step % 2 == 0 and nxt < len(pool):
            m = min(rnd.randint(1, max(1, start // 6)), len(pool) - nxt)
            new = [name(i) for i in range(nxt, nxt + m)]
            report = graph.add(pool[nxt : nxt + m], new)
            assert report.added == m and report.num_nodes == len(current) + m
            current.update({name(i): i for i in range(nxt, nxt + m)})
            nxt += m
        else:
            gone = rnd.sample(sorted(current, key=str), rnd.randint(1, max(1, len(current) // 6)))
            report = graph.remove(gone)
            assert report.removed == len(gone)
            for x in gone:
                del current[x]
    rows = torch.stack([pool[current[x]] for x in graph.passage_ids.ids])
    return graph, rows


@pytest.mark.parametrize("ids_kind", ["str", "int"])
@pytest.mark.parametrize("k", [1, 4, 10])
def test_random_updates_equal_rebuild(k, ids_kind, device):
    pool = torch.randn(420, 12, generator=torch.Generator().manual_seed(k))
    graph, rows = run_sequence(pool, 200, k, 10, seed=k, ids_kind=ids_kind, device=device, chunk_size=64)
    ref = CorpusGraph.from_knn(rows, k)
    assert torch.equal(graph.embeddings, rows)
    assert torch.equal(graph.edge_index, ref.edge_index)
    assert torch.equal(graph.rowptr, ref.rowptr)
    assert edge_set(graph) == numpy_knn_edges(rows.double().cpu().numpy(), k)


def test_scifact_updates_equal_rebuild():
    pool = scifact_rows()[:900]
    graph, rows = run_sequence(pool, 500, 10, 12, seed=3, ids_kind="str", device="cpu", chunk_size=128)
    assert torch.equal(graph.edge_index, CorpusGraph.from_knn(rows, 10).edge_index)
    assert edge_set(graph) == numpy_knn_edges(rows.double().numpy(), 10)


def test_growing_from_fewer_than_k_passages():
    pool = torch.randn(30, 5, generator=torch.Generator().manual_seed(1))
    graph = CorpusGraph.from_knn(pool[:3], 6)
    graph.add(pool[3:20], list(range(3, 20)))
    graph.remove([0, 5, 6])
    graph.add(pool[20:], list(range(20, 30)))
    rows = torch.cat([pool[1:5], pool[7:]])
    assert torch.equal(graph.edge_index, CorpusGraph.from_knn(rows, 6).edge_index)


def test_loaded_graph_updates_equal_rebuild(tmp_path):
    pool = torch.randn(120, 8, generator=torch.Generator().manual_seed(2))
    CorpusGraph.from_knn(pool[:100], 3).save(tmp_path / "g")
    graph = CorpusGraph.load(tmp_path / "g")  # no lists saved: made again by one scan
    graph.remove([4, 50])
    graph.add(pool[100:], list(range(100, 120)))
    rows = torch.cat([pool[:4], pool[5:50], pool[51:]])
    assert torch.equal(graph.edge_index, CorpusGraph.from_knn(rows, 3).edge_index)


def test_update_report_counts_only_touched_rows():
    pool = torch.randn(2010, 16, generator=torch.Generator().manual_seed(4))
    graph = CorpusGraph.from_knn(pool[:2000], 5)
    report = graph.add(pool[2000:], list(range(2000, 2010)))
    # an old row changes only if a new row enters its top-5: far fewer than all rows
    assert 0 < report.rows_changed < 200 and report.rows_rescanned == 10
    report = graph.remove([0, 1, 2])
    assert report.rows_rescanned == report.rows_changed < 60


def test_groups_and_mentions_updates_equal_rebuild():
    x = torch.randn(6, 3, generator=torch.Generator().manual_seed(0))
    graph = CorpusGraph.from_groups(x[:4], [[0, 1], [1, 2, 3]])
    graph.add(x[4:], [4, 5], groups=[[4, 0], [5, 3, 2]])
    ref = CorpusGraph.from_groups(x, [[0, 1], [1, 2, 3], [4, 0], [5, 3, 2]])
    assert torch.equal(graph.edge_index, ref.edge_index)
    graph.remove([1, 5])
    ref = CorpusGraph.from_groups(x[[0, 2, 3, 4]], [[0], [1, 2], [3, 0], [2, 1]])
    assert torch.equal(graph.edge_index, ref.edge_index)
    titles = ["Alpha Centauri", "Beta Pictoris", "Gamma Draconis", "Delta Cephei"]
    texts = ["near Beta Pictoris", "see Gamma Draconis and Alpha Centauri", "Delta Cephei", "Alpha Centauri"]
    graph = CorpusGraph.from_mentions(x[:4], titles, texts)
    graph.set_ids(["a", "b", "c", "d"])
    graph.remove(["b"])
    keep = [0, 2, 3]
    ref = CorpusGraph.from_mentions(x[keep], [titles[i] for i in keep], [texts[i] for i in keep])
    assert torch.equal(graph.edge_index, ref.edge_index)


def test_bad_input_is_one_line():
    x = torch.randn(10, 4)
    graph = CorpusGraph.from_knn(x, 2)
    graph.set_ids([f"d{i}" for i in range(10)])
    cases = [
        (lambda: graph.add(torch.randn(1, 4), ["d3"]), "already in the corpus"),
        (lambda: graph.add(torch.randn(2, 4), ["n", "n"]), "given twice"),
        (lambda: graph.add(torch.randn(2, 4), ["n"]), "1 ids for 2"),
        (lambda: graph.add(torch.randn(1, 5), ["n"]), "D=4"),
        (lambda: graph.add(torch.randn(1, 4, dtype=torch.float64), ["n"]), "float64"),
        (lambda: graph.add(torch.full((1, 4), float("nan")), ["n"]), "embeddings"),
        (lambda: graph.add(torch.randn(1, 4), [1.5]), "str or int"),
        (lambda: graph.remove(["nope"]), "'nope' is not in the corpus"),
        (lambda: graph.remove([f"d{i}" for i in range(10)]), "empty corpus"),
        (lambda: graph.set_ids(["a"]), "1 ids for 10"),
        (lambda: CorpusGraph.from_mentions(x[:1], ["t"], ["u"]).add(x[:1], ["z"]), "cannot be extended"),
    ]
    for call, words in cases:
        with pytest.raises(ValueError, match=words) as err:
            call()
        assert "\n" not in str(err.value)
    assert graph.num_nodes == 10 and graph.passage_ids.ids[-1] == "d9"  # nothing half done


def test_dense_exact_updates_equal_rebuild():
    from geograph import DenseRetriever

    pool = torch.randn(300, 8, generator=torch.Generator().manual_seed(5))
    model = DenseRetriever(pool[:200], chunk_size=64)
    model.add(pool[200:], list(range(200, 300)))
    model.remove([3, 250, 17])
    rows = pool[[i for i in range(300) if i not in (3, 17, 250)]]
    ref = DenseRetriever(rows)
    assert torch.equal(model.embeddings, ref.embeddings)
    q = torch.randn(7, 8, generator=torch.Generator().manual_seed(6))
    out, want = model(q, k=10), ref(q, k=10)
    assert torch.equal(out.indices, want.indices) and torch.equal(out.scores, want.scores)
    sims = torch.nn.functional.normalize(q.double(), dim=1) @ torch.nn.functional.normalize(rows.double(), dim=1).T
    assert torch.equal(out.indices, sims.topk(10).indices)


def clustered(n: int, d: int, centres: torch.Tensor, gen: torch.Generator) -> torch.Tensor:
    return centres[torch.randint(len(centres), (n,), generator=gen)] + 0.3 * torch.randn(n, d, generator=gen)


def test_dense_ivf_updates_recall_against_exact_rebuild():
    pytest.importorskip("faiss")
    from geograph import DenseRetriever

    gen = torch.Generator().manual_seed(7)
    centres = torch.randn(40, 16, generator=gen)
    pool = clustered(4400, 16, centres, gen)
    model = DenseRetriever(pool[:4000], index="ivf", nlist=64, nprobe=2)
    q = clustered(200, 16, centres, gen)
    model(q, k=10)  # builds the index
    model.add(pool[4000:], list(range(4000, 4400)))
    gone = list(range(0, 4000, 9))
    model.remove(gone)
    rows = pool[[i for i in range(4400) if i % 9 or i >= 4000]]
    exact = DenseRetriever(rows)(q, k=10).indices
    got = model(q, k=10).indices
    rebuilt = DenseRetriever(rows, index="ivf", nlist=64, nprobe=2)(q, k=10).indices

    def recall(found):
        return np.mean([len(set(a) & set(b)) / 10 for a, b in zip(found.tolist(), exact.tolist())])

    assert int(got.max()) < len(rows) and (got >= 0).all()
    assert recall(got) >= 0.9 and recall(got) >= recall(rebuilt) - 0.05


def test_reserve_spares_rescans_and_stays_equal():
    pool = torch.randn(700, 12, generator=torch.Generator().manual_seed(9))
    graph, rows = run_sequence(pool, 400, 5, 10, seed=9, ids_kind="int", device="cpu", reserve=5)
    assert torch.equal(graph.edge_index, CorpusGraph.from_knn(rows, 5).edge_index)
    wide = CorpusGraph.from_knn(pool[:600], 5, reserve=5)
    assert torch.equal(wide.edge_index, CorpusGraph.from_knn(pool[:600], 5).edge_index)
    narrow = CorpusGraph.from_knn(pool[:600], 5)
    gone = list(range(0, 600, 20))
    assert wide.remove(gone).rows_rescanned < narrow.remove(gone).rows_rescanned
    assert torch.equal(wide.edge_index, narrow.edge_index)
    with pytest.raises(ValueError, match="reserve must be a non-negative integer"):
        CorpusGraph.from_knn(pool, 5, reserve=-1)


def test_ivf_knn_updates_recall_against_exact_rebuild():
    pytest.importorskip("faiss")
    gen = torch.Generator().manual_seed(11)
    centres = torch.randn(50, 32, generator=gen)
    x = clustered(3100, 32, centres, gen)
    graph = CorpusGraph.from_knn(x[:3000], 5, index="ivf", nlist=16, nprobe=2, recall_target=None)
    assert graph.knn_state.exact is False
    graph.add(x[3000:], list(range(3000, 3100)))
    graph.remove(list(range(0, 3000, 30)))
    rows = torch.cat([x[:3000][torch.arange(3000) % 30 != 0], x[3000:]])
    want = edge_set(CorpusGraph.from_knn(rows, 5))
    rebuilt = edge_set(CorpusGraph.from_knn(rows, 5, index="ivf", nlist=16, nprobe=2, recall_target=None))
    got = edge_set(graph)
    assert len(got & want) / len(want) >= min(0.95, len(rebuilt & want) / len(want) - 0.02)


def test_kept_lists_follow_to():
    pool = torch.nn.functional.normalize(torch.randn(70, 6, generator=torch.Generator().manual_seed(6)), dim=1)
    graph = CorpusGraph.from_knn(pool[:60], 4)
    graph = graph.to(torch.float64)
    assert graph.knn_state.lists.values.dtype == torch.float64  # the lists moved with the buffers
    graph.add(pool[60:].double(), list(range(60, 70)))
    assert edge_set(graph) == numpy_knn_edges(pool.double().numpy(), 4)


def random_lists(rng: np.random.Generator, n: int, k: int) -> np.ndarray:
    """``(n, k)`` lists of distinct other rows, some cut short (``-1`` past the end)."""
    out = np.full((n, k), -1, dtype=np.int64)
    for i in range(n):
        depth = min(n - 1, k if rng.random() < 0.8 else int(rng.integers(0, k + 1)))
        others = np.delete(np.arange(n), i)
        out[i, :depth] = rng.choice(others, depth, replace=False)
    return out


def numpy_union(lists: np.ndarray) -> list:
    """The clean union graph of the lists, sorted (source, target) pairs."""
    pairs = {(i, int(j)) for i, row in enumerate(lists) for j in row if j >= 0}
    return sorted(pairs | {(j, i) for i, j in pairs})


@pytest.mark.parametrize("path", ["compiled", "torch"])
@pytest.mark.parametrize("seed", range(6))
def test_union_update_equals_the_union_of_the_new_lists(seed, path, monkeypatch):
    from geograph.knn import update
    from geograph.knn.update import union_update

    if path == "torch":  # the path of CUDA tensors and of tracing, on the CPU
        monkeypatch.setattr(update, "tracing", lambda: True)

    rng = np.random.default_rng(seed)
    n, k = int(rng.integers(2, 60)), int(rng.integers(1, 6))
    old = random_lists(rng, n, k)
    keep = rng.random(n) > (0.0 if seed % 3 == 0 else 0.2)  # some seeds only add
    keep[rng.integers(n)] = True
    pos = np.where(keep, np.cumsum(keep) - 1, -1)
    added = int(rng.integers(0, 8))
    n_new = int(keep.sum()) + added
    new = random_lists(rng, n_new, k)
    # most kept rows keep their list (renumbered) where it names no removed row
    for i in np.flatnonzero(keep):
        row = old[i]
        if rng.random() < 0.7 and all(j < 0 or keep[j] for j in row):
            new[pos[i]] = np.where(row >= 0, pos[row.clip(0)], -1)
    pairs = np.array(numpy_union(old), dtype=np.int64).reshape(-1, 2).T
    ei = torch.from_numpy(pairs)
    rowptr = torch.from_numpy(np.concatenate([[0], np.cumsum(np.bincount(pairs[0], minlength=n))]))
    got, ptr = union_update(ei, rowptr, torch.from_numpy(old), torch.from_numpy(new), torch.from_numpy(pos))
    assert got.T.tolist() == [list(p) for p in numpy_union(new)]
    assert ptr.tolist() == np.concatenate([[0], np.cumsum(np.bincount(got[0].numpy(), minlength=n_new))]).tolist()


def test_ivf_updates_keep_the_union_graph_of_the_lists():
    pytest.importorskip("faiss")
    from geograph.functional import clean_edge_index
    from geograph.knn.update import lists_edges

    gen = torch.Generator().manual_seed(12)
    x = clustered(2600, 16, torch.randn(30, 16, generator=gen), gen)
    graph = CorpusGraph.from_knn(x[:2400], 6, index="ivf", nlist=16, nprobe=2, recall_target=None)
    graph.add(x[2400:2500], list(range(2400, 2500)))
    graph.remove(list(range(0, 2400, 25)))
    graph.add(x[2500:], list(range(2500, 2600)))
    graph.remove([i for i in range(1, 300, 7) if i % 25])
    state = graph.knn_state
    want = clean_edge_index(lists_edges(state.lists, state.k), graph.num_nodes)
    assert torch.equal(graph.edge_index, want)
    counts = np.bincount(want[0].numpy(), minlength=graph.num_nodes)
    assert graph.rowptr.tolist() == [0, *np.cumsum(counts).tolist()]


def test_additions_write_spare_rows_and_never_rows_someone_holds():
    """An addition writes into the spare rows an earlier one left (no copy of the corpus), and never
    into rows that a tensor held from before, or another graph sharing the rows, can see."""
    gen = torch.Generator().manual_seed(3)
    x = torch.nn.functional.normalize(torch.randn(80, 8, generator=gen), dim=1)
    x0 = x.clone()
    graph = CorpusGraph.from_knn(x[:40], 3)
    graph.add(x[40:41], [40])  # the first addition copies the corpus into a buffer with spare rows
    held = graph.embeddings
    before = held.clone()
    graph.add(x[41:44], [41, 42, 43])
    assert graph.embeddings.data_ptr() == held.data_ptr()  # written in place
    assert torch.equal(held, before)
    twin = CorpusGraph.from_knn(graph.embeddings, 3)  # another graph on the same 44 rows (and buffer)
    graph.add(x[44:46], [44, 45])  # into the spare rows
    twin.add(x[46:48], [44, 45])  # not there (the buffer has room for them): a buffer of its own
    assert twin.embeddings.data_ptr() != graph.embeddings.data_ptr()
    assert torch.equal(graph.embeddings, x[:46]) and torch.equal(twin.embeddings, torch.cat([x[:44], x[46:48]]))
    assert torch.equal(x, x0)  # the caller's tensor (the first graph's rows were a view of it) is never written
    graph.remove([0, 1])
    graph.add(x[50:52], [50, 51])
    assert torch.equal(graph.embeddings, torch.cat([x[2:46], x[50:52]]))
    assert edge_set(graph) == numpy_knn_edges(graph.embeddings.numpy(), 3)


@pytest.mark.parametrize("plain", [True, False])
def test_passage_ids_follow_a_list_through_random_adds_and_removes(plain, monkeypatch):
    """The serial numbers and their rows against a plain list of ids, through enough churn that the
    serials are numbered again, with removed plain ids added back."""
    from geograph.graphs.updates import PassageIds

    monkeypatch.setattr(PassageIds, "RENUMBER_SLACK", 0)
    rng = random.Random(5)
    renumbered = 0
    ref = list(range(50)) if plain else [f"p{i}" for i in range(50)]
    ids = PassageIds(range(50) if plain else list(ref))
    fresh = iter(range(1000, 10**6))
    for _ in range(60):
        if rng.random() < 0.5 and len(ref) > 5:
            gone = set(rng.sample(ref, rng.randint(1, len(ref) // 3)))
            keep = torch.tensor([x not in gone for x in ref])
            before = ids._row_of.size
            ids.keep(keep)
            renumbered += ids._row_of.size < before
            ref = [x for x in ref if x not in gone]
        else:
            back = [x for x in range(50) if x not in ref][:2] if plain else []  # plain ids seen before
            new = back + [next(fresh) for _ in range(rng.randint(1, 8))]
            assert ids.check_new(new) == new
            ids.add(new)
            ref += new
        assert ids.ids == ref and len(ids) == len(ref)
        probe = rng.sample(ref, min(10, len(ref)))
        assert ids.rows(probe).tolist() == sorted(ref.index(x) for x in probe)
        if plain:  # numpy integers name the same ids (a removal given an array)
            assert ids.rows(np.array(probe)).tolist() == ids.rows(probe).tolist()
        with pytest.raises(ValueError, match="already in the corpus"):
            ids.check_new([ref[-1]])
        with pytest.raises(ValueError, match="not in the corpus"):
            ids.rows([-1])
    assert renumbered >= 3  # the serials were numbered again along the way
