"""The server's errors as a client meets them: a field of another API named, unknown paths and
methods in the same `{"error": ...}` shape, and a port in use told before any model loads."""
import socket

import pytest

pytest.importorskip("fastapi")
from fastapi.testclient import TestClient  # noqa: E402

from spanflow.cli.main import main  # noqa: E402
from spanflow.errors import ConfigError  # noqa: E402
from spanflow.models.encoder import build_tiny  # noqa: E402
from spanflow.serving.address import listening  # noqa: E402
from spanflow.serving.app import ServeOptions, create_app  # noqa: E402
from spanflow.serving.guard import CODES  # noqa: E402
from spanflow.serving.requests import InvalidRequest, Limits, read_body  # noqa: E402
from spanflow.serving.services import Service  # noqa: E402
from spanflow.tasks.embed import Embedder  # noqa: E402
from spanflow.tasks.embed.pooling import Pooling  # noqa: E402
from spanflow.tasks.ner import NerModel  # noqa: E402
from spanflow.tasks.registry import get  # noqa: E402

TEXTS = ["Ann lives in Rome .", "Bob works for Hooli in Oslo ."]


@pytest.fixture(scope="module")
def client():
    enc, tok = build_tiny(TEXTS, hidden=16, embedding=16, bigram_buckets=101)
    ner = NerModel(encoder=enc, tokenizer=tok, labels=["LOC", "PER"], limit=32, policy=None)
    emb_enc, emb_tok = build_tiny(TEXTS, hidden=16, embedding=16, bigram_buckets=101)
    emb = Embedder(encoder=emb_enc, tokenizer=emb_tok, pooling=Pooling(), device="cpu")
    services = [Service("ner", get("ner"), ner), Service("emb", get("embed"), emb)]
    app = create_app(services, ServeOptions())

    @app.get("/probe")
    async def probe(n: int):  # a route with a typed parameter: FastAPI's own validation
        return {"n": n}

    with TestClient(app) as c:
        yield c


def error_of(r, status: int) -> dict:
    assert r.status_code == status, r.text
    body = r.json()
    assert set(body) == {"error"} and body["error"]["code"] == CODES[status], body  # a string, as OpenAI's
    assert body["error"]["type"] == ("server_error" if status >= 500 else "invalid_request_error"), body
    return body["error"]


@pytest.mark.parametrize("body, field, sent", [
    ({"inputs": ["a"]}, "input", "'inputs' (Text Embeddings Inference's field)"),
    ({"text": "a"}, "texts", "'text'"),
    ({"input": ["a"]}, "texts", "'input' (OpenAI's embeddings field)"),
])
def test_a_missing_text_field_names_the_field_that_was_sent(body, field, sent):
    with pytest.raises(InvalidRequest) as e:
        read_body(body, field, Limits(10, 100))
    assert e.value.message.startswith(f"'{field}' is missing; got {sent}: this endpoint takes the texts in "
                                      f"'{field}'"), e.value.message
    assert e.value.field == field


def test_a_body_without_any_text_field_lists_what_it_has():
    with pytest.raises(InvalidRequest) as e:
        read_body({"model": "m", "query": "x"}, "texts", Limits(10, 100))
    assert e.value.message.endswith("; the body has 'model', 'query'"), e.value.message


def test_the_routes_name_the_field_sent(client):
    err = error_of(client.post("/v1/embeddings", json={"inputs": ["a text"]}), 422)
    assert "got 'inputs'" in err["message"] and err["param"] == "input"
    err = error_of(client.post("/v1/ner", json={"text": "Ann lives in Rome ."}), 422)
    assert "'texts' is missing; got 'text'" in err["message"] and err["param"] == "texts"


def test_unknown_paths_and_wrong_methods_answer_in_the_error_shape(client):
    err = error_of(client.post("/v1/embed", json={"inputs": ["a"]}), 404)
    assert err["message"].startswith("no route POST /v1/embed; the routes are ") and "POST /v1/embeddings, " in \
        err["message"] and "POST /v1/ner" in err["message"]
    assert "GET /v1/models/{name}," in err["message"] and ":path" not in err["message"]  # the router's converter
    # a number past Python's digit limit: the message is the client's, not Python's advice to raise the limit
    err = error_of(client.post("/v1/ner", content=b'{"texts": [], "model": ' + b"9" * 5000 + b"}",
                               headers={"Content-Type": "application/json"}), 400)
    assert err["message"] == "malformed JSON: a number too long to read"
    err = error_of(client.post("/v1/relations", json={"texts": ["a"]}), 404)  # a route of a task not loaded
    assert err["message"] == ("no re model is loaded on this server, so /v1/relations is not served; loaded: "
                              "ner (ner), emb (embed)")
    r = client.get("/v1/embeddings")
    err = error_of(r, 405)
    assert err["message"] == "GET is not allowed on /v1/embeddings; it takes POST"
    assert r.headers["allow"] == "POST"
    r = client.post("/health")
    assert error_of(r, 405)["param"] is None and r.headers["allow"] == "GET, HEAD"  # a probe's HEAD too
    r = client.post("/v1/ner", content=b"\x1f\x8b", headers={"Content-Encoding": "Identity, GZIP"})
    assert error_of(r, 415)["message"].startswith("unsupported Content-Encoding 'gzip'")
    r = client.post("/v1/ner", json={"texts": ["Ann ran"]}, headers={"Content-Encoding": "identity, "})
    assert r.status_code == 200


def test_fastapi_validation_errors_answer_in_the_error_shape(client):
    err = error_of(client.get("/probe", params={"n": "many"}), 422)
    assert err["param"] == "n" and err["message"].startswith("n: ")


def test_a_port_in_use_is_a_config_error():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        port = s.getsockname()[1]
        with pytest.raises(ConfigError, match=f"--port {port}: 127.0.0.1:{port} is already in use"):
            with listening("127.0.0.1", port):
                pass
    with listening("127.0.0.1", port):  # free again; held (while models load), no other server takes it
        with pytest.raises(ConfigError, match="is already in use"):
            with listening("127.0.0.1", port):
                pass
        with socket.socket() as other:  # as http.server and uvicorn bind
            other.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            with pytest.raises(OSError, match="in use"):
                other.bind(("127.0.0.1", port))


def test_serve_checks_the_port_before_loading_any_model(tmp_path, monkeypatch, capsys):
    from spanflow.cli import serve

    def no_load(a):
        raise AssertionError("a model was loaded before the port was checked")

    monkeypatch.setattr(serve, "load_services", no_load)
    enc, tok = build_tiny(TEXTS, hidden=16, embedding=16, bigram_buckets=101)
    enc.save_pretrained(tmp_path)
    tok.save_pretrained(tmp_path)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        port = s.getsockname()[1]
        assert main(["serve", "--model", str(tmp_path), "--port", str(port)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err == [(f"error: --port {port}: 127.0.0.1:{port} is already in use (another server?); stop it or pick "
                    "another --port")]


@pytest.mark.parametrize("flags, said", [
    (["--timeout", "0"], "error: --timeout must be > 0, got 0.0: every request would be refused"),
    (["--max-texts", "0"], "error: --max-texts must be > 0, got 0: every request would be refused"),
    (["--max-wait-ms", "-1"], "error: --max-wait-ms must be >= 0, got -1.0"),
    # inf: a batcher asleep for good (every later request 504, SIGTERM never drained), or a drain
    # time that crashed after the models loaded
    (["--max-wait-ms", "inf"], "error: --max-wait-ms must be a finite number, got inf"),
    (["--timeout", "inf"], "error: --timeout must be a finite number, got inf"),
    (["--read-timeout", "inf"], "error: --read-timeout must be a finite number, got inf"),
])
def test_limits_that_refuse_every_request_are_refused_before_any_model_loads(tmp_path, monkeypatch, capsys,
                                                                              flags, said):
    from spanflow.cli import serve

    monkeypatch.setattr(serve, "load_services", lambda a: pytest.fail("a model was loaded"))
    assert main(["serve", "--model", str(tmp_path), *flags]) == 2
    assert capsys.readouterr().err.strip().splitlines() == [said]


def test_two_models_of_one_name_are_refused_and_a_directory_may_hold_an_equals_sign(tmp_path, capsys):
    from spanflow.serving.services import parse_spec

    runs = tmp_path / "sweep" / "lr=3e-5"
    a, b = tmp_path / "a" / "ner" / "model", tmp_path / "b" / "ner" / "model"
    for d in (runs / "model", a, b):
        enc, tok = build_tiny(TEXTS, hidden=16, embedding=16, bigram_buckets=101)
        enc.save_pretrained(d)
        tok.save_pretrained(d)
    # NAME=DIR splits at the first '=': a directory's own '=' stays in it; an existing directory is whole
    assert parse_spec(f"emb={runs}/model") == ("emb", f"{runs}/model")
    assert parse_spec(str(runs)) == ("lr=3e-5", str(runs))
    # a trained model (OUT/model) is named after its run: two runs' models are two names
    assert parse_spec(f"{runs}/model") == ("lr=3e-5", f"{runs}/model")
    assert parse_spec(str(a)) == ("ner", str(a))
    with pytest.raises(ConfigError, match=r"^--model ner=: no directory after '=' \(NAME=DIR\)$"):
        parse_spec("ner=")  # was looked for as a directory named "ner="
    with pytest.raises(ConfigError, match=r"^--model =x: no name before '='"):
        parse_spec("=x")  # was named after x's directory without a word
    assert main(["serve", "--model", str(runs / "model"), "--model", str(a), "--model", str(b)]) == 2
    assert capsys.readouterr().err.strip().splitlines() == [
        f"error: two models are named 'ner', {a} and {b} (a model without "
        "NAME= is named after its directory, or a trained one's run): give each a name, --model NAME=DIR"]
    enc, tok = build_tiny(TEXTS, hidden=16, embedding=16, bigram_buckets=101)
    twins = [Service("m", get("embed"), Embedder(encoder=enc, tokenizer=tok, pooling=Pooling(), device="cpu"))] * 2
    with pytest.raises(ConfigError, match="^two models are named 'm', the embed model and the embed model "):
        create_app(twins, ServeOptions())


def test_a_connection_made_while_the_models_load_is_answered_once_they_are(tmp_path, monkeypatch, capsys):
    import contextlib
    import threading

    import uvicorn

    from spanflow.cli import serve
    from spanflow.serving import address
    from spanflow.runtime.policy import resolve_policy

    enc, tok = build_tiny(TEXTS, hidden=16, embedding=16, bigram_buckets=101)
    NerModel(encoder=enc, tokenizer=tok, labels=["LOC", "PER"], limit=32,
             policy=resolve_policy("fp32", "cpu")).save(str(tmp_path / "ner"))
    bound, loading, servers = threading.Event(), threading.Event(), []
    real_listening, real_load = address.listening, serve.load_services

    @contextlib.contextmanager
    def held(host, port):
        with real_listening(host, port) as socks:
            servers.append(socks)
            bound.set()
            yield socks

    def load(a):
        assert loading.wait(60), "the test never let the models load"
        return real_load(a)

    def run(socks, app, **kw):  # the real server, stoppable from here (signals are the main thread's)
        servers.append(uvicorn.Server(uvicorn.Config(app, **kw)))
        servers[-1].run(sockets=socks)

    monkeypatch.setattr(address, "listening", held)
    monkeypatch.setattr(serve, "load_services", load)
    monkeypatch.setattr(address, "serve_on", run)
    rc = []
    t = threading.Thread(target=lambda: rc.append(main(["serve", "--model", f"ner={tmp_path / 'ner'}", "--port", "0",
                                                        "--device", "cpu", "--backend", "eager"])))
    t.start()
    assert bound.wait(60)
    port = servers[0][0].getsockname()[1]
    with socket.create_connection(("127.0.0.1", port), timeout=60) as c:  # while the models have not loaded
        c.sendall(b"GET /health HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
        loading.set()
        answer = b""
        while chunk := c.recv(65536):
            answer += chunk
    assert answer.startswith(b"HTTP/1.1 200") and answer.endswith(b'{"status":"ok"}')
    servers[-1].should_exit = True
    t.join(60)
    assert rc == [0] and f"on http://127.0.0.1:{port} (batching on)" in capsys.readouterr().out  # --port 0's
