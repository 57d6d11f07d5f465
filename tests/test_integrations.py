"""The in-process components inside each framework's own objects, on the demo corpus.

A LangChain chain (retriever, then the compressor), a LlamaIndex query engine over nodes
(retriever, then the postprocessor) and a Haystack ``Pipeline`` (retriever, then the ranker):
each answers in the module's own order on the same inputs, with exactly one module call per
query (counted with a forward hook on the module the component holds). Every component is made
without ``encoder=``, as the docs show it: the default encoder is the offline all-MiniLM-L6-v2
that the expected answers are computed with.
"""

import asyncio

import pytest
import torch

from conftest import require

require("sentence_transformers")

from geograph import CorpusGraph, G3Retriever, ISORetriever, Maniscope, RicciFiltration  # noqa: E402
from geograph.data import Encoder, load_demo  # noqa: E402

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def demo():
    data = load_demo()
    enc = Encoder(cache=False)
    passages = data.passages()
    return {
        "passages": passages,
        "ids": list(data.doc_ids),
        "emb": enc.encode(passages),
        "enc": enc,
        "queries": list(data.queries)[:2],
    }


def counted(module):
    calls = []
    module.register_forward_hook(lambda m, args, out: calls.append(args[0].shape[0]))
    return module, calls


def reranked(module, q, docs):
    res = module(q, docs[None])
    order = [j for j in res.order[0].tolist() if bool(res.keep[0, j])]
    return order, [float(res.scores[0, j]) for j in order]


def retrieved(module, q, k):
    res = module(q, k)
    return res.indices[0].tolist(), res.scores[0].tolist()


def test_langchain_retriever_chain_and_compressor(demo):
    require("langchain_core")
    from langchain_core.documents import Document
    from langchain_core.runnables import RunnableLambda, RunnableParallel, RunnablePassthrough

    from geograph.integrations.langchain import GeographCompressor, GeographRetriever

    iso, iso_calls = counted(ISORetriever(CorpusGraph.from_knn(demo["emb"], 10)))
    man, man_calls = counted(Maniscope())
    corpus = [Document(page_content=t, metadata={"row": i}) for i, t in enumerate(demo["passages"])]
    retriever = GeographRetriever(module=iso, corpus=corpus, k=8)
    compressor = GeographCompressor(module=man, top_n=5)
    chain = RunnableParallel(docs=retriever, query=RunnablePassthrough()) | RunnableLambda(
        lambda x: compressor.compress_documents(x["docs"], x["query"])
    )
    for n, query in enumerate(demo["queries"], 1):
        got = chain.invoke(query)
        q = demo["enc"].encode([query])
        rows, _ = retrieved(ISORetriever(CorpusGraph.from_knn(demo["emb"], 10)), q, 8)
        order, scores = reranked(Maniscope(), q, demo["emb"][rows])
        assert [d.metadata["row"] for d in got] == [rows[j] for j in order[:5]]
        assert [d.metadata["geograph_score"] for d in got] == pytest.approx(scores[:5], abs=1e-6)
        want = [(s + 0.3) / 1.3 for s in scores[:5]]  # Maniscope's range [-alpha, 1] onto [0, 1]
        assert [d.metadata["relevance_score"] for d in got] == pytest.approx(want, abs=1e-6)
        assert iso_calls == [1] * n and man_calls == [1] * n  # one call per query, all its documents in it
    docs = retriever.invoke(demo["queries"][0])
    got = asyncio.run(compressor.acompress_documents(docs, demo["queries"][0]))
    assert got == compressor.compress_documents(docs, demo["queries"][0])
    assert compressor.compress_documents([], "q") == []
    with pytest.raises(ValueError, match="top_n"):
        GeographCompressor(module=man, top_n=0)
    with pytest.raises(ValueError, match="unknown key 'beta' for method maniscope"):
        GeographCompressor(params={"beta": 0.4})
    # by name, every default: G3RAG over the texts, Maniscope
    by_name = GeographRetriever(method="g3", corpus=demo["passages"])
    q = demo["enc"].encode([demo["queries"][0]])
    rows, _ = retrieved(G3Retriever(demo["emb"]), q, 4)
    got = by_name.invoke(demo["queries"][0])
    assert [d.page_content for d in got] == [demo["passages"][j] for j in rows]
    order, _ = reranked(Maniscope(), q, demo["emb"][rows])
    got = GeographCompressor().compress_documents(got, demo["queries"][0])
    assert [d.page_content for d in got] == [demo["passages"][rows[j]] for j in order]


def test_llamaindex_query_engine_over_nodes(demo, monkeypatch):
    require("llama_index.core")
    from llama_index.core import Settings
    from llama_index.core.llms import MockLLM
    from llama_index.core.query_engine import RetrieverQueryEngine
    from llama_index.core.response_synthesizers import get_response_synthesizer
    from llama_index.core.schema import NodeWithScore, QueryBundle, TextNode

    from geograph.integrations.llamaindex import GeographPostprocessor, GeographRetriever

    monkeypatch.setattr(Settings, "_llm", MockLLM())  # the synthesizer resolves an LLM even for no_text
    g3, g3_calls = counted(G3Retriever(demo["emb"]))
    ricci, ricci_calls = counted(RicciFiltration())
    nodes = [TextNode(text=t, id_=str(i)) for i, t in enumerate(demo["passages"])]
    engine = RetrieverQueryEngine(  # no LLM: the answer is the retrieved, postprocessed nodes
        GeographRetriever(g3, nodes, k=10),
        response_synthesizer=get_response_synthesizer(response_mode="no_text"),
        node_postprocessors=[GeographPostprocessor(module=ricci)],
    )
    for n, query in enumerate(demo["queries"], 1):
        got = engine.query(query).source_nodes
        q = demo["enc"].encode([query])
        rows, _ = retrieved(G3Retriever(demo["emb"]), q, 10)
        order, scores = reranked(RicciFiltration(), q, demo["emb"][rows])
        assert [int(x.node.node_id) for x in got] == [rows[j] for j in order]
        assert [x.score for x in got] == pytest.approx(scores, abs=1e-6)
        assert g3_calls == [1] * n and ricci_calls == [1] * n
    # node and query embeddings are used where present (here: vectors the encoder would not give)
    g = torch.Generator().manual_seed(0)
    vecs = torch.nn.functional.normalize(torch.randn(12, demo["emb"].shape[1], generator=g), dim=-1)
    qv = torch.nn.functional.normalize(torch.randn(demo["emb"].shape[1], generator=g), dim=0)
    with_emb = [
        NodeWithScore(node=TextNode(text=demo["passages"][i], id_=str(i), embedding=vecs[i].tolist()))
        for i in range(12)
    ]
    pp = GeographPostprocessor(method="maniscope", top_n=6)
    got = pp.postprocess_nodes(with_emb, QueryBundle("ignored", embedding=qv.tolist()))
    order, _ = reranked(Maniscope(), qv[None], vecs)
    assert [int(x.node.node_id) for x in got] == order[:6]
    # by name over nodes with embeddings: the nodes' vectors are the corpus
    by_name = GeographRetriever("dense", [TextNode(text=f"n{i}", embedding=vecs[i].tolist()) for i in range(12)], k=3)
    got = by_name.retrieve(QueryBundle("ignored", embedding=qv.tolist()))
    assert [x.node.get_content() for x in got] == [f"n{i}" for i in (vecs @ qv).topk(3).indices.tolist()]


def test_haystack_pipeline_retriever_then_ranker(demo):
    require("haystack")
    from haystack import Document, Pipeline

    from geograph.integrations.haystack import GeographRanker, GeographRetriever

    iso, iso_calls = counted(ISORetriever(CorpusGraph.from_knn(demo["emb"], 10)))
    ricci, ricci_calls = counted(RicciFiltration())
    docs = [Document(content=t, id=str(i)) for i, t in enumerate(demo["passages"])]
    pipe = Pipeline()
    pipe.add_component("retriever", GeographRetriever(iso, docs, top_k=12))
    pipe.add_component("ranker", GeographRanker(ricci, top_k=4))
    pipe.connect("retriever.documents", "ranker.documents")
    for n, query in enumerate(demo["queries"], 1):
        got = pipe.run({"retriever": {"query": query}, "ranker": {"query": query}})["ranker"]["documents"]
        q = demo["enc"].encode([query])
        rows, _ = retrieved(ISORetriever(CorpusGraph.from_knn(demo["emb"], 10)), q, 12)
        order, scores = reranked(RicciFiltration(), q, demo["emb"][rows])
        assert [int(d.id) for d in got] == [rows[j] for j in order[:4]]
        assert [d.score for d in got] == pytest.approx(scores[:4], abs=1e-6)
        assert iso_calls == [1] * n and ricci_calls == [1] * n
    # document embeddings are used where present
    g = torch.Generator().manual_seed(1)
    vecs = torch.nn.functional.normalize(torch.randn(9, demo["emb"].shape[1], generator=g), dim=-1)
    mixed = [
        Document(content=demo["passages"][i], id=str(i), embedding=vecs[i].tolist() if i % 2 else None)
        for i in range(9)
    ]
    got = GeographRanker().run(query=demo["queries"][0], documents=mixed)["documents"]
    rows = torch.stack([vecs[i] if i % 2 else demo["emb"][i] for i in range(9)])
    order, _ = reranked(Maniscope(), demo["enc"].encode([demo["queries"][0]]), rows)
    assert [int(d.id) for d in got] == order


def test_haystack_components_round_trip_through_to_dict(demo):
    require("haystack")
    from haystack import Document, Pipeline

    from geograph.integrations.haystack import GeographRanker, GeographRetriever

    docs = [Document(content=t, id=str(i)) for i, t in enumerate(demo["passages"][:40])]
    pipe = Pipeline()
    pipe.add_component("retriever", GeographRetriever("g3", docs, top_k=8, params={"seeds": 3, "beta": 0.7}))
    pipe.add_component("ranker", GeographRanker("maniscope", top_k=5, params={"k": 3, "alpha": 0.5}))
    pipe.connect("retriever.documents", "ranker.documents")
    again = Pipeline.loads(pipe.dumps(), allowed_modules=["geograph.integrations.haystack"])
    ranker = again.get_component("ranker")
    assert ranker.ranker.params == {"k": 3, "alpha": 0.5, "early_stop": True} and ranker.top_k == 5
    assert again.get_component("retriever").retriever.params == {"seeds": 3, "beta": 0.7}
    query = demo["queries"][1]
    inputs = {"retriever": {"query": query}, "ranker": {"query": query}}
    got = [d.id for d in again.run(inputs)["ranker"]["documents"]]
    assert got == [d.id for d in pipe.run(inputs)["ranker"]["documents"]]
    # independent: G3RAG with beta 0.7 over the 40 passages, then Maniscope(k=3, alpha=0.5)
    emb = demo["emb"][:40]
    q = demo["enc"].encode([query])
    rows, _ = retrieved(G3Retriever(emb, beta=0.7, seeds=3), q, 8)
    order, _ = reranked(Maniscope(k=3, alpha=0.5), q, emb[rows])
    assert got == [str(rows[j]) for j in order[:5]]
    # a module given instead of a name saves as its name and parameters
    data = GeographRanker(RicciFiltration(percentile=40.0)).to_dict()
    assert data["init_parameters"]["method"] == "ricci" and data["init_parameters"]["params"]["percentile"] == 40.0
    with pytest.raises(ValueError, match="cannot be saved; give the encoder as a model name"):
        GeographRanker(encoder=lambda texts: demo["enc"].encode(texts)).to_dict()
