"""``geograph demo``: every method on a few queries side by side, then one quality table.

On the shipped demo corpus (or any BEIR-format folder): dense top-5; Maniscope; Ricci-Filtration
(what it keeps and what it drops); ISO-RAG (which passages reached the top through the graph
rather than as dense seeds); G3RAG (seeds, then diffused passages); the Ricci-Filtration ->
Maniscope chain; then nDCG@10 / Recall@5 / HitAll@5 / MRR@10 and ms/query of every method and
of BM25, per part of the corpus when its queries carry a ``part`` field, and where each method
differs from dense.
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from geograph.commands import checked_encoder_options
from geograph.console import UsageError, add_command, add_encoder_options, command_parser, format_table
from geograph.data import BEIRError, Dataset, corpus_path, load_beir, load_demo

# torch, the encoder and the methods are imported by the functions that run them: registering
# the command (every ``geograph`` call, ``--help`` included) loads none of them
if TYPE_CHECKING:
    from torch import Tensor

    from geograph.graphs.corpus_graph import CorpusGraph
    from geograph.outputs import RetrievalOutput

PROG = "geograph demo"
SUMMARY = "every method side by side on the shipped corpus (or --data DIR), then a quality table"
METRICS = ("nDCG@10", "Recall@5", "HitAll@5", "MRR@10")
DEPTH = 10  # passages each method returns for the quality table

DESCRIPTION = """\
Every method of geograph on a few queries side by side, then one quality table.

Runs on the shipped demo corpus (111 passages: a single-topic part and a multi-hop part of
bridge questions) or on any BEIR-format folder given with --data. The first run embeds the
passages with all-MiniLM-L6-v2 (offline; another model with --encoder, and its --query-prefix
and --passage-prefix) and caches them on disk; later runs reuse the cache.

Marks in the side-by-side listing: * judged relevant, + not in the dense top-5."""


@dataclass
class MethodRun:
    """One method's ranking of every query: ``indices (Q, K)`` best first, ``scores (Q, K)``
    (``-inf`` = dropped), and the milliseconds per query of one batched call."""

    name: str
    indices: Tensor
    scores: Tensor
    ms: float
    extra: dict[str, Any] = field(default_factory=dict)


def build_parser() -> argparse.ArgumentParser:
    """The parser of ``geograph demo`` on its own (:func:`register` adds it to ``geograph``)."""
    return command_parser(PROG, DESCRIPTION, add_arguments)


def register(commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add ``demo`` to the ``geograph`` command's subcommands."""
    add_command(commands, "demo", SUMMARY, DESCRIPTION, add_arguments, run)


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--data",
        type=corpus_path,
        metavar="DIR",
        help="a BEIR-format folder, or a shipped corpus by name (default: the shipped demo corpus)",
    )
    p.add_argument("--split", default="test", help="qrels split to evaluate (default: test)")
    p.add_argument(
        "--cache", metavar="DIR", help="embedding cache folder (default: $GEOGRAPH_CACHE or ~/.cache/geograph)"
    )
    p.add_argument(
        "--candidates",
        type=int,
        default=20,
        metavar="M",
        help="dense top-M that the rerankers (Maniscope, Ricci-Filtration, the chain) reorder (default: 20)",
    )
    p.add_argument("--k", type=int, default=5, help="Maniscope's k-NN degree over the candidates (default: 5)")
    p.add_argument("--alpha", type=float, default=0.3, help="Maniscope's cosine weight in [0, 1] (default: 0.3)")
    p.add_argument(
        "--graph",
        choices=("auto", "mentions", "knn"),
        default="auto",
        help="ISO-RAG's passage graph: passages linked when one mentions the other's title, a k-NN "
        "graph, or auto: mentions when they link at least a quarter of the passages (default: auto)",
    )
    p.add_argument("--graph-k", type=int, default=10, metavar="K", help="degree of the k-NN graph (default: 10)")
    p.add_argument(
        "--show",
        type=int,
        default=4,
        metavar="N",
        help="queries printed side by side, spread over the corpus parts (default: 4)",
    )
    add_encoder_options(p)


def validate(args: argparse.Namespace, dataset: Dataset) -> None:
    """Reject values that would fail later, before anything is embedded."""
    v = len(dataset.doc_ids)
    if not 2 <= args.candidates <= v:
        raise UsageError(f"--candidates must be between 2 and the corpus size ({v} passages), got {args.candidates}")
    if not 1 <= args.k < args.candidates:
        raise UsageError(f"--k must be at least 1 and below --candidates ({args.candidates}), got {args.k}")
    if not 0.0 <= args.alpha <= 1.0:
        raise UsageError(f"--alpha must lie in [0, 1], got {args.alpha}")
    if not 1 <= args.graph_k < v:
        raise UsageError(f"--graph-k must be at least 1 and below the corpus size ({v} passages), got {args.graph_k}")
    if args.show < 0:
        raise UsageError(f"--show must be 0 or more, got {args.show}")
    if v < DEPTH + 1:
        raise UsageError(f"--data: the demo needs at least {DEPTH + 1} passages, {dataset.name} has {v}")


def _timed(
    fn: Callable[[], tuple[Tensor, Tensor]], n_queries: int, warmup: Callable[[], object] | None = None
) -> tuple[Tensor, Tensor, float]:
    if warmup is not None:  # one-time costs (JIT compilation, first allocations) are not per-query costs
        warmup()
    t0 = time.perf_counter()
    idx, scores = fn()
    return idx, scores, 1000.0 * (time.perf_counter() - t0) / max(n_queries, 1)


def _pair(out: RetrievalOutput) -> tuple[Tensor, Tensor]:
    return out.indices, out.scores


def choose_graph(args: argparse.Namespace, dataset: Dataset, corpus: Tensor) -> tuple[CorpusGraph, str]:
    from geograph.graphs.corpus_graph import CorpusGraph

    if args.graph in ("auto", "mentions"):
        graph = CorpusGraph.from_mentions(corpus, dataset.titles, dataset.texts)
        linked = int((graph.degree() > 0).sum())
        if args.graph == "mentions" or 4 * linked >= graph.num_nodes:
            return graph, f"title mentions ({graph.num_edges} edges, {linked} of {graph.num_nodes} passages linked)"
    graph = CorpusGraph.from_knn(corpus, args.graph_k)
    return graph, f"k-NN, k={args.graph_k} ({graph.num_edges} edges)"


def run_methods(args: argparse.Namespace, dataset: Dataset, corpus: Tensor, query: Tensor) -> dict[str, MethodRun]:
    """Every method over all queries (one batched call each, timed)."""
    import torch

    from geograph.rerankers import Maniscope, RicciFiltration
    from geograph.retrievers import DenseRetriever, G3Retriever, ISORetriever

    q, v, m = query.shape[0], corpus.shape[0], args.candidates
    runs: dict[str, MethodRun] = {}
    dense = DenseRetriever(corpus)
    d_idx, d_s, ms = _timed(lambda: _pair(dense(query, max(m, DEPTH))), q)
    runs["dense"] = MethodRun("dense", d_idx, d_s, ms)
    cand = d_idx[:, :m]
    docs = corpus[cand]

    from geograph.retrievers.bm25 import BM25Retriever

    bm25 = BM25Retriever(dataset.passages())  # k1 1.5, b 0.75, English stopwords; indexing is not timed
    b_idx, b_s, ms = _timed(lambda: _pair(bm25.retrieve(dataset.queries, DEPTH)), q)
    runs["BM25"] = MethodRun("BM25 (k1=1.5, b=0.75)", b_idx, b_s, ms)

    maniscope = Maniscope(k=args.k, alpha=args.alpha)

    def man() -> tuple[Tensor, Tensor]:
        out = maniscope(query, docs)
        return cand.gather(1, out.order), out.scores.gather(1, out.order)

    runs["Maniscope"] = MethodRun(f"Maniscope (k={args.k}, alpha={args.alpha})", *_timed(man, q))

    ricci = RicciFiltration()
    keep: dict[str, Tensor] = {}

    def rf() -> tuple[Tensor, Tensor]:
        out = ricci(query, docs)
        keep["keep"] = out.keep
        return cand.gather(1, out.order), out.scores.gather(1, out.order)

    from geograph.functional import warmup

    # every exact kernel, not only those this run calls: a server started next loads them all from the cache
    r_idx, r_s, r_ms = _timed(rf, q, lambda: (warmup(), ricci(query[:1], docs[:1])))
    runs["Ricci-Filtration"] = MethodRun(
        "Ricci-Filtration (percentile 50, kept by cosine)", r_idx, r_s, r_ms, {"keep": keep["keep"]}
    )

    # Maniscope over the candidates Ricci-Filtration kept (its first stage is the run above)
    def chain() -> tuple[Tensor, Tensor]:
        out = maniscope(query, corpus[r_idx], torch.isfinite(r_s))
        return r_idx.gather(1, out.order), out.scores.gather(1, out.order)

    c_idx, c_s, c_ms = _timed(chain, q)
    runs["Ricci -> Maniscope"] = MethodRun("Ricci-Filtration -> Maniscope", c_idx, c_s, r_ms + c_ms)

    graph, about = choose_graph(args, dataset, corpus)
    iso = ISORetriever(graph, L=min(50, v))
    i_idx, i_s, ms = _timed(lambda: _pair(iso(query, min(DEPTH, iso.max_k))), q)
    runs["ISO-RAG"] = MethodRun(
        f"ISO-RAG (m={iso.m}, L={iso.L}, graph: {about})", i_idx, i_s, ms, {"graph": graph, "seeds": d_idx[:, : iso.m]}
    )

    g3 = G3Retriever(corpus, candidates=min(10, v))
    g_idx, g_s, ms = _timed(lambda: _pair(g3(query, DEPTH)), q)
    runs["G3RAG"] = MethodRun(
        f"G3RAG ({g3.seeds} cosine seeds of the dense top-{g3.candidates}, one diffusion step)",
        g_idx,
        g_s,
        ms,
        {"seeds": g3.seeds},
    )
    return runs


def pick_queries(dataset: Dataset, n: int) -> list[int]:
    """``n`` query positions in file order, spread evenly over the corpus parts."""
    parts: dict[str, list[int]] = {}
    for i, qid in enumerate(dataset.query_ids):
        parts.setdefault(str(dataset.query_fields.get(qid, {}).get("part", "")), []).append(i)
    queues = list(parts.values())
    out: list[int] = []
    while len(out) < n and any(queues):
        for qu in queues:
            if qu and len(out) < n:
                out.append(qu.pop(0))
    return sorted(out)


def show_query(dataset: Dataset, runs: dict[str, MethodRun], qi: int, top: int = 5) -> str:
    """One query's block: each method's top passages with marks, then the passages' texts."""
    import torch

    qid = dataset.query_ids[qi]
    gold = dataset.qrels[qid]
    fields = dataset.query_fields.get(qid, {})
    head = f"Query {qid}" + (f" ({fields['part']})" if "part" in fields else "") + f": {dataset.queries[qi]}"
    if "answer" in fields:
        head += f"   [answer: {fields['answer']}]"
    dense_top = set(runs["dense"].indices[qi, :top].tolist())
    shown: list[int] = []

    def tag(i: int) -> str:
        if i not in shown:
            shown.append(i)
        mark = ("*" if gold.get(dataset.doc_ids[i], 0) > 0 else " ") + ("+" if i not in dense_top else " ")
        return f"{mark}{dataset.doc_ids[i]}"

    def ids(run: MethodRun, n: int = top) -> list[int]:
        ok = torch.isfinite(run.scores[qi])
        return [i for i, keep in zip(run.indices[qi].tolist(), ok.tolist()) if keep][:n]

    width = 22
    lines = [head]
    lines.append("  " + "dense top-5".ljust(width) + " ".join(tag(i) for i in ids(runs["dense"])))
    lines.append("  " + "Maniscope".ljust(width) + " ".join(tag(i) for i in ids(runs["Maniscope"])))
    rf = runs["Ricci-Filtration"]
    keep = rf.extra["keep"][qi]
    kept = ids(rf)
    dropped = [
        i for i in rf.indices[qi].tolist() if i not in set(rf.indices[qi][torch.isfinite(rf.scores[qi])].tolist())
    ]
    lines.append(
        "  "
        + "Ricci-Filtration".ljust(width)
        + f"kept {int(keep.sum())}/{keep.numel()}, top: "
        + " ".join(tag(i) for i in kept)
    )
    cos_rank = {i: r for r, i in enumerate(runs["dense"].indices[qi].tolist())}
    dropped = sorted(dropped, key=lambda i: cos_rank.get(i, 10**9))[:top]
    lines.append("  " + "".ljust(width) + "dropped (best by cosine): " + " ".join(tag(i) for i in dropped))
    iso = runs["ISO-RAG"]
    seeds = set(iso.extra["seeds"][qi].tolist())
    ei = iso.extra["graph"].edge_index
    parts = []
    for i in ids(iso):
        if i in seeds:
            parts.append(tag(i))
        else:
            via = sorted(set(ei[1][ei[0] == i].tolist()) & seeds, key=lambda s: cos_rank.get(s, 10**9))
            parts.append(tag(i) + (f"(via {dataset.doc_ids[via[0]]})" if via else "(dense)"))
    lines.append("  " + "ISO-RAG".ljust(width) + " ".join(parts))
    g3 = runs["G3RAG"]
    s = g3.extra["seeds"]
    g3_ids = ids(g3)
    lines.append(
        "  "
        + "G3RAG".ljust(width)
        + "seeds: "
        + " ".join(tag(i) for i in g3_ids[:s])
        + " | diffused: "
        + " ".join(tag(i) for i in g3_ids[s:])
    )
    lines.append("  " + "Ricci -> Maniscope".ljust(width) + " ".join(tag(i) for i in ids(runs["Ricci -> Maniscope"])))
    lines.append("  passages:")
    for i in shown:
        text = f"{dataset.titles[i]}: {dataset.texts[i]}" if dataset.titles[i] else dataset.texts[i]
        lines.append(f"    {dataset.doc_ids[i]:>10}  {text[:100]}")
    return "\n".join(lines)


def quality(dataset: Dataset, runs: dict[str, MethodRun]) -> dict[str, dict[str, Tensor]]:
    """Per-query metrics of every method, ``{method: {metric: (Q,)}}``."""
    from geograph.evaluation import per_query
    from geograph.pipeline import run_ids

    qrels = dataset.qrels_list()
    return {
        name: per_query(run_ids(dataset, r.indices[:, :DEPTH], r.scores[:, :DEPTH]), qrels, METRICS)
        for name, r in runs.items()
    }


def report(dataset: Dataset, runs: dict[str, MethodRun], split: str) -> str:
    """The quality table (per part when the queries have one) and the differences to dense."""
    import torch

    per = quality(dataset, runs)
    parts = [str(dataset.query_fields.get(q, {}).get("part", "")) for q in dataset.query_ids]
    groups = {"all queries": list(range(len(parts)))}
    for p in dict.fromkeys(parts):
        if p:
            groups[p] = [i for i, x in enumerate(parts) if x == p]
    out = []
    for label, rows in groups.items():
        sel = torch.tensor(rows)
        table = {name: {m: float(v[sel].mean()) for m, v in per[name].items()} for name in runs}
        for name in runs:
            table[name]["ms/query"] = runs[name].ms
        cols = list(METRICS) + (["ms/query"] if label == "all queries" else [])
        out.append(f"\nQuality on {dataset.name} ({split}), {label}: {len(rows)} queries")
        out.append(format_table(table, cols, {"ms/query": "12.2f"}))
    out.append(
        "\nms/query: one batched call over all queries after one warm-up call, on this machine (not a benchmark:"
        "\nsee `geograph bench run`); rerankers are timed without the dense stage. "
        "Recall@5/HitAll@5: judged passages in the top 5 (HitAll: all of them)."
    )
    out.append("\nWhere each method differs from dense (top-5 as a set; nDCG@10 per query):")
    base = per["dense"]["nDCG@10"]
    dense5 = runs["dense"].indices[:, :5]
    for name, r in runs.items():
        if name == "dense":
            continue
        ok = torch.isfinite(r.scores[:, :5])
        top5 = torch.where(ok, r.indices[:, :5], torch.full_like(r.indices[:, :5], -1))
        same = (torch.sort(top5, 1).values == torch.sort(dense5, 1).values).all(1)
        delta = per[name]["nDCG@10"] - base
        better, worse = (delta > 1e-12), (delta < -1e-12)
        best = [dataset.query_ids[i] for i in torch.argsort(-delta)[: min(3, int(better.sum()))].tolist()]
        line = (
            f"  {name:<20} top-5 differs on {int((~same).sum()):>3}/{len(same)} queries; "
            f"nDCG@10 better on {int(better.sum())}, worse on {int(worse.sum())}"
        )
        if best:
            line += f" (largest gains: {', '.join(best)})"
        out.append(line)
    return "\n".join(out)


def load(args: argparse.Namespace) -> Dataset:
    """The data set, or a :class:`~geograph.console.UsageError` naming ``--data`` or ``--split``."""
    if not args.data:
        if args.split != "test":
            raise UsageError(f"--split: the shipped demo corpus has only the split 'test', got {args.split!r}")
        return load_demo()
    try:
        return load_beir(args.data, args.split)
    except BEIRError as e:
        raise UsageError(f"--{'split' if e.argument == 'split' else 'data'}: {e}") from None


def main(argv: Sequence[str] | None = None) -> int:
    """Run ``geograph demo`` with ``argv``; the exit status."""
    return run(build_parser().parse_args(argv))


def run(args: argparse.Namespace) -> int:
    """The demo of the parsed arguments; the exit status."""
    from geograph.data import Encoder
    from geograph.pipeline import embed, missing_embeddings

    t0 = time.perf_counter()
    try:
        dataset = load(args)
        validate(args, dataset)
        options = checked_encoder_options(args)
    except UsageError as e:
        return e.exit(PROG)

    encoder = Encoder(cache=args.cache, **options)
    todo = missing_embeddings(dataset, encoder)
    total = len(dataset.doc_ids) + len(dataset.queries)
    if todo:
        print(
            f"{dataset}: embedding {todo} of {total} texts with {encoder.model_name} (first run; cached afterwards)",
            flush=True,
        )
    else:
        print(f"{dataset}: embeddings of all {total} texts from the cache (cached)", flush=True)
    corpus, query = embed(dataset, encoder)
    t_embed = time.perf_counter() - t0

    runs = run_methods(args, dataset, corpus, query)
    for qi in pick_queries(dataset, args.show):
        print()
        print(show_query(dataset, runs, qi))
    if args.show:
        print(
            "\n(* = judged relevant, + = not in the dense top-5, (via X) = ISO-RAG reached it from seed X "
            "through the graph)"
        )
    print("\nMethods: " + "; ".join(r.name for r in runs.values() if r.name != "dense"))
    print(report(dataset, runs, args.split))
    print(f"\ndone in {time.perf_counter() - t0:.1f} s (embedding {t_embed:.1f} s)")
    return 0
