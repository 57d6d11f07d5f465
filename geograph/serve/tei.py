"""``POST /rerank`` in two dialects: geograph's own and text-embeddings-inference's (TEI).

The path is shared with TEI (and Infinity, vLLM), so TEI's rerank clients (Haystack's
``HuggingFaceTEIRanker``, LlamaIndex's TEI postprocessor, the ``rerankers`` TEI provider) can point
at ``geograph serve``. The body says which dialect it is:

* with ``texts``: TEI's, ``{"query", "texts", "return_text", "raw_scores", "truncate",
  "truncation_direction"}`` (:class:`TEIRerankRequest`), answered in TEI's shape, a JSON list
  ``[{"index": 2, "score": 0.91, "text": "..."}, ...]`` sorted by score, best first
  (:class:`TEIRank`; ``text`` only with ``return_text``);
* otherwise geograph's (``candidates``, ``candidate_embeddings`` or ``candidate_ids``;
  :class:`~geograph.serve.schema.RerankRequest`), answered with
  :class:`~geograph.serve.schema.RerankResponse`.

A TEI request becomes the native request ``{"query", "candidates": texts}`` and joins the same
queue, batches, metrics and limits (``texts`` counts against ``--max-candidates``). ``score`` is
the method's score mapped linearly from its range onto [0, 1], the ``relevance_score`` of
``/v1`` and ``/v2/rerank`` (``raw_scores: true``: the method's raw score, as
:func:`geograph.serve.models.score_bounds` bounds it). Ricci-Filtration's dropped texts are left
out of the list, as TEI has no place for them. Texts are always cut to the encoder's maximum
sequence length, keeping their start (TEI's ``truncate: true`` with ``truncation_direction:
"Right"``); ``truncate: true`` with ``"Left"`` is a 422, since keeping the end is not offered.
Errors of a TEI body are 422 with the native API's detail.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Annotated, Any, Literal, Self, Union, cast

from pydantic import BaseModel, ConfigDict, Discriminator, Field, Tag, model_validator

from geograph.serve.schema import RerankRequest, RerankResponse, count_limit

if TYPE_CHECKING:
    from fastapi import FastAPI
    from fastapi.routing import APIRoute

#: the tags of ``/rerank``'s two dialects (a validation error's location names one after ``body``)
DIALECTS = ("geograph", "tei")


class TEIRerankRequest(BaseModel):
    """text-embeddings-inference's ``POST /rerank`` body."""

    model_config = ConfigDict(extra="forbid")

    query: str = Field(min_length=1, max_length=10000)
    texts: list[str] = Field(min_length=1, description="the candidate texts")
    return_text: bool = Field(False, description="each result carries its text")
    raw_scores: bool = Field(False, description="the method's raw score instead of the [0, 1] one")
    truncate: bool | None = Field(None, description="accepted; texts are always cut at the encoder's limit")
    truncation_direction: Literal["Left", "Right", "left", "right"] = Field(
        "Right", description="Right (keep the start) only, when truncate is true"
    )

    @model_validator(mode="after")
    def _validate(self) -> Self:
        over = count_limit(len(self.texts))
        if over is not None:
            raise ValueError(f"texts has {len(self.texts)} entries; at most {over[0]} per request ({over[1]})")
        for i, t in enumerate(self.texts):
            if not t:
                raise ValueError(f"texts[{i}] is empty")
        if self.truncate and self.truncation_direction.lower() == "left":
            raise ValueError(
                "truncation_direction: Left is not supported; texts are cut at the end (Right) to the encoder's limit"
            )
        return self

    def native(self) -> RerankRequest:
        """The native request for the same query and texts."""
        return RerankRequest(query=self.query, candidates=list(self.texts))


class TEIRank(BaseModel):
    """One item of TEI's rerank answer."""

    index: int = Field(description="position in texts")
    score: float = Field(description="the score mapped onto [0, 1] (raw_scores: the method's own)")
    text: str | None = Field(None, description="with return_text: the text")


def dialect(body: Any) -> str:
    """``"tei"`` for a body with ``texts``, else ``"geograph"`` (whose errors then say what is wrong).

    Example:
        >>> dialect({"query": "q", "texts": ["a"]}), dialect({"query": "q", "candidates": ["a"]}), dialect([1])
        ('tei', 'geograph', 'geograph')
    """
    if isinstance(body, TEIRerankRequest) or (isinstance(body, dict) and "texts" in body):
        return "tei"
    return "geograph"


#: ``/rerank``'s body: either dialect, told apart by :func:`dialect`
RerankBody = Annotated[
    Union[Annotated[RerankRequest, Tag("geograph")], Annotated[TEIRerankRequest, Tag("tei")]],  # noqa: UP007
    Discriminator(dialect),
]


def tei_answer(req: TEIRerankRequest, out: dict[str, Any], bounds: tuple[float, float]) -> list[dict[str, Any]]:
    """TEI's answer for the native answer ``out`` (``order``, ``scores``; best first).

    Example:
        >>> req = TEIRerankRequest(query="q", texts=["a", "b"], return_text=True)
        >>> tei_answer(req, {"order": [1, 0], "scores": [0.5, -0.5]}, (-1.0, 1.0))
        [{'index': 1, 'score': 0.75, 'text': 'b'}, {'index': 0, 'score': 0.25, 'text': 'a'}]
    """
    from geograph.serve.interop import relevance_score

    lo, hi = bounds
    items = []
    for j, s in zip(out["order"], out["scores"]):
        item: dict[str, Any] = {"index": int(j), "score": float(s) if req.raw_scores else relevance_score(s, lo, hi)}
        if req.return_text:
            item["text"] = req.texts[j]
        items.append(item)
    return sorted(items, key=lambda x: -x["score"])  # stable: the method's order among ties


def add_tei_dialect(app: FastAPI, *, bounds: tuple[float, float]) -> None:
    """Replace the native ``POST /rerank`` route of ``app`` with one that takes either dialect
    (:data:`RerankBody`) and hands both to the native route's handler (the one queue)."""
    route = cast(  # LitServe registers POST /rerank as an APIRoute
        "APIRoute | None",
        next(
            (
                r
                for r in app.router.routes
                if getattr(r, "path", None) == "/rerank" and "POST" in getattr(r, "methods", ())
            ),
            None,
        ),
    )
    if route is None:
        raise RuntimeError("the /rerank endpoint must be registered before its TEI dialect")
    native = route.endpoint
    app.router.routes.remove(route)

    # the return annotation is FastAPI's response model: it validates the answers
    async def rerank(body: RerankBody) -> Union[RerankResponse, list[TEIRank]]:  # noqa: UP007
        if isinstance(body, TEIRerankRequest):
            return tei_answer(body, await native(body.native()), bounds)  # type: ignore[return-value]
        return await native(body)  # type: ignore[no-any-return]

    app.add_api_route(
        "/rerank",
        rerank,
        methods=["POST"],
        dependencies=route.dependencies,
        response_model_exclude_none=True,
        summary="Rerank (geograph's body, or TEI's with texts)",
    )
