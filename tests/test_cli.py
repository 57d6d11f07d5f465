import argparse
import json
import re
from pathlib import Path

import pytest
import torch

from geograph.cli import main
from geograph.data import DEMO_PATH
from geograph.testing import has_package

DEMO = str(DEMO_PATH)


COMMANDS = ("demo", "bench", "build-graph", "update", "embed", "serve")


def test_help_lists_every_command_with_a_summary(capsys):
    assert main(["--help"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("usage: geograph ")
    for command in COMMANDS:  # the name, then its one-line summary on the same line
        assert re.search(rf"^\s+{command}\s+\w", out, re.M), (command, out)
    assert main([]) == 2 and "<command>" in capsys.readouterr().out  # no command: the help, status 2
    assert main(["nope"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "invalid choice: 'nope'" in err and "'serve'" in err


def test_version(capsys):
    from geograph._version import DISTRIBUTION, version

    for flag in ("--version", "-V"):
        assert main([flag]) == 0
        assert capsys.readouterr().out.strip() == f"geograph {version()} ({DISTRIBUTION})"


def test_bench_help_lists_its_subcommands(capsys):
    from geograph.bench.__main__ import BENCHES, benchmarks

    assert main(["bench", "--help"]) == 0
    out = capsys.readouterr().out
    assert all(re.search(rf"^\s+{name}\s+\w", out, re.M) for name in benchmarks()), out
    # the methods' own commands first (registry order), then the benchmarks of no one method
    listed = re.findall(r"^    (\w+)  ", out, re.M)
    assert listed == ["maniscope", "ricci", "iso", "g3", *BENCHES], listed
    assert main(["bench"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "required: <name>" in err and "geograph bench --help" in err
    assert main(["bench", "nosuch"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "invalid choice: 'nosuch'" in err and "'scale'" in err


@pytest.mark.parametrize("command", ["demo", "build-graph", "embed", "update", "serve"])
def test_help_is_plain_text(command, capsys):
    if command == "serve" and not has_package("litserve"):
        pytest.skip("serve extra not installed")
    assert main([command, "--help"]) == 0
    out = capsys.readouterr().out
    assert out.startswith(f"usage: geograph {command} ")
    assert "--corpus" in out if command == "serve" else "--data" in out
    for markup in ("``", ":class:", ":func:", ":meth:", ".. ", "\n::"):
        assert markup not in out, markup


def test_bench_lists_every_registered_method_with_a_command(capsys, caplog, monkeypatch):
    """A method's command comes from its spec (a copied folder's or a plugin's as well); a method
    without one is not listed, and one named like another benchmark is one warning line."""
    from dataclasses import replace

    from geograph import registry
    from geograph.bench import __main__ as bench

    table = dict(registry.METHODS)
    table["geodesic"] = replace(table["maniscope"], name="geodesic", bench_summary="a copied Maniscope's own command")
    table["quiet"] = replace(table["maniscope"], name="quiet", bench_command=None)
    table["serve"] = replace(table["ricci"], name="serve")
    monkeypatch.setattr(registry, "_table", table)
    monkeypatch.setattr(bench, "_warned", set())
    for _ in range(2):
        assert main(["bench", "--help"]) == 0
    out = capsys.readouterr().out
    assert re.search(r"^\s+geodesic\s+a copied Maniscope's own command$", out, re.M), out
    assert not re.search(r"^\s+quiet\s", out, re.M)
    assert re.search(rf"^\s+serve\s+{re.escape(bench.SUMMARIES['serve'][:40])}", out, re.M), out
    warnings = [r.getMessage() for r in caplog.records if r.name == "geograph.bench"]
    assert warnings == [
        "geograph: the bench command of method 'serve' (geograph.methods.ricci.module) is not listed: the name is taken"
    ]
    # it runs the command its spec names (relative to the method's package): here Maniscope's
    assert main(["bench", "geodesic", "--help"]) == 0
    assert capsys.readouterr().out.startswith("usage: geograph bench maniscope ")
    assert main(["bench", "geodesic", "--no-such-flag"]) == 2
    assert "unrecognized arguments: --no-such-flag" in capsys.readouterr().err
    assert bench.main(["nosuch"]) == 2  # python -m geograph.bench: the same list
    assert "unknown benchmark 'nosuch': maniscope, ricci, iso, g3, geodesic, run," in capsys.readouterr().err


def test_a_plugin_bench_command_needs_a_function_and_a_summary():
    from dataclasses import replace

    from geograph.registry import _invalid, get

    spec = replace(get("maniscope"), name="geodesic")
    assert _invalid(spec, {}) is None
    for bad in (replace(spec, bench_summary=""), replace(spec, bench_command=".command")):
        assert _invalid(bad, {}) == "method geodesic: bench_command must be 'module:function', with a bench_summary"


def test_bench_help_texts_are_plain_text(capsys, monkeypatch):
    from geograph.bench.__main__ import benchmarks

    def patched(*args, **kwargs):  # nothing may patch argparse for the whole process
        raise AssertionError("argparse.ArgumentParser.format_help was replaced")

    for name in benchmarks():
        assert main(["bench", name, "--help"]) == 0
        out = capsys.readouterr().out
        assert out.startswith("usage: geograph bench " + name), out[:200]
        for markup in ("``", ":class:", ":func:", ":meth:", "**", ".. math::"):
            assert markup not in out, (name, markup)
        assert argparse.ArgumentParser.format_help.__module__ == "argparse"
    monkeypatch.setattr(argparse.ArgumentParser, "format_help", patched)
    with pytest.raises(AssertionError, match="was replaced"):  # the check above sees a patch
        argparse.ArgumentParser(prog="x").format_help()


def test_import_and_help_stay_cheap():
    """``import geograph.cli`` imports no command; ``geograph --help`` and ``--version`` import the
    command modules but neither torch (``import torch`` alone takes seconds) nor the server's
    configuration (pydantic), a benchmark, Ray or sentence-transformers, and no geoopt (with
    scipy.optimize, over a second of every process's start) until a ball is made."""
    import subprocess
    import sys

    heavy = (
        "torch",
        "pydantic",
        "litserve",
        "sentence_transformers",
        "ray",
        "geoopt",
        "scipy.optimize",
        "geograph.serve.config",
        "geograph.bench.run",
    )
    code = (
        "import sys, geograph\n"
        "before = set(sys.modules)\n"
        "import geograph.cli\n"
        "print(sorted(m for m in set(sys.modules) - before if m.startswith('geograph')))\n"
        "import contextlib, io\n"
        "with contextlib.redirect_stdout(io.StringIO()):\n"
        "    assert geograph.cli.main(['--help']) == 0\n"
        "    assert geograph.cli.main(['--version']) == 0\n"
        f"print([m for m in {heavy!r} if m in sys.modules])\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300, check=True)
    imported, loaded = out.stdout.splitlines()
    assert imported == "['geograph.cli', 'geograph.console']", imported
    assert loaded == "[]", loaded


def test_the_servers_metrics_process_loads_no_torch():
    """LitServe's logger process (spawned) imports the main script (``geograph.cli``) and unpickles
    :class:`~geograph.serve.prometheus.PrometheusLogger`: neither may load torch, a method or the
    schema (a few seconds of CPU and about 200 MB for a process that counts requests)."""
    import subprocess
    import sys

    pytest.importorskip("litserve")
    pytest.importorskip("prometheus_client")
    code = (
        "import pickle, sys\n"
        "import geograph.cli\n"
        "from geograph.serve.prometheus import PrometheusLogger\n"
        "pickle.loads(pickle.dumps(PrometheusLogger()))\n"
        "print([m for m in ('torch', 'geograph.registry', 'geograph.serve.schema') if m in sys.modules])\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300, check=True)
    assert out.stdout.splitlines()[-1] == "[]", out.stdout


def test_method_choices_are_the_registry_and_the_docs(capsys):
    """``geograph serve --method`` offers every registered method, and docs/commands.md lists the same."""
    if not has_package("litserve"):
        pytest.skip("serve extra not installed")
    from geograph.registry import names

    assert main(["serve", "--help"]) == 0
    shown = re.search(r"--method \{([^}]*)\}", capsys.readouterr().out).group(1).split(",")
    assert sorted(shown) == sorted(names())
    docs = (Path(__file__).resolve().parents[1] / "docs" / "commands.md").read_text()
    listed = re.findall(r"geograph serve --method \{([^}]*)\}", docs)
    assert listed and all(sorted(x.split(",")) == sorted(names()) for x in listed), listed


def test_shipped_corpus_by_name_from_any_directory(tmp_path, monkeypatch):
    """``--data demo`` names the shipped corpus in every command that takes a corpus; a folder
    of that name in the working directory wins."""
    from geograph.commands import build_graph, demo, embed, update
    from geograph.data import corpus_path

    monkeypatch.chdir(tmp_path)
    argvs = {
        demo: ["--data", "demo"],
        build_graph: ["--data", "demo", "--knn", "3", "--out", "g"],
        embed: ["--data", "demo"],
        update: ["--data", "demo", "--graph", "g"],
    }
    for module, argv in argvs.items():
        assert module.build_parser().parse_args(argv).data == DEMO_PATH, module.__name__
    assert corpus_path("geograph/data/demo") == DEMO_PATH  # as the source tree's docs write it
    (tmp_path / "demo").mkdir()
    assert corpus_path("demo") == Path("demo")
    assert corpus_path("nowhere") == Path("nowhere")  # the caller's error names it


def _beir(root: Path, passages, queries=(("q1", "a question"),), qrels=(("q1", "d0"),)) -> str:
    (root / "qrels").mkdir(parents=True)
    (root / "corpus.jsonl").write_text(
        "".join(json.dumps({"_id": i, "title": t, "text": x}) + "\n" for i, t, x in passages)
    )
    (root / "queries.jsonl").write_text("".join(json.dumps({"_id": i, "text": x}) + "\n" for i, x in queries))
    (root / "qrels" / "test.tsv").write_text(
        "query-id\tcorpus-id\tscore\n" + "".join(f"{q}\t{d}\t1\n" for q, d in qrels)
    )
    return str(root)


@pytest.fixture
def no_embedding(monkeypatch):
    """Every mistake must be reported before anything is embedded."""
    from geograph.data import Encoder

    def fail(self, texts):
        raise AssertionError("embedded before validating the arguments")

    monkeypatch.setattr(Encoder, "encode", fail)


def _cases(tmp: Path):
    missing = str(tmp / "nowhere")
    not_beir = tmp / "plain"
    not_beir.mkdir()
    (not_beir / "notes.txt").write_text("hello")
    empty = tmp / "empty"
    empty.mkdir()
    (empty / "qrels").mkdir()
    (empty / "corpus.jsonl").write_text("")
    (empty / "queries.jsonl").write_text('{"_id": "q1", "text": "x"}\n')
    (empty / "qrels" / "test.tsv").write_text("query-id\tcorpus-id\tscore\n")
    unlinked = _beir(tmp / "unlinked", [("d0", "Alpha", "one"), ("d1", "Beta", "two")])
    g = ["--out", str(tmp / "g")]
    return [
        (["demo", "--data", missing], "--data", "no such folder"),
        (["demo", "--data", str(not_beir)], "--data", "not a BEIR folder"),
        (["demo", "--data", str(empty)], "--data", "no passages"),
        (["demo", "--data", DEMO, "--split", "dev"], "--split", "splits here: test"),
        (["demo", "--split", "train"], "--split", "only the split 'test'"),
        (["demo", "--k", "-3"], "--k", "got -3"),
        (["demo", "--k", "0"], "--k", "at least 1"),
        (["demo", "--k", "20"], "--k", "below --candidates (20)"),
        (["demo", "--candidates", "500"], "--candidates", "corpus size (111 passages)"),
        (["demo", "--candidates", "1"], "--candidates", "got 1"),
        (["demo", "--alpha", "2"], "--alpha", "[0, 1]"),
        (["demo", "--graph-k", "111"], "--graph-k", "below the corpus size"),
        (["demo", "--show", "-1"], "--show", "0 or more"),
        (["demo", "--k", "abc"], "--k", "invalid int value"),
        (["demo", "--bogus"], "--bogus", "unrecognized arguments"),
        (["build-graph", "--data", missing, "--knn", "3", *g], "--data", "no such folder"),
        (["build-graph", "--data", str(not_beir), "--knn", "3", *g], "--data", "no corpus.jsonl"),
        (["build-graph", "--data", str(empty), "--knn", "3", *g], "--data", "no passages"),
        (["build-graph", "--data", DEMO, "--split", "dev", "--knn", "3", *g], "--split", "no qrels/dev.tsv"),
        (["build-graph", "--data", DEMO, "--knn", "0", *g], "--knn", "at least 1"),
        (["build-graph", "--data", DEMO, "--knn", "-3", *g], "--knn", "got -3"),
        (["build-graph", "--data", DEMO, "--knn", "111", *g], "--knn", "below the number of passages (111)"),
        (["build-graph", "--data", DEMO, "--knn", "5000", *g], "--knn", "got 5000"),
        (["build-graph", "--data", unlinked, "--mentions", *g], "--mentions", "use --knn K"),
        (["build-graph", "--data", DEMO, *g], "--knn", "one of the arguments --knn --mentions --g3 is required"),
        (
            ["build-graph", "--data", DEMO, "--knn", "3", "--index", "ivf", "--nlist", "4", "--nprobe", "9", *g],
            "--nprobe",
            "exceeds nlist=4",
        ),
        (
            ["build-graph", "--data", DEMO, "--knn", "3", "--index", "ivf", "--nlist", "200", *g],
            "--nlist",
            "exceeds the number of passages (111)",
        ),
        (
            [
                "build-graph",
                "--data",
                DEMO,
                "--knn",
                "3",
                "--index",
                "ivf",
                "--nlist",
                "2",
                "--nprobe",
                "2",
                "--sample",
                "20",
                *g,
            ],
            "--sample",
            "too small",
        ),
        (["build-graph", "--data", DEMO, "--knn", "3", "--nlist", "2", *g], "--nlist", "apply to --index ivf"),
        (
            ["build-graph", "--data", DEMO, "--knn", "3", "--index", "ivf", "--recall-target", "1.5", *g],
            "--recall-target",
            "must be in (0, 1], got 1.5",
        ),
        (["build-graph", "--data", DEMO, "--mentions", "--index", "ivf", *g], "--index", "not --mentions"),
        (
            ["build-graph", "--data", DEMO, "--g3", "--candidates", "8", "--max-degree", "16", *g],
            "--candidates",
            "at least --max-degree",
        ),
        (["build-graph", "--data", DEMO, "--knn", "3", "--candidates", "8", *g], "--candidates", "apply to --g3"),
        (["build-graph", "--data", DEMO, "--knn", "3", "--out", str(not_beir / "notes.txt")], "--out", "is a file"),
        *(  # without the serve extra, `geograph serve` says which extra it needs (tested in test_packaging)
            [
                (["serve", "--port", "abc"], "port: ", "invalid int value: 'abc'"),
                (["serve", "--max-batch-texts", "x"], "max_batch_texts: ", "invalid int value"),
                (["serve", "--method", "nope"], "--method", "invalid choice: 'nope'"),
            ]
            if has_package("litserve")
            else []
        ),
        *[(["bench", name, "--no-such-flag"], "--no-such-flag", "unrecognized arguments") for name in _bench_names()],
    ]


def _bench_names():
    from geograph.bench.__main__ import benchmarks

    return list(benchmarks())


def test_every_mistake_is_one_line_naming_the_argument(tmp_path, capsys, no_embedding):
    for argv, arg, text in _cases(tmp_path):
        try:
            rc = main(argv)
        except SystemExit as exc:  # argparse's own errors exit through our one-line parser
            rc = exc.code
        out = capsys.readouterr()
        assert rc == 2, (argv, out)
        lines = out.err.splitlines()
        assert len(lines) == 1, (argv, out.err)
        assert arg in lines[0] and text in lines[0], (argv, lines[0])
        assert "Traceback" not in out.err and out.out == "", argv


@pytest.mark.skipif(not has_package("sentence_transformers"), reason="text extra not installed")
def test_build_graph_g3_with_ivf_saves_a_loadable_g3graph(tmp_path, capsys):
    from geograph.graphs import G3Graph

    out = out_dir = tmp_path / "g3"
    argv = [
        "build-graph",
        "--data",
        DEMO,
        "--g3",
        "--max-degree",
        "8",
        "--index",
        "ivf",
        "--nlist",
        "2",
        "--nprobe",
        "2",
        "--candidates",
        "40",
        "--cache",
        str(tmp_path / "c"),
        "--out",
        str(out),
    ]
    assert main(argv) == 0
    graph = G3Graph.load(out)
    assert graph.num_nodes == 111 and graph.max_degree == 8
    # every cell meets every cell (nprobe = nlist): the graph equals the exact build
    exact = G3Graph.build(graph.embeddings, max_degree=8)
    assert torch.equal(graph.col, exact.col) and torch.allclose(graph.val, exact.val, atol=1e-6)
    out = capsys.readouterr().out.splitlines()
    assert graph.build_info["index"] == "ivf" and out[0].startswith("built a G3 graph (max degree 8, ")
    assert out[1].startswith("index: ivf, nprobe 2, recall ") and out[2].startswith(f"saved to {out_dir}: 3 files, ")


@pytest.mark.skipif(not has_package("sentence_transformers"), reason="text extra not installed")
@pytest.mark.parametrize("kind", [["--knn", "3"], ["--mentions", "--json"]])
def test_build_graph_saves_a_loadable_graph(tmp_path, capsys, monkeypatch, kind):
    """From a directory that holds no corpus, ``--data demo`` builds over the shipped corpus; the
    command says what it built in lines, or as JSON with ``--json``."""
    from geograph import CorpusGraph

    monkeypatch.chdir(tmp_path)
    assert main(["build-graph", "--data", "demo", *kind, "--cache", "c", "--out", "graph"]) == 0
    graph = CorpusGraph.load(tmp_path / "graph")
    out = capsys.readouterr().out
    assert graph.num_nodes == 111
    if kind[0] == "--knn":
        assert (graph.degree() >= 3).all()
        lines = out.splitlines()
        assert lines[0].startswith("built a k-NN graph (k = 3) over 111 passages (384-dimensional ")
        assert lines[0].endswith(f": {graph.num_edges} edges") and lines[1] == "index: exact"
        assert re.fullmatch(r"saved to graph: 3 files, \d+\.\d kB", lines[2]), lines[2]
        assert re.fullmatch(r"took \S+ s: embedding \S+ s, graph \S+ s, saving \S+ s", lines[3]), lines[3]
        assert "{" not in out  # no Python dict
    else:
        built = json.loads(out)
        assert (built["kind"], built["name"], built["passages"], built["edges"]) == (
            "CorpusGraph",
            "mentions",
            111,
            graph.num_edges,
        )
        assert built["bytes"] == sum(p.stat().st_size for p in (tmp_path / "graph").iterdir())
        # every bridge question's first passage links to the passage titled by its entity
        ids = [json.loads(line)["_id"] for line in (DEMO_PATH / "corpus.jsonl").read_text().splitlines()]
        edges = set(map(tuple, graph.edge_index.T.tolist()))
        for n in range(1, 31):
            assert (ids.index(f"hop-{n:02d}a"), ids.index(f"hop-{n:02d}b")) in edges
