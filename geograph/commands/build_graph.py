"""geograph build-graph: embed a BEIR folder (cached) and save a CorpusGraph for ISO-RAG and training."""

from __future__ import annotations

import argparse
import contextlib
import json
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

from geograph.commands import checked_encoder_options
from geograph.console import (
    UsageError,
    add_command,
    add_encoder_options,
    add_ray_options,
    check_ray_options,
    command_parser,
)
from geograph.data import corpus_path

if TYPE_CHECKING:
    from geograph.data import Dataset, Encoder
    from geograph.graphs.corpus_graph import CorpusGraph
    from geograph.graphs.g3_graph import G3Graph

PROG = "geograph build-graph"
SUMMARY = "embed a corpus and save a graph over it: k-NN or title mentions (ISO-RAG), or G3RAG's"

DESCRIPTION = """\
Embed the passages of a BEIR-format folder (only corpus.jsonl is read) or of a JSONL file of
passages with --encoder (default: the offline all-MiniLM-L6-v2; --passage-prefix prepended;
cached on disk) and save a graph over them: a CorpusGraph for ISO-RAG, a k-NN graph (--knn K) or a title-mention graph
(--mentions: passage u links to v when u's text mentions v's title), or G3RAG's gain graph
(--g3). The graph is saved as an artefact folder (tensors.safetensors and manifest.json, which
records the encoder, its prefixes, the passage ids and a checksum of the embeddings, and
passages.jsonl: each passage's id and the hash of its embedded text, which geograph update reads). Load it with
CorpusGraph.from_pretrained(OUT) / G3Graph.from_pretrained(OUT), serve it with
geograph serve --graph OUT (with the same --encoder and prefixes), or train f_theta on a
CorpusGraph with python -m geograph.train fit --data.graph_dir OUT.

Corpora of millions: --index ivf (or auto: exact up to 50,000 passages) builds the k-NN and G3
graphs from an IVF cell join (--nlist cells trained on --sample passages, each joined with its
--nprobe nearest, by default as many as the sampled passages show are needed to find
--recall-target of their exact neighbours; exact scores), G3 from each passage's
--candidates best pairs by weight (every row certified up to the join's misses) and a
density estimated from --density-sample columns. A build interrupted by Ctrl-C writes nothing; the save itself
writes the graph's metadata last, so an interrupted save never leaves a graph that loads.

Past one machine: --ray embeds the missing passages on a Ray Data actor pool (--concurrency
encoders, --num-gpus each) into the same embedding cache and runs the graph's tiles as Ray
tasks; the graph equals the one built without --ray. --ray alone starts a local Ray; --ray auto
or --ray ray://HOST:PORT joins a cluster (--data and --cache on storage every node reads)."""


def build_parser() -> argparse.ArgumentParser:
    """The parser of ``geograph build-graph`` on its own (:func:`register` adds it to ``geograph``)."""
    return command_parser(PROG, DESCRIPTION, add_arguments)


def register(commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add ``build-graph`` to the ``geograph`` command's subcommands."""
    add_command(commands, "build-graph", SUMMARY, DESCRIPTION, add_arguments, run)


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--data",
        required=True,
        type=corpus_path,
        metavar="PATH",
        help="a folder with corpus.jsonl (BEIR layout; queries and qrels are not needed), a JSONL file of "
        "passages, or a shipped corpus by name (demo)",
    )
    p.add_argument("--split", help="if given, check that the folder has qrels/SPLIT.tsv (not otherwise read)")
    kind = p.add_mutually_exclusive_group(required=True)
    kind.add_argument("--knn", type=int, metavar="K", help="k-NN graph over the passage embeddings, 1 <= K < passages")
    kind.add_argument("--mentions", action="store_true", help="passage -> passage whose title it mentions")
    kind.add_argument("--g3", action="store_true", help="G3RAG's geometric-gain graph (a G3Graph)")
    idx = p.add_argument_group("index (--knn and --g3)")
    idx.add_argument(
        "--index",
        default="exact",
        choices=["exact", "ivf", "auto"],
        help="candidate pairs: every pair (exact), an IVF cell join, or auto (default: exact)",
    )
    idx.add_argument("--nlist", type=int, help="IVF cells of the join (default: about 2 sqrt(N), a power of two)")
    idx.add_argument(
        "--nprobe",
        type=int,
        help="cells each cell is joined with (default: chosen for --recall-target "
        "from 32, or as many as hold 2,560 passages where cells are small)",
    )
    idx.add_argument(
        "--recall-target",
        type=float,
        default=0.98,
        help="share of each passage's exact neighbours the IVF join must find, estimated on sampled "
        "passages; the build probes more cells, or scans exactly, to reach it (default: %(default)s)",
    )
    idx.add_argument("--sample", type=int, help="passages the IVF cells are trained on (default: 256 per cell)")
    g3 = p.add_argument_group("G3 (--g3)")
    g3.add_argument("--max-degree", type=int, default=128, help="strongest edges kept per passage (default: 128)")
    g3.add_argument("--beta", type=float, default=0.4, help="density penalty (default: 0.4)")
    g3.add_argument(
        "--band",
        type=float,
        nargs=2,
        default=(0.1, 0.7),
        metavar=("LO", "HI"),
        help="cosine band of the edges (default: 0.1 0.7)",
    )
    g3.add_argument(
        "--candidates",
        type=int,
        help="candidates per passage with --index ivf (default: max-degree + a quarter; 512 with --ranking cosine)",
    )
    g3.add_argument(
        "--density-sample",
        type=int,
        help="columns sampled for the density (default: exact; 8192 with --index ivf; 0 = exact)",
    )
    p.add_argument(
        "--cache", metavar="DIR", help="embedding cache folder (default: $GEOGRAPH_CACHE or ~/.cache/geograph)"
    )
    p.add_argument("--out", required=True, metavar="DIR", help="folder to write the graph to")
    p.add_argument("--json", action="store_true", help="print what was built as one JSON object instead of lines")
    add_encoder_options(p)
    add_ray_options(p)


def main(argv: Sequence[str] | None = None) -> int:
    """Run ``geograph build-graph`` with ``argv``; the exit status."""
    return run(build_parser().parse_args(argv))


def run(args: argparse.Namespace) -> int:
    """Build and save the graph that the parsed arguments describe; the exit status."""
    from geograph.data import BEIRError, Encoder, load_beir, load_corpus
    from geograph.data.cache import show_progress

    try:
        if not Path(args.data).exists():
            raise UsageError(f"--data: {args.data}: no such folder or file")
        try:
            dataset = load_corpus(args.data) if args.split is None else load_beir(args.data, args.split)
        except BEIRError as e:
            raise UsageError(f"--{'split' if e.argument == 'split' else 'data'}: {e}") from None
        options = checked_encoder_options(args)
        if args.ray is not None and args.passage_prefix:
            raise UsageError("--passage-prefix is not supported with --ray")
        if args.ray is not None and options["backend"] != "torch":
            raise UsageError(
                f"--encoder-backend {options['backend']} is not supported with --ray (its actors run torch)"
            )
        n = len(dataset.doc_ids)
        if args.knn is not None and not 1 <= args.knn < n:
            raise UsageError(f"--knn must be at least 1 and below the number of passages ({n}), got {args.knn}")
        _check_index_options(args, n)
        check_ray_options(args)
        if args.mentions:  # the links depend on the texts only: check them before embedding
            import torch

            from geograph.graphs.corpus_graph import CorpusGraph

            if CorpusGraph.from_mentions(torch.zeros(n, 1), dataset.titles, dataset.texts).num_edges == 0:
                raise UsageError(f"--mentions: no passage of {args.data} mentions another passage's title; use --knn K")
        if Path(args.out).is_file():
            raise UsageError(f"--out: {args.out} is a file; give a folder to write the graph into")
    except UsageError as e:
        return e.exit(PROG)

    import logging

    from geograph.graphs.corpus_graph import CorpusGraph

    # geograph's own notes (the IVF join's recall, an index chosen by auto), not every library's;
    # G3Graph.build's dict of timings is what the summary below says in words
    logging.basicConfig(format="%(name)s: %(message)s")
    logging.getLogger("geograph").setLevel(logging.INFO)
    logging.getLogger("geograph.g3").setLevel(logging.WARNING)
    seconds: dict[str, float] = {}
    start = time.perf_counter()
    with contextlib.ExitStack() as stack:
        if args.ray is not None:
            try:
                from geograph.distributed import embed_corpus, on_ray
            except ImportError as e:
                return UsageError(f"--ray: {e}").exit(PROG)
            try:
                executor = stack.enter_context(on_ray(args.ray))
            except (ConnectionError, ValueError, RuntimeError) as e:
                return UsageError(f"--ray {args.ray}: cannot connect ({str(e).splitlines()[0]})").exit(PROG)
            report = embed_corpus(
                args.data,
                cache=args.cache,
                model=options["model"],
                concurrency=args.concurrency,
                num_gpus=args.num_gpus,
                batch_size=args.batch_size,
            )
            if not args.json:
                print(
                    f"embedded on Ray: {report.passages} passages, {report.cached} already cached, {report.encoded} "
                    f"encoded by {args.concurrency} actors ({report.seconds:.1f} s)",
                    flush=True,
                )
        encoder = Encoder(cache=args.cache, batch_size=args.batch_size, **options)
        emb = encoder.encode_passages(dataset.passages())
        seconds["embedding"] = time.perf_counter() - start
        ivf = dict(
            index=args.index,
            nlist=args.nlist,
            nprobe=args.nprobe,
            sample=args.sample,
            progress=show_progress(None),  # on a terminal only
            recall_target=args.recall_target,
        )
        graph: CorpusGraph | G3Graph
        try:
            if args.knn is not None:
                graph = CorpusGraph.from_knn(emb, args.knn, **ivf)
            elif args.g3:
                from geograph.graphs.g3_graph import G3Graph

                graph = G3Graph.build(
                    emb,
                    max_degree=args.max_degree,
                    beta=args.beta,
                    band=tuple(args.band),
                    candidates=args.candidates,
                    density_sample=args.density_sample,
                    **ivf,
                )
            else:
                graph = CorpusGraph.from_mentions(emb, dataset.titles, dataset.texts)
        except ValueError as e:  # an index option the corpus cannot take
            return UsageError(str(e)).exit(PROG)
        except KeyboardInterrupt:
            print("interrupted: nothing was written", file=sys.stderr)
            return 130
        except RuntimeError as e:  # a Ray build whose tiles failed past their retries
            print(f"{PROG}: error: {e}; nothing was written", file=sys.stderr)
            return 1
        seconds["graph"] = time.perf_counter() - start - seconds["embedding"]
        if args.ray is not None and getattr(graph, "build_info", None) is not None:
            graph.build_info = dict(
                graph.build_info, ray={"address": args.ray, "tasks": executor.tasks, "cpus": executor.session["cpus"]}
            )
    t0 = time.perf_counter()
    graph.save_pretrained(args.out, encoder=encoder, ids=dataset.doc_ids, text_keys=passage_keys(encoder, dataset))
    seconds["saving"] = time.perf_counter() - t0
    seconds["total"] = time.perf_counter() - start
    built = summary(graph, Path(args.out), encoder=encoder.model_name, seconds=seconds)
    print(json.dumps(built, indent=2, default=str) if args.json else describe(built))
    return 0


def summary(graph: CorpusGraph | G3Graph, out: Path, *, encoder: str, seconds: dict[str, float]) -> dict[str, Any]:
    """What ``build-graph`` built, as ``--json`` prints it: the graph's class and name, its
    passages, edges (a G3Graph's stored entries) and dimension, the encoder, the folder with its
    files' sizes in bytes, the seconds of each stage, and the builder's ``build_info``."""
    files = {p.name: p.stat().st_size for p in sorted(out.iterdir()) if p.is_file()}
    kind = type(graph).__name__
    g3 = cast("G3Graph", graph)  # read only where kind says it is one
    return {
        "kind": kind,
        "name": graph.name if kind == "CorpusGraph" else "g3",
        "passages": graph.num_nodes,
        "edges": graph.num_edges if kind == "CorpusGraph" else int(g3.val.numel()),
        "dim": int(graph.embeddings.shape[1]),
        "encoder": encoder,
        "out": str(out),
        "files": files,
        "bytes": sum(files.values()),
        "seconds": {k: round(v, 3) for k, v in seconds.items()},
        "build_info": dict(getattr(graph, "build_info", None) or {}),
        # the G3Graph here comes from G3Graph.build, which records its band
        **({"band": list(g3.band), "beta": g3.beta, "max_degree": g3.max_degree} if kind == "G3Graph" else {}),  # type: ignore[arg-type]
    }


def describe(built: dict[str, Any]) -> str:
    """The lines ``build-graph`` prints about what it built (:func:`summary`).

    Example:
        >>> print(describe({"kind": "CorpusGraph", "name": "knn3", "passages": 111, "edges": 216, "dim": 384,
        ...     "encoder": "all-MiniLM-L6-v2", "out": "g", "files": {"a": 1500, "b": 200}, "bytes": 1700,
        ...     "seconds": {"embedding": 2.5, "graph": 0.03, "saving": 0.01, "total": 2.54},
        ...     "build_info": {"index": "exact", "k": 3}}))
        built a k-NN graph (k = 3) over 111 passages (384-dimensional all-MiniLM-L6-v2 embeddings): 216 edges
        index: exact
        saved to g: 2 files, 1.7 kB
        took 2.5 s: embedding 2.5 s, graph 0.03 s, saving 0.01 s
    """
    info = built["build_info"]
    if built["kind"] == "G3Graph":
        lo, hi = built["band"]
        what = f"a G3 graph (max degree {built['max_degree']}, cosine band {lo}-{hi}, beta {built['beta']})"
        edges = f"{built['edges']:,} weighted edges"
    elif built["name"].startswith("knn"):
        what, edges = f"a k-NN graph (k = {info.get('k', built['name'][3:])})", f"{built['edges']:,} edges"
    else:
        what, edges = "a title-mention graph", f"{built['edges']:,} edges"
    lines = [
        f"built {what} over {built['passages']:,} passages ({built['dim']}-dimensional {built['encoder']} "
        f"embeddings): {edges}"
    ]
    if "index" in info:
        index = f"index: {info['index']}"
        if info.get("nprobe") is not None and not info.get("exact", False):
            index += f", nprobe {info['nprobe']}"
        if info.get("recall") is not None:
            index += (
                f", recall {info['recall']:.3f} measured on {info['recall_rows']:,} passages"
                f" (target {info['recall_target']})"
            )
        lines.append(index)
    if "ray" in info:
        ray = info["ray"]
        lines.append(f"on Ray ({ray['address']}): {ray['tasks']} tasks over {ray['cpus']} CPUs")
    lines.append(f"saved to {built['out']}: {len(built['files'])} files, {_size(built['bytes'])}")
    s = built["seconds"]
    lines.append(
        f"took {_secs(s['total'])}: embedding {_secs(s['embedding'])}, graph {_secs(s['graph'])}, "
        f"saving {_secs(s['saving'])}"
    )
    return "\n".join(lines)


def _secs(x: float) -> str:
    return f"{x:.1f} s" if x >= 1 else f"{x:.2g} s"


def _size(n: int) -> str:
    for unit in ("bytes", "kB", "MB", "GB"):
        if n < 1000 or unit == "GB":
            return f"{n} bytes" if unit == "bytes" else f"{n:.1f} {unit}"
        n /= 1000  # type: ignore[assignment]
    raise AssertionError  # pragma: no cover


def passage_keys(encoder: Encoder, dataset: Dataset) -> list[str]:
    """The embedding cache's key of each passage's embedded text (its prefix included), saved with
    the graph so that ``geograph update`` tells an edited passage from an unchanged one."""
    from geograph.data.cache import text_key

    return [text_key(encoder.passage_prefix + p) for p in dataset.passages()]


def _check_index_options(args: argparse.Namespace, n: int) -> None:
    """The index options, checked against the corpus before embedding (one line naming the option)."""
    if args.index == "exact" and any(v is not None for v in (args.nlist, args.sample)):
        raise UsageError("--nlist and --sample apply to --index ivf or auto")
    if args.mentions and args.index != "exact":
        raise UsageError("--index applies to --knn and --g3, not --mentions")
    if args.g3:
        if args.max_degree < 1:
            raise UsageError(f"--max-degree must be at least 1, got {args.max_degree}")
        if args.candidates is not None and args.candidates < min(args.max_degree, n - 1):
            raise UsageError(f"--candidates ({args.candidates}) must be at least --max-degree ({args.max_degree})")
        lo, hi = args.band
        if not -1.0 <= lo < hi <= 1.0:
            raise UsageError(f"--band must satisfy -1 <= LO < HI <= 1, got {lo} {hi}")
    elif args.candidates is not None or args.density_sample is not None:
        raise UsageError("--candidates and --density-sample apply to --g3")
    if not 0.0 < args.recall_target <= 1.0:
        raise UsageError(f"--recall-target must be in (0, 1], got {args.recall_target}")
    if args.index != "exact":
        from geograph.knn.policy import check_ivf, default_join_nlist, default_join_nprobe

        nlist = args.nlist if args.nlist is not None else default_join_nlist(n)
        try:
            check_ivf(n, nlist, args.nprobe if args.nprobe is not None else default_join_nprobe(n, nlist), args.sample)
        except ValueError as e:
            raise UsageError(f"--{str(e).split('=')[0].split()[-1]}: {e}") from None
