"""The text-first API: Ranker and Retriever answer as the modules do on the same embeddings, for every
registered method, batched as one call per query, and with the default encoder as the docs show."""

import numpy as np
import pytest
import torch

from conftest import require
from geograph import CorpusGraph, DenseRetriever, G3Retriever, ISORetriever, Maniscope, Ranker, Retriever
from geograph import RicciFiltration as Ricci
from geograph.registry import METHODS, RERANKERS, RETRIEVERS

D = 12
G = torch.Generator().manual_seed(7)
CORPUS = torch.nn.functional.normalize(torch.randn(60, D, generator=G), dim=1)
TEXTS = [f"passage {i}" for i in range(60)]
#: parameters per method (small, not the defaults, so that they are seen to be passed on)
PARAMS = {"maniscope": {"k": 3, "alpha": 0.4}, "ricci": {"percentile": 40.0}, "iso": {"m": 3}, "g3": {"seeds": 3}}
#: the score range of each reranker, from its formula: Maniscope alpha * cos + (1 - alpha) / (1 + d) in
#: [-alpha, 1]; Ricci-Filtration orders the kept candidates by cosine, [-1, 1]
RANGES = {"maniscope": (-0.4, 1.0), "ricci": (-1.0, 1.0)}


def direct(name):
    """The module built by its own constructor (not through the registry); a method without an entry
    here is built by its class from its parameters (a reranker) or over the corpus (a retriever)."""
    if name == "maniscope":
        return Maniscope(k=3, alpha=0.4)
    if name == "ricci":
        return Ricci(percentile=40.0)
    if name == "iso":
        return ISORetriever(CorpusGraph.from_knn(CORPUS, 10), m=3)
    if name == "g3":
        return G3Retriever(CORPUS, seeds=3)
    if name == "dense":
        return DenseRetriever(CORPUS)
    spec = METHODS[name]
    return spec.module(**PARAMS.get(name, {})) if spec.is_reranker else spec.module(CORPUS, **PARAMS.get(name, {}))


def score_range(name):
    """The published rerankers' ranges from their formulas; a later method's from its registry entry."""
    return RANGES[name] if name in RANGES else METHODS[name].score_range(direct(name))


def lists(b=4):
    """``b`` queries and candidate lists of different lengths (rows of the corpus, some near the query)."""
    g = torch.Generator().manual_seed(b)
    q = torch.nn.functional.normalize(torch.randn(b, D, generator=g), dim=1)
    docs = [CORPUS[torch.randperm(60, generator=g)[: 6 + 3 * i]] for i in range(b)]
    return q, docs


def module_ranking(module, q, docs):
    """Kept positions best first, their scores, and the dropped positions, from one module call for one query."""
    res = module(q[None], docs[None])
    order = [j for j in res.order[0].tolist() if res.keep[0, j]]
    return order, [float(res.scores[0, j]) for j in order], [j for j in range(len(docs)) if not res.keep[0, j]]


@pytest.mark.parametrize("name", RERANKERS)
def test_ranker_equals_the_module(name):
    q, docs = lists()
    ranker = Ranker(name, **PARAMS.get(name, {}))
    module = direct(name)
    lo, hi = score_range(name)
    batch = ranker.rank_batch(list(q), docs)
    for i in range(len(docs)):
        order, scores, dropped = module_ranking(module, q[i], docs[i])
        got = ranker.rank(q[i], docs[i])
        assert got.indices == order and list(got.dropped) == dropped
        assert [r.score for r in got] == pytest.approx(scores, abs=1e-6)
        assert [r.relevance for r in got] == pytest.approx([(s - lo) / (hi - lo) for s in scores], abs=1e-6)
        assert all(0.0 <= r.relevance <= 1.0 for r in got)
        # one padded call for all queries answers as one call per query (scores up to the padding's rounding)
        assert batch[i].indices == got.indices and batch[i].dropped == got.dropped
        assert [r.score for r in batch[i]] == pytest.approx([r.score for r in got], abs=1e-6)
        assert ranker.rank(q[i], docs[i], top_k=2).results == got.results[:2]
        assert ranker.rank(q[i].numpy(), docs[i].numpy()) == got  # numpy in, the same answer


@pytest.mark.parametrize("name", RETRIEVERS)
def test_retriever_equals_the_module(name):
    ids = [f"d{i}" for i in range(60)]
    retriever = Retriever(name, corpus=dict(zip(ids, TEXTS)), embeddings=CORPUS, **PARAMS.get(name, {}))
    module = direct(name)
    q, _ = lists(5)
    batch = retriever.retrieve_batch(q, k=6)
    want = module(q, 6)
    for i in range(5):
        got = retriever.retrieve(q[i], k=6)
        assert got.indices == want.indices[i].tolist()
        assert [r.score for r in got] == pytest.approx(want.scores[i].tolist(), abs=1e-6)
        assert got.ids == [ids[j] for j in got.indices] and got.texts == [TEXTS[j] for j in got.indices]
        assert batch[i].indices == got.indices and batch[i].ids == got.ids  # scores: batched matmul rounding
        assert [r.score for r in batch[i]] == pytest.approx([r.score for r in got], abs=1e-6)


def test_ranker_calls_the_module_once_for_a_batch():
    calls = []
    module = Maniscope()
    module.register_forward_hook(lambda m, args, out: calls.append(tuple(args[1].shape)))
    q, docs = lists(3)
    Ranker(module).rank_batch(q, docs)
    assert calls == [(3, 12, D)]


def test_mixed_texts_and_embeddings_use_the_encoder_for_texts_only():
    seen = []

    def encoder(texts):
        seen.append(list(texts))
        return CORPUS[[int(t.split()[1]) for t in texts]]

    ranker = Ranker("maniscope", encoder=encoder, k=3)
    docs = [TEXTS[4], CORPUS[9], TEXTS[20], CORPUS[33].numpy()]
    got = ranker.rank(CORPUS[1], docs)
    order, _, _ = module_ranking(Maniscope(k=3), CORPUS[1], CORPUS[[4, 9, 20, 33]])
    assert got.indices == order and seen == [[TEXTS[4], TEXTS[20]]]
    assert {r.index: r.text for r in got} == {0: TEXTS[4], 1: None, 2: TEXTS[20], 3: None}
    assert ranker.rank("passage 1", []).results == ()


def test_bad_input_one_line():
    with pytest.raises(ValueError, match=f"method must be one of {', '.join(METHODS)}, got 'colbert'"):
        Ranker("colbert")
    with pytest.raises(ValueError, match=r"alpha must be a float in \[0, 1\], got 1.5"):
        Ranker("maniscope", alpha=1.5)
    with pytest.raises(ValueError, match="unknown key 'beta' for method maniscope"):
        Ranker("maniscope", beta=0.4)
    with pytest.raises(ValueError, match="method iso is a retriever: use geograph.Retriever"):
        Ranker("iso")
    with pytest.raises(ValueError, match="method ricci is a reranker: use geograph.Ranker"):
        Retriever("ricci", corpus=TEXTS)
    with pytest.raises(ValueError, match="top_k must be a positive integer or None, got 0"):
        Ranker("maniscope").rank(CORPUS[0], CORPUS[:5], top_k=0)
    with pytest.raises(ValueError, match=r"different dimensions \[3, 12\]"):
        Ranker("maniscope").rank(CORPUS[0], torch.ones(4, 3))
    with pytest.raises(ValueError, match="documents has 1 lists for 2 queries"):
        Ranker("maniscope").rank_batch(CORPUS[:2], [CORPUS[:4]])
    with pytest.raises(ValueError, match="documents\\[1\\] must be a text or a 1-D embedding"):
        Ranker("maniscope").rank(CORPUS[0], ["a", {"text": "b"}])
    with pytest.raises(ValueError, match="single string"):
        Ranker("maniscope").rank("q", "one document")
    r = Retriever("g3", corpus=TEXTS, embeddings=CORPUS, seeds=3)
    with pytest.raises(ValueError, match=r"k must be an integer in \[3, 60\] \(the corpus size\), got 2"):
        r.retrieve(CORPUS[0], k=2)
    with pytest.raises(ValueError, match=r"embeddings: shape \(59, 12\), expected \(60, D\)"):
        Retriever("dense", corpus=TEXTS, embeddings=CORPUS[:59])
    with pytest.raises(ValueError, match="corpus: 59 passages, the dense corpus has 60"):
        Retriever(DenseRetriever(CORPUS), corpus=TEXTS[:59])
    with pytest.raises(ValueError, match="band must be"):
        Retriever("g3", corpus=TEXTS, embeddings=CORPUS, band=(0.7, 0.1))
    with pytest.raises(ValueError, match="encoder must be"):
        Ranker("maniscope", encoder=3)


def test_defaults_as_the_docs_show():
    """``Ranker("maniscope")`` and ``Retriever("g3", corpus=texts)`` with the default (offline) encoder."""
    require("sentence_transformers")
    from geograph.data import Encoder

    texts = [
        "Paris is the capital of France.",
        "The Seine flows through Paris.",
        "Bananas are yellow.",
        "Berlin is the capital of Germany.",
    ]
    query = "What is the capital of France?"
    ranked = Ranker("maniscope").rank(query, texts)
    enc = Encoder(cache=False)
    order, scores, _ = module_ranking(Maniscope(), enc.encode([query])[0], enc.encode(texts))
    assert ranked.indices == order and [r.text for r in ranked] == [texts[j] for j in order]
    assert [r.score for r in ranked] == pytest.approx(scores, abs=1e-5)
    assert ranked[0].text == "Paris is the capital of France."
    got = Retriever("g3", corpus=texts).retrieve("Which river flows through Paris?", k=2)
    want = G3Retriever(enc.encode(texts), candidates=4)(enc.encode(["Which river flows through Paris?"]), 2)
    assert got.indices == want.indices[0].tolist() and got.texts == [texts[j] for j in got.indices]
    assert np.isfinite([r.score for r in got]).all()


@pytest.mark.parametrize("name", RERANKERS)
def test_ids_and_metadata_follow_their_documents(name):
    """``doc_ids`` / ``metadata`` come back on each result, whatever the order; ``None`` when not given."""
    q, docs = lists(3)
    ranker = Ranker(name, **PARAMS.get(name, {}))
    ids = [[f"q{i}-d{j}" for j in range(len(d))] for i, d in enumerate(docs)]
    metas = [[{"row": j, "query": i} for j in range(len(d))] for i, d in enumerate(docs)]
    batch = ranker.rank_batch(q, docs, doc_ids=ids, metadata=metas)
    for i in range(3):
        plain = ranker.rank(q[i], docs[i])
        got = ranker.rank(q[i], docs[i], top_k=4, doc_ids=ids[i], metadata=metas[i])
        assert got.indices == plain.indices[:4] and got.dropped == plain.dropped
        assert [r.id for r in got] == [ids[i][j] for j in got.indices] == got.ids
        assert [r.meta for r in got] == [metas[i][j] for j in got.indices]
        assert batch[i].ids == [ids[i][j] for j in batch[i].indices]
        assert [r.meta for r in batch[i]] == [{"row": j, "query": i} for j in batch[i].indices]
        assert all(r.id is None and r.meta is None for r in plain)
    # ids of any type (ints, as rerankers takes), metadata for some queries only
    some = ranker.rank_batch(q, docs, doc_ids=[list(range(len(docs[0]))), None, None])
    assert some[0].ids == some[0].indices and some[1].ids == [None] * len(some[1])


def test_ids_and_metadata_of_the_wrong_length_one_line():
    ranker = Ranker("maniscope")
    with pytest.raises(ValueError, match=r"^doc_ids: 2 entries for 3 documents$"):
        ranker.rank(CORPUS[0], CORPUS[:3], doc_ids=["a", "b"])
    with pytest.raises(ValueError, match=r"^metadata: 4 entries for 3 documents$"):
        ranker.rank(CORPUS[0], CORPUS[:3], metadata=[{}] * 4)
    with pytest.raises(ValueError, match=r"^doc_ids must be a list with one entry per document, got str$"):
        ranker.rank(CORPUS[0], CORPUS[:3], doc_ids="abc")
    with pytest.raises(ValueError, match=r"^doc_ids: 1 lists for 2 queries$"):
        ranker.rank_batch(CORPUS[:2], [CORPUS[:3], CORPUS[3:5]], doc_ids=[["a", "b", "c"]])
    with pytest.raises(ValueError, match=r"^metadata\[1\]: 3 entries for 2 documents$"):
        ranker.rank_batch(CORPUS[:2], [CORPUS[:3], CORPUS[3:5]], metadata=[None, [{}, {}, {}]])


async def _ticking(coro):
    """``coro``'s result and how often a concurrent task ran meanwhile (advanced while ``coro`` was pending)."""
    import asyncio

    ticks = 0
    done = asyncio.Event()

    async def tick():
        nonlocal ticks
        while not done.is_set():
            ticks += 1
            await asyncio.sleep(0)

    ticker = asyncio.create_task(tick())
    await asyncio.sleep(0)  # the ticker is running before the call starts
    start = ticks
    try:
        out = await coro
    finally:
        done.set()
        await ticker
    return out, ticks - start


def test_async_rank_leaves_the_event_loop_free():
    """While ``await arank(...)`` runs (the encoder made slow), another coroutine goes on ticking;
    the answers equal :meth:`rank`'s."""
    import asyncio
    import threading
    import time

    entered = threading.Event()

    def slow_encoder(texts):  # blocks its thread; the loop must not be that thread
        entered.set()
        time.sleep(0.3)
        return CORPUS[[int(t.split()[1]) for t in texts]]

    ranker = Ranker("maniscope", encoder=slow_encoder, k=3)
    texts = [TEXTS[j] for j in (4, 9, 20, 33, 41)]
    ids, metas = list("abcde"), [{"n": j} for j in range(5)]
    want = ranker.rank("passage 1", texts, top_k=3, doc_ids=ids, metadata=metas)
    want_batch = ranker.rank_batch(["passage 1", "passage 2"], [texts, texts[:3]])

    async def main():
        got, ticks = await _ticking(ranker.arank("passage 1", texts, top_k=3, doc_ids=ids, metadata=metas))
        batch, batch_ticks = await _ticking(ranker.arank_batch(["passage 1", "passage 2"], [texts, texts[:3]]))
        return got, ticks, batch, batch_ticks

    got, ticks, batch, batch_ticks = asyncio.run(main())
    assert entered.is_set() and got == want and batch == want_batch
    assert ticks > 10 and batch_ticks > 10, (ticks, batch_ticks)  # a blocking call lets it tick 0 times


def test_async_retrieve_leaves_the_event_loop_free():
    import asyncio
    import time

    def slow_encoder(texts):
        time.sleep(0.3)
        return CORPUS[[int(t.split()[1]) for t in texts]]

    retriever = Retriever("dense", corpus=TEXTS, embeddings=CORPUS, encoder=slow_encoder)
    want = retriever.retrieve("passage 7", k=3)
    want_batch = retriever.retrieve_batch(["passage 7", "passage 8"], k=3)

    async def main():
        got, ticks = await _ticking(retriever.aretrieve("passage 7", k=3))
        batch, batch_ticks = await _ticking(retriever.aretrieve_batch(["passage 7", "passage 8"], k=3))
        return got, ticks, batch, batch_ticks

    got, ticks, batch, batch_ticks = asyncio.run(main())
    assert got == want and batch == want_batch and ticks > 10 and batch_ticks > 10


def test_async_rank_from_many_coroutines_at_once():
    """Eight concurrent ``arank`` calls (eight worker threads, one module) answer as ``rank`` does."""
    import asyncio

    q, docs = lists(8)
    ranker = Ranker("maniscope", k=3)
    want = [ranker.rank(q[i], docs[i]) for i in range(8)]

    async def main():
        return await asyncio.gather(*(ranker.arank(q[i], docs[i]) for i in range(8)))

    assert asyncio.run(main()) == want
