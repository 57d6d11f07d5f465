"""``geograph bench serve``: closed-loop load on ``geograph serve`` over HTTP, against the encoder's limit.

It starts a server on 127.0.0.1 (``--method``, ``--corpus``; extra server flags with
``--server-arg``) or targets one (``--url``), and measures, in one run on one machine:

* **limit**: the encoder's batched texts/s (all-MiniLM-L6-v2 or ``--encoder``, batches of 64,
  this process, before the server starts; median of ``--repeat`` passes over distinct texts,
  with one torch thread and with all CPUs: the better);
* **text**: ``--text-requests`` ``/retrieve`` requests, each with a distinct query text, from
  ``--clients`` closed-loop clients: req/s, and req/s as a share of the limit (one text per
  request, so the encoder bounds it);
* **mixed**: ``--requests`` requests mixing ``/retrieve`` with a query text, ``/retrieve``
  with a query vector, ``/rerank`` with candidate texts, ``/rerank`` with candidate ids (the
  last two for rerankers): req/s and p50 / p99 per kind and overall;
* **soak** (``--soak N``): N mixed requests drawn from a pool of requests whose answers were
  first fetched one at a time; after a warm-up pass the resident memory (RSS) of every server
  process before and after, wrong answers (ids or order differ, or a score by more than 1e-6),
  5xx. Needs a server this command started (RSS is read from its process tree). With a
  server whose ``--text-cache-size`` is below the pool's texts, texts are encoded again under
  load (in groups with other requests' texts) and checked against their answers alone.

Targets of issue 26: p99 <= 4 x p50 (mixed), text req/s >= 50% of the limit, and in the soak
RSS growth <= 50 MB per process, 0 wrong answers, 0 5xx. Prints a table and writes
``<out>/serve.json``; exits 1 when a request is not answered with 200, or a soak finds a wrong
answer.
"""

from __future__ import annotations

import math
import os
import random
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Sequence
from pathlib import Path

from geograph.console import UsageError, make_parser

KINDS = ("retrieve_text", "retrieve_vector", "rerank_texts", "rerank_ids")
SCORE_TOL = 1e-6


def parser():
    p = make_parser("geograph bench serve", __doc__)
    p.add_argument("--url", help="a running server to load (default: start one on 127.0.0.1)")
    p.add_argument("--method", default="maniscope", choices=("maniscope", "ricci", "iso", "g3"))
    p.add_argument("--corpus", help="BEIR folder the server serves (default: the demo corpus)")
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


def check_args(args) -> None:
    for name in ("clients", "pool", "repeat", "candidates"):
        if getattr(args, name) < 1:
            raise UsageError(f"--{name} must be >= 1, got {getattr(args, name)}")
    for name in ("text_requests", "requests", "soak"):
        if getattr(args, name) < 0:
            raise UsageError(f"--{name.replace('_', '-')} must be >= 0, got {getattr(args, name)}")
    if args.soak and args.url:
        raise UsageError("--soak reads the memory of the server's processes: leave out --url")
    if args.timeout <= 0:
        raise UsageError(f"--timeout must be > 0, got {args.timeout}")
    if args.corpus and not (Path(args.corpus) / "corpus.jsonl").is_file():
        raise UsageError(f"--corpus {args.corpus} is not a BEIR-format folder (no corpus.jsonl)")


# -- texts and requests -------------------------------------------------------------------
class Workload:
    """Distinct request texts and bodies made from the corpus (seeded)."""

    def __init__(self, dataset, emb, method: str, seed: int, candidates: int) -> None:
        self.ids, self.passages, self.emb = list(dataset.doc_ids), dataset.passages(), emb
        self.words = " ".join(self.passages).split()
        self.rng = random.Random(seed)
        self.method, self.candidates = method, min(candidates, len(self.ids))
        self.reranker = method in ("maniscope", "ricci")
        self.serial = 0

    def text(self) -> str:
        """A query text no earlier call returned (a window of corpus words and a serial number)."""
        self.serial += 1
        n = self.rng.randint(4, 16)
        i = self.rng.randrange(max(1, len(self.words) - n))
        return f"{' '.join(self.words[i : i + n])} {self.serial}"

    def vector(self) -> list[float]:
        import torch

        v = self.emb[self.rng.randrange(len(self.ids))] + 0.3 * torch.randn(self.emb.shape[1], generator=self._gen())
        return torch.nn.functional.normalize(v, dim=0).tolist()

    def _gen(self):
        import torch

        return torch.Generator().manual_seed(self.rng.randrange(2**31))

    def k(self) -> int:
        return {"g3": 5, "iso": 5}.get(self.method, 10)

    def make(self, kind: str) -> tuple[str, dict]:
        if kind == "retrieve_text":
            return "/retrieve", {"query": self.text(), "k": self.k()}
        if kind == "retrieve_vector":
            return "/retrieve", {"query_embedding": self.vector(), "k": self.k()}
        picks = self.rng.sample(range(len(self.ids)), self.candidates)
        if kind == "rerank_texts":
            # corpus passages cut at a random word: candidate texts the server has not seen yet
            docs = [" ".join(self.passages[j].split()[: self.rng.randint(8, 40)]) for j in picks]
            return "/rerank", {"query": self.text(), "candidates": docs}
        return "/rerank", {"query": self.text(), "candidate_ids": [self.ids[j] for j in picks]}

    def kinds(self) -> tuple[str, ...]:
        return KINDS if self.reranker else KINDS[:2]

    def mixed(self, n: int) -> list[tuple[str, str, dict]]:
        kinds = self.kinds()
        return [(kind, *self.make(kind)) for kind in (kinds[i % len(kinds)] for i in range(n))]


# -- the load ------------------------------------------------------------------------------
def closed_loop(url: str, calls, clients: int, timeout: float):
    """Send ``calls`` [(kind, path, body)] from ``clients`` threads, each sending its next call
    when its last one was answered; [(status, body or None, seconds)] in the order of ``calls``
    and the wall seconds of the whole run."""
    import requests

    out: list = [None] * len(calls)
    lock = threading.Lock()
    nxt = [0]

    def client():
        s = requests.Session()
        while True:
            with lock:
                i = nxt[0]
                nxt[0] += 1
            if i >= len(calls):
                return
            _, path, body = calls[i]
            t = time.perf_counter()
            try:
                r = s.post(url + path, json=body, timeout=timeout)
                got = r.json() if r.headers.get("content-type", "").startswith("application/json") else None
                out[i] = (r.status_code, got, time.perf_counter() - t)
            except requests.RequestException:
                out[i] = (599, None, time.perf_counter() - t)  # no answer at all counts as a 5xx

    threads = [threading.Thread(target=client, daemon=True) for _ in range(min(clients, max(1, len(calls))))]
    t = time.perf_counter()
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    return out, time.perf_counter() - t


def quantile(xs: Sequence[float], q: float) -> float:
    """The ``q`` quantile of ``xs`` (nearest rank).

    Example:
        >>> quantile([1, 2, 3, 4], 0.5), quantile(range(1, 101), 0.99)
        (2, 99)
    """
    xs = sorted(xs)
    return xs[max(0, min(len(xs) - 1, math.ceil(len(xs) * q) - 1))] if xs else float("nan")


def summarise(calls, got, seconds: float) -> dict:
    """req/s, 5xx, and per kind and overall: count, p50, p99, max (ms), p99/p50.

    ``p99_over_p50`` is over all requests; ``worst_kind_p99_over_p50`` the largest ratio of one
    kind. The kinds differ in work (a ``/rerank`` with eight candidate texts encodes nine texts,
    a ``/retrieve`` one or none), so the overall distribution has two modes and its median can
    fall in the gap between them; the per-kind ratio is the tail of requests of equal work.
    """
    rows = {}
    for kind in sorted({c[0] for c in calls}) + ["all"]:
        lat = [g[2] for c, g in zip(calls, got) if kind in ("all", c[0])]
        rows[kind] = {
            "requests": len(lat),
            "p50_ms": 1000 * quantile(lat, 0.5),
            "p99_ms": 1000 * quantile(lat, 0.99),
            "max_ms": 1000 * max(lat),
        }
        rows[kind]["p99_over_p50"] = rows[kind]["p99_ms"] / rows[kind]["p50_ms"]
    codes = [g[0] for g in got]
    return {
        "requests": len(got),
        "seconds": seconds,
        "req_per_s": len(got) / seconds,
        "status_5xx": sum(c >= 500 for c in codes),
        "status_other": sum(c != 200 and c < 500 for c in codes),
        "kinds": rows,
        "p99_over_p50": rows["all"]["p99_over_p50"],
        "worst_kind_p99_over_p50": max(r["p99_over_p50"] for k, r in rows.items() if k != "all"),
    }


# -- the server ----------------------------------------------------------------------------
def wait_healthy(url: str, proc: subprocess.Popen, seconds: float, output: Callable[[], str]) -> None:
    """Poll ``url/health`` every 0.5 s until it answers ``ok``. RuntimeError (with the end of
    ``output()``) when ``proc`` exits first, or when ``seconds`` pass (the process is left running)."""
    import requests

    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"the server exited with status {proc.returncode}: {output()[-2000:]}")
        try:
            if requests.get(url + "/health", timeout=2).text == "ok":
                return
        except requests.RequestException:
            pass
        time.sleep(0.5)
    raise RuntimeError(f"the server was not healthy after {seconds:g} s")


class Server:
    """``geograph serve`` in a subprocess on a free port of 127.0.0.1, stopped with SIGTERM."""

    def __init__(self, method: str, corpus: str, extra: Sequence[str], wait: float = 600) -> None:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            self.port = s.getsockname()[1]
        self.url = f"http://127.0.0.1:{self.port}"
        cmd = [
            sys.executable,
            "-m",
            "geograph",
            "serve",
            "--method",
            method,
            "--corpus",
            corpus,
            "--host",
            "127.0.0.1",
            "--port",
            str(self.port),
            *extra,
        ]
        env = {**os.environ, "HF_HUB_OFFLINE": os.environ.get("HF_HUB_OFFLINE", "1")}
        self.proc = subprocess.Popen(
            cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, env=env, start_new_session=True
        )
        self.log: list[bytes] = []
        threading.Thread(target=lambda: self.log.extend(self.proc.stdout), daemon=True).start()
        try:
            wait_healthy(self.url, self.proc, wait, self.output)
        except RuntimeError as exc:
            self.stop()
            raise SystemExit(f"geograph bench serve: {exc}") from None

    def output(self) -> str:
        return b"".join(self.log).decode(errors="replace")

    def rss(self) -> dict[str, float]:
        """MB of resident memory of every process of the server's tree, by ``pid name``."""
        import psutil

        main = psutil.Process(self.proc.pid)
        out = {}
        for p in [main, *main.children(recursive=True)]:
            try:
                out[f"{p.pid} {p.name()}"] = p.memory_info().rss / 2**20
            except psutil.Error:
                pass
        return out

    def stop(self) -> int:
        if self.proc.poll() is None:
            os.kill(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(60)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait(10)
        return self.proc.returncode


# -- the encoder limit ---------------------------------------------------------------------
def encoder_limit(encoder: str | None, texts: list[str], repeat: int) -> dict:
    """Batched texts/s of the encoder in this process (batches of 64, distinct texts, warmed up,
    median of ``repeat`` passes), with one torch thread and with all usable CPUs: the better one."""
    import torch

    from geograph.bench.common import time_calls
    from geograph.data import Encoder

    model = Encoder(encoder, cache=False, progress=False).model
    before = torch.get_num_threads()
    runs = {}
    try:
        for n in sorted({1, len(os.sched_getaffinity(0))}):
            torch.set_num_threads(n)
            t = time_calls(
                lambda: model.encode(texts, batch_size=64, normalize_embeddings=True), repeat=repeat, warmup=1
            )
            runs[n] = {
                "texts_per_s": len(texts) / t["median"],
                "spread": [len(texts) / t["max"], len(texts) / t["min"]],
            }
    finally:
        torch.set_num_threads(before)
    best = max(runs, key=lambda n: runs[n]["texts_per_s"])
    return {
        "texts": len(texts),
        "batch_size": 64,
        "threads": best,
        "texts_per_s": runs[best]["texts_per_s"],
        "by_threads": runs,
    }


# -- the soak ------------------------------------------------------------------------------
def same_answer(got, want) -> bool:
    """Equal ids / order and dropped lists, scores within 1e-6.

    Example:
        >>> a = {"ids": ["a"], "scores": [0.5], "dropped": []}
        >>> same_answer(a, {"ids": ["a"], "scores": [0.5 + 1e-7], "dropped": []})
        True
    """
    if not isinstance(got, dict) or not isinstance(want, dict):
        return False
    keys = ("ids", "dropped") if "ids" in want else ("order", "dropped")
    if any(got.get(k) != want.get(k) for k in keys):
        return False
    a, b = got.get("scores") or [], want.get("scores") or []
    return len(a) == len(b) and all(abs(x - y) <= SCORE_TOL for x, y in zip(a, b))


def soak(server: Server, work: Workload, n: int, pool: int, clients: int, timeout: float) -> dict:
    """``n`` mixed requests from a pool of ``pool`` whose answers were fetched alone first."""
    import requests

    calls = work.mixed(pool)
    session = requests.Session()
    alone = []
    for _, path, body in calls:  # one at a time: each answer is computed in a batch of one
        r = session.post(server.url + path, json=body, timeout=timeout)
        alone.append((r.status_code, r.json() if r.status_code == 200 else None))
    bad_alone = sum(s != 200 for s, _ in alone)
    rng = random.Random(len(calls))
    warm, _ = closed_loop(server.url, [calls[rng.randrange(pool)] for _ in range(min(n, 2 * pool))], clients, timeout)
    before = server.rss()
    picks = [rng.randrange(pool) for _ in range(n)]
    got, seconds = closed_loop(server.url, [calls[i] for i in picks], clients, timeout)
    after = server.rss()
    wrong = sum(not same_answer(g[1], alone[i][1]) for i, g in zip(picks, got) if g[0] == 200)
    growth = {p: after[p] - before[p] for p in before if p in after}
    out = summarise([calls[i] for i in picks], got, seconds)
    out.update(
        pool=pool,
        alone_not_200=bad_alone,
        wrong=wrong,
        warmup_requests=len(warm),
        rss_before_mb=before,
        rss_after_mb=after,
        rss_growth_mb=growth,
        max_rss_growth_mb=max(growth.values()) if growth else float("nan"),
        processes_gone=sorted(set(before) - set(after)),
    )
    return out


# -- the command ---------------------------------------------------------------------------
def main(argv: Sequence[str] | None = None) -> int:
    args = parser().parse_args(argv)
    try:
        check_args(args)
    except UsageError as e:
        return e.exit("geograph bench serve")
    from geograph.bench.common import write_json
    from geograph.data import DEMO_PATH, Encoder, load_corpus

    corpus = args.corpus or str(DEMO_PATH)
    dataset = load_corpus(corpus)  # the passages only (the server reads the same folder)
    emb = Encoder(args.encoder, progress=False).encode(dataset.passages())  # through the on-disk cache
    work = Workload(dataset, emb, args.method, args.seed, args.candidates)

    limit_texts = [work.text() for _ in range(256)]
    print(f"encoder limit: {len(limit_texts)} distinct texts, batches of 64, {args.repeat} passes ...", flush=True)
    limit = encoder_limit(args.encoder, limit_texts, args.repeat)
    print(f"  {limit['texts_per_s']:.0f} texts/s ({limit['threads']} torch threads)", flush=True)

    server = None if args.url else Server(args.method, corpus, args.server_arg)
    url = args.url.rstrip("/") if args.url else server.url
    result: dict = {
        "method": args.method,
        "corpus": corpus,
        "clients": args.clients,
        "url": args.url,
        "server_args": args.server_arg,
        "cpus": len(os.sched_getaffinity(0)),
        "encoder_limit": limit,
    }
    status = False
    try:
        warm = work.mixed(2 * args.clients)
        closed_loop(url, warm, args.clients, args.timeout)
        if args.text_requests:
            calls = [("retrieve_text", *work.make("retrieve_text")) for _ in range(args.text_requests)]
            got, seconds = closed_loop(url, calls, args.clients, args.timeout)
            text = summarise(calls, got, seconds)
            text["share_of_limit"] = text["req_per_s"] / limit["texts_per_s"]
            result["text"] = text
            print(
                f"text: {text['requests']} /retrieve with distinct query texts: {text['req_per_s']:.1f} req/s "
                f"= {100 * text['share_of_limit']:.0f}% of the encoder's {limit['texts_per_s']:.0f} texts/s; "
                f"p50 {text['kinds']['all']['p50_ms']:.0f} ms, p99 {text['kinds']['all']['p99_ms']:.0f} ms, "
                f"{text['status_5xx']} 5xx, {text['status_other']} other non-200",
                flush=True,
            )
            status |= bool(text["status_5xx"] or text["status_other"])
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
            s = soak(server, work, args.soak, args.pool, args.clients, args.timeout)
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


if __name__ == "__main__":
    sys.exit(main())
