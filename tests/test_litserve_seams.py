"""The LitServe internals ``geograph serve`` overrides or reads (:mod:`geograph.serve._litserve`) still
have the shape its code relies on: each private name exists with the parameter names used, the
overrides keep the upstream signatures, and no other module of the server touches a private name.

Fast, no server starts: a LitServer is constructed (its routes registered) but never run. Tested
on LitServe 0.2.19 (the serve extra's range, ``>=0.2.19,<0.3``); an upgrade that renames, removes
or re-signs one of these fails here instead of in a running server.
"""

import asyncio
import inspect
import queue
import re
import time
from pathlib import Path
from types import SimpleNamespace

import pytest

from conftest import require

require("litserve")

import litserve as ls  # noqa: E402
from litserve.loops import base as loops_base  # noqa: E402
from litserve.loops.simple_loops import BatchedLoop  # noqa: E402
from litserve.server import RegularRequestHandler  # noqa: E402
from litserve.transport.process_transport import MPQueueTransport  # noqa: E402

from geograph.serve import _litserve as seams  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]

#: (owner, name) -> the parameter names geograph's code relies on: the methods it overrides and the
#: private ones it calls (every private one, and the public methods of the classes it subclasses
#: whose protocol its overrides follow)
METHODS = {
    (ls.LitServer, "_register_api_endpoints"): ["self", "lit_api", "request_type", "response_type"],
    (ls.LitServer, "_start_worker_monitoring"): ["self", "manager", "uvicorn_workers"],
    (ls.LitServer, "_init_manager"): ["self", "num_api_servers"],
    (ls.LitServer, "_perform_graceful_shutdown"): ["self", "manager", "uvicorn_workers", "shutdown_reason"],
    (ls.LitServer, "_register_spec_endpoints"): ["self", "lit_api"],
    (ls.LitServer, "_inference_workers_config_for_api"): ["self", "api_path"],
    (ls.LitServer, "setup_auth"): ["self", "lit_api"],
    (RegularRequestHandler, "__init__"): ["self", "lit_api", "server"],
    (RegularRequestHandler, "_submit_request"): ["self", "payload"],
    (RegularRequestHandler, "handle_request"): ["self", "request", "request_type"],
    (BatchedLoop, "get_batch_requests"): ["self", "lit_api", "request_queue", "transport"],
    (BatchedLoop, "put_response"): [
        "self",
        "transport",
        "response_queue_id",
        "uid",
        "response_data",
        "status",
        "response_type",
    ],
    (MPQueueTransport, "areceive"): ["self", "consumer_id", "timeout", "block"],
    (MPQueueTransport, "__reduce__"): ["self"],
    (ls.LitAPI, "log"): ["self", "key", "value"],
    (ls.LitAPI, "set_logger_queue"): ["self", "queue"],
}

#: every private LitServe name geograph reads, calls or overrides (attributes and module names included)
PRIVATE = sorted(
    {name for _, name in METHODS if name.startswith("_") and not name.startswith("__")}
    | {"_callback_runner", "_logger_queue", "_SENTINEL_VALUE", "_StopLoopError", "_get_request_queue"}
    | {"_transport", "_queues", "_closed"}
)

#: geograph's subclasses of LitServe classes whose overrides are recorded in METHODS
SUBCLASSES = [seams.GeoLitServer, seams.ForgetfulHandler, seams.WaitingBatchedLoop, seams.ThreadedReceiveTransport]


def _params(fn) -> list[str]:
    return list(inspect.signature(fn).parameters)


def test_the_installed_litserve_is_in_the_tested_range_and_the_extra_pins_it():
    from packaging.specifiers import SpecifierSet
    from packaging.version import Version

    assert Version(ls.__version__) in SpecifierSet(seams.TESTED_RANGE), (
        f"LitServe {ls.__version__} is outside {seams.TESTED_RANGE}: check geograph/serve/_litserve.py's "
        "overrides against it, then widen TESTED_RANGE and the serve extra"
    )
    # a requirement's version specifier (not the module pattern of the mypy settings)
    pins = re.findall(r'"litserve([<>=!~][^"]*)"', (ROOT / "pyproject.toml").read_text(encoding="utf-8"))
    # the serve extra and the all extra both name it
    assert pins and set(pins) == {seams.TESTED_RANGE}, (
        f"pyproject.toml pins litserve {pins}, the seams: {seams.TESTED_RANGE}"
    )


@pytest.mark.parametrize("owner, name", list(METHODS), ids=[f"{o.__name__}.{n}" for o, n in METHODS])
def test_each_litserve_method_relied_on_has_its_parameters(owner, name):
    assert hasattr(owner, name), f"LitServe's {owner.__name__} has no {name}"
    assert _params(getattr(owner, name)) == METHODS[owner, name]


@pytest.mark.parametrize("cls", SUBCLASSES, ids=lambda c: c.__name__)
def test_every_override_is_recorded_and_keeps_the_upstream_signature(cls):
    own = {name: fn for name, fn in vars(cls).items() if inspect.isfunction(fn)}
    assert own, cls
    for name, fn in own.items():
        base = next((b for b in cls.__mro__[1:] if name in vars(b)), None)
        assert base is not None, f"{cls.__name__}.{name} overrides nothing in LitServe: keep it out of the seam classes"
        assert any(name == n and issubclass(cls, o) for o, n in METHODS), f"{cls.__name__}.{name} not in METHODS"
        upstream = inspect.signature(getattr(base, name)).parameters
        ours = inspect.signature(fn).parameters
        assert [(p.name, p.default) for p in ours.values()] == [(p.name, p.default) for p in upstream.values()], (
            f"{cls.__name__}.{name}"
        )


def test_the_loop_protocol_constants():
    from litserve.callbacks import EventTypes
    from litserve.utils import LitAPIStatus, LoopResponseType, WorkerSetupStatus

    # the stop sentinel has the arity of a queue item, and stopping raises an exception the loop catches
    assert loops_base._SENTINEL_VALUE == (None, None, None, None)
    assert issubclass(loops_base._StopLoopError, Exception)
    for enum, member in (
        (EventTypes, "ON_SERVER_START"),
        (LitAPIStatus, "START"),
        (LoopResponseType, "REGULAR"),
        (WorkerSetupStatus, "ERROR"),
        (WorkerSetupStatus, "READY"),
    ):
        assert hasattr(enum, member), f"{enum.__name__}.{member}"


def test_a_submitted_request_is_the_queue_item_the_loop_reads():
    """``_submit_request`` puts ``(response_queue_id, uid, arrival time, payload)``: what
    ``WaitingBatchedLoop.get_batch_requests`` unpacks and ``ForgetfulHandler`` forgets by uid."""
    q = queue.Queue()
    server = SimpleNamespace(
        _get_request_queue=lambda path: q,
        app=SimpleNamespace(response_queue_id=7),
        active_requests=0,
        _callback_runner=SimpleNamespace(trigger_event=lambda *a, **k: None),
    )
    handler = RegularRequestHandler(SimpleNamespace(api_path="/infer"), server)
    uid, queue_id = asyncio.run(handler._submit_request({"query": "q"}))
    item = q.get_nowait()
    assert queue_id == 7 and len(item) == 4 and item[:2] == (7, uid) and item[3] == {"query": "q"}
    assert isinstance(item[2], float)


def test_the_logger_queue_is_what_logging_enabled_reads():
    class API(ls.LitAPI):
        def setup(self, device):
            pass

        def predict(self, x):
            return x

    api = API()
    assert not seams.logging_enabled(api)
    api.set_logger_queue(queue.Queue())
    assert seams.logging_enabled(api)


def test_a_constructed_server_has_what_the_overrides_read():
    """A GeoLitServer, constructed (not run): the routes of its override, the workers' status keys,
    and the attributes the overrides and the lifecycle read."""

    class API(ls.LitAPI):
        def setup(self, device):
            pass

        def predict(self, x):
            return x

    api = API(api_path="/infer")
    api.routes = {"/retrieve": dict, "/rerank": dict}
    server = seams.GeoLitServer(api, accelerator="cpu", workers_per_device=3)
    paths = [r.path for r in server.app.routes]
    assert "/retrieve" in paths and "/rerank" in paths and "/infer" not in paths
    # LitServe names a worker's status key {endpoint}_{i}: the keys watch_workers reads
    assert seams.worker_status_keys(server) == ["infer_0", "infer_1", "infer_2"]
    assert 'f"{endpoint}_{worker_id}"' in inspect.getsource(ls.LitServer.launch_inference_worker)
    assert callable(server._callback_runner.trigger_event)
    assert server.response_buffer == {} and isinstance(server.uvicorn_graceful_timeout, (int, float))
    assert [a.api_path for a in server.litapi_connector] == ["/infer"]
    assert seams.manager_pid(server) is None  # no manager before run
    # set while the server starts: the manager (whose process _init_manager notes), the status
    # table and the worker processes
    assert "self.transport_config.manager = manager" in inspect.getsource(ls.LitServer._init_manager)
    assert "self.workers_setup_status = " in inspect.getsource(ls.LitServer._init_manager)
    assert "self.inference_workers = " in inspect.getsource(ls.LitServer.run)


def test_no_other_module_of_the_server_touches_a_private_litserve_name():
    bad = []
    for path in sorted((ROOT / "geograph" / "serve").glob("*.py")):
        if path.name == "_litserve.py":
            continue
        text = path.read_text(encoding="utf-8")
        bad += [f"{path.name}: {name}" for name in PRIVATE if re.search(rf"\b{re.escape(name)}\b", text)]
        bad += [f"{path.name}: {m}" for m in re.findall(r"from litserve[.\w]* import [^\n]*\b_\w+", text)]
    assert not bad, "private LitServe names outside geograph/serve/_litserve.py:\n" + "\n".join(bad)


class _Echo(ls.LitAPI):
    def setup(self, device):
        pass

    def predict(self, x):
        return x


def _route_dependencies(server, path):
    route = next(r for r in server.app.router.routes if getattr(r, "path", None) == path)
    return [d.call for d in route.dependant.dependencies]  # codespell:ignore dependant (FastAPI's name)


def test_a_route_without_litserve_auth_runs_no_dependency_in_the_thread_pool(monkeypatch):
    import litserve.server as upstream

    assert callable(upstream.no_auth)  # the name the routes' override compares with
    plain = seams.GeoLitServer(_Echo(), accelerator="cpu")
    assert _route_dependencies(plain, "/predict") == []
    monkeypatch.setattr(upstream, "LIT_SERVER_API_KEY", "k")  # LitServe's own key: its check stays
    keyed = seams.GeoLitServer(_Echo(), accelerator="cpu")
    assert _route_dependencies(keyed, "/predict") == [upstream.api_key_auth]


def test_the_api_server_transport_reads_each_answer_in_order_on_one_thread():
    import threading

    source = queue.Queue()
    transport = seams.ThreadedReceiveTransport(None, [source])
    # what the workers get: LitServe's own transport on the same queues
    assert transport.__reduce__() == (MPQueueTransport, (None, [source]))
    before = threading.active_count()

    async def read(n):
        return [await transport.areceive(0) for _ in range(n)]

    async def main():
        first = await read(1)  # starts the reader
        for i in range(1, 200):
            source.put(("uid", i))
        rest = await read(199)
        nothing = await transport.areceive(0, timeout=0.05)  # upstream's answer to a timeout
        return first + rest, nothing

    source.put(("uid", 0))
    got, nothing = asyncio.run(main())
    assert got == [("uid", i) for i in range(200)] and nothing is None
    assert threading.active_count() == before + 1, "one reader thread, not one per answer"
    transport.close(send_sentinel=False)
    deadline = time.monotonic() + 5
    while threading.active_count() > before and time.monotonic() < deadline:
        time.sleep(0.05)
    assert threading.active_count() == before, "the reader outlived its closed transport"


def test_the_server_gives_its_api_servers_the_threaded_transport():
    server = seams.GeoLitServer(_Echo(), accelerator="cpu")
    manager = server._init_manager(1)
    try:
        assert type(server._transport) is seams.ThreadedReceiveTransport
    finally:
        seams.stop_processes(server.logger_processes, 5)
        manager.shutdown()
