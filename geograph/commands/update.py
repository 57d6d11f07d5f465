"""geograph update: apply a changed BEIR folder to a saved graph (added, removed and edited passages)."""

from __future__ import annotations

import argparse
import contextlib
import os
import secrets
import shutil
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

from geograph.commands import checked_encoder_options
from geograph.console import UsageError, add_command, add_encoder_options, command_parser
from geograph.data import corpus_path

if TYPE_CHECKING:
    from torch import nn

    from geograph.data import Encoder
    from geograph.graphs import CorpusGraph, G3Graph
    from geograph.methods.dense.module import DenseRetriever
    from geograph.methods.iso.module import ISORetriever

    Updatable = CorpusGraph | G3Graph | DenseRetriever
    Changeable = Updatable | ISORetriever  # what takes an add / remove

PROG = "geograph update"
SUMMARY = "apply a changed corpus (added, removed, edited passages) to a saved graph or dense index, in place"

DESCRIPTION = """\
Apply the passages of a changed BEIR-format folder (only corpus.jsonl is read) to a graph saved
by geograph build-graph (a k-NN CorpusGraph or a G3Graph), in place of a rebuild. --graph may also
be a DenseRetriever saved with its passages (save_pretrained(dir, ids=..., text_keys=...)): its
corpus is updated (an IVF index keeps its trained cells and takes the new vectors).

The saved graph lists each passage's id and the hash of the text it embedded (passages.jsonl).
A passage whose id is new is added; one whose id is gone is removed; one whose text
(title + " " + text, the passage prefix included) hashes differently is edited: removed, then
added with its new text. Only the added and edited passages are embedded, with --encoder and
--passage-prefix (which must be the graph's: another encoder is refused) through the embedding
cache (--cache), as build-graph embeds. The updated graph is put in the passages' order in
corpus.jsonl, so it is the graph build-graph gives on the changed folder (k-NN: the same
edges; G3: the same edges, values within float rounding; an exact DenseRetriever: the same
corpus), and geograph serve --corpus DIR --graph OUT accepts it. A graph's manifest's corpus
version is one more for each removal and addition applied (an edit counts both).

--projection DIR (a PoincareProjection saved by python -m geograph.train fit: ISO-RAG's f_theta, same
encoder) updates a k-NN graph served with it: the update runs through ISO-RAG, so the new passages
are projected with f_theta before they enter the graph (a projection that fails on them is refused
and nothing is written), and the line printed gives the share of edges ISO-RAG prunes on the
updated graph (at its default beta). The projection itself does not depend on the passages: it is
not changed, and geograph serve --graph OUT --projection DIR serves the result.

The result is written to a new folder beside --out (default: --graph itself), which is then
swapped into place (one atomic step on Linux): an update interrupted at any point leaves the
graph it started from. Nothing to apply prints "no change" and writes nothing."""


def build_parser() -> argparse.ArgumentParser:
    """The parser of ``geograph update`` on its own (:func:`register` adds it to ``geograph``)."""
    return command_parser(PROG, DESCRIPTION, add_arguments)


def register(commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add ``update`` to the ``geograph`` command's subcommands."""
    add_command(commands, "update", SUMMARY, DESCRIPTION, add_arguments, run)


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--data",
        required=True,
        type=corpus_path,
        metavar="PATH",
        help="the changed corpus: a folder with corpus.jsonl (BEIR layout), a JSONL file of passages, "
        "or a shipped corpus by name (demo)",
    )
    p.add_argument(
        "--graph",
        required=True,
        metavar="DIR",
        help="the graph saved by geograph build-graph, or a DenseRetriever saved with its passages",
    )
    p.add_argument("--out", metavar="DIR", help="folder to write the updated graph to (default: --graph)")
    p.add_argument(
        "--projection",
        metavar="DIR",
        help="ISO-RAG's f_theta (a saved PoincareProjection) served with the k-NN graph: new passages are "
        "projected with it before they enter the graph",
    )
    p.add_argument(
        "--cache", metavar="DIR", help="embedding cache folder (default: $GEOGRAPH_CACHE or ~/.cache/geograph)"
    )
    add_encoder_options(p)


@dataclass(frozen=True)
class Change:
    """What a changed corpus does to a saved one: ids removed, edited and added (in file order)."""

    removed: list[str]
    edited: list[str]
    added: list[str]

    def __bool__(self) -> bool:
        return bool(self.removed or self.edited or self.added)

    def describe(self) -> str:
        return f"{len(self.added)} added, {len(self.removed)} removed, {len(self.edited)} edited"


def diff(old_ids: Sequence[str], old_keys: Sequence[str], new_ids: Sequence[str], new_keys: Sequence[str]) -> Change:
    """The :class:`Change` from the saved passages to the new ones (ids with their text keys).

    Example:
        >>> diff(["a", "b", "c"], ["1", "2", "3"], ["c", "a", "d"], ["3", "9", "4"])
        Change(removed=['b'], edited=['a'], added=['d'])
    """
    old = dict(zip(old_ids, old_keys))
    new = set(new_ids)
    return Change(
        removed=[i for i in old_ids if i not in new],
        edited=[i for i, k in zip(new_ids, new_keys) if i in old and old[i] != k],
        added=[i for i in new_ids if i not in old],
    )


def rebuild_command(graph: str | Path, data: str | Path) -> str:
    """One line: the ``geograph build-graph`` command that builds the saved graph again from ``data``
    (its kind and parameters read from its manifest; the encoder options are the ones given)."""
    from geograph._io import read_json

    params: dict[str, Any] = {}
    kind = None
    try:
        manifest = read_json(Path(graph) / "manifest.json")
        params, kind = dict(manifest.get("params") or {}), manifest.get("kind")
    except (OSError, ValueError):
        pass
    name = str(params.get("name", ""))
    if kind == "G3Graph" or "max_degree" in params:
        what = f"--g3 --max-degree {params.get('max_degree', 128)} --beta {params.get('beta', 0.4)}"
    elif name.startswith("knn") and name[3:].isdigit():
        what = f"--knn {name[3:]}"
    elif name == "mentions":
        what = "--mentions"
    else:
        what = "--knn K"
    return f"build it again with: geograph build-graph --data {data} {what} --out {graph} (and your --encoder options)"


def main(argv: Sequence[str] | None = None) -> int:
    """Run ``geograph update`` with ``argv``; the exit status."""
    return run(build_parser().parse_args(argv))


def run(args: argparse.Namespace) -> int:
    """Apply the changed corpus to the saved graph as the parsed arguments say; the exit status."""
    from geograph.artefacts import ArtefactMismatch
    from geograph.artefacts.format import saved_kind
    from geograph.artefacts.saved_graphs import read_passages
    from geograph.commands.build_graph import passage_keys
    from geograph.data import BEIRError, Encoder, load_corpus

    out = Path(args.out if args.out is not None else args.graph)
    try:
        if not Path(args.data).exists():
            raise UsageError(f"--data: {args.data}: no such folder or file")
        try:
            dataset = load_corpus(args.data)
        except BEIRError as e:
            raise UsageError(f"--data: {e}") from None
        seen: set[str] = set()
        for i in dataset.doc_ids:
            if i in seen:
                raise UsageError(f"--data: passage id {i!r} appears twice in {args.data}")
            seen.add(i)
        if not Path(args.graph).is_dir():
            what = "is a file, not a graph's folder" if Path(args.graph).exists() else "no such folder"
            raise UsageError(f"--graph: {args.graph}: {what}")
        kind = saved_kind(args.graph)
        if kind not in ("CorpusGraph", "G3Graph", "DenseRetriever"):
            what = "holds no readable manifest.json" if kind is None else f"is a saved {kind}"
            raise UsageError(
                f"--graph: {args.graph} {what}, not a graph saved by geograph build-graph or a saved DenseRetriever"
            )
        hint = DENSE_HINT if kind == "DenseRetriever" else rebuild_command(args.graph, args.data)
        try:
            old_ids, saved_keys = read_passages(args.graph)
        except ValueError as e:
            raise UsageError(f"--graph: {str(e).split(';')[0]}; {hint}") from None
        old_keys = [k for k in saved_keys if k is not None]
        if len(old_keys) != len(saved_keys):
            raise UsageError(
                f"--graph: {args.graph} was saved without its passages' text keys, so edits cannot be told; {hint}"
            )
        if out.is_file():
            raise UsageError(f"--out: {out} is a file; give a folder to write the graph into")
        if out.is_dir() and saved_kind(out) is None and any(out.iterdir()):  # replaced whole: only a graph
            raise UsageError(f"--out: {out} is a folder that holds no saved graph; give a new folder or a graph")
        if args.projection is not None:
            if not Path(args.projection).is_dir():
                raise UsageError(f"--projection: {args.projection}: no such folder")
            if kind != "CorpusGraph":
                raise UsageError(f"--projection: applies to a k-NN graph (ISO-RAG's), not a saved {kind}")
        options = checked_encoder_options(args)
    except UsageError as e:
        return e.exit(PROG)

    from geograph.graphs import CorpusGraph, G3Graph
    from geograph.methods.dense.module import DenseRetriever

    encoder = Encoder(cache=args.cache, **options)
    try:
        graph: Updatable
        if kind == "DenseRetriever":
            graph = DenseRetriever.from_pretrained(args.graph, encoder=encoder)
        else:
            graph = (CorpusGraph if kind == "CorpusGraph" else G3Graph).from_pretrained(args.graph, encoder=encoder)
    except ArtefactMismatch as e:  # another encoder, prefixes or format
        return UsageError(f"--encoder: {e}").exit(PROG)
    except ValueError as e:
        return UsageError(f"--graph: {e}").exit(PROG)
    projection = None
    if args.projection is not None:
        from geograph.projection import PoincareProjection

        try:
            projection = PoincareProjection.from_pretrained(
                args.projection, encoder=encoder, in_dim=int(graph.embeddings.shape[1])
            )
        except (ArtefactMismatch, ValueError) as e:
            return UsageError(f"--projection: {e}").exit(PROG)
    texts = [encoder.passage_prefix + p for p in dataset.passages()]  # as build-graph embeds them
    keys = passage_keys(encoder, dataset)
    change = diff(old_ids, old_keys, dataset.doc_ids, keys)
    if not change:
        print(f"no change: {args.graph} already holds the passages of {args.data}{_version(graph)}")
        return 0
    if projection is not None and not (isinstance(graph, CorpusGraph) and graph.name.startswith("knn")):
        return UsageError(f"--projection: {args.graph} is a {graph.name!r} graph, not a k-NN graph").exit(PROG)
    if (change.added or change.edited) and isinstance(graph, CorpusGraph) and not graph.name.startswith("knn"):
        return UsageError(
            f"--graph: {args.graph} is a {graph.name!r} graph, which cannot take new or edited passages; "
            "build it again with geograph build-graph"
        ).exit(PROG)
    t0 = time.perf_counter()
    iso = ""
    try:
        if projection is not None:
            retriever = apply_projected(
                cast("CorpusGraph", graph), projection, old_ids, dataset.doc_ids, texts, change, encoder
            )
            graph = retriever.graph
            pruned = f"{retriever.pruned_share:.1%} of its edges (beta={retriever.beta})"
            iso = f"; ISO-RAG with f_theta {args.projection} prunes {pruned}"
        else:
            graph = apply(graph, old_ids, dataset.doc_ids, texts, change, encoder)
    except ValueError as e:  # a graph that cannot take the change (a mentions graph, too few passages left)
        if projection is not None and "projection" in str(e):  # f_theta failed on the new passages
            return UsageError(f"--projection: {args.projection}: {e}").exit(PROG)
        return UsageError(f"--graph: {args.graph}: {e}").exit(PROG)
    except KeyboardInterrupt:
        print(f"interrupted: nothing was written; {out} is unchanged", file=sys.stderr)
        return 130
    seconds = time.perf_counter() - t0
    try:
        write(graph, out, encoder=encoder, ids=dataset.doc_ids, text_keys=keys)
    except KeyboardInterrupt:
        print(f"interrupted: {out} is unchanged", file=sys.stderr)
        return 130
    print(f"{change.describe()} in {seconds:.1f} s: {graph} -> {out}{_version(graph)}{iso}")
    return 0


#: how to make a saved DenseRetriever that ``geograph update`` can take (one line)
DENSE_HINT = (
    "save it again with DenseRetriever.save_pretrained(dir, encoder=..., ids=..., text_keys=...) "
    "(text_keys: geograph.data.cache.text_key of each passage's embedded text, its prefix included)"
)


def _version(model: Updatable) -> str:
    """`` (corpus version N)`` for a graph, nothing for a retriever (which does not count its updates)."""
    version = getattr(model, "corpus_version", None)
    return "" if version is None else f" (corpus version {version})"


def apply(
    graph: Updatable,
    old_ids: Sequence[str],
    new_ids: Sequence[str],
    texts: Sequence[str],
    change: Change,
    encoder: Encoder,
) -> Updatable:
    """``graph`` (a graph or a :class:`~geograph.DenseRetriever`, over ``old_ids``) updated to
    ``new_ids`` in their order: the removed and edited passages removed, the added and edited ones
    embedded (``texts``: every new passage's embedded text) and added, then the rows put in the
    order of ``new_ids``."""
    import torch

    from geograph.graphs.updates import reorder
    from geograph.methods.dense.module import DenseRetriever
    from geograph.methods.dense.updates import dense_reorder

    graph.set_ids(list(old_ids))
    order = torch.tensor(_change(graph, graph, new_ids, texts, change, encoder), dtype=torch.long)
    if isinstance(graph, DenseRetriever):
        dense_reorder(graph, order)
    else:
        reorder(graph, order)
    return graph


def apply_projected(
    graph: CorpusGraph,
    projection: nn.Module,
    old_ids: Sequence[str],
    new_ids: Sequence[str],
    texts: Sequence[str],
    change: Change,
    encoder: Encoder,
) -> ISORetriever:
    """:func:`apply` on a k-NN ``graph`` through an :class:`~geograph.ISORetriever` with
    ``projection`` (f_theta): the new passages are projected before they enter the graph, ``phi``
    is recomputed where it can change, and the retriever (its graph updated, in the order of
    ``new_ids``) is what one built on the final graph with the same projection is."""
    from geograph.methods.iso.module import ISORetriever
    from geograph.methods.iso.updates import iso_reorder

    graph.set_ids(list(old_ids))
    model = ISORetriever(graph, projection=projection)
    iso_reorder(model, _change(model, graph, new_ids, texts, change, encoder))
    return model


def _change(
    target: Changeable,
    graph: Updatable,
    new_ids: Sequence[str],
    texts: Sequence[str],
    change: Change,
    encoder: Encoder,
) -> list[int]:
    """Apply ``change`` through ``target`` (``graph`` itself, or a model over it): the removed and
    edited passages removed, the added and edited ones embedded (``texts``, in file order) and
    added; the row of each of ``new_ids`` in the updated ``graph``."""
    gone = change.removed + change.edited
    if gone:
        target.remove(gone)
    fresh = set(change.added) | set(change.edited)
    todo = [(i, t) for i, t in zip(new_ids, texts) if i in fresh]  # in file order
    if todo:
        emb = encoder.encode([t for _, t in todo]).to(graph.embeddings.device, graph.embeddings.dtype)
        target.add(emb, [i for i, _ in todo])
    known = graph.passage_ids
    assert known is not None  # (the ids were set before the change)
    row = {i: r for r, i in enumerate(known.ids)}
    return [row[i] for i in new_ids]


def write(graph: Updatable, out: Path, **save: Any) -> None:
    """Save ``graph`` into a new folder beside ``out``, then put it in ``out``'s place
    (:func:`geograph._io.replace_directory`); the new folder is removed on any failure."""
    from geograph._io import replace_directory

    out = out.resolve()  # a symlinked graph: the folder it points to is replaced, the link stays
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_name(f".{out.name}.update-{os.getpid()}.{secrets.token_hex(4)}")
    try:
        graph.save_pretrained(tmp, **save)
        replace_directory(tmp, out)
    except BaseException:
        with contextlib.suppress(OSError):
            shutil.rmtree(tmp)
        raise
