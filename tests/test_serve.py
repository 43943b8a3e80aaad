import asyncio
import json
import threading
import time

import numpy as np
import pytest
import torch

pytest.importorskip("fastapi")
from fastapi.testclient import TestClient  # noqa: E402

from spanflow.data.synthetic import synthetic_ner, synthetic_re  # noqa: E402
from spanflow.embedder import Embedder  # noqa: E402
from spanflow.models.encoder import build_tiny  # noqa: E402
from spanflow.serving.app import ServeOptions, create_app  # noqa: E402
from spanflow.serving.batcher import DynamicBatcher, Overloaded  # noqa: E402
from spanflow.serving.services import load_service  # noqa: E402
from spanflow.training.options import TrainOptions  # noqa: E402

TEXTS = [e.text for e in synthetic_ner(30, seed=1)]


@pytest.fixture(scope="module")
def model_dirs(tmp_path_factory):
    from spanflow.ner import train_ner
    from spanflow.re import train_re

    d = tmp_path_factory.mktemp("serve")
    enc, tok = build_tiny(TEXTS, hidden=32, embedding=32, bigram_buckets=1009)
    enc.save_pretrained(d / "emb")
    tok.save_pretrained(d / "emb")
    opts = TrainOptions(epochs=2, max_tokens=512, max_length=32, log_every=0)
    train_ner(synthetic_ner(40, seed=2), None, out_dir=str(d / "ner"), options=opts, log_fn=lambda s: None)
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
        long = " ".join(TEXTS[:6])  # over the NER model's 32-token windows
        r = c.post("/v1/ner", json={"texts": [TEXTS[0], long]}).json()
        assert len(r["results"]) == 2
        for text, res in zip([TEXTS[0], long], r["results"]):
            for e in res["entities"]:
                assert text[e["start"]:e["end"]] == e["text"]
        r = c.post("/v1/relations", json={"texts": ["Hooli is based in Oslo ."]}).json()
        assert isinstance(r["results"][0]["relations"], list)
        m = c.get("/metrics").text
        assert 'spanflow_requests_total{route="/v1/ner",status="200"}' in m and "spanflow_batch_tokens_bucket" in m


def test_errors_are_4xx(model_dirs):
    with client(model_dirs, max_texts=3, max_text_chars=50, max_request_bytes=2000) as c:
        assert c.post("/v1/ner", content=b"{nope", headers={"content-type": "application/json"}).status_code == 400
        r = c.post("/v1/embeddings", json={"input": ["a"], "model": "text-embedding-3-small"})
        assert r.status_code == 200 and r.json()["model"] == "emb"  # the one embedding model answers any name
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
        assert c.post("/v1/embeddings", json={"input": ["x"], "model": "b"}).json()["model"] == "b"


def test_api_key(model_dirs):
    with client({"emb": model_dirs["emb"]}, api_key="s3cret") as c:
        assert c.get("/health").status_code == 200
        assert c.post("/v1/embeddings", json={"input": "a"}).status_code == 401
        ok = c.post("/v1/embeddings", json={"input": "a"}, headers={"Authorization": "Bearer s3cret"})
        assert ok.status_code == 200 and c.get("/metrics").status_code == 401


def run(coro):
    return asyncio.run(coro)


def test_batcher_batches_across_requests_and_keeps_order():
    seen = []

    def run_batch(units):
        seen.append(len(units))
        return [u * 10 for u in units]

    async def main():
        b = DynamicBatcher(run_batch, max_tokens=64, max_wait_ms=20)
        b.start()
        reqs = [b.submit([i, i + 100], [4, 4]) for i in range(8)]
        out = await asyncio.gather(*reqs)
        await b.close()
        return out

    out = run(main())
    assert out == [[i * 10, (i + 100) * 10] for i in range(8)]
    assert sum(seen) == 16 and len(seen) < 8  # units of different requests shared batches


def test_batcher_runs_a_mixed_batch_as_similar_length_parts_in_order():
    parts = []

    def run_batch(units):
        parts.append(sorted(len(u) for u in units))
        return [u.upper() for u in units]

    texts = ["a" * n for n in (4, 40, 4, 40, 4, 40)]  # one request: all fit one 1024-token budget

    async def main(min_split_tokens):
        b = DynamicBatcher(run_batch, max_tokens=1024, max_wait_ms=1, min_split_tokens=min_split_tokens)
        b.start()
        out = await b.submit(texts, [len(t) for t in texts])
        await b.close()
        return out

    assert run(main(None)) == [t.upper() for t in texts]  # 240 padded tokens: under a quarter budget, one batch
    assert parts == [[4, 4, 4, 40, 40, 40]]
    parts.clear()
    assert run(main(0)) == [t.upper() for t in texts]  # split: short and long texts apart, results in order
    assert sorted(parts) == [[4, 4, 4], [40, 40, 40]]


def test_batcher_per_request_mode_and_overload_and_timeout():
    async def main():
        sizes = []
        b = DynamicBatcher(lambda u: sizes.append(len(u)) or u, max_tokens=64, max_wait_ms=1, per_request=True)
        b.start()
        await asyncio.gather(*[b.submit([1, 2], [4, 4]) for _ in range(5)])
        await b.close()
        assert sizes == [2] * 5  # never mixes requests

        slow = DynamicBatcher(lambda u: __import__("time").sleep(0.3) or u, max_tokens=8, max_wait_ms=1,
                              max_queue_tokens=16)
        slow.start()
        first = asyncio.ensure_future(slow.submit([1, 2, 3, 4], [4, 4, 4, 4]))
        await asyncio.sleep(0.05)
        with pytest.raises(Overloaded) as e:
            await slow.submit([5] * 5, [4] * 5)
        assert e.value.retry_after_s >= 1
        with pytest.raises(asyncio.TimeoutError):
            await slow.submit([6], [4], timeout_s=0.01)
        assert await first == [1, 2, 3, 4]
        await slow.close()

    run(main())


def test_batcher_answers_each_part_as_it_finishes_on_one_model_thread():
    answered, threads, seen_answer = threading.Event(), [], []

    def run_batch(units):
        threads.append(threading.current_thread())
        if units == ["s"]:  # the second part: the first part's request must be answered by now
            seen_answer.append(answered.wait(timeout=2))
        return units

    async def main():
        b = DynamicBatcher(run_batch, max_tokens=1024, max_wait_ms=20, min_split_tokens=0)
        b.start()
        long = asyncio.ensure_future(b.submit(["l" * 40], [40]))
        long.add_done_callback(lambda _: answered.set())
        short = asyncio.ensure_future(b.submit(["s"], [4]))
        out = await asyncio.gather(long, short)
        await b.close()
        return out

    assert run(main()) == [["l" * 40], ["s"]]
    assert seen_answer == [True]  # parts are [long], [short] (longest first); long answered before short ran
    assert len({id(t) for t in threads}) == 1 and threads[0].name.startswith("spanflow-model")


def test_batcher_refuses_work_it_could_not_start_in_time_and_recovers():
    def run_batch(units):  # 8 tokens per 0.1 s
        time.sleep(0.1)
        return units

    async def main():
        b = DynamicBatcher(run_batch, max_tokens=8, max_wait_ms=1, max_queue_wait_s=0.1)
        b.start()
        await b.warm_up([0], [4])
        assert b.tokens_per_s is None  # the warm-up does not count as the service rate
        first = asyncio.ensure_future(b.submit(list(range(8)), [4] * 8))  # 4 batches of 2
        await asyncio.sleep(0.15)  # one batch done (about 80 tokens/s), the next running, 16 tokens queued
        with pytest.raises(Overloaded) as e:
            await b.submit([99], [4])  # about 0.2 s of queued work before it: over 0.1 s
        assert e.value.retry_after_s >= 1
        assert await first == list(range(8))  # admitted work is still served
        assert await b.submit([7], [4]) == [7]  # the queue drained: admitted again
        await b.close()

    run(main())


def test_a_huge_request_does_not_stall_a_small_one():
    order = []

    def run_batch(units):
        order.append(tuple(units))
        __import__("time").sleep(0.01)
        return units

    async def main():
        b = DynamicBatcher(run_batch, max_tokens=8, max_wait_ms=1, max_queue_tokens=10**6)
        b.start()
        big = asyncio.ensure_future(b.submit(list(range(100)), [8] * 100))
        await asyncio.sleep(0.02)
        small = await b.submit(["s"], [8])
        done_big = big.done()
        await big
        await b.close()
        return small, done_big

    small, done_big = run(main())
    assert small == ["s"] and not done_big  # served while the big one was still running


def test_served_crf_model_decodes_like_predict(tmp_path):
    from spanflow.ner import NerModel, train_ner

    data = synthetic_ner(40, seed=2, max_clauses=1)
    opts = TrainOptions(epochs=10, lr=2e-2, max_tokens=512, max_length=64, log_every=0, patience=0)
    train_ner(data, None, out_dir=str(tmp_path), options=opts, head="crf", log_fn=lambda s: None)
    model = NerModel.load(str(tmp_path / "model"), device="cpu")
    assert model.window < model.max_length
    texts = [e.text for e in data[:6]] + [" ".join(e.text for e in data[:6])]  # the last spans several windows
    from spanflow.serving.services import Service  # the server cuts windows as predict does: at the trained length
    _, lengths, _ = Service("crf", "ner", model).units(texts)
    assert max(lengths) == model.window and len(lengths) > len(texts)
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
    fast = svc.run_batch

    def slow(units):  # holds the model so that a queue forms
        time.sleep(0.3)
        return fast(units)

    svc.run_batch = slow
    body = {"input": ["Grace flew to Oslo"] * 3}
    need = sum(svc.units(body["input"])[1])
    app = create_app([svc], ServeOptions(max_queue_tokens=need, max_wait_ms=1))

    async def main():
        async with app.router.lifespan_context(app):
            async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://t") as c:
                first = asyncio.create_task(c.post("/v1/embeddings", json=body))
                await asyncio.sleep(0.1)  # taken by the worker: running
                second = asyncio.create_task(c.post("/v1/embeddings", json=body))
                await asyncio.sleep(0.05)  # queued: the queue now holds its limit
                third = await c.post("/v1/embeddings", json=body)
                return third, await first, await second

    third, first, second = run(main())
    assert third.status_code == 429 and int(third.headers["retry-after"]) >= 1
    assert "queue full" in third.json()["error"]["message"]
    assert first.status_code == 200 and second.status_code == 200  # admitted work is still served
    assert len(second.json()["data"]) == 3


def test_serve_max_tokens_auto_without_a_profile_serves_every_model_with_a_budget(model_dirs, monkeypatch, capsys,
                                                                                 tmp_path):
    import uvicorn

    from spanflow.cli.main import main

    monkeypatch.setenv("SPANFLOW_CACHE", str(tmp_path))  # no cached profiles
    seen = {}
    monkeypatch.setattr(uvicorn, "run", lambda app, **kw: seen.update(app=app, **kw))
    import spanflow.cli.serve as serve_cli

    asked = []  # compiling is tested in test_backend.py; here: what a batching server asks for
    monkeypatch.setattr(serve_cli, "use_backend", lambda model, name: asked.append(name) or "eager")
    assert main(["serve", "--model", f"ner={model_dirs['ner']}", "--model", f"emb={model_dirs['emb']}",
                 "--max-tokens", "auto"]) == 0
    assert asked == ["compile", "compile"]
    profile = tmp_path / "profile.json"  # measured by tune for the NER model: eager was faster there
    profile.write_text(json.dumps({"task": "ner", "mode": "infer", "best": {"max_tokens": 512, "max_length": 64},
                                   "backend": {"eager": 900.0, "compile": 800.0, "compile_s": 9.0, "best": "eager"}}))
    asked.clear()
    assert main(["serve", "--model", f"ner={model_dirs['ner']}", "--model", f"emb={model_dirs['emb']}",
                 "--profile", str(profile)]) == 0
    assert asked == ["eager", "compile"]
    out = capsys.readouterr().out
    assert "ner (ner, max_tokens 4096)" in out and "emb (embed, max_tokens 4096)" in out
    assert "app" in seen and seen["http"].__name__ == "DeadlineProtocol"
