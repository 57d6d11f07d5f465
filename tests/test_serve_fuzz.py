"""``geograph serve``'s HTTP API fuzzed from its own OpenAPI document, and what the fuzzer found.

One Maniscope server with an API key on 127.0.0.1 for the module.

* property: schemathesis reads the server's ``/openapi.json`` and sends every route of it
  generated requests, valid and invalid (its fuzzing phase, positive and negative modes, with
  the key); every answer must decode as sent (its ``content-encoding``, and a JSON
  ``content-type`` as JSON) and none may be a 5xx. About a minute on 2 CPU cores; the requests
  per route are printed at the end.
* what the fuzzer found, sent by hand: an error answer of ``/v1`` or ``/v2/rerank`` long
  enough to be gzip-compressed (a 422 naming many invalid fields, to a client that accepts
  gzip) was rewritten after compression and reached the client as JSON marked
  ``content-encoding: gzip``, which no client could decode; and a ``max_tokens_per_doc`` too
  large for the tokenizer's integers was a 500.
"""

import base64
import gzip
import json
import subprocess
import sys
from collections import Counter
from pathlib import Path

import pytest

from conftest import require

require("litserve")
requests = require("requests")
schemathesis = require("schemathesis")
require("prometheus_client")

from test_serve_http import Server, env  # noqa: E402,F401

pytestmark = pytest.mark.integration

KEY = "fuzz-key-0123456789abcdef"
#: seconds schemathesis generates requests for (every route of the document: 1000 to 1500
#: requests on 2 busy CPU cores)
FUZZ_SECONDS = 60
#: the body schemathesis sent to ``POST /v2/rerank`` when an answer first failed to decode
FUZZER_BODY = {"documents": [""], "max_tokens_per_doc": "", "query": "", "query_embedding": [None] * 17}
#: starlette's GZipMiddleware (as LitServe adds it) compresses answers from this many bytes
GZIP_MINIMUM = 1000


@pytest.fixture(scope="module")
def server(env):
    s = Server(env, "maniscope", "--api-key", KEY)
    yield s
    s.kill()


def headers(**extra):
    return {"Authorization": f"Bearer {KEY}", **extra}


def raw_post(url, body: bytes, accept_encoding: str):
    """(status, headers, the body's bytes as they came over the wire)."""
    r = requests.post(
        url,
        data=body,
        headers=headers(**{"Content-Type": "application/json", "Accept-Encoding": accept_encoding}),
        stream=True,
        timeout=120,
    )
    with r:
        return r.status_code, r.headers, r.raw.read(decode_content=False)


@pytest.mark.parametrize("path", ["/v1/rerank", "/v2/rerank"])
@pytest.mark.parametrize("nulls", [17, 60], ids=["fuzzer-body", "longer"])
@pytest.mark.parametrize("accept_encoding", ["gzip, deflate", "identity"])
def test_a_long_error_answer_decodes(server, path, nulls, accept_encoding):
    body = json.dumps({**FUZZER_BODY, "query_embedding": [None] * nulls}).encode()
    status, got, raw = raw_post(server.url + path, body, accept_encoding)
    assert status == 422, (status, raw[:200])
    encoding = got.get("content-encoding")
    if accept_encoding == "identity":
        assert encoding is None, got
        plain = raw
    else:
        assert encoding == "gzip", f"an answer of {len(raw)} bytes: expected compressed, got {dict(got)}"
        plain = gzip.decompress(raw)  # raises if the bytes are not what the header says
    assert int(got["content-length"]) == len(raw)
    assert len(plain) >= GZIP_MINIMUM, "the answer must be long enough to be compressed for this test to mean anything"
    message = json.loads(plain)["message"]
    assert message.startswith("query: String should have at least 1 character; max_tokens_per_doc: "), message
    assert f"query_embedding.{nulls - 1}: Input should be a valid number" in message, message


@pytest.mark.parametrize("path", ["/v1/rerank", "/v2/rerank"])
def test_a_max_tokens_per_doc_beyond_any_integer_cuts_nothing(server, path):
    """The fuzzer's second finding: ``max_tokens_per_doc`` above the tokenizer's integers was a 500."""
    body = {"query": "volcanic eruptions", "documents": ["lava flows from the crater", "a cat on a sofa", "ash"]}
    answers = []
    for extra in ({}, {"max_tokens_per_doc": 10**20}, {"max_tokens_per_doc": 2**64}):
        r = requests.post(server.url + path, json={**body, **extra}, headers=headers(), timeout=120)
        assert r.status_code == 200, (extra, r.status_code, r.text[:300])
        answers.append([(x["index"], round(x["relevance_score"], 6)) for x in r.json()["results"]])
    assert answers[1] == answers[2] == answers[0]


# -- the fuzz run over every route of the document -------------------------------------------
def fuzz_report(path: Path) -> tuple[Counter, list[str]]:
    """From schemathesis' NDJSON report: answers per (route, status), and each JSON answer that
    does not parse (route, status, its first bytes)."""
    counts: Counter = Counter()
    bad_json = []
    for line in path.read_text().splitlines():
        event = json.loads(line)
        finished = event.get("ScenarioFinished")
        if finished is None:
            continue
        label = finished["recorder"]["label"]
        for interaction in (finished["recorder"].get("interactions") or {}).values():
            response = interaction.get("response")
            if response is None:  # no answer that could be read: the run's errors say why
                continue
            counts[(label, response["status_code"])] += 1
            ctype = (response["headers"].get("content-type") or [""])[0]
            content = response.get("content") or {}
            body = base64.b64decode(content["$base64"]) if "$base64" in content else str(content).encode()
            if ctype.startswith("application/json") and body:
                try:
                    json.loads(body)
                except ValueError:
                    bad_json.append(f"{label} {response['status_code']}: {body[:200]!r}")
    return counts, bad_json


@pytest.mark.slow
def test_every_route_of_the_openapi_document_answers_decodable_and_no_5xx(server, tmp_path):
    report = tmp_path / "fuzz.ndjson"
    cmd = [
        sys.executable,
        "-m",
        "schemathesis.cli",
        "run",
        f"{server.url}/openapi.json",
        "-H",
        f"Authorization: Bearer {KEY}",
        "--checks",
        "not_a_server_error",
        "--phases",
        "fuzzing",
        "--max-time",
        str(FUZZ_SECONDS),
        "--request-timeout",
        "120",
        "--report",
        "ndjson",
        "--report-ndjson-path",
        str(report),
        "--no-color",
    ]
    # the CLI's own time limit bounds it; this one is for a server that stops answering
    run = subprocess.run(cmd, capture_output=True, text=True, timeout=FUZZ_SECONDS + 300, cwd=tmp_path)
    out = run.stdout + run.stderr
    counts, bad_json = fuzz_report(report)
    document = requests.get(f"{server.url}/openapi.json", headers=headers(), timeout=30).json()
    routes = sorted(f"{m.upper()} {p}" for p, ops in document["paths"].items() for m in ops)
    print(f"\nfuzzed {sum(counts.values())} answers over {len(routes)} routes in {FUZZ_SECONDS} s:")
    for label in routes:
        statuses = {s: n for (r, s), n in sorted(counts.items()) if r == label}
        print(f"  {label}: {sum(statuses.values())} ({', '.join(f'{s}: {n}' for s, n in statuses.items())})")
    lines = [line.strip() for line in out.splitlines()]
    for i, line in enumerate(lines):  # "Test cases:" then its counts on the next line; "Seed: N"
        if line == "Test cases:" and i + 1 < len(lines):
            print(f"schemathesis: {lines[i + 1]}")
        elif line.startswith("Seed:"):
            print(f"schemathesis {line.lower()} (--seed reproduces the run)")
    # a 5xx fails the check, an answer requests cannot decode is an error: either is a non-zero exit
    assert run.returncode == 0, out[-8000:]
    assert not bad_json, bad_json[:10]
    unfuzzed = [r for r in routes if not any(label == r for label, _ in counts)]
    assert not unfuzzed, f"routes the fuzzer sent nothing: {unfuzzed}"
