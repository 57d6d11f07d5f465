"""Configuration of ``geograph serve``: a YAML file (``--config``) and flags that override it.

Every key of the file is a field of :class:`ServeConfig` (the flag of the same name, with
``-`` for ``_``); method parameters go under ``params`` (or ``--param KEY=VALUE``, the value
read as YAML). Unknown keys and bad values raise :class:`ConfigError` with one line naming the
key, which the CLI prints before exiting with status 2. See ``configs/serve.yaml``.
"""

from __future__ import annotations

import argparse
import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, SecretStr, ValidationError, field_validator, model_validator

from geograph.console import make_parser
from geograph.serve.models import METHODS, check_params

#: The environment variable read for the API key when neither the flag nor the file sets it.
API_KEY_ENV = "GEOGRAPH_API_KEY"


#: ``max_candidates: auto`` per method (else :data:`DEFAULT_MAX_CANDIDATES`): Ricci-Filtration's work grows
#: with about the fourth power of the candidates (docs/guide/serving-limits.md), 100 took seconds
AUTO_MAX_CANDIDATES = {"ricci": 100}
DEFAULT_MAX_CANDIDATES = 1000


class ConfigError(ValueError):
    """A configuration error: one line, naming the key."""


class ServeConfig(BaseModel):
    """Everything ``geograph serve`` can be told (defaults as shown)."""

    model_config = ConfigDict(extra="forbid")

    method: Literal[METHODS]  # type: ignore[valid-type]  # every registered method
    corpus: str = Field(description="BEIR-format folder (corpus.jsonl)")
    params: dict[str, Any] = Field(default_factory=dict, description="the method's constructor arguments")
    graph: str | None = Field(None, description="saved CorpusGraph (iso) or G3Graph (g3) directory")
    projection: str | None = Field(None, description="saved PoincareProjection directory (iso)")
    encoder: str | None = Field(None, description="local sentence-transformers directory (default: MiniLM)")
    query_prefix: str = ""
    passage_prefix: str = ""
    cache: str | None = Field(None, description="on-disk embedding cache root for the corpus")
    text_cache_size: int = Field(4096, ge=0, description="in-memory LRU of request text embeddings, per worker")
    host: Literal["127.0.0.1", "0.0.0.0", "::"] = "127.0.0.1"
    port: int = Field(8000, ge=1, le=65535)
    max_batch_size: int = Field(64, ge=1)
    max_batch_texts: int = Field(
        64,
        ge=1,
        description="a batch takes no more requests once their texts (queries and "
        "candidates to encode) reach this many",
    )
    batch_timeout: float = Field(0.01, ge=0, description="seconds a batch waits to fill")
    candidates: int = Field(20, ge=1, description="default dense pool of /retrieve (maniscope, ricci)")
    max_candidates: int | Literal["auto"] = Field(
        "auto",
        description="largest candidate list of /rerank (and /v1, /v2) and dense pool of /retrieve "
        f"(auto: {', '.join(f'{m} {n}' for m, n in AUTO_MAX_CANDIDATES.items())}, else {DEFAULT_MAX_CANDIDATES})",
    )
    max_batch_candidates: int = Field(
        4096,
        ge=1,
        description="a batch takes no more requests once its padded size (requests x the largest "
        "candidate count) would exceed this; a request above it gets 422",
    )
    max_text_chars: int = Field(
        20000,
        ge=1,
        description="request texts (query, candidates, documents) are cut to this many characters "
        "before tokenization, then to the encoder's max_seq_length tokens",
    )
    max_k: int = Field(1000, ge=1)
    max_payload_mb: float = Field(10.0, gt=0)
    request_timeout: float = Field(60.0, gt=0, description="seconds from a request's arrival to its answer; then 504")
    accelerator: Literal["auto", "cpu", "cuda", "gpu", "mps"] = "auto"
    devices: int | Literal["auto"] = "auto"
    workers_per_device: int | Literal["auto"] = Field(
        "auto",
        description="inference workers per device, one pool for every endpoint (auto: on the CPU one "
        "per usable CPU, at most 4; on GPUs 1)",
    )
    threads: int | Literal["auto"] = Field(
        "auto",
        description="torch intra-op threads of each inference worker "
        "on the CPU (auto: the usable CPUs divided among the workers)",
    )
    api_servers: int = Field(1, ge=1)
    shutdown_timeout: float = Field(5.0, gt=0, description="seconds in-flight requests get on SIGTERM/SIGINT")
    reload_timeout: float = Field(
        300.0,
        gt=0,
        description="seconds POST /admin/reload waits for every worker to load the saved version, then 503",
    )
    log_level: Literal["critical", "error", "warning", "info", "debug"] = "warning"
    api_key: SecretStr | None = Field(
        None, description="require Authorization: Bearer <key> (default $GEOGRAPH_API_KEY)"
    )
    public: list[Literal["metrics", "docs"]] = Field(
        default_factory=list, description="endpoint groups open without the key"
    )

    @model_validator(mode="after")
    def _auto_max_candidates(self):
        if self.max_candidates == "auto":
            self.max_candidates = AUTO_MAX_CANDIDATES.get(self.method, DEFAULT_MAX_CANDIDATES)
        return self

    @field_validator("threads", "workers_per_device", "max_candidates")
    @classmethod
    def _threads(cls, v: int | str) -> int | str:
        if isinstance(v, int) and v < 1:
            raise ValueError(f"must be a positive integer or 'auto', got {v}")
        return v

    @field_validator("api_key")
    @classmethod
    def _api_key(cls, v: SecretStr | None) -> SecretStr | None:
        if v is not None and not v.get_secret_value().strip():
            raise ValueError("must not be empty")
        return v

    @field_validator("corpus")
    @classmethod
    def _corpus(cls, v: str) -> str:
        if not (Path(v) / "corpus.jsonl").is_file():
            raise ValueError(f"{v} is not a BEIR-format folder (no corpus.jsonl)")
        return v

    @field_validator("graph")
    @classmethod
    def _graph(cls, v: str | None) -> str | None:
        if v is not None and not Path(v).is_dir():
            raise ValueError(f"{v} is not a directory")
        return v

    @field_validator("projection")
    @classmethod
    def _projection(cls, v: str | None) -> str | None:
        if v is not None and not Path(v).exists():
            raise ValueError(f"{v}: no such directory or file")
        return v

    @field_validator("encoder")
    @classmethod
    def _encoder(cls, v: str | None) -> str | None:
        if v is not None and not Path(v).is_dir():
            raise ValueError(f"{v} is not a local sentence-transformers directory")
        return v


def parser() -> argparse.ArgumentParser:
    """The ``geograph serve`` argument parser (every default comes from :class:`ServeConfig`)."""
    from geograph.serve import __doc__ as doc

    p = make_parser("geograph serve", doc, argument_default=argparse.SUPPRESS)
    p.add_argument("--config", help="YAML file with any of the keys below (flags override it)")
    p.add_argument("--method", choices=METHODS)
    p.add_argument("--corpus", help="BEIR-format folder (corpus.jsonl)")
    p.add_argument("--param", action="append", metavar="KEY=VALUE", help="a method parameter (repeatable)")
    p.add_argument("--graph", help="saved CorpusGraph (iso) / G3Graph (g3) directory, instead of building one")
    p.add_argument("--projection", help="trained PoincareProjection directory (iso)")
    p.add_argument("--encoder", help="local sentence-transformers directory (default: all-MiniLM-L6-v2)")
    p.add_argument("--query-prefix")
    p.add_argument("--passage-prefix")
    p.add_argument("--cache", help="embedding cache root for the corpus (default $GEOGRAPH_CACHE)")
    p.add_argument("--text-cache-size", type=int, help="in-memory LRU of request texts per worker (4096)")
    p.add_argument("--host", help="127.0.0.1 (default), 0.0.0.0 or ::")
    p.add_argument("--port", type=int, help="8000")
    p.add_argument("--max-batch-size", type=int, help="64")
    p.add_argument(
        "--max-batch-texts",
        type=int,
        help="a batch takes no more requests once their texts to encode reach this many (64)",
    )
    p.add_argument("--batch-timeout", type=float, help="seconds a batch waits to fill (0.01)")
    p.add_argument("--candidates", type=int, help="default dense pool of /retrieve for maniscope, ricci (20)")
    p.add_argument(
        "--max-candidates",
        help="largest candidate list of /rerank and dense pool of /retrieve, or auto (ricci 100, else 1000)",
    )
    p.add_argument(
        "--max-batch-candidates",
        type=int,
        help="largest padded batch, requests x their largest candidate count (4096)",
    )
    p.add_argument(
        "--max-text-chars", type=int, help="request texts cut to this many characters before tokenization (20000)"
    )
    p.add_argument("--max-k", type=int, help="largest k (1000)")
    p.add_argument("--max-payload-mb", type=float, help="largest request body (10)")
    p.add_argument(
        "--request-timeout",
        "--timeout",
        type=float,
        dest="request_timeout",
        help="seconds from a request's arrival to its answer, then 504 (60; --timeout: the old name)",
    )
    p.add_argument("--accelerator", help="auto, cpu, cuda, gpu, mps")
    p.add_argument("--devices", help="number of devices or auto")
    p.add_argument(
        "--workers-per-device",
        help="inference workers per device (one pool serves every endpoint), or auto "
        "(on the CPU one per usable CPU, at most 4; on GPUs 1)",
    )
    p.add_argument(
        "--threads", help="torch threads per inference worker on the CPU, or auto (the CPUs divided among the workers)"
    )
    p.add_argument("--api-servers", type=int, help="uvicorn API server processes (1)")
    p.add_argument("--shutdown-timeout", type=float, help="seconds in-flight requests get on SIGTERM (5)")
    p.add_argument(
        "--reload-timeout", type=float, help="seconds POST /admin/reload waits for the workers to load, then 503 (300)"
    )
    p.add_argument("--log-level", help="warning")
    p.add_argument(
        "--api-key",
        help=f"require 'Authorization: Bearer KEY' on every endpoint but /health "
        f"(default ${API_KEY_ENV}; prefer the variable: a flag shows in ps)",
    )
    p.add_argument(
        "--public",
        action="append",
        metavar="GROUP",
        help="metrics or docs: keep /metrics or /docs open without the key (repeatable)",
    )
    return p


def _line(e: ValidationError) -> str:
    err = e.errors()[0]
    loc = ".".join(str(x) for x in err.get("loc", ())) or "config"
    msg = str(err.get("msg", "")).removeprefix("Value error, ")
    if err.get("type") == "extra_forbidden":
        msg = "unknown key"
    return f"{loc}: {msg}"


def load_config(argv: Sequence[str] | None = None) -> ServeConfig:
    """Parse flags, read ``--config``, merge (flags win) and validate.

    Raises:
        ConfigError: one line naming the bad key.
    """
    import yaml

    args = vars(parser().parse_args(argv))
    values: dict[str, Any] = {}
    path = args.pop("config", None)
    if path is not None:
        try:
            text = Path(path).read_text()
        except OSError as e:
            raise ConfigError(f"--config {path}: {e.strerror or e}") from None
        try:
            loaded = yaml.safe_load(text)
        except yaml.YAMLError as e:
            raise ConfigError(f"--config {path}: not valid YAML ({str(e).splitlines()[0]})") from None
        if loaded is None:
            loaded = {}
        if not isinstance(loaded, dict):
            raise ConfigError(f"--config {path}: expected a mapping of keys, got {type(loaded).__name__}")
        values.update(loaded)
    params = dict(values.get("params") or {}) if isinstance(values.get("params", {}), dict) else values["params"]
    for item in args.pop("param", []) or []:
        key, sep, raw = item.partition("=")
        if not sep or not key:
            raise ConfigError(f"--param {item!r}: expected KEY=VALUE")
        try:
            params[key.strip()] = yaml.safe_load(raw)
        except yaml.YAMLError:
            raise ConfigError(f"--param {item!r}: the value is not valid YAML") from None
    if params or "params" in values:
        values["params"] = params
    for name in ("threads", "workers_per_device", "max_candidates"):
        if name in args and args[name] != "auto":
            try:
                args[name] = int(args[name])
            except ValueError:
                raise ConfigError(f"{name}: expected a positive integer or 'auto', got {args[name]!r}") from None
    if "devices" in args and args["devices"] != "auto":
        try:
            args["devices"] = int(args["devices"])
        except ValueError:
            raise ConfigError(f"devices: expected an integer or 'auto', got {args['devices']!r}") from None
    if "timeout" in values:  # the old name of request_timeout in a config file
        if "request_timeout" in values:
            raise ConfigError("timeout: the old name of request_timeout; give only request_timeout")
        values["request_timeout"] = values.pop("timeout")
    values.update(args)
    if values.get("api_key") is None and os.environ.get(API_KEY_ENV):
        values["api_key"] = os.environ[API_KEY_ENV]
    for required in ("method", "corpus"):
        if required not in values:
            raise ConfigError(f"{required}: missing (give --{required} or put it in --config)")
    try:
        cfg = ServeConfig(**values)
    except ValidationError as e:
        raise ConfigError(_line(e)) from None
    try:
        check_params(cfg.method, cfg.params, graph=cfg.graph, projection=cfg.projection)
    except ValueError as e:
        raise ConfigError(str(e)) from None
    return cfg
