"""Configuration of ``geograph serve``: flags, environment variables, a YAML file, defaults.

Every setting is a field of :class:`ServeConfig`, and each field is, with nothing written twice:

* a flag of the same name with ``-`` for ``_`` (``max_batch_size``: ``--max-batch-size``),
  generated from the field's type, choices, default and description (:func:`add_arguments`);
* an environment variable ``GEOGRAPH_`` + the name in capitals (``GEOGRAPH_MAX_BATCH_SIZE``),
  read with the flag's parser; an empty variable counts as unset (:func:`from_environment`);
* a key of the YAML file that ``--config`` (or ``$GEOGRAPH_CONFIG``) names: a path, or a config
  shipped with geograph by name (``--config serve``, :func:`geograph.configs.resolve`).

A flag beats its variable, a variable beats the file, the file beats the default. Method
parameters go under ``params`` (``--param KEY=VALUE`` with the value read as YAML, repeatable;
``GEOGRAPH_PARAMS`` a YAML mapping) and merge key by key in the same order. ``corpus`` takes a
BEIR-format folder or a shipped corpus's name (``demo``, :func:`geograph.data.corpus_path`).
Unknown keys and bad values raise :class:`ConfigError` with one line naming the key (or the
variable it came from), which the CLI prints before exiting with status 2.
"""

from __future__ import annotations

import argparse
import os
import types
import typing
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, SecretStr, ValidationError, field_validator, model_validator
from pydantic.fields import FieldInfo

from geograph import registry
from geograph.console import command_parser
from geograph.data import SHIPPED_CORPORA, corpus_path
from geograph.serve.models import METHODS, check_params

#: The prefix of every setting's environment variable (``GEOGRAPH_PORT`` for ``port``).
ENV_PREFIX = "GEOGRAPH_"
#: The environment variable read for the config file when ``--config`` is not given.
CONFIG_ENV = ENV_PREFIX + "CONFIG"
#: The environment variable of the API key, the one to prefer (a flag shows in ``ps``).
API_KEY_ENV = ENV_PREFIX + "API_KEY"


#: ``max_candidates: auto`` per method (else :data:`DEFAULT_MAX_CANDIDATES`): the registry entries'
#: ``max_candidates``, set by a method whose work grows fast with the candidates
AUTO_MAX_CANDIDATES = {s.name: s.max_candidates for s in registry.METHODS.values() if s.max_candidates is not None}
DEFAULT_MAX_CANDIDATES = 1000
#: the saved artefacts a configuration may name, per method that takes them (the field descriptions)
_GRAPHS = " or ".join(f"{s.graph.__name__} ({s.name})" for s in registry.METHODS.values() if s.graph is not None)
_PROJECTIONS = ", ".join(s.name for s in registry.METHODS.values() if s.projection)


class ConfigError(ValueError):
    """A configuration error: one line, naming the key."""


class ServeConfig(BaseModel):
    """Everything ``geograph serve`` can be told (defaults as shown)."""

    model_config = ConfigDict(extra="forbid")

    method: Literal[METHODS] = Field(  # type: ignore[valid-type]  # every registered method
        description="the method served (the rerankers also serve /rerank, /v1 and /v2/rerank)"
    )
    corpus: str = Field(
        description="BEIR-format folder (corpus.jsonl), or a shipped corpus by name: " + ", ".join(SHIPPED_CORPORA)
    )
    params: dict[str, Any] = Field(default_factory=dict, description="the method's constructor arguments")
    graph: str | None = Field(None, description=f"saved {_GRAPHS} directory")
    projection: str | None = Field(None, description=f"saved PoincareProjection directory ({_PROJECTIONS})")
    encoder: str | None = Field(
        None,
        description="local sentence-transformers directory, or a hub id (ORG/NAME) fetched when online or read from "
        "the local Hugging Face cache (default: the shipped all-MiniLM-L6-v2)",
    )
    encoder_backend: Literal["torch", "onnx", "onnx-int8"] = Field(
        "torch",
        description="the encoder's runtime: torch, onnx (ONNX Runtime, exported locally on first use) or "
        "onnx-int8 (that export, dynamically quantised); the onnx ones need the 'onnx' extra",
    )
    query_prefix: str = Field("", description="prepended to query texts (e5: 'query: ')")
    passage_prefix: str = Field("", description="prepended to passage and candidate texts (e5: 'passage: ')")
    cache: str | None = Field(
        None, description="on-disk embedding cache root for the corpus (default: ~/.cache/geograph)"
    )
    text_cache_size: int = Field(4096, ge=0, description="in-memory LRU of request text embeddings, per worker")
    host: Literal["127.0.0.1", "0.0.0.0", "::"] = Field(
        "127.0.0.1", description="address to listen on (beyond this machine: set an API key)"
    )
    port: int = Field(8000, ge=1, le=65535, description="TCP port to listen on")
    max_batch_size: int = Field(64, ge=1, description="most requests in one batch")
    max_batch_texts: int = Field(
        64,
        ge=1,
        description="a batch takes no more requests once their texts (queries and "
        "candidates to encode) reach this many",
    )
    max_batch_tokens: int = Field(
        8192,
        ge=1,
        description="a batch takes no request that would bring its padded tokens to encode over this "
        "(a request over it alone runs alone)",
    )
    batch_timeout: float = Field(0.01, ge=0, description="seconds a batch waits to fill")
    candidates: int = Field(20, ge=1, description=f"default dense pool of /retrieve ({', '.join(registry.RERANKERS)})")
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
    max_k: int = Field(1000, ge=1, description="largest k of /retrieve")
    max_payload_mb: float = Field(10.0, gt=0, description="largest request body, in MB")
    request_timeout: float = Field(60.0, gt=0, description="seconds from a request's arrival to its answer; then 504")
    accelerator: Literal["auto", "cpu", "cuda", "gpu", "mps"] = Field("auto", description="where the workers run")
    devices: int | Literal["auto"] = Field("auto", description="number of devices, or auto")
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
    api_servers: int = Field(1, ge=1, description="uvicorn API server processes")
    shutdown_timeout: float = Field(5.0, gt=0, description="seconds in-flight requests get on SIGTERM/SIGINT")
    reload_timeout: float = Field(
        300.0,
        gt=0,
        description="seconds POST /admin/reload waits for every worker to load the saved version, then 503",
    )
    log_level: Literal["critical", "error", "warning", "info", "debug"] = Field(
        "warning", description="the server's log level"
    )
    api_key: SecretStr | None = Field(
        None,
        description="require Authorization: Bearer KEY on every endpoint but /health "
        "(prefer $GEOGRAPH_API_KEY: a flag shows in ps)",
    )
    public: list[Literal["metrics", "docs"]] = Field(
        default_factory=list, description="endpoint groups open without the key"
    )

    @model_validator(mode="after")
    def _auto_max_candidates(self) -> ServeConfig:
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
        path = corpus_path(v)
        if not (path / "corpus.jsonl").is_file():
            shipped = ", ".join(SHIPPED_CORPORA)
            raise ValueError(f"{v} is not a BEIR-format folder (no corpus.jsonl) nor a shipped corpus ({shipped})")
        return str(path)

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
        if v is None or Path(v).is_dir():
            return v
        if v.startswith((".", "/", "~")) or v.count("/") != 1:  # a path, not an ORG/NAME hub id
            raise ValueError(f"{v} is not a local sentence-transformers directory")
        from geograph.data.cache import EncoderUnavailable, check_model

        try:
            check_model(v, probe=True)  # offline and not cached, no network, no such model: one line now
        except EncoderUnavailable as e:
            raise ValueError(str(e)) from None
        return v


# -- flags and environment variables, generated from the fields ------------------------------------

#: flags other than ``--name-of-the-field`` (``--timeout``: the old name of ``--request-timeout``)
_FLAGS = {"params": ("--param",), "request_timeout": ("--request-timeout", "--timeout")}
#: what a flag's value is called in the help (else ``N``, ``X`` or ``TEXT`` by the field's type)
_METAVARS = {
    "corpus": "DIR|NAME",
    "params": "KEY=VALUE",
    "graph": "DIR",
    "projection": "PATH",
    "encoder": "DIR|ORG/NAME",
    "cache": "DIR",
    "api_key": "KEY",
    "public": "GROUP",
}


@dataclass(frozen=True)
class Setting:
    """One field of :class:`ServeConfig` as a flag and an environment variable.

    Attributes:
        name: the field (the key of the config file).
        flags: its flags (``--max-batch-size``).
        env: its environment variable (``GEOGRAPH_MAX_BATCH_SIZE``).
        parse: a flag's or variable's text to the value (``None``: the text itself); raises
            ``ValueError`` with a message that names no key.
        choices: the accepted values of a text or list field (``None``: any).
        many: a list: the flag repeats, the variable separates its values with commas.
        metavar, help: as the help shows them.
    """

    name: str
    flags: tuple[str, ...]
    env: str
    parse: Callable[[str], Any] | None
    choices: tuple[str, ...] | None
    many: bool
    metavar: str | None
    help: str

    @property
    def dest(self) -> str:
        """The attribute of the parsed flags (``param`` for ``params``: one ``KEY=VALUE`` a flag)."""
        return "param" if self.name == "params" else self.name

    def from_text(self, text: str) -> Any:
        """The value of an environment variable's ``text`` (``ValueError``: one line, no key)."""
        if self.name == "params":
            import yaml

            try:
                value = yaml.safe_load(text)
            except yaml.YAMLError:
                value = None
            if not isinstance(value, dict):
                raise ValueError(f"expected a YAML mapping of the method's parameters (e.g. '{{k: 5}}'), got {text!r}")
            return value
        if self.many:
            return [self.read(word.strip()) for word in text.split(",") if word.strip()]
        return self.read(text)

    def read(self, text: str) -> Any:
        """The value of one text: a flag's, a variable's, or one item of a list variable's
        (``ValueError``: one line, no key)."""
        value = self.parse(text) if self.parse is not None else text
        if self.choices is not None and value not in self.choices:
            raise ValueError(f"invalid choice: {text!r} (choose from {', '.join(map(repr, self.choices))})")
        return value


def _number(kind: type) -> Callable[[str], Any]:
    def parse(text: str) -> Any:
        try:
            return kind(text)
        except ValueError:
            raise ValueError(f"invalid {kind.__name__} value: {text!r}") from None

    return parse


def _int_or(words: tuple[str, ...]) -> Callable[[str], Any]:
    def parse(text: str) -> Any:
        if text in words:
            return text
        try:
            return int(text)
        except ValueError:
            raise ValueError(f"expected a positive integer or {' or '.join(map(repr, words))}, got {text!r}") from None

    return parse


def _shape(annotation: Any) -> tuple[Callable[[str], Any] | None, tuple[str, ...] | None, bool, str | None]:
    """``(parse, choices, many, metavar)`` of a field's type: ``int``, ``float``, ``str``,
    :class:`~pydantic.SecretStr`, a ``Literal`` of strings, ``int | Literal[...]``, a list of
    one of these, each optionally ``| None``."""
    origin, args = typing.get_origin(annotation), typing.get_args(annotation)
    if origin in (typing.Union, types.UnionType):
        rest = [a for a in args if a is not type(None)]
        words = tuple(w for a in rest if typing.get_origin(a) is Literal for w in typing.get_args(a))
        if int in rest and words:
            return _int_or(words), None, False, f"N|{'|'.join(words)}"
        if len(rest) == 1:
            return _shape(rest[0])
    if origin is Literal:
        return None, tuple(str(a) for a in args), False, None
    if origin is list:
        parse, choices, _, metavar = _shape(args[0])
        return parse, choices, True, metavar
    if annotation in (int, float):
        return _number(annotation), None, False, "N" if annotation is int else "X"
    if annotation in (str, SecretStr):
        return None, None, False, "TEXT"
    raise TypeError(f"ServeConfig: no flag for the type {annotation!r}")  # pragma: no cover - a new field's type


def _default(field: FieldInfo) -> Any:
    """The default the help shows (``None``: nothing to show)."""
    from pydantic_core import PydanticUndefined

    value = field.default_factory() if field.default_factory is not None else field.default  # type: ignore[call-arg]
    return None if value is PydanticUndefined or value in (None, "", [], {}) else value


def settings() -> list[Setting]:
    """Every field of :class:`ServeConfig` as a :class:`Setting`, in the model's order."""
    out = []
    for name, field in ServeConfig.model_fields.items():
        env = ENV_PREFIX + name.upper()
        if name == "params":
            parse, choices, many, metavar = None, None, True, None
            text = "a method parameter, the value read as YAML (repeatable)"
        else:
            parse, choices, many, metavar = _shape(field.annotation)
            text = field.description or ""
        default = _default(field)
        if default is not None:
            text += f" (default: {default})"
        if many and name != "params":
            text += " (repeatable; the variable: comma-separated)"
        flags = _FLAGS.get(name, (f"--{name.replace('_', '-')}",))
        metavar = _METAVARS.get(name, metavar if choices is None else None)
        if choices is not None and metavar is not None:  # the help names what the metavar hides
            text += f" (one of: {', '.join(choices)})"
        out.append(Setting(name, flags, env, parse, choices, many, metavar, f"{text} [env: {env}]".strip()))
    return out


def add_arguments(p: argparse.ArgumentParser) -> None:
    """Add ``--config`` and a flag for every field of :class:`ServeConfig` to ``p``. A flag keeps
    its text (:func:`from_flags` reads it as :func:`from_environment` reads a variable); an
    unset flag leaves no attribute, so that the variables, the file and the defaults stay in charge."""
    p.epilog = (
        "Every setting is also an environment variable GEOGRAPH_<NAME> (shown as [env: ...];\n"
        "an empty one counts as unset) and a key of the --config file. A flag beats its\n"
        "variable, a variable beats the file, the file beats the default."
    )
    p.add_argument(
        "--config",
        metavar="FILE|NAME",
        default=argparse.SUPPRESS,
        help=f"YAML file with any of the keys below, or a shipped config by name: serve [env: {CONFIG_ENV}]",
    )
    for s in settings():
        kwargs: dict[str, Any] = dict(dest=s.dest, default=argparse.SUPPRESS, metavar=s.metavar, help=s.help)
        if s.choices is not None:
            kwargs["choices"] = s.choices
        p.add_argument(*s.flags, action="append" if s.many else "store", **kwargs)


def parser() -> argparse.ArgumentParser:
    """The ``geograph serve`` argument parser, generated from :class:`ServeConfig` (:func:`add_arguments`)."""
    from geograph.serve.cli import DESCRIPTION, PROG

    return command_parser(PROG, DESCRIPTION, add_arguments)


def from_environment(environ: Mapping[str, str] | None = None) -> dict[str, Any]:
    """The settings that ``GEOGRAPH_<NAME>`` variables of ``environ`` (default: ``os.environ``) give,
    parsed as their flags are (``GEOGRAPH_PUBLIC``: comma-separated; ``GEOGRAPH_PARAMS``: a YAML
    mapping). An empty variable counts as unset.

    Raises:
        ConfigError: a value that does not parse, naming the variable.

    Example:
        >>> from_environment({"GEOGRAPH_PORT": "9000", "GEOGRAPH_PUBLIC": "metrics,docs", "GEOGRAPH_HOST": ""})
        {'port': 9000, 'public': ['metrics', 'docs']}
    """
    environ = os.environ if environ is None else environ
    out = {}
    for s in settings():
        text = environ.get(s.env)
        if not text:
            continue
        try:
            out[s.name] = s.from_text(text)
        except ValueError as e:
            raise ConfigError(f"{s.env}: {e}") from None
    return out


def from_flags(args: argparse.Namespace) -> dict[str, Any]:
    """The settings that the flags of ``args`` (parsed by :func:`add_arguments`) give, read as
    their variables are (:meth:`Setting.from_text`); ``params``: the ``--param KEY=VALUE`` texts.

    Raises:
        ConfigError: a value that does not parse, naming the key (as the model's errors do).

    Example:
        >>> from_flags(parser().parse_args(["--port", "9000", "--public", "docs", "--threads", "auto"]))
        {'port': 9000, 'threads': 'auto', 'public': ['docs']}
    """
    flags = vars(args)
    out = {}
    for s in settings():
        if s.dest not in flags:
            continue
        texts = flags[s.dest]
        try:
            if s.name == "params":
                out[s.name] = texts
            elif s.many:
                out[s.name] = [s.read(text) for text in texts]
            else:
                out[s.name] = s.read(texts)
        except ValueError as e:
            raise ConfigError(f"{s.name}: {e}") from None
    return out


def _line(e: ValidationError, origin: Mapping[str, str]) -> str:
    err = e.errors()[0]
    loc = [str(x) for x in err.get("loc", ())]
    where = ".".join(loc) or "config"
    if loc and origin.get(loc[0], loc[0]) != loc[0]:  # from an environment variable: name it
        where = origin[loc[0]]
    msg = str(err.get("msg", "")).removeprefix("Value error, ")
    if err.get("type") == "extra_forbidden":
        msg = "unknown key"
    return f"{where}: {msg}"


def _read_file(value: str, label: str) -> dict[str, Any]:
    """The mapping of the config file ``value`` names (a path, or a shipped config's name)."""
    import yaml

    from geograph import configs

    try:
        path = configs.resolve(value)
    except ValueError as e:
        raise ConfigError(str(e).replace("--config", label, 1)) from None
    try:
        text = path.read_text()
    except OSError as e:
        raise ConfigError(f"{label} {value}: {e.strerror or e}") from None
    try:
        loaded = yaml.safe_load(text)
    except yaml.YAMLError as e:
        raise ConfigError(f"{label} {value}: not valid YAML ({str(e).splitlines()[0]})") from None
    if loaded is None:
        loaded = {}
    if not isinstance(loaded, dict):
        raise ConfigError(f"{label} {value}: expected a mapping of keys, got {type(loaded).__name__}")
    if "timeout" in loaded:  # the old name of request_timeout in a config file
        if "request_timeout" in loaded:
            raise ConfigError("timeout: the old name of request_timeout; give only request_timeout")
        loaded["request_timeout"] = loaded.pop("timeout")
    return loaded


def _flag_params(items: Sequence[str]) -> dict[str, Any]:
    import yaml

    params: dict[str, Any] = {}
    for item in items:
        key, sep, raw = item.partition("=")
        if not sep or not key:
            raise ConfigError(f"--param {item!r}: expected KEY=VALUE")
        try:
            params[key.strip()] = yaml.safe_load(raw)
        except yaml.YAMLError:
            raise ConfigError(f"--param {item!r}: the value is not valid YAML") from None
    return params


def config_from_args(args: argparse.Namespace, environ: Mapping[str, str] | None = None) -> ServeConfig:
    """The :class:`ServeConfig` of parsed flags (:func:`add_arguments`), the ``GEOGRAPH_*`` variables
    of ``environ`` (default: ``os.environ``) and the config file: a flag beats its variable, a
    variable beats the file, the file beats the default; ``params`` merge key by key in that order.

    Raises:
        ConfigError: one line naming the bad key or the variable it came from.
    """
    environ = os.environ if environ is None else environ
    flags = vars(args)
    given = from_flags(args)
    origin: dict[str, str] = {}
    values: dict[str, Any] = {}
    config, label = flags.get("config"), "--config"
    if config is None and environ.get(CONFIG_ENV):
        config, label = environ[CONFIG_ENV], CONFIG_ENV
    if config is not None:
        values = _read_file(config, label)
        origin = {k: k for k in values}
    env = from_environment(environ)
    in_file, in_env, in_flags = (
        values.pop("params", None),
        env.pop("params", None),
        _flag_params(given.pop("params", [])),
    )
    if in_file is not None and not isinstance(in_file, dict):
        values["params"] = in_file  # for the model to name
    elif in_file is not None or in_env is not None or in_flags:
        values["params"] = {**(in_file or {}), **(in_env or {}), **in_flags}
    for key, value in env.items():
        values[key], origin[key] = value, ENV_PREFIX + key.upper()
    for key, value in given.items():
        values[key], origin[key] = value, key
    for required in ("method", "corpus"):
        if required not in values:
            raise ConfigError(
                f"{required}: missing (give --{required}, set {ENV_PREFIX}{required.upper()} or put it in --config)"
            )
    try:
        cfg = ServeConfig(**values)
    except ValidationError as e:
        raise ConfigError(_line(e, origin)) from None
    try:
        check_params(cfg.method, cfg.params, graph=cfg.graph, projection=cfg.projection)
    except ValueError as e:
        raise ConfigError(str(e)) from None
    return cfg


def load_config(argv: Sequence[str] | None = None, environ: Mapping[str, str] | None = None) -> ServeConfig:
    """Parse the flags ``argv``, read the ``GEOGRAPH_*`` variables of ``environ`` (default:
    ``os.environ``) and the ``--config`` file, merge and validate (:func:`config_from_args`).

    Raises:
        ConfigError: one line naming the bad key or the variable it came from.
    """
    return config_from_args(parser().parse_args(argv), environ)
