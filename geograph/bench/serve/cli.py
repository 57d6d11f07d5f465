"""``geograph bench serve``: the command line (its help text is the package's docstring) and the printed
summary."""

from __future__ import annotations

import argparse
import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from geograph import registry
from geograph.bench.serve.cpu import PARTS, CpuMeter, split, usable_cpus
from geograph.bench.serve.limit import encoder_limit, serving_limit
from geograph.bench.serve.load import closed_loop, summarise
from geograph.bench.serve.process import Server
from geograph.bench.serve.soak import soak
from geograph.bench.serve.stages import STAGES, breakdown, read_stages
from geograph.bench.serve.workload import Workload
from geograph.console import UsageError, make_parser
from geograph.data import corpus_path


def parser() -> argparse.ArgumentParser:
    from geograph.bench import serve as package

    p = make_parser("geograph bench serve", package.__doc__)
    p.add_argument("--url", help="a running server to load (default: start one on 127.0.0.1)")
    p.add_argument("--method", default="maniscope", choices=registry.names(), help="a served method (maniscope)")
    p.add_argument(
        "--corpus",
        type=corpus_path,
        help="BEIR folder the server serves, or a shipped corpus by name (default: the demo corpus)",
    )
    p.add_argument(
        "--server-arg",
        action="append",
        default=[],
        metavar="ARG",
        help="a flag passed to geograph serve (repeatable, e.g. --server-arg=--max-batch-size=32)",
    )
    p.add_argument("--clients", type=int, default=32, help="closed-loop clients (32)")
    p.add_argument("--text-requests", type=int, default=800, help="requests of the text phase (800; 0 skips it)")
    p.add_argument("--requests", type=int, default=2000, help="requests of the mixed phase (2000; 0 skips it)")
    p.add_argument("--candidates", type=int, default=8, help="candidate texts of a /rerank request (8)")
    p.add_argument(
        "--rerank-requests",
        type=int,
        default=0,
        help="requests of each /v2/rerank phase (rerankers; 0 skips them): documents never seen (the "
        "text cache misses), then corpus passages (it hits once they are held)",
    )
    p.add_argument("--documents", type=int, default=20, help="documents of a /v2/rerank request (20)")
    p.add_argument(
        "--encoder-backend",
        default="torch",
        choices=("torch", "onnx", "onnx-int8"),
        help="the encoder's runtime, for the server (its --encoder-backend) and the limits (torch)",
    )
    p.add_argument(
        "--soak", type=int, default=0, metavar="N", help="N mixed requests checked against answers alone (0: none)"
    )
    p.add_argument(
        "--pool", type=int, default=400, help="distinct requests of the soak, each answered alone first (400)"
    )
    p.add_argument("--encoder", help="local sentence-transformers directory (default: all-MiniLM-L6-v2)")
    p.add_argument("--repeat", type=int, default=3, help="passes of the encoder limit (median)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--timeout", type=float, default=300, help="seconds a client waits for an answer (300)")
    p.add_argument("--out", default="bench-results", help="folder of serve.json")
    return p


def check_args(args: argparse.Namespace) -> None:
    for name in ("clients", "pool", "repeat", "candidates", "documents"):
        if getattr(args, name) < 1:
            raise UsageError(f"--{name} must be >= 1, got {getattr(args, name)}")
    for name in ("text_requests", "requests", "soak", "rerank_requests"):
        if getattr(args, name) < 0:
            raise UsageError(f"--{name.replace('_', '-')} must be >= 0, got {getattr(args, name)}")
    if args.soak and args.url:
        raise UsageError("--soak reads the memory of the server's processes: leave out --url")
    if args.timeout <= 0:
        raise UsageError(f"--timeout must be > 0, got {args.timeout}")
    if args.corpus and not (Path(args.corpus) / "corpus.jsonl").is_file():
        raise UsageError(f"--corpus {args.corpus} is not a BEIR-format folder (no corpus.jsonl)")


def main(argv: Sequence[str] | None = None) -> int:
    args = parser().parse_args(argv)
    try:
        check_args(args)
    except UsageError as e:
        return e.exit("geograph bench serve")
    from geograph.bench.common import provenance, write_json
    from geograph.data import DEMO_PATH, Encoder, load_corpus

    corpus = str(args.corpus or DEMO_PATH)
    dataset = load_corpus(corpus)  # the passages only (the server reads the same folder)
    emb = Encoder(args.encoder, progress=False).encode(dataset.passages())  # through the on-disk cache
    work = Workload(dataset, emb, args.method, args.seed, args.candidates)

    # the encoder's limits are what the text and rerank phases are measured against: a run of
    # only the mixed requests or the soak does not pay for them
    limits = bool(args.text_requests or (args.rerank_requests and work.reranker))
    limit: dict[str, Any] | None = None
    if limits:
        limit_texts = [work.text() for _ in range(256)]
        print(f"encoder limit: {len(limit_texts)} distinct texts, batches of 64, {args.repeat} passes ...", flush=True)
        limit = encoder_limit(args.encoder, limit_texts, args.repeat)
        print(f"  {limit['texts_per_s']:.0f} texts/s ({limit['threads']} torch threads)", flush=True)

    server_args = list(args.server_arg)
    if args.encoder_backend != "torch" and not any(a.startswith("--encoder-backend") for a in server_args):
        server_args.append(f"--encoder-backend={args.encoder_backend}")
    server = None if args.url else Server(args.method, corpus, server_args)
    url = args.url.rstrip("/") if args.url else server.url  # type: ignore[union-attr]  # started without --url
    served = _server_shape(url, args.clients)
    at_server: dict[str, Any] | None = None
    if limits:
        print(
            f"serving limit: {served['workers']} workers of one thread, batches of {served['batch']} "
            f"({args.clients} clients over {served['workers']} workers, at most max_batch_size) ...",
            flush=True,
        )
        at_server = serving_limit(
            args.encoder,
            [work.text() for _ in range(max(256, 8 * served["batch"] * served["workers"]))],
            batch=served["batch"],
            workers=served["workers"],
            repeat=args.repeat,
            backend=args.encoder_backend,
        )
        print(f"  {at_server['texts_per_s']:.0f} texts/s ({args.encoder_backend})", flush=True)
    result: dict[str, Any] = {
        **provenance(),
        "method": args.method,
        "corpus": corpus,
        "clients": args.clients,
        "url": args.url,
        "server_args": args.server_arg,
        "cpus": len(os.sched_getaffinity(0)),
        "encoder_limit": limit,  # both None without a text or rerank phase
        "serving_limit": at_server,
        "encoder_backend": args.encoder_backend,
    }
    status = False
    meter = CpuMeter(None if server is None else server.proc.pid, served["workers"])
    try:
        warm = work.mixed(2 * args.clients)
        closed_loop(url, warm, args.clients, args.timeout)
        if args.text_requests:
            assert limit is not None and at_server is not None  # measured above for a text phase
            calls = [("retrieve_text", *work.make("retrieve_text")) for _ in range(args.text_requests)]
            before = read_stages(url)
            meter.start()
            got, seconds = closed_loop(url, calls, args.clients, args.timeout)
            used = meter.stop()
            text = summarise(calls, got, seconds)
            text["cpu"] = split(used, len(calls), at_server["cpu_s_per_text"], usable_cpus())
            text["share_of_limit"] = text["req_per_s"] / limit["texts_per_s"]
            text["share_of_serving_limit"] = text["req_per_s"] / at_server["texts_per_s"]
            text["stages_ms"] = breakdown(before, read_stages(url))
            result["text"] = text
            print(
                f"text: {text['requests']} /retrieve with distinct query texts: {text['req_per_s']:.1f} req/s "
                f"= {100 * text['share_of_serving_limit']:.0f}% of the encoder's {at_server['texts_per_s']:.0f} "
                f"texts/s as served ({100 * text['share_of_limit']:.0f}% of {limit['texts_per_s']:.0f} at batch 64); "
                f"p50 {text['kinds']['all']['p50_ms']:.0f} ms, p99 {text['kinds']['all']['p99_ms']:.0f} ms "
                f"(p99/p50 {text['p99_over_p50']:.2f}), {text['status_5xx']} 5xx, {text['status_other']} other non-200",
                flush=True,
            )
            _print_stages(text["stages_ms"])
            _print_cpu(text["cpu"])
            status |= bool(text["status_5xx"] or text["status_other"])
        if args.rerank_requests and work.reranker:
            assert at_server is not None  # measured above for a rerank phase
            for phase, fresh in (("rerank_cache_miss", True), ("rerank_cache_hit", False)):
                calls = [("v2_rerank", *work.v2_rerank(args.documents, fresh)) for _ in range(args.rerank_requests)]
                if not fresh:  # the passages once, so that the phase reads them from the text cache
                    every = ("v2_rerank", *work.v2_rerank(args.documents, False, every=True))
                    closed_loop(url, [every] * 4 * served["workers"], 2 * served["workers"], args.timeout)
                before = read_stages(url)
                meter.start()
                got, seconds = closed_loop(url, calls, args.clients, args.timeout)
                used = meter.stop()
                part = summarise(calls, got, seconds)
                # a cache hit encodes only the query: the documents are read from the text cache
                texts = len(calls) * (args.documents + 1 if fresh else 1)
                part["cpu"] = split(used, texts, at_server["cpu_s_per_text"], usable_cpus())
                part["texts_per_request"] = args.documents + 1
                part["texts_per_s"] = part["req_per_s"] * (args.documents + 1)
                part["share_of_serving_limit"] = part["texts_per_s"] / at_server["texts_per_s"]
                part["stages_ms"] = breakdown(before, read_stages(url))
                result[phase] = part
                print(
                    f"{phase}: {part['requests']} /v2/rerank of {args.documents} documents: {part['req_per_s']:.1f} "
                    f"req/s, {part['texts_per_s']:.0f} texts/s = {100 * part['share_of_serving_limit']:.0f}% of the "
                    f"limit; p50 {part['kinds']['all']['p50_ms']:.0f} ms, p99 {part['kinds']['all']['p99_ms']:.0f} "
                    f"ms (p99/p50 {part['p99_over_p50']:.2f}), {part['status_5xx']} 5xx, "
                    f"{part['status_other']} other non-200",
                    flush=True,
                )
                _print_stages(part["stages_ms"])
                _print_cpu(part["cpu"])
                status |= bool(part["status_5xx"] or part["status_other"])
        if args.requests:
            calls = work.mixed(args.requests)
            got, seconds = closed_loop(url, calls, args.clients, args.timeout)
            mixed = summarise(calls, got, seconds)
            result["mixed"] = mixed
            print(
                f"mixed: {mixed['requests']} requests, {mixed['req_per_s']:.1f} req/s, {mixed['status_5xx']} 5xx, "
                f"{mixed['status_other']} other non-200, p99/p50 {mixed['p99_over_p50']:.2f} over all requests, "
                f"{mixed['worst_kind_p99_over_p50']:.2f} in the worst kind",
                flush=True,
            )
            status |= bool(mixed["status_5xx"] or mixed["status_other"])
            print(f"  {'kind':<16}{'requests':>9}{'p50 ms':>9}{'p99 ms':>9}{'max ms':>9}{'p99/p50':>9}")
            for kind, row in mixed["kinds"].items():
                print(
                    f"  {kind:<16}{row['requests']:>9}{row['p50_ms']:>9.0f}{row['p99_ms']:>9.0f}{row['max_ms']:>9.0f}"
                    f"{row['p99_over_p50']:>9.2f}"
                )
        if args.soak:
            s = soak(server, work, args.soak, args.pool, args.clients, args.timeout)  # type: ignore[arg-type]  # no --url
            result["soak"] = s
            print(
                f"soak: {s['requests']} requests in {s['seconds']:.0f} s ({s['req_per_s']:.1f} req/s), "
                f"{s['wrong']} wrong, {s['status_5xx']} 5xx, RSS growth per process (MB): "
                + ", ".join(f"{p}: {g:+.1f}" for p, g in s["rss_growth_mb"].items()),
                flush=True,
            )
            status |= bool(
                s["wrong"] or s["status_5xx"] or s["status_other"] or s["alone_not_200"] or s["processes_gone"]
            )
    finally:
        if server is not None:
            result["server_exit_status"] = server.stop()
    path = write_json("serve", result, args.out)
    print(f"wrote {path}")
    return int(status)


def _server_shape(url: str, clients: int) -> dict[str, int]:
    """The server's inference workers and the batch ``clients`` closed-loop clients fill at most
    (clients over workers, capped at its ``max_batch_size``), from its ``/info``."""
    import requests

    info = requests.get(url + "/info", timeout=30).json()
    workers = max(1, int(info.get("workers", {}).get("inference_workers", 1)))
    cap = int(info.get("limits", {}).get("max_batch_size", 64))
    return {"workers": workers, "batch": max(1, min(cap, -(-clients // workers)))}


def _print_cpu(cpu: dict[str, Any]) -> None:
    """The phase's CPU by part, as shares of the machine's (wall seconds x usable CPUs)."""
    names = {
        "clients": "clients (this process)",
        "front": "HTTP front",
        "workers_encode": "workers' encoding",
        "workers_other": "workers' other",
        "server_other": "server's other processes",
        "outside": "outside the measurement",
    }
    parts = ", ".join(f"{names[k]} {100 * cpu['share'][k]:.0f}%" for k in PARTS)
    print(f"  CPU of the machine ({cpu['capacity_s']:.0f} core-s): {parts}, idle {100 * cpu['idle_share']:.0f}%")


def _print_stages(stages: dict[str, dict[str, float]]) -> None:
    """The per-request breakdown (mean ms a request, from the server's /metrics), one line an endpoint."""
    for endpoint, row in stages.items():
        parts = ", ".join(f"{s} {row[s]:.1f}" for s in STAGES if s in row)
        print(f"  {endpoint} in a worker, mean ms a request: {parts} (total {row['total']:.1f})", flush=True)
