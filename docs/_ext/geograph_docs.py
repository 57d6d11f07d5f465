"""Sphinx directives that write the site's generated tables from the code and from ``docs/bench``.

Every table a page shows that the code or a benchmark file already holds is generated at build
time, so a page cannot disagree with its source:

* ``{bench-results}``: the results table of ``geograph bench run`` (``docs/bench/results.json``),
  through the benchmark's own :func:`geograph.bench.run.tables.markdown`;
* ``{bench-method} LABEL``: the rows of one method (and dense) from the same file;
* ``{bench-scale} FILE``: the builds of a ``geograph bench scale`` file (per size: times, recall,
  peak memory, the dense index);
* ``{bench-serve} FILE``: the runs of a ``geograph bench serve`` file;
* ``{method-params} NAME``: the parameters a configuration may set, from :mod:`geograph.registry`;
* ``{serve-config}``: the fields of :class:`geograph.serve.config.ServeConfig`;
* ``{serve-endpoints}``: every route of the server, from the FastAPI apps that
  :func:`geograph.serve.server.build_server` builds over the demo corpus (nothing is started):
  its OpenAPI document's summaries and request bodies (required and optional fields), and the
  routes the document leaves out; without the ``serve`` extra, from the request models.

Each function returns Markdown; the directive parses it in place (MyST) and records the file it
read as a dependency of the page.
"""

from __future__ import annotations

import json
import math
from functools import cache
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
BENCH = ROOT / "docs" / "bench"


def _table(header: list[str], rows: list[list[str]]) -> str:
    esc = [[str(c).replace("|", "\\|") for c in r] for r in rows]
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    return "\n".join(lines + ["| " + " | ".join(r) + " |" for r in esc]) + "\n"


def _load(name: str) -> dict:
    return json.loads((BENCH / name).read_text(encoding="utf-8"))


# --- benchmark tables ------------------------------------------------------------------------


def bench_results() -> str:
    """The results of ``geograph bench run`` as the benchmark writes them (its own
    :func:`~geograph.bench.run.tables.markdown`), the one wide table split for a page: per data
    set, quality, then speed and parity."""
    from geograph.bench.run.tables import markdown, table_rows

    results = _load("results.json")
    header, rows = table_rows(results)
    cut = 3 + len(results["config"]["metrics"]) + 1  # data set, method, queries, the metrics, the interval
    tables = []
    for name, ds in results["datasets"].items():
        mine = [r for r in rows if r[0] == name]
        primary = ds["primary"]
        keep = [i for i in range(1, cut) if i != 2 and any(r[i] != "-" for r in mine)]  # no empty metric
        q_head = [header[i] if i != cut - 1 else f"Δ {primary} [95% CI]" for i in keep]
        q_rows = [[r[i].removeprefix(f"{primary} ") for i in keep] for r in mine]
        s_head = header[1:2] + header[cut:]
        s_rows = [r[1:2] + r[cut:] for r in mine]
        tables.append(
            f"**{name}** ({ds['queries_reported']} queries): quality\n\n{_table(q_head, q_rows)}\n"
            f"**{name}**: speed and parity\n\n{_table(s_head, s_rows)}"
        )
    lines = markdown(results).splitlines()
    first = next(i for i, line in enumerate(lines) if line.startswith("|"))
    last = max(i for i, line in enumerate(lines) if line.startswith("|"))
    if _table(header, rows).splitlines() != lines[first : last + 1]:
        raise ValueError("bench-results: the benchmark's markdown no longer holds its table_rows")
    before, after = "\n".join(lines[:first]), "\n".join(lines[last + 1 :])
    return f"{before}\n\n" + "\n".join(tables) + f"\n{after}\n"


def bench_method(label: str) -> str:
    """One method's rows (and dense's) of ``results.json``: quality, the interval against dense,
    speed against its reference and the tuned values."""
    results = _load("results.json")
    b = results["config"]["speed"]["batch"]
    header = ["data set", "method", "primary metric", "Δ vs dense [95% CI]", f"ms/q B={b}", f"× ref (B={b})",
              "same top-k as ref", "tuned"]  # fmt: skip
    rows = []
    for name, ds in results["datasets"].items():
        for row_label in ("dense", label) if label != "dense" else ("dense",):
            row = ds["methods"].get(row_label)
            if row is None:
                continue
            sp, primary = row["speed"], ds["primary"]
            ci = row.get("vs_dense", {}).get(primary)
            has_ref = "reference_ms" in sp
            rows.append(
                [
                    name,
                    row_label,
                    f"{primary} {row['metrics'][primary]:.3f}",
                    f"{ci['diff']:+.3f} [{ci['low']:+.3f}, {ci['high']:+.3f}]" if ci else "-",
                    f"{sp['Bbatch_ms']:.3f}",
                    f"{sp['speedup_Bbatch']:.1f}x" if has_ref else "-",
                    f"{sp['reference_top_k_identical'] * 100:.0f}% of {sp['reference_queries']}" if has_ref else "-",
                    ", ".join(f"{k}={v}" for k, v in row["params"].items()) or "-",
                ]
            )
    if len(rows) <= len(results["datasets"]) and label != "dense":
        raise ValueError(f"bench-method: no rows for {label!r} in results.json")
    env = results["environment"]
    note = (
        f"\nFrom `docs/bench/results.json` (`geograph bench run`, {env['date'][:10]}, commit {env['commit']}, "
        f"torch {env['torch']}, {env['threads']} CPU threads, device {env['device']}).\n"
    )
    return _table(header, rows) + note


#: What the ``mixture-N`` and ``gauss-N`` sizes of a ``geograph bench scale`` file are.
SYNTHETIC = (
    "The `mixture` and `gauss` corpora are synthetic: N unit vectors drawn from generators fitted to "
    "SciFact's MiniLM embeddings (`geograph.bench.scale.generators`: a mixture of topics, and one "
    "Gaussian with no topics), not the embeddings of real passages."
)


def _synthetic_note(sizes: dict) -> str:
    """:data:`SYNTHETIC` when ``sizes`` has a generated corpus, else nothing."""
    return f" {SYNTHETIC}" if any(s.split("-")[0] in ("mixture", "gauss") for s in sizes) else ""


def _gb(mb: float | None) -> str:
    return "-" if mb is None else f"{mb / 1024:.1f} GB"


def bench_scale(name: str) -> str:
    """Per corpus size of a ``geograph bench scale`` file: the k-NN and G3 builds and the dense index."""
    data = _load(name)
    header = ["corpus (x 384)", "k-NN s", "k-NN nprobe", "k-NN recall@10", "k-NN peak RSS", "G3 s", "G3 nprobe",
              "G3 edge recall", "G3 peak RSS", "dense nprobe", "dense recall@20", "dense speed-up"]  # fmt: skip
    rows = []
    for size, e in data["sizes"].items():
        knn, g3, dense = e.get("knn", {}), e.get("g3", {}), e.get("dense", {})
        g3_info = g3.get("build_info", {})
        g3_nprobe = "exact" if g3_info.get("exact") else g3_info.get("nprobe", "-")
        rows.append(
            [
                f"{size.split('-')[0]} {e['N']:,}",
                f"{knn['seconds']:.0f}" if "seconds" in knn else "-",
                str(knn.get("build_info", {}).get("nprobe", data.get("nprobe") or "-")),
                f"{knn['recall@10']:.5f}" if "recall@10" in knn else "-",
                _gb(knn.get("peak_rss_mb")),
                f"{g3['seconds']:.0f}" if "seconds" in g3 else "-",
                str(g3_nprobe) if g3 else "-",
                f"{g3['edge_recall']:.4f}" if "edge_recall" in g3 else "-",
                _gb(g3.get("peak_rss_mb")),
                str(dense.get("nprobe", "-")),
                f"{dense['recall@20']:.4f}" if "recall@20" in dense else "-",
                f"{dense['speedup']:.1f}x" if "speedup" in dense else "-",
            ]
        )
    out = _table(header, rows) if rows else ""
    if data.get("real"):
        header = ["real set", "N", "nprobe", "k-NN recall@10", "G3 rows certified", "ISO same top-k", "G3 same top-k"]
        rows = [
            [
                k,
                f"{r['N']:,}",
                str(r.get("nprobe", "-")),
                f"{r['knn_recall@10']:.4f}",
                f"{r['g3_certified']:.0%}",
                f"{r['iso_same_topk']:.0%}",
                f"{r['g3_same_topk']:.0%}",
            ]  # fmt: skip
            for k, r in data["real"].items()
        ]
        out += "\n" + _table(header, rows)
    note = _synthetic_note(data["sizes"])
    return out + f"\nFrom `docs/bench/{name}` (`geograph bench scale`, {data['threads']} torch threads).{note}\n"


def bench_ray(name: str) -> str:
    """One process against Ray for each build of a ``geograph bench scale --ray`` file."""
    data = _load(name)
    header = ["corpus", "build", "one process s", "Ray s", "overhead", "tasks", "Ray start s", "worker warm-up s"]
    rows = []
    for size, e in data["sizes"].items():
        for build in ("knn", "g3"):
            ray = e.get("ray", {}).get(build)
            if ray is None or build not in e:
                continue
            one, on_ray = e[build]["seconds"], ray["seconds"]
            info = ray["ray"]
            rows.append(
                [
                    size,
                    build,
                    f"{one:.1f}",
                    f"{on_ray:.1f}",
                    f"{(on_ray / one - 1) * 100:+.0f}%",
                    str(info["tasks"]),
                    f"{info['connect_seconds']:.1f}",
                    f"{info['warmup_seconds']:.1f}",
                ]  # fmt: skip
            )
    return _table(header, rows) + f"\nFrom `docs/bench/{name}`.{_synthetic_note(data['sizes'])}\n"


def _serve_row(label: str, run: dict) -> list[str]:
    text, mixed = run["text"], run["mixed"]
    t, m = text["kinds"]["all"], mixed["kinds"]["all"]
    return [
        label,
        f"{run['encoder_limit']['texts_per_s']:.0f}",
        f"{text['req_per_s']:.1f} ({text['share_of_limit']:.0%})",
        f"{t['p50_ms']:.0f} / {t['p99_ms']:.0f}",
        f"{mixed['req_per_s']:.1f}",
        f"{m['p50_ms']:.0f} / {m['p99_ms']:.0f}",
        f"{mixed['p99_over_p50']:.2f} ({mixed.get('worst_kind_p99_over_p50', math.nan):.2f})",
    ]


def bench_serve(name: str) -> str:
    """The runs of a ``geograph bench serve`` file (text phase, then the mixed phase), and its soak."""
    data = _load(name)
    header = ["run", "encoder limit texts/s", "text req/s (share)", "text p50 / p99 ms", "mixed req/s",
              "mixed p50 / p99 ms", "mixed p99/p50 (worst kind)"]  # fmt: skip
    runs = data["runs"]
    main = runs.get("one_pool_default", runs if isinstance(runs, list) else [])
    rows = [_serve_row(r.get("run", str(i)), r) for i, r in enumerate(main, 1)]
    out = _table(header, rows)
    soak = runs.get("soak_20000") if isinstance(runs, dict) else None
    if soak:
        s = soak["soak"]
        flags = " ".join(f"`{a}`" for a in soak.get("server_args", [])) or "default"
        out += (
            f"\nSoak (server flags {flags}): {s['requests']:,} requests "
            f"in {s['seconds']:.0f} s ({s['req_per_s']:.1f} req/s), {s['wrong']} wrong answers, {s['status_5xx']} 5xx, "
            f"p99/p50 {s['p99_over_p50']:.2f}, largest resident memory growth of a server process "
            f"{s['max_rss_growth_mb']:.1f} MB after {s['warmup_requests']} warm-up requests.\n"
        )
    made = f"{data.get('command', 'geograph bench serve')}; {data.get('machine', '')}"
    return out + f"\nFrom `docs/bench/{name}` ({made}).\n"


# --- code-generated references ---------------------------------------------------------------


def method_params(name: str) -> str:
    """The parameters of one registry entry: accepted values, default, what each does."""
    from geograph.registry import get

    spec = get(name)
    defaults = spec.defaults()
    rows = []
    for p in (*spec.params, *spec.build_params):
        default = defaults.get(p.name, p.default)
        shown = "-" if default is _empty() else f"`{default!r}`"
        where = "build" if p in spec.build_params else "module"
        rows.append([f"`{p.name}`", p.describe(), shown, where, p.doc])
    head = f"{{py:class}}`geograph.{spec.module.__name__}`"
    twin = ""
    if spec.functional is not None:  # cited where it is exported: geograph.functional, else its own module
        home = "geograph.functional" if spec.functional in spec.exports else spec.functional.__module__
        twin = f", functional twin {{py:func}}`{home}.{spec.functional.__name__}`"
    return (
        f"{head}{twin} ({spec.kind}). The keys `geograph serve --param` and the benchmark configs accept:\n\n"
        + _table(["parameter", "accepted values", "default", "set on", "what it does"], rows)
    )


def _empty() -> Any:
    import inspect

    return inspect.Parameter.empty


def _type_name(annotation: Any) -> str:
    text = str(annotation).replace("typing.", "")
    for prefix in ("<class '", "'>"):
        text = text.replace(prefix, "")
    return text.replace("pydantic.types.", "")


def serve_config() -> str:
    """Every field of ``ServeConfig``: YAML key, flag, type, default, description."""
    from pydantic_core import PydanticUndefined

    from geograph.serve.config import ServeConfig, parser

    flags = {a.dest: a for a in parser()._actions}
    flags["params"] = flags.pop("param")
    rows = []
    for key, field in ServeConfig.model_fields.items():
        action = flags.get(key)
        flag = ", ".join(f"`{f}{' ' + action.metavar if action.metavar else ''}`" for f in action.option_strings)
        if field.default_factory is not None:
            default = repr(field.default_factory())
        elif field.default is PydanticUndefined:
            default = "required"
        else:
            default = repr(field.default)
        bounds = [f"{op} {getattr(m, op)}" for m in field.metadata for op in ("ge", "gt", "le", "lt") if hasattr(m, op)]
        kind = _type_name(field.annotation) + (f" ({', '.join(bounds)})" if bounds else "")
        rows.append([f"`{key}` {flag}", kind, f"`{default}`", field.description or action.help or ""])
    return _table(["key and flag", "type", "default", "description"], rows)


#: The routes of the server that its OpenAPI document leaves out (FastAPI's own pages and
#: ``/metrics``), with what each answers. A route outside the document and missing here fails the build.
UNLISTED_ROUTES = {
    "/metrics": "Prometheus metrics in text format ([Metrics](#metrics))",
    "/openapi.json": "the OpenAPI document",
    "/docs": "the OpenAPI document as a page (Swagger UI)",
    "/docs/oauth2-redirect": "Swagger UI's OAuth2 redirect page",
    "/redoc": "the OpenAPI document as a page (ReDoc)",
}


def _routes(method: str, key: str | None) -> tuple[dict, list[tuple[str, list[str], bool]]]:
    """The OpenAPI document and the routes ``(path, verbs, in the document)`` of the FastAPI app
    that ``geograph serve --method METHOD`` builds over the demo corpus (nothing is started)."""
    import shutil

    from geograph.data import DEMO_PATH
    from geograph.serve.config import ServeConfig
    from geograph.serve.server import build_server

    server = build_server(ServeConfig(method=method, corpus=str(DEMO_PATH), api_key=key))
    try:
        spec = server.app.openapi()
        routes = []
        for r in server.app.router.routes:
            verbs = sorted(getattr(r, "methods", None) or ()) or ["GET"]
            verbs = [v for v in verbs if v != "HEAD"] or verbs
            routes.append((r.path, verbs, bool(getattr(r, "include_in_schema", True))))
    finally:
        directory = getattr(server, "reload_directory", None)
        if directory:  # the reload channel's folder (the server made one for its key)
            shutil.rmtree(directory, ignore_errors=True)
    return spec, routes


@cache
def _openapi() -> dict | None:
    """The servers the endpoints table describes: ``full`` (a reranker with an API key: every
    route), ``no_key`` (the same without a key) and ``retriever`` (a retriever without a key)."""
    try:
        from geograph.registry import RERANKERS, RETRIEVERS

        return {
            "full": _routes(RERANKERS[0], "docs-build"),
            "no_key": _routes(RERANKERS[0], None),
            "retriever": _routes(RETRIEVERS[0], None),
        }
    except ImportError:
        return None


def _bodies(schema: dict, components: dict) -> list[tuple[str, dict]]:
    """``(name, JSON schema)`` of each body a request schema accepts (a ``$ref``, or each
    alternative of a ``oneOf`` / ``anyOf``)."""
    if "$ref" in schema:
        name = schema["$ref"].rsplit("/", 1)[-1]
        return [(name, components[name])]
    for key in ("oneOf", "anyOf"):
        if key in schema:
            return [b for alt in schema[key] for b in _bodies(alt, components)]
    return [(schema.get("title", "body"), schema)]


def _names(fields: list[str]) -> str:
    return ", ".join(f"`{f}`" for f in fields) or "-"


def serve_endpoints() -> str:
    """Every route of the server: those of its OpenAPI document (summary, request bodies with
    their required and optional fields) and those the document leaves out, with which servers
    have each (every method, the rerankers, or only with an API key)."""
    servers = _openapi()
    if servers is None:  # without the serve extra: the request models
        from geograph.serve.schema import RerankRequest, RetrieveRequest

        rows = []
        for n, m in (("retrieve", RetrieveRequest), ("rerank", RerankRequest)):
            required = [k for k, f in m.model_fields.items() if f.is_required()]
            optional = [k for k in m.model_fields if k not in required]
            rows.append([f"POST `/{n}`", f"`{m.__name__}`", _names(required), _names(optional)])
        return _table(["route", "request body", "required fields", "optional fields"], rows)
    from geograph.registry import RERANKERS

    spec, routes = servers["full"]
    plain = {p for p, _, _ in servers["no_key"][1]}
    everywhere = {p for p, _, _ in servers["retriever"][1]}

    def served(path: str) -> str:
        if path in everywhere:
            return "every method"
        return ", ".join(RERANKERS) if path in plain else "with an API key"

    components = spec.get("components", {}).get("schemas", {})
    rows = []
    for path, ops in spec["paths"].items():
        for verb, op in ops.items():
            schema = op.get("requestBody", {}).get("content", {}).get("application/json", {}).get("schema")
            bodies = _bodies(schema, components) if schema else [("-", {})]
            for name, body in bodies:
                required = [k for k in body.get("properties", {}) if k in body.get("required", ())]
                optional = [k for k in body.get("properties", {}) if k not in required]
                shown = f"`{name}`" if name != "-" else "-"
                rows.append([f"{verb.upper()} `{path}`", served(path), op.get("summary", ""), shown,
                             _names(required), _names(optional)])  # fmt: skip
    for path, verbs, listed in routes:
        if listed:
            continue
        if path not in UNLISTED_ROUTES:
            raise ValueError(f"serve-endpoints: route {path} is not in the OpenAPI document nor in UNLISTED_ROUTES")
        rows.append([f"{' '.join(verbs)} `{path}`", served(path), UNLISTED_ROUTES[path], "-", "-", "-"])
    missing = {p for p, _, _ in routes} - {r[0].split("`")[1] for r in rows}
    if missing:
        raise ValueError(f"serve-endpoints: routes left out of the table: {sorted(missing)}")
    version = spec.get("info", {}).get("version", "")
    return (
        _table(["route", "served by", "summary", "request body", "required fields", "optional fields"], rows)
        + f"\nFrom the OpenAPI document (version {version}) and the routes of the app `geograph serve` builds "
        "over the demo corpus, for a reranker and a retriever, with and without an API key (the routes "
        "outside the document are FastAPI's pages of the document and `/metrics`).\n"
    )


GENERATORS = {
    "bench-results": (bench_results, None),
    "bench-method": (bench_method, None),
    "bench-scale": (bench_scale, BENCH),
    "bench-ray": (bench_ray, BENCH),
    "bench-serve": (bench_serve, BENCH),
    "method-params": (method_params, None),
    "serve-config": (serve_config, None),
    "serve-endpoints": (serve_endpoints, None),
}


def _before_autodoc(app) -> None:
    """Build the server's app and import the framework integrations before autodoc imports
    anything: pydantic models of FastAPI and LlamaIndex fail to build once autodoc has imported
    some modules in this process."""
    import importlib

    _openapi()
    for name in ("langchain", "llamaindex", "haystack"):
        try:
            importlib.import_module(f"geograph.integrations.{name}")
        except ImportError:
            pass


# --- cross-references to geograph objects by another path -------------------------------------


def _import(name: str) -> Any:
    """The object a dotted ``name`` names, or ``None``."""
    import importlib

    parts = name.split(".")
    for cut in range(len(parts), 0, -1):
        try:
            obj = importlib.import_module(".".join(parts[:cut]))
        except ImportError:
            continue
        try:
            for attr in parts[cut:]:
                obj = getattr(obj, attr)
        except AttributeError:
            return None
        return obj
    return None


def _candidates(target: str, module: str | None, classes: str | None) -> list[str]:
    """Absolute names ``target`` may mean where it is cited (a bare name: its module and class)."""
    import sys

    target = target.lstrip(".~")
    if target.startswith("geograph."):
        return [target]
    scopes = [f"{module}.{classes}" if module and classes else None, module, "geograph", "geograph.functional"]
    out = [f"{s}.{target}" for s in scopes if s]
    head = target.split(".")[0]
    out += [f"{m}.{target}" for m, mod in list(sys.modules.items()) if m.startswith("geograph") and hasattr(mod, head)]
    return out


def resolve_alias(app, env, node, contnode):
    """A reference to a geograph object under another path than the one it is documented at
    (the defining module instead of the package that re-exports it, or a bare name): link to the
    documented name, or render the name as code when the object exists but is not part of the
    public reference (a private helper, a module constant). A name that names nothing stays an
    unresolved reference, which the nitpicky build reports."""
    if node.get("refdomain") != "py":
        return None
    domain = env.get_domain("py")
    index = env.temp_data.setdefault("geograph_objects", {})
    if not index:
        for name, entry in domain.objects.items():
            if entry.aliased:
                continue
            obj = _import(name)
            if obj is not None and not isinstance(obj, (int, float, str, tuple, bool)):
                index.setdefault(id(obj), name)
    if node["reftype"] == "attr" and node.get("py:class") and "." not in node["reftarget"]:
        import inspect
        import re

        owner = _import(f"{node.get('py:module')}.{node['py:class']}")
        try:
            source = inspect.getsource(owner) if inspect.isclass(owner) else ""
        except (OSError, TypeError):
            source = ""
        if re.search(rf"self\.{node['reftarget']}\s*(:[^=]+)?=", source):
            return contnode  # an instance attribute the constructor sets
    for name in _candidates(node["reftarget"], node.get("py:module"), node.get("py:class")):
        obj = _import(name)
        if obj is None:
            continue
        documented = index.get(id(obj))
        if documented is not None and not isinstance(obj, (int, float, str, tuple, bool)):
            refnode = node.deepcopy()
            refnode["reftarget"] = documented
            refnode["refexplicit"] = True
            return domain.resolve_xref(env, node["refdoc"], app.builder, node["reftype"], documented, refnode, contnode)
        return contnode
    return None


def setup(app):  # pragma: no cover - called by Sphinx
    from docutils import nodes
    from docutils.statemachine import StringList
    from sphinx.util.docutils import SphinxDirective

    def make(name, func, folder):
        class Generated(SphinxDirective):
            optional_arguments = 1
            final_argument_whitespace = True

            def run(self):
                args = [self.arguments[0]] if self.arguments else []
                if folder is not None and args:
                    self.env.note_dependency(str(folder / args[0]))
                elif name.startswith("bench"):
                    self.env.note_dependency(str(BENCH / "results.json"))
                text = func(*args)
                container = nodes.container(classes=[f"geograph-{name}"])
                lines = StringList(text.splitlines(), source=f"<{name}>")
                self.state.nested_parse(lines, self.content_offset, container)
                return [container]

        Generated.__name__ = f"Generated_{name.replace('-', '_')}"
        return Generated

    for name, (func, folder) in GENERATORS.items():
        app.add_directive(name, make(name, func, folder))

    def changelog(app, docname, source):
        """The page ``changelog`` is the repository's ``CHANGELOG.md`` where there is one."""
        path = ROOT / "CHANGELOG.md"
        if docname != "changelog":
            return
        app.env.note_dependency(str(path))  # a missing file marks the page outdated: re-read each build
        if path.is_file():
            source[0] = path.read_text(encoding="utf-8")

    app.connect("source-read", changelog)
    # build the server's app before autodoc imports anything: FastAPI's models fail to build once
    # autodoc has imported some modules in this process
    app.connect("builder-inited", _before_autodoc)
    app.connect("missing-reference", resolve_alias)
    return {"parallel_read_safe": True, "parallel_write_safe": True}
