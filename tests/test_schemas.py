"""The pydantic schemas of the files spanflow reads (spanflow.json, the embed job's journals) and of
the server's request bodies: a valid one passes; each kind of invalid one fails with a message
naming the file (or request field) and the field, and quoting the value."""
import json
import os
from types import SimpleNamespace

import pytest

from spanflow.data.synthetic import synthetic_ner
from spanflow.errors import ConfigError, ModelDirError
from spanflow.models.directory import CONFIG, ModelConfig, check_names, config_int, read_model_config
from spanflow.serving.requests import InvalidRequest, Limits, body_schema, read_body
from spanflow.tasks.embed.journal import (ChunkDone, EmbedSpec, Fingerprint, Job, JobIdentity, Progress,
                                          fingerprint, read_journal, write_journal)
from spanflow.tasks.embed.request import read_options

TEXTS = [e.text for e in synthetic_ner(30, seed=4, max_clauses=1)]


# spanflow.json


def model_dir(tmp_path, cfg, name="m"):
    d = tmp_path / name
    d.mkdir()
    (d / CONFIG).write_text(cfg if isinstance(cfg, str) else json.dumps(cfg))
    return str(d)


def config_error(tmp_path, cfg, name="m", task=None) -> str:
    d = model_dir(tmp_path, cfg, name)
    with pytest.raises(ModelDirError) as e:
        read_model_config(d, task=task)
    assert os.path.join(d, CONFIG) in str(e.value) or d in str(e.value)
    return str(e.value)


def test_a_valid_spanflow_json_passes_with_the_task_keys_kept(tmp_path):
    cfg = {"format_version": 1, "task": "ner", "labels": ["PER"], "limit": 64, "window": 32, "anything": [1]}
    assert read_model_config(model_dir(tmp_path, cfg), task="ner") == cfg
    assert ModelConfig.model_validate({"task": "re"}).format_version == 1  # absent: the first format


@pytest.mark.parametrize("cfg, expect", [
    ({"format_version": 0, "task": "ner"}, "'format_version' must be a positive integer, got 0"),
    ({"format_version": "1", "task": "ner"}, "'format_version' must be a positive integer, got \"1\""),
    ({"format_version": True, "task": "ner"}, "'format_version' must be a positive integer, got true"),
    ({"format_version": 1}, "'task' is missing"),
    ({"task": 7}, "'task' must be a task name, got 7"),
    ({"task": ""}, "'task' must be a task name, got \"\""),
    ([1, 2], "must be a JSON object, got [1, 2]"),
    ("{\"task\": ", "is unreadable"),
])
def test_an_invalid_spanflow_json_names_the_file_the_key_and_the_value(tmp_path, cfg, expect):
    msg = config_error(tmp_path, cfg)
    assert f"{CONFIG}" in msg and expect in msg, msg


def test_a_newer_format_and_another_task_are_refused(tmp_path):
    assert "newer spanflow (model format 9" in config_error(tmp_path, {"format_version": 9, "task": "ner"}, "new")
    assert "is a 're' model, but this command needs a 'ner' model" in config_error(
        tmp_path, {"task": "re"}, "re", task="ner")


@pytest.mark.parametrize("names", [[], ["PER", "PER"], ["PER", 3], ["PER", ""], "PER", None])
def test_label_lists_are_checked(names):
    with pytest.raises(ModelDirError) as e:
        check_names({"task": "ner", "labels": names}, "labels", "/m")
    assert str(e.value).startswith(f"/m/{CONFIG}: 'labels' must be a non-empty list of distinct names, got ")
    assert json.dumps(names)[:20] in str(e.value)  # the value as the JSON file holds it
    assert check_names({"relations": ["a", "b"]}, "relations", "/m") == ["a", "b"]


@pytest.mark.parametrize("value", [0, -3, "8", 2.0, True, [8]])
def test_integer_keys_are_checked(value):
    with pytest.raises(ModelDirError) as e:
        config_int({"limit": value}, "limit", "/m")
    assert str(e.value) == f"/m/{CONFIG}: 'limit' must be a positive integer, got {json.dumps(value)}"


def test_an_absent_or_null_integer_key_takes_the_default_or_is_named():
    assert config_int({"stride": None}, "stride", "/m", 32) == 32 and config_int({}, "stride", "/m", 32) == 32
    with pytest.raises(ModelDirError, match="'limit' must be a positive integer, got null"):
        config_int({}, "limit", "/m")


@pytest.fixture(scope="module")
def tiny_encoder_for_schemas():
    from spanflow.models.encoder import build_tiny

    return build_tiny(TEXTS, hidden=16, embedding=16, bigram_buckets=101, max_length=128)


@pytest.fixture(scope="module")
def ner_dir(tmp_path_factory):
    from spanflow.models.encoder import build_tiny
    from spanflow.tasks.ner import NerModel

    enc, tok = build_tiny(TEXTS, hidden=16, embedding=16, bigram_buckets=101, max_length=128)
    d = str(tmp_path_factory.mktemp("ner") / "model")
    NerModel(encoder=enc, tokenizer=tok, labels=["LOC", "PER"], limit=96, max_length=48, stride=8).save(d)
    return d


def rewrite(src, dst, **changes):
    import shutil

    shutil.copytree(src, dst)
    cfg = json.loads(open(os.path.join(dst, CONFIG)).read())
    for k, v in changes.items():
        if v is None:
            cfg.pop(k, None)
        else:
            cfg[k] = v
    with open(os.path.join(dst, CONFIG), "w") as f:
        json.dump(cfg, f)
    return str(dst)


def test_an_old_format_ner_directory_still_loads(ner_dir, tmp_path):
    from spanflow.tasks.ner import NerModel

    new = NerModel.load(ner_dir, device="cpu")
    assert (new.limit, new.max_length, new.stride) == (96, 48, 8)
    # before "limit": "max_length" was the limit and "window" the length read
    old = rewrite(ner_dir, tmp_path / "old", limit=None, max_length=96, window=40)
    m = NerModel.load(old, device="cpu")
    assert (m.limit, m.max_length, m.stride, m.labels) == (96, 40, 8, ["LOC", "PER"])
    assert m.predict(["Ada met Bob in Oslo ."])[0] is not None
    # the first directories had neither: "max_length" was both the limit and the length read
    oldest = rewrite(ner_dir, tmp_path / "oldest", limit=None, max_length=96, window=None, format_version=1)
    assert (NerModel.load(oldest, device="cpu").limit, NerModel.load(oldest, device="cpu").max_length) == (96, 96)


def test_a_format_1_relation_directory_still_loads(tmp_path, tiny_encoder_for_schemas):
    from spanflow.tasks.re import ReModel

    enc, tok = tiny_encoder_for_schemas
    d = str(tmp_path / "re")
    ReModel(encoder=enc, tokenizer=tok, relations=["born_in"], limit=64).save(d)
    assert json.load(open(os.path.join(d, CONFIG)))["format_version"] == 2
    assert ReModel.load(d, device="cpu").limit == 64
    old = rewrite(d, tmp_path / "old", limit=None, max_length=64, format_version=1)
    assert (ReModel.load(old, device="cpu").limit, ReModel.load(old, device="cpu").max_length) == (64, 64)


def test_a_damaged_ner_directory_names_the_key(ner_dir, tmp_path):
    from spanflow.tasks.ner import NerModel

    for name, change, expect in (("w", {"limit": None, "max_length": 96, "window": 0}, "'window'"),
                                 ("l", {"limit": "96"}, "'limit' must be a positive integer, got \"96\""),
                                 ("n", {"labels": ["PER", "PER"]}, "'labels'")):
        d = rewrite(ner_dir, tmp_path / name, **change)
        with pytest.raises(ModelDirError) as e:
            NerModel.load(d, device="cpu")
        assert os.path.join(d, CONFIG) in str(e.value) and expect in str(e.value), str(e.value)


# the embed job's journals


def identity(**kw):
    spec = EmbedSpec(input="in.txt", output="out.npy", chunk_size=4)
    return JobIdentity(**{**spec.model_dump(), "format": "npy", "dim": 8, "precision": "fp32", **kw})


def test_journals_round_trip(tmp_path):
    job = Job(spec=identity(), input=Fingerprint(size=3, mtime_ns=1, sha256="ab"), n=9, chunks=3)
    write_journal(str(tmp_path / "j.json"), job)
    assert read_journal(str(tmp_path / "j.json"), Job) == job
    st = Progress()
    st.done[2] = ChunkDone(bytes=(0, 10), errors=(0, 0))
    st.end, st.stats.real_tokens = 10, 7
    write_journal(str(tmp_path / "r.json"), st)
    back = read_journal(str(tmp_path / "r.json"), Progress)
    assert back == st and json.loads((tmp_path / "r.json").read_text())["done"]["2"]["bytes"] == [0, 10]


GOOD_JOB = {"spec": identity().model_dump(), "input": {"size": 3, "mtime_ns": 1, "sha256": "ab"}, "n": 9, "chunks": 3}


@pytest.mark.parametrize("schema, content, expect", [
    (Job, '{"spec": ', "invalid JSON"),
    (Job, "[]", "must be a JSON object, got []"),
    (Job, {**GOOD_JOB, "n": -1}, "'n' must be a non-negative integer, got -1"),
    (Job, {**GOOD_JOB, "chunks": "3"}, "'chunks' must be a non-negative integer, got \"3\""),
    (Job, {k: v for k, v in GOOD_JOB.items() if k != "input"}, "'input' is missing"),
    (Job, {**GOOD_JOB, "input": {"size": 3, "mtime_ns": 1}}, "'input.sha256' is missing"),
    (Progress, {"done": {"x": {"bytes": [0, 1], "errors": [0, 0]}}}, "'done.x (a key)'"),
    (Progress, {"done": {"1": {"bytes": [9, 1], "errors": [0, 0]}}}, "'done.1.bytes' must be a byte range"),
    (Progress, {"done": {"1": {"bytes": [0, 1]}}}, "'done.1.errors' is missing"),
    (Progress, {"end": 1.5}, "'end' must be a non-negative integer, got 1.5"),
    (Progress, {"stats": {"seconds": -1}}, "'stats.seconds' must be greater than or equal to 0, got -1"),
    (Progress, {"partial": 1}, "'partial' is not a known field"),
])
def test_a_damaged_journal_names_the_file_and_the_field(tmp_path, schema, content, expect):
    f = tmp_path / "out.npy.progress.json"
    f.write_text(content if isinstance(content, str) else json.dumps(content))
    with pytest.raises(ConfigError) as e:
        read_journal(str(f), schema)
    msg = str(e.value)
    assert msg.startswith(f"{f} is damaged or was not written by spanflow embed (") and expect in msg, msg
    assert msg.endswith("; remove it or drop --resume")


def test_a_journal_of_an_older_layout_belongs_to_other_settings(tmp_path):
    f = tmp_path / "j.json"
    old = {**GOOD_JOB, "spec": {**GOOD_JOB["spec"], "window": 4}}
    f.write_text(json.dumps(old))
    with pytest.raises(ConfigError, match=r"belongs to a job with other settings \('spec.window' is not a known "
                                          r"field\); remove it or drop --resume"):
        read_journal(str(f), Job)


class Stub:
    """What embed_file asks of an embedder before it embeds anything."""

    dim, precision_name, max_length = 8, "fp32", 128


def start_a_job(tmp_path, chunk_size=4, model=""):
    """The files an interrupted job leaves, written by this job's own code path."""
    from spanflow.tasks.embed.job import _open_job
    from spanflow.tasks.embed.journal import job_paths

    src = tmp_path / "in.txt"
    src.write_text("a\nb\nc\n")
    spec = EmbedSpec(input=str(src), output=str(tmp_path / "out.npy"), chunk_size=chunk_size, model=model)
    ident = JobIdentity(**spec.model_dump(), format="npy", dim=8, precision="fp32")
    _open_job(spec, "npy", ident, job_paths(spec.output), 8, False)
    return spec


def test_embed_resume_refuses_a_journal_of_other_settings_naming_the_setting(tmp_path):
    from spanflow.tasks.embed.job import embed_file

    spec = start_a_job(tmp_path, chunk_size=4)
    with pytest.raises(ConfigError) as e:
        embed_file(Stub(), spec.model_copy(update={"chunk_size": 2}), resume=True, calibrate=False, progress=False,
                   log=lambda m: None)
    assert str(e.value) == (f"{spec.output}.progress.json belongs to a job with other settings (chunk_size 4 then, "
                            "2 now); give --chunk-size 4 to go on with it, or drop --resume to start over")


def test_embed_resume_of_another_job_is_refused_before_the_model_loads(tmp_path, monkeypatch, capsys):
    from spanflow.cli.main import main
    from spanflow.models.encoder import build_tiny

    enc, tok = build_tiny(["a b c"], hidden=16, embedding=16, bigram_buckets=101)
    enc.save_pretrained(tmp_path / "enc")
    tok.save_pretrained(tmp_path / "enc")
    spec = start_a_job(tmp_path, chunk_size=4, model=str(tmp_path / "enc"))
    monkeypatch.setattr("spanflow.runtime.resolve.resolve_runtime",
                        lambda *a, **kw: pytest.fail("the model was set up before the journal was checked"))
    run = ["embed", "--model", str(tmp_path / "enc"), "--input", spec.input, "--output", spec.output, "--resume"]
    assert main(run + ["--chunk-size", "2"]) == 2
    assert capsys.readouterr().err == (f"error: {spec.output}.progress.json belongs to a job with other settings "
                                       "(chunk_size 4 then, 2 now); give --chunk-size 4 to go on with it, or drop "
                                       "--resume to start over\n")
    with open(spec.input, "a") as f:
        f.write("d\n")
    assert main(run + ["--chunk-size", "4"]) == 2
    assert "in.txt changed since the interrupted job began (6 -> 8 bytes)" in capsys.readouterr().err


def test_embed_resume_refuses_a_corrupt_journal(tmp_path):
    from spanflow.tasks.embed.job import embed_file

    spec = start_a_job(tmp_path)
    journal = tmp_path / "out.npy.progress.json"
    journal.write_text(journal.read_text()[:40])  # cut short
    with pytest.raises(ConfigError, match="out.npy.progress.json is damaged .*invalid JSON.*drop --resume"):
        embed_file(Stub(), spec, resume=True, calibrate=False, progress=False, log=lambda m: None)
    (tmp_path / "b").mkdir()
    spec = start_a_job(tmp_path / "b")
    (tmp_path / "b" / "out.npy.progress.chunks.json").write_text('{"done": {"0": {"bytes": [0]}}}')
    with pytest.raises(ConfigError, match=r"chunks.json is damaged .*'done.0.bytes\[1\]' is missing"):
        embed_file(Stub(), spec, resume=True, calibrate=False, progress=False, log=lambda m: None)


def test_the_input_fingerprint_is_a_schema_value(tmp_path):
    (tmp_path / "f").write_bytes(b"abc")
    fp = fingerprint(str(tmp_path / "f"))
    assert fp.size == 3 and len(fp.sha256) == 64 and Fingerprint.model_validate(fp.model_dump()) == fp


# request bodies

LIMITS = Limits(max_texts=3, max_text_chars=10)


def test_a_valid_body_passes_with_the_other_fields_kept():
    r = read_body({"input": "a b", "model": "m", "encoding_format": "base64"}, "input", LIMITS, ("encoding_format",))
    assert (r.texts, r.model, r.model_extra) == (["a b"], "m", {"encoding_format": "base64"})
    assert read_body({"texts": ["a", "b"]}, "texts", LIMITS).texts == ["a", "b"]
    assert read_body({"texts": ["a"], "k": 3}, "texts", LIMITS, None).model_extra == {"k": 3}  # options unnamed
    with pytest.raises(InvalidRequest, match="unknown field 'k'"):
        read_body({"texts": ["a"], "k": 3}, "texts", LIMITS)
    assert read_body({"texts": []}, "texts", LIMITS).texts == []
    assert body_schema("texts") is body_schema("texts")


@pytest.mark.parametrize("body, field, expect", [
    ({}, "input", "'input' is missing"),
    ({"texts": ["a"]}, "input", "'input' is missing"),  # another route's field
    ({"input": 3}, "input", "'input' must be a string or a list of strings, got 3"),
    ({"input": [{"a": 1}]}, "input", "'input': text 0 must be a string, got {\"a\": 1}"),
    ({"input": [1, 2]}, "input", "'input': holds token ids; this server tokenizes itself"),
    ({"input": [[1, 2]]}, "input", "'input': holds token ids"),
    ({"texts": ["a"] * 4}, "texts", "'texts': 4 texts in one request; the limit is 3 (--max-texts)"),
    ({"texts": ["x" * 11]}, "texts", "'texts': text 0 has 11 characters; the limit is 10 (--max-text-chars)"),
    ({"texts": ["a", "\ud800"]}, "texts", "'texts': text 1 is not valid Unicode: a lone surrogate at character 0"),
    ({"texts": ["a"], "model": 5}, "texts", "'model' must be a model name (a string), got 5"),
    ({"texts": ["a"] * 2 + [None]}, "texts", "'texts': text 2 must be a string, got null"),  # which one, as JSON
    ({"texts": "a", "model": ["\ud800x"]}, "texts", "'model' must be a model name (a string), got [\"\\ud800x\"]"),
])
def test_an_invalid_body_names_the_field(body, field, expect):
    """`field`: where the route reads its texts."""
    with pytest.raises(InvalidRequest) as e:
        read_body(body, field, LIMITS)
    assert expect in e.value.message, e.value.message
    assert e.value.field == expect.split("'")[1]


@pytest.mark.parametrize("body, expect", [
    ({}, {"encoding_format": "float", "dimensions": None}),
    ({"encoding_format": None, "dimensions": 4, "user": "u"}, {"encoding_format": "float", "dimensions": 4}),
    ({"encoding_format": "base64", "dimensions": 8}, {"encoding_format": "base64", "dimensions": 8}),
])
def test_valid_embeddings_options_pass(body, expect):
    assert read_options(body, 8) == expect


@pytest.mark.parametrize("body, expect", [
    ({"encoding_format": "fp16"}, "'encoding_format' must be \"float\" or \"base64\", got \"fp16\""),
    ({"dimensions": 0}, "'dimensions' must be an integer from 1 to 8 (the model's width), got 0"),
    ({"dimensions": 9}, "'dimensions' must be an integer from 1 to 8 (the model's width), got 9"),
    ({"dimensions": True}, "'dimensions' must be an integer from 1 to 8"),
    ({"dimensions": "4"}, "'dimensions' must be an integer from 1 to 8 (the model's width), got \"4\""),
    ({"user": 3}, "'user' must be a string, got 3"),
])
def test_invalid_embeddings_options_name_the_field(body, expect):
    with pytest.raises(ConfigError) as e:
        read_options(body, 8)
    assert expect in str(e.value), str(e.value)


@pytest.mark.parametrize("body", [{}, {"encoding_format": ""}, {"encoding_format": "base64", "dimensions": 3},
                                  {"encoding_format": "x"}, {"dimensions": 0}, {"dimensions": 9},
                                  {"dimensions": False}, {"dimensions": 2.0}])
def test_embeddings_options_read_as_the_embed_task_reads_them(body):
    from spanflow.tasks.embed.task import EmbedTask

    model = SimpleNamespace(dim=8)
    try:
        want = EmbedTask().request_params(model, body)
    except ConfigError:
        with pytest.raises(ConfigError):
            read_options(body, 8)
        return
    assert read_options(body, 8) == want


# request bodies through the server

@pytest.fixture(scope="module")
def server(tmp_path_factory):
    pytest.importorskip("fastapi")
    from fastapi.testclient import TestClient

    from spanflow.models.encoder import build_tiny
    from spanflow.serving.app import ServeOptions, create_app
    from spanflow.serving.services import load_service

    d = tmp_path_factory.mktemp("emb")
    enc, tok = build_tiny(TEXTS, hidden=16, embedding=16, bigram_buckets=101)
    enc.save_pretrained(d)
    tok.save_pretrained(d)
    app = create_app([load_service(f"emb={d}", device="cpu")],
                     ServeOptions(max_texts=3, max_text_chars=50, max_request_bytes=2000))
    with TestClient(app) as c:
        yield c


@pytest.mark.parametrize("body, status, field, expect", [
    ({"input": ["a"] * 4}, 422, "input", "'input': 4 texts in one request; the limit is 3 (--max-texts)"),
    ({"input": ["x" * 51]}, 422, "input", "(--max-text-chars)"),
    ({"input": [1, 2]}, 422, "input", "holds token ids"),
    ({"texts": ["a"]}, 422, "input", "'input' is missing"),
    ({"input": "a", "model": ["emb"]}, 422, "model", "'model' must be a model name (a string), got [\"emb\"]"),
    ({"input": "a", "dimensions": 0}, 422, "dimensions", "must be an integer from 1 to 16"),
    ({"input": "a", "encoding_format": "hex"}, 422, "encoding_format", "encoding_format"),
    ({"input": "a", "encoding_format": 0}, 422, "encoding_format", "encoding_format"),  # no format, not float
    ({"input": [True, False]}, 422, "input", "'input': text 0 must be a string, got true"),  # not token ids
    ({"input": "a", "dimension": 8}, 422, "dimension", "unknown field 'dimension' (did you mean 'dimensions'?); "
                                                      "this endpoint reads 'input', 'model', 'encoding_format', "
                                                      "'dimensions', 'user'"),
])
def test_the_server_answers_an_invalid_body_with_a_4xx_naming_the_field(server, body, status, field, expect):
    r = server.post("/v1/embeddings", json=body)
    err = r.json()["error"]
    assert r.status_code == status and err["code"] == "invalid_request" and expect in err["message"], r.text
    assert err["param"] == field


def test_the_server_keeps_its_status_codes_for_bodies_that_are_not_json_objects(server):
    bad = {b"{nope": "malformed JSON", b"[1, 2]": "must be a JSON object", b"\"a\"": "must be a JSON object"}
    for raw, expect in bad.items():
        r = server.post("/v1/embeddings", content=raw, headers={"content-type": "application/json"})
        assert r.status_code == 400 and expect in r.json()["error"]["message"], r.text
    r = server.post("/v1/embeddings", json={"input": ["y" * 40] * 2, "pad": "z" * 3000})
    assert r.status_code == 413
    r = server.post("/v1/embeddings", json={"input": ["a", "b c"], "model": "text-embedding-3-small",
                                            "dimensions": 4, "user": "u"})
    assert r.status_code == 200 and [len(d["embedding"]) for d in r.json()["data"]] == [4, 4]


@pytest.mark.parametrize("task, key, value, said", [
    ("ner", "id2label", list(range(5)), "'id2label' must be a non-empty list of distinct names"),
    ("ner", "id2label", ["O", "DATE", "B-PER", "I-PER", "X"], "id2label in spanflow.json holds 'DATE', which is not O "
                                                               "or B-/I- plus one of its labels"),
    ("ner", "lines", "false", "lines in spanflow.json must be true or false, got 'false'"),
    ("re", "threshold", None, "threshold must be a number between 0 and 1, got None (in spanflow.json)"),
    ("re", "threshold", "0.5", "threshold must be a number between 0 and 1, got '0.5' (in spanflow.json)"),
])
def test_a_models_own_settings_of_the_wrong_kind_are_one_error_naming_them(tmp_path, task, key, value, said):
    from helpers import tiny_bert

    from spanflow.tasks.ner import NerModel
    from spanflow.tasks.re import ReModel

    enc, tok = tiny_bert(TEXTS, hidden=16, layers=1, heads=2)
    if task == "ner":
        model, cls = NerModel(encoder=enc, tokenizer=tok, labels=["PER"], limit=64, head_type="softmax"), NerModel
    else:
        model, cls = ReModel(encoder=enc, tokenizer=tok, relations=["born_in"], limit=64), ReModel
    model.save(str(tmp_path / "m"))
    cfg = json.loads((tmp_path / "m" / CONFIG).read_text())
    (tmp_path / "m" / CONFIG).write_text(json.dumps({**cfg, key: value}))
    with pytest.raises(ModelDirError) as e:
        cls.load(str(tmp_path / "m"), precision="fp32")
    assert str(tmp_path / "m") in str(e.value) and said in str(e.value)
