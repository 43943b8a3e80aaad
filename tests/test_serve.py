import asyncio
import json
import math
import re
import sys
import threading
import time
import warnings

import numpy as np
import pytest
import torch

pytest.importorskip("fastapi")
from fastapi.testclient import TestClient  # noqa: E402
from helpers import Gate  # noqa: E402

from spanflow.data.synthetic import synthetic_ner, synthetic_re  # noqa: E402
from spanflow.models.encoder import build_tiny  # noqa: E402
from spanflow.serving.app import ServeOptions, create_app  # noqa: E402
from spanflow.serving.services import load_service  # noqa: E402
from spanflow.tasks.embed import Embedder  # noqa: E402
from spanflow.tasks.ner import NerModel  # noqa: E402
from spanflow.training.options import TrainOptions  # noqa: E402

TEXTS = [e.text for e in synthetic_ner(30, seed=1)]
NER_DATA = synthetic_ner(40, seed=2)  # what the NER model is trained on: it finds these entities


@pytest.fixture(scope="module")
def model_dirs(tmp_path_factory):
    from spanflow.tasks.ner import train_ner
    from spanflow.tasks.re import train_re

    d = tmp_path_factory.mktemp("serve")
    enc, tok = build_tiny(TEXTS, hidden=32, embedding=32, bigram_buckets=1009)
    enc.save_pretrained(d / "emb")
    tok.save_pretrained(d / "emb")
    opts = TrainOptions(epochs=2, max_tokens=512, max_length=32, log_every=0)
    ner_opts = TrainOptions(epochs=3, lr=2e-2, max_tokens=512, max_length=32, log_every=0, patience=0)
    train_ner(NER_DATA, None, out_dir=str(d / "ner"), options=ner_opts, log_fn=lambda s: None)
    train_re(synthetic_re(40, seed=2), None, out_dir=str(d / "re"), options=opts, log_fn=lambda s: None)
    return {"emb": str(d / "emb"), "ner": str(d / "ner" / "model"), "re": str(d / "re" / "model")}


def client(dirs, **kw):
    services = [load_service(f"{k}={v}", device="cpu") for k, v in dirs.items()]
    return TestClient(create_app(services, ServeOptions(**kw)))


def test_routes_and_shapes(model_dirs):
    with client(model_dirs) as c:
        assert c.get("/health").json() == {"status": "ok"}
        assert c.get("/ready").json()["models"] == {"emb": "embed", "ner": "ner", "re": "re"}
        r = c.post("/v1/embeddings", json={"input": TEXTS[:5], "model": "emb"}).json()
        assert r["object"] == "list" and [d["index"] for d in r["data"]] == list(range(5))
        want = Embedder.load(model_dirs["emb"], device="cpu").encode(TEXTS[:5])
        np.testing.assert_allclose(np.array([d["embedding"] for d in r["data"]]), want, atol=1e-5)
        assert r["usage"]["prompt_tokens"] > 0
        texts = [e.text for e in NER_DATA[:4]]
        texts.append(" ".join(texts + TEXTS[:4]))  # over the NER model's 32-token windows
        r = c.post("/v1/ner", json={"texts": texts}).json()
        got = [[(e["start"], e["end"], e["label"]) for e in res["entities"]] for res in r["results"]]
        want = NerModel.load(model_dirs["ner"], device="cpu").predict(texts)
        assert got == [[tuple(s) for s in spans] for spans in want]  # the server decodes as predict does
        assert any(set(g) & set(e.spans) for g, e in zip(got, NER_DATA))  # and finds trained entities
        r = c.post("/v1/relations", json={"texts": ["Hooli is based in Oslo ."]}).json()
        assert isinstance(r["results"][0]["relations"], list)
        m = c.get("/metrics").text
        assert 'spanflow_requests_total{route="/v1/ner",status="200"}' in m and "spanflow_batch_tokens_bucket" in m
        if sys.platform.startswith("linux"):  # the CPU split by thread reads /proc
            assert re.search(r'^spanflow_thread_cpu_\w+\{thread="model"\} ', m, re.MULTILINE)  # the split by role
        # a CPU server exports no GPU figures (they read as an idle GPU), and says what runs each model
        assert "spanflow_accelerator" not in m
        for name in ("ner", "emb"):
            assert sum(float(x) for x in re.findall(rf'^spanflow_backend\{{backend="\w+",model="{name}"\}} (\S+)', m,
                                                    re.MULTILINE)) == 1, name


def test_metrics_count_served_batches_padded_as_they_ran(model_dirs):
    svc = load_service(f"emb={model_dirs['emb']}", device="cpu")
    length = svc.units(["Grace flew to Oslo"])[1][0]
    padded = -(-length // 8) * 8  # run_batch pads to a multiple of 8

    def metric(text, name):
        found = re.search(rf'^{name}{{model="emb"}} (\S+)$', text, re.MULTILINE)
        return float(found.group(1)) if found else None

    with TestClient(create_app([svc], ServeOptions())) as c:
        assert metric(c.get("/metrics").text, "spanflow_batch_size_count") in (None, 0.0)  # not the warm-up's
        assert c.post("/v1/embeddings", json={"input": "Grace flew to Oslo"}).status_code == 200
        m = c.get("/metrics").text
    assert metric(m, "spanflow_batch_size_count") == 1 and metric(m, "spanflow_batch_tokens_sum") == padded
    assert metric(m, "spanflow_padding_efficiency") == pytest.approx(length / padded)
    # the request whole: its time (its phases summed), its text and its real tokens
    assert metric(m, "spanflow_request_seconds_count") == 1 and metric(m, "spanflow_texts_total") == 1
    assert metric(m, "spanflow_real_tokens_total") == length
    assert re.search(r"^spanflow_requests_in_flight 0\.0$", m, re.MULTILINE)  # answered: out of flight
    phases = sum(float(x) for x in re.findall(r'^spanflow_request_phase_seconds_sum\{model="emb",phase="\w+"\} (\S+)$',
                                               m, re.MULTILINE))
    assert metric(m, "spanflow_request_seconds_sum") == pytest.approx(phases, rel=1e-6, abs=1e-9)


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")
def test_thread_cpu_is_split_by_role():
    from spanflow.serving.metrics import thread_cpu

    burned, held = threading.Event(), threading.Event()

    def model():  # 0.3 CPU seconds, then alive until read: /proc has a thread's time only while it lives
        end = time.thread_time() + 0.3
        while time.thread_time() < end:
            pass
        burned.set()
        held.wait(60)

    before = thread_cpu()
    t = threading.Thread(target=model, name="spanflow-model_test")
    t.start()
    try:
        assert burned.wait(60)
        now = thread_cpu()
    finally:
        held.set()
        t.join()
    assert now["model"] - before.get("model", 0.0) >= 0.25  # counted under its role
    assert now.get("other", 0.0) - before.get("other", 0.0) < 0.25  # and not elsewhere
    assert thread_cpu()["model"] >= now["model"]  # the thread is gone, its seconds are not (they fell to 0)


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")
def test_a_thread_that_says_its_cpu_as_it_ends_is_counted_whole():
    """A compile aside burned seconds after the last scrape, then ended: /proc forgot them."""
    from spanflow.runtime.threads import said_cpu_at_end
    from spanflow.serving.metrics import thread_cpu

    started = threading.Event()

    def compile_():
        started.wait(60)
        end = time.thread_time() + 0.3  # after the scrape below
        while time.thread_time() < end:
            pass
        said_cpu_at_end()

    t = threading.Thread(target=compile_, name="spanflow-compile_test")
    t.start()
    before = thread_cpu().get("compile", 0.0)  # the thread seen, idle
    started.set()
    t.join()
    assert thread_cpu()["compile"] - before >= 0.25
    started.clear()
    unseen = threading.Thread(target=compile_, name="spanflow-compile_unseen")  # ends before any scrape
    unseen.start()
    started.set()
    unseen.join()
    assert thread_cpu()["compile"] - before >= 0.5


def test_errors_are_4xx(model_dirs):
    with client(model_dirs, max_texts=3, max_text_chars=50, max_request_bytes=2000) as c:
        assert c.post("/v1/ner", content=b"{nope", headers={"content-type": "application/json"}).status_code == 400
        r = c.post("/v1/embeddings", json={"input": ["a"], "model": "text-embedding-3-small"})
        assert r.status_code == 200 and r.json()["model"] == "emb"  # the one embedding model answers any name
        r = c.post("/v1/ner", json={"texts": ["a"], "max_lenght": 3})  # a misspelt option is not ignored
        assert r.status_code == 422 and r.json()["error"]["param"] == "max_lenght"
        r = c.post("/v1/embeddings", json={"input": ["a"], "model": "ner"})  # a served model of another task
        assert r.status_code == 422 and r.json()["error"] == {
            "message": "model 'ner' is a model of task 'ner'; this route runs 'embed' models: ['emb']",
            "type": "invalid_request_error", "code": "invalid_request", "param": "model"}
        r = c.post("/v1/ner", json={"texts": ["a"] * 4})
        assert r.status_code == 422 and "limit is 3" in r.json()["error"]["message"]
        r = c.post("/v1/ner", json={"texts": ["x" * 51]})
        assert r.status_code == 422 and "--max-text-chars" in r.json()["error"]["message"]
        assert c.post("/v1/ner", json={"texts": [1, 2]}).status_code == 422
        assert c.post("/v1/ner", json={"texts": ["y" * 40] * 2, "pad": "z" * 3000}).status_code == 413


def test_an_unknown_model_name_is_404_where_several_could_answer(model_dirs):
    with client({"a": model_dirs["emb"], "b": model_dirs["emb"]}) as c:
        r = c.post("/v1/embeddings", json={"input": ["x"], "model": "nope"})
        assert r.status_code == 404 and "'a', 'b'" in r.json()["error"]["message"]
        assert r.json()["error"]["param"] == "model"
        r = c.post("/v1/embeddings", json={"input": ["x"]})  # no name, and two could answer
        assert r.status_code == 422 and "'a', 'b'" in r.json()["error"]["message"]
        assert r.json()["error"]["param"] == "model"
        assert c.post("/v1/embeddings", json={"input": ["x"], "model": "b"}).json()["model"] == "b"


def test_api_key(model_dirs):
    with client({"emb": model_dirs["emb"]}, api_key="s3cret") as c:
        assert c.get("/health").status_code == 200
        assert c.head("/health").status_code == 200  # a load balancer's probe
        assert c.head("/ready", headers={"Authorization": "Bearer s3cret"}).status_code == 200
        # a readiness probe holds no secret: /ready answers it, naming no model
        assert c.get("/ready").json() == {"status": "ready"} and c.head("/ready").status_code == 200
        assert c.get("/ready", headers={"Authorization": "Bearer s3cret"}).json()["models"] == {"emb": "embed"}
        assert c.get("/ready", headers={"Authorization": "Bearer wrong"}).json() == {"status": "ready"}
        assert c.post("/v1/embeddings", json={"input": "a"}).status_code == 401
        ok = c.post("/v1/embeddings", json={"input": "a"}, headers={"Authorization": "Bearer s3cret"})
        assert ok.status_code == 200 and c.get("/metrics").status_code == 401
    from spanflow.serving.guard import key_matches

    # the header's raw bytes (the test client re-encodes headers as latin-1; a server gets them as sent)
    assert key_matches("bearer  schlüssel ".encode(), "schlüssel")  # UTF-8, as clients send a key
    assert not key_matches("Bearer schlüssel".encode("latin-1"), "schlüssel")
    assert not key_matches(b"Basic s3cret", "s3cret") and not key_matches(None, "s3cret")
    with client({"emb": model_dirs["emb"]}) as c, warnings.catch_warnings():
        warnings.simplefilter("error")  # the schema's operation ids are unique: no warning at the first /docs
        paths = c.get("/openapi.json").json()["paths"]
        assert set(paths["/health"]) == {"get"} and set(paths["/ready"]) == {"get"}
    # each route's body is in the schema (the handlers read the raw body: /docs could send none, and a
    # generated client had no types)
    with client(model_dirs) as c:
        paths = c.get("/openapi.json").json()["paths"]
    body = lambda route: paths[route]["post"]["requestBody"]["content"]["application/json"]["schema"]  # noqa: E731
    ner, emb = body("/v1/ner"), body("/v1/embeddings")
    assert ner["required"] == ["texts"] and set(ner["properties"]) == {"texts", "model"}
    assert ner["additionalProperties"] is False and emb["required"] == ["input"]
    assert set(emb["properties"]) == {"input", "model", "encoding_format", "dimensions", "user"}
    assert emb["properties"]["encoding_format"]["enum"] == ["float", "base64"]
    assert emb["properties"]["dimensions"]["type"] == "integer"


def test_openapi_describes_every_answer(model_dirs):
    """Each route's 200 answer and error answers carry the schema the server keeps to (they were
    given as any JSON: a generated client had no types), checked against real answers."""
    import jsonschema

    with client(model_dirs) as c:
        paths = c.get("/openapi.json").json()["paths"]

        def schema(route, method, status):
            return paths[route][method]["responses"][status]["content"]["application/json"]["schema"]

        sent = {"/v1/ner": {"texts": TEXTS[:3]}, "/v1/relations": {"texts": TEXTS[:3]},
                "/v1/embeddings": {"input": TEXTS[:3]}}
        for route, body in sent.items():
            jsonschema.validate(c.post(route, json=body).json(), schema(route, "post", "200"))
            bad = c.post(route, json={**body, "bogus": 1})
            assert bad.status_code == 422
            jsonschema.validate(bad.json(), schema(route, "post", "4XX"))
            with pytest.raises(jsonschema.ValidationError):  # a schema that takes anything checks nothing
                jsonschema.validate({"results": "x"}, schema(route, "post", "200"))
        based = c.post("/v1/embeddings", json={"input": TEXTS[:2], "encoding_format": "base64"}).json()
        jsonschema.validate(based, schema("/v1/embeddings", "post", "200"))
        for route in ("/health", "/ready", "/v1/models"):
            jsonschema.validate(c.get(route).json(), schema(route, "get", "200"))
        jsonschema.validate(c.get("/v1/models/ner").json(), schema("/v1/models/{name}", "get", "200"))
        missing = c.get("/v1/models/org/none")
        assert missing.status_code == 404
        jsonschema.validate(missing.json(), schema("/v1/models/{name}", "get", "404"))
        assert set(paths["/v1/models/{name}"]["get"]["responses"]) == {"200", "404"}  # no 422 of another shape
        assert set(paths["/metrics"]["get"]["responses"]["200"]["content"]) == {"text/plain"}  # no JSON


def test_served_crf_model_decodes_like_predict(tmp_path):
    from spanflow.tasks.ner import train_ner

    data = synthetic_ner(40, seed=2, max_clauses=1)
    opts = TrainOptions(epochs=10, lr=2e-2, max_tokens=512, max_length=64, log_every=0, patience=0)
    train_ner(data, None, out_dir=str(tmp_path), options=opts, head="crf", log_fn=lambda s: None)
    model = NerModel.load(str(tmp_path / "model"), device="cpu")
    assert model.max_length < model.limit
    texts = [e.text for e in data[:6]] + [" ".join(e.text for e in data[:6])]  # the last spans several windows
    from spanflow.serving.services import (
        Service,  # the server cuts windows as predict does: at the trained length
    )
    _, lengths, _ = Service("crf", "ner", model).units(texts)
    assert max(lengths) == model.max_length and len(lengths) > len(texts)
    assert any(s > 0 for spans in model.predict(texts[:6]) for s, _, _ in spans)
    # forbid every transition into a B- tag: Viterbi now finds entities only at a window's
    # first word, while the per-token argmax of the same emissions would still find the rest
    with torch.no_grad():
        crf = model.module.head.crf
        for j, lab in enumerate(model.id2label):
            if lab.startswith("B-"):
                crf.transitions[:, j] = -1e3
    model.save(str(tmp_path / "forced"))
    want = NerModel.load(str(tmp_path / "forced"), device="cpu").predict(texts)
    assert all(s == 0 for spans in want[:6] for s, _, _ in spans)  # one window each
    with client({"crf": str(tmp_path / "forced")}) as c:
        got = c.post("/v1/ner", json={"texts": texts}).json()["results"]
    assert [[(e["start"], e["end"], e["label"]) for e in r["entities"]] for r in got] == want


@pytest.mark.parametrize("with_orjson", [True, False])
def test_embeddings_json_with_and_without_orjson(model_dirs, monkeypatch, with_orjson):
    import sys

    if with_orjson:
        pytest.importorskip("orjson")
    else:
        monkeypatch.setitem(sys.modules, "orjson", None)  # as if the serve extra's orjson were absent
    want = Embedder.load(model_dirs["emb"], device="cpu").encode(TEXTS[:3])
    with client({"emb": model_dirs["emb"]}) as c:
        r = c.post("/v1/embeddings", json={"input": TEXTS[:3]})
    assert r.headers["content-type"].startswith("application/json")
    got = np.array([d["embedding"] for d in r.json()["data"]])
    np.testing.assert_allclose(got, want, atol=1e-6)


def test_http_429_with_retry_after_while_admitted_requests_are_served(model_dirs):
    import httpx

    svc = load_service(f"emb={model_dirs['emb']}", device="cpu")
    fast, gate, serving = svc.run_batch, Gate(), threading.Event()

    def held(units):  # after the warm-up, the first batch holds the model so that a queue forms
        if serving.is_set() and not gate.entered.is_set():
            gate.hold()
        return fast(units)

    svc.run_batch = held
    body = {"input": ["Grace flew to Oslo"] * 3}
    lengths = svc.units(body["input"])[1]
    # one text a batch, and a queue that holds one request
    app = create_app([svc], ServeOptions(max_tokens=lengths[0], max_queue_tokens=sum(lengths), max_wait_ms=1))

    async def main():
        async with app.router.lifespan_context(app):
            serving.set()
            async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://t") as c:
                first = asyncio.create_task(c.post("/v1/embeddings", json=body))
                await gate.running()  # its first text runs, two wait
                second = await asyncio.wait_for(c.post("/v1/embeddings", json=body), 30)  # over the bound
                gate.released.set()
                return second, await first, await c.post("/v1/embeddings", json=body)

    second, first, third = gate.run(main())
    assert second.status_code == 429 and int(second.headers["retry-after"]) >= 1
    # the body says the header's wait (it rounded 1.4 s to 1 where the header said 2)
    L = lengths[0]
    assert second.json()["error"]["message"] == (f"queue full ({2 * L} tokens queued, {3 * L} asked, bound {3 * L}); "
                                                  f"retry after {second.headers['retry-after']}s")
    assert first.status_code == 200 and len(first.json()["data"]) == 3  # admitted work is still served
    assert third.status_code == 200  # the queue drained: admitted again


def test_small_requests_are_tokenized_on_the_event_loop_and_one_thread_at_a_time(model_dirs, monkeypatch):
    from concurrent.futures import ThreadPoolExecutor

    import httpx

    import spanflow.serving.app as app_module
    from spanflow.serving.app import INLINE_CHARS, INLINE_TEXTS

    svc = load_service(f"emb={model_dirs['emb']}", device="cpu")
    units, seen, inside = svc.units, [], []
    entered, release = threading.Event(), threading.Event()
    big = " ".join(TEXTS) * (INLINE_CHARS // len(" ".join(TEXTS)) + 1)  # over the inline bound

    def recording(texts):
        inside.append(1)
        assert len(inside) == 1, "two threads in the tokenizer at once"
        seen.append((texts[0], threading.current_thread().name))
        if texts == [big]:  # the large request holds the tokenizer until the test releases it
            entered.set()
            assert release.wait(60)
        inside.pop()
        return units(texts)

    queued = threading.Event()  # work handed to the io thread while the large request holds the tokenizer

    class Pool(ThreadPoolExecutor):
        def submit(self, fn, *args, **kwargs):
            future = super().submit(fn, *args, **kwargs)
            if entered.is_set() and not release.is_set():
                queued.set()
            return future

    monkeypatch.setattr(app_module, "ThreadPoolExecutor", Pool)
    svc.units = recording
    app = create_app([svc], ServeOptions(max_wait_ms=1))

    async def main():
        async with app.router.lifespan_context(app):
            async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://t") as c:
                loop_thread = threading.current_thread().name
                alone = await c.post("/v1/embeddings", json={"input": TEXTS[0]})
                large = asyncio.create_task(c.post("/v1/embeddings", json={"input": big}))
                assert await asyncio.to_thread(entered.wait, 60)
                small = asyncio.create_task(c.post("/v1/embeddings", json={"input": TEXTS[1]}))
                handed = asyncio.create_task(asyncio.to_thread(queued.wait, 60))
                await asyncio.wait([small, handed], return_when=asyncio.FIRST_COMPLETED)  # queued, or answered
                release.set()
                queued.set()  # ends the waiting thread either way
                many = await c.post("/v1/embeddings", json={"input": [TEXTS[2]] * (INLINE_TEXTS + 1)})
                return loop_thread, alone, await large, await small, many

    try:
        loop_thread, *answers = asyncio.run(main())
    finally:
        release.set()
    assert [r.status_code for r in answers] == [200, 200, 200, 200]
    where = dict(seen)
    assert where[TEXTS[0]] == loop_thread  # small, tokenizer free: on the event loop, no thread hop
    assert where[big].startswith("spanflow-io")  # large: off the loop
    assert where[TEXTS[1]].startswith("spanflow-io")  # small, but the io thread held the tokenizer
    assert where[TEXTS[2]].startswith("spanflow-io")  # short texts, but more than INLINE_TEXTS of them


def _batches(metrics: str, model: str) -> int:
    """Batches the server ran for `model`, from its Prometheus text."""
    m = re.search(rf'^spanflow_batch_size_count{{model="{model}"}} (\S+)$', metrics, re.MULTILINE)
    return int(float(m.group(1)))


def test_serve_takes_the_budget_and_backend_from_the_profile(model_dirs, monkeypatch, capsys, tmp_path):
    from spanflow.cli.main import main
    from spanflow.runtime.budget import default_budget

    monkeypatch.setenv("SPANFLOW_CACHE", str(tmp_path))  # no cached profiles
    started = []
    monkeypatch.setattr("spanflow.serving.address.serve_on", lambda socks, app, **kw: started.append((app, kw)))
    asked = []  # compiling is tested in test_backend.py; here: what a batching server asks for
    monkeypatch.setattr("spanflow.serving.app.start_backend",
                        lambda model, name, log=print, swapped=None: asked.append(name) or swaps.append(swapped)
                        or log(f"backend {name}"))
    swaps = []  # what each model's compile calls once batches run compiled: its calls timed anew
    text = min(TEXTS, key=len)
    lengths = load_service(f"ner={model_dirs['ner']}", device="cpu").units([text])[1]
    assert len(lengths) == 1  # one window
    n, budget, default = 30, 3 * lengths[0] + 1, default_budget("serve", "cpu")  # the profile's: 3 texts a batch
    assert n * lengths[0] <= default

    def serve(*flags):
        """Start `spanflow serve`; batches run for n copies of the text by each model, and what it printed."""
        capsys.readouterr()
        assert main(["serve", "--device", "cpu", "--model", f"ner={model_dirs['ner']}",
                     "--model", f"emb={model_dirs['emb']}", *flags]) == 0
        got = capsys.readouterr()
        out = got.out + got.err
        app, kw = started.pop()
        assert kw["http"].__name__ == "DeadlineProtocol"
        with TestClient(app) as c:
            assert c.post("/v1/ner", json={"texts": [text] * n}).status_code == 200
            assert c.post("/v1/embeddings", json={"input": [text] * n}).status_code == 200
            assert [swapped().result(60) for swapped in swaps] == [None, None]  # timed on the model thread
            swaps.clear()
            metrics = c.get("/metrics").text
        late = capsys.readouterr()  # what the server printed as it started (its backends' lines)
        return {m: _batches(metrics, m) for m in ("ner", "emb")}, out + late.out  # (the warm-up is not counted)

    batches, out = serve("--max-tokens", "auto")
    assert batches == {"ner": 1, "emb": 1}  # the default budget holds all n
    assert "ner: backend " in out and "emb: backend " in out  # of two models, each backend's line names its own
    assert f"max_tokens {budget}" not in out and f"max_tokens {default}" in out
    # how to get a measured one: a command that caches it, or tune and --profile
    assert f"`spanflow embed --model {model_dirs['emb']} --input YOUR_TEXTS --output OUT --max-tokens auto` " \
           "measures and caches one" in out and "--profile DIR/profile.json" in out
    assert asked == ["compile", "compile"]
    profile = tmp_path / "profile.json"  # measured by tune for the NER model: eager was faster there
    profile.write_text(json.dumps({"task": "ner", "mode": "infer", "best": {"max_tokens": budget, "max_length": 32},
                                   "backend": {"eager": 900.0, "compile": 800.0, "compile_s": 9.0, "best": "eager"}}))
    asked.clear()
    batches, out = serve("--profile", str(profile))
    assert batches == {"ner": math.ceil(n / 3), "emb": 1}  # the NER model's budget is the profile's, 3 texts a batch
    assert f"max_tokens {budget}" in out
    assert asked == ["eager", "compile"]  # the profile's backend, for its task's model only
    assert main(["serve", "--device", "cpu", "--model", f"emb={model_dirs['emb']}", "--profile", str(profile)]) == 2
    assert (f"error: profile {profile} was measured for task 'ner', and no --model served is one (they are 'embed')"
            in capsys.readouterr().err) and not started  # refused, where it would have been ignored


def test_the_timeout_counts_from_the_start_of_the_request(model_dirs, monkeypatch):
    import types

    import spanflow.serving.app as app_module

    ticks = iter(range(0, 10**6, 20))  # every clock reading 20 s on: reading and tokenizing take 40 s of 30
    monkeypatch.setattr(app_module, "time", types.SimpleNamespace(perf_counter=lambda: float(next(ticks)),
                                                                  time=time.time))
    with client({"emb": model_dirs["emb"]}, timeout=30) as c:
        r = c.post("/v1/embeddings", json={"input": "Grace flew to Oslo"})
    assert r.status_code == 504 and r.json()["error"]["code"] == "timeout"
    assert r.json()["error"]["message"].startswith("request not served within 30s;")
    ticks = iter(range(0, 10**6, 20))
    with client({"emb": model_dirs["emb"]}, timeout=0.5) as c:  # a fraction of a second said as given ("0s")
        r = c.post("/v1/embeddings", json={"input": "Grace flew to Oslo"})
    assert r.status_code == 504 and r.json()["error"]["message"].startswith("request not served within 0.5s;")


def test_a_large_request_whose_client_goes_is_dropped_from_the_queue():
    """The client of a request of several batches closes its connection: its work was run to
    the end for no one; now it is cancelled, and the batcher drops its queued units."""
    from spanflow.serving.app import ClientGone, _unless_gone
    from spanflow.serving.batcher import DynamicBatcher

    gate, ran = Gate(), []

    def run_batch(units):
        ran.extend(units)
        if len(ran) == 1:
            gate.hold()  # the first batch holds the model while the client goes
        return units

    class Leaving:  # the ASGI messages after the body: the disconnect, once the client goes
        def __init__(self):
            self.left = asyncio.Event()

        async def receive(self):
            await self.left.wait()
            return {"type": "http.disconnect"}

    async def main():
        b = DynamicBatcher(run_batch, max_tokens=4, max_wait_ms=1)
        b.start()
        client = Leaving()
        served = asyncio.ensure_future(_unless_gone(client, b.submit(list(range(10)), [4] * 10)))
        await gate.running()
        client.left.set()
        with pytest.raises(ClientGone):
            await served
        queued = b.queued_tokens
        gate.released.set()
        assert await b.submit(["next"], [4]) == ["next"]
        await b.close()
        return queued

    assert gate.run(main()) == 0
    assert ran == [0, "next"]  # none of the gone client's other nine units ran
