import itertools
import json
import logging
import os
import re

import numpy as np
import pytest
import torch

from spanflow.cli.main import main
from spanflow.data.synthetic import synthetic_ner
from spanflow.tasks.embed import Embedder
from spanflow.errors import ConfigError, ModelDirError
from spanflow.tasks.embed.job import EmbedSpec, embed_file
from helpers import tiny_bert
from spanflow.tasks.embed.pooling import Pooling

TEXTS = [e.text for e in synthetic_ner(40, seed=8, max_clauses=3)]


def make_dir(path, modules=None, max_seq_length=None, pooling="mean"):
    enc, tok = tiny_bert(TEXTS, hidden=32, layers=2, heads=2, seed=0)
    enc.save_pretrained(path)
    tok.save_pretrained(path)
    if modules is not None:
        (path / "modules.json").write_text(json.dumps(modules))
        (path / "1_Pooling").mkdir()
        keys = {"mean": "pooling_mode_mean_tokens", "cls": "pooling_mode_cls_token",
                "max": "pooling_mode_max_tokens", "lasttoken": "pooling_mode_lasttoken"}
        (path / "1_Pooling" / "config.json").write_text(json.dumps({keys[pooling]: True, "word_embedding_dimension": 32}))
        if max_seq_length:
            (path / "sentence_bert_config.json").write_text(json.dumps({"max_seq_length": max_seq_length}))
    return str(path)


ST_MODULES = [{"idx": 0, "name": "0", "path": "", "type": "sentence_transformers.models.Transformer"},
              {"idx": 1, "name": "1", "path": "1_Pooling", "type": "sentence_transformers.models.Pooling"},
              {"idx": 2, "name": "2", "path": "2_Normalize", "type": "sentence_transformers.models.Normalize"}]


@pytest.fixture(scope="module")
def st_dir(tmp_path_factory):
    return make_dir(tmp_path_factory.mktemp("st"), ST_MODULES, max_seq_length=24, pooling="cls")


@pytest.fixture(scope="module")
def hf_dir(tmp_path_factory):
    return make_dir(tmp_path_factory.mktemp("hf"))


def test_pooling_modes_ignore_padding():
    x = torch.tensor([[[1.0, 0.0], [3.0, 2.0], [100.0, 100.0]]])  # last position is padding
    m = torch.tensor([[1, 1, 0]])
    f = {"token_embeddings": x, "attention_mask": m}
    assert Pooling(mode="mean")(f).tolist() == [[2.0, 1.0]]
    assert Pooling(mode="cls")(f).tolist() == [[1.0, 0.0]]
    assert Pooling(mode="max")(f).tolist() == [[3.0, 2.0]]
    assert Pooling(mode="lasttoken")(f).tolist() == [[3.0, 2.0]]
    n = Pooling(mode="mean", normalize=True)(f)
    assert torch.allclose(n.norm(dim=-1), torch.ones(1))


def test_st_dir_config_is_read(st_dir, hf_dir):
    st = Embedder.load(st_dir)
    assert st.max_length == 24 and st.module.pooling.mode == "cls" and st.module.pooling.normalize
    hf = Embedder.load(hf_dir)
    assert hf.module.pooling.mode == "mean" and not hf.module.pooling.normalize and hf.max_length == 512


def test_a_sentence_transformers_6_directory_is_read(tmp_path):
    # sentence-transformers 6 names the pooling mode, and keeps the max length in the tokenizer's config
    d = make_dir(tmp_path / "st6", ST_MODULES)
    (tmp_path / "st6" / "1_Pooling" / "config.json").write_text(json.dumps({"embedding_dimension": 32,
                                                                            "pooling_mode": "max"}))
    tok = json.loads((tmp_path / "st6" / "tokenizer_config.json").read_text())
    (tmp_path / "st6" / "tokenizer_config.json").write_text(json.dumps({**tok, "model_max_length": 40}))
    st6 = Embedder.load(d)
    assert st6.module.pooling.mode == "max" and st6.max_length == 40 and st6.module.pooling.normalize
    (tmp_path / "st6" / "1_Pooling" / "config.json").write_text(json.dumps({"pooling_mode": ["cls"]}))
    assert Embedder.load(d).module.pooling.mode == "cls"  # a list of one mode, as version 6 also takes
    (tmp_path / "st6" / "1_Pooling" / "config.json").write_text(json.dumps({"pooling_mode": "weightedmean"}))
    with pytest.raises(ModelDirError, match="pooling 'weightedmean'; spanflow pools one of mean, cls, max or "
                                            "lasttoken"):
        Embedder.load(d)


def test_do_lower_case_lowers_the_texts_and_survives_a_save(tmp_path):
    d = make_dir(tmp_path / "st", ST_MODULES, max_seq_length=24)
    cased = Embedder.load(d, precision="fp32")
    assert not np.allclose(cased.encode("Grace HOPPER works"), cased.encode("grace hopper works"), atol=1e-4)
    (tmp_path / "st" / "sentence_bert_config.json").write_text(json.dumps({"max_seq_length": 24,
                                                                           "do_lower_case": True}))
    lower = Embedder.load(d, precision="fp32")  # as sentence-transformers: the text lowercased, then tokenized
    np.testing.assert_allclose(lower.encode("Grace HOPPER works"), cased.encode("grace hopper works"), atol=1e-6)
    lower.save(str(tmp_path / "saved"))
    again = Embedder.load(str(tmp_path / "saved"), precision="fp32")
    np.testing.assert_allclose(again.encode("Grace HOPPER works"), cased.encode("grace hopper works"), atol=1e-6)
    assert lower.with_precision("fp32").lowercase and again.lowercase
    # a bulk job's tokenizing stage (Ray) lowers the text as encode does
    assert lower.pretokenizer()(["Grace HOPPER works"])["input_ids"].to_pylist() == \
        cased.tokenize(["grace hopper works"])[0]


@pytest.mark.parametrize("name, content, said", [
    ("1_Pooling/config.json", {"pooling_mode_mean_tokens": True, "pooling_mode_weightedmean_tokens": True},
     "pooling mean and weightedmean_tokens; spanflow pools one of"),
    ("1_Pooling/config.json", {"pooling_mode_weightedmean_tokens": True}, "pooling weightedmean_tokens; spanflow"),
    ("modules.json", {"0": "Transformer"}, "expected a list of module objects"),
    ("modules.json", [ST_MODULES[0], ST_MODULES[2]], "names no Pooling module"),
    ("modules.json", [], "names no Pooling module"),
    ("sentence_bert_config.json", {"max_seq_length": "256"}, "max_seq_length must be a positive whole number, "
                                                             "got '256'"),
    ("sentence_bert_config.json", {"max_seq_length": -1}, "max_seq_length must be a positive whole number, got -1"),
    ("config_sentence_transformers.json", {"prompts": {"query": "query: "}, "default_prompt_name": "query"},
     "default_prompt_name 'query' puts 'query: ' before every text"),
])
def test_a_sentence_transformers_setting_spanflow_would_not_honour_is_one_error(tmp_path, name, content, said):
    d = make_dir(tmp_path / "st", ST_MODULES, max_seq_length=24)
    (tmp_path / "st" / name).write_text(json.dumps(content))
    with pytest.raises(ModelDirError, match=re.escape(said)):
        Embedder.load(d, precision="fp32")


def test_loading_leaves_the_random_state_and_names_a_broken_config(tmp_path):
    d = make_dir(tmp_path / "hf")
    torch.manual_seed(0)
    Embedder.load(d, precision="fp32")  # builds the encoder (random init) before its weights replace it
    after_load = torch.rand(3)
    torch.manual_seed(0)
    assert torch.equal(after_load, torch.rand(3))
    (tmp_path / "hf" / "config.json").write_text('{"hidden_size": 32,\n')
    with pytest.raises(ModelDirError, match=r"config\.json is unreadable: .*line 2"):  # not "the weights"
        Embedder.load(d, precision="fp32")
    (tmp_path / "hf" / "config.json").write_text("[]")
    with pytest.raises(ModelDirError, match=r"config\.json: must be a JSON object, got \[\]"):
        Embedder.load(d, precision="fp32")


def test_unsupported_module_is_a_clear_error(tmp_path):
    mods = ST_MODULES + [{"idx": 3, "name": "3", "path": "3_Dense", "type": "sentence_transformers.models.Dense"}]
    d = make_dir(tmp_path, mods)
    with pytest.raises(ModelDirError, match="Dense"):
        Embedder.load(d)


def test_batching_changes_nothing_and_order_is_kept(st_dir):
    emb = Embedder.load(st_dir)
    texts = TEXTS + ["", "   ", "x"]
    together = emb.encode(texts, max_tokens=64)
    alone = np.stack([emb.encode([t])[0] for t in texts])
    np.testing.assert_allclose(together, alone, atol=1e-5)
    assert np.allclose(np.linalg.norm(together, axis=1), 1, atol=1e-5)
    # empty and whitespace-only texts: the embedding of the special tokens alone
    np.testing.assert_allclose(together[-3], together[-2], atol=1e-6)
    assert np.isfinite(together).all()


def test_truncation_is_counted(st_dir):
    emb = Embedder.load(st_dir)
    emb.encode([" ".join(TEXTS[:5]), "short"])
    assert emb.truncated == 1


def test_oom_splits_and_lowers_budget(st_dir, monkeypatch, caplog):
    emb = Embedder.load(st_dir, precision="fp32")
    want = emb.encode(TEXTS, max_tokens=4096)
    real = emb._forward

    def flaky(model, ids, batch, autocast):
        if len(batch) > 6:
            raise torch.cuda.OutOfMemoryError("CUDA out of memory (simulated)")
        return real(model, ids, batch, autocast)

    monkeypatch.setattr(emb, "_forward", flaky)
    with caplog.at_level(logging.WARNING, logger="spanflow"):
        got = emb.encode(TEXTS, max_tokens=4096)
    np.testing.assert_allclose(got, want, atol=1e-5)
    assert emb.oom_budget is not None and emb.oom_budget < 4096
    assert "out of memory" in caplog.text and "lowered" in caplog.text


def test_reduced_precision_checked_against_fp32(st_dir, monkeypatch):
    emb = Embedder.load(st_dir, precision="bf16", device="cpu")
    cal = emb.check_precision(TEXTS)
    assert cal["precision"] == "bf16" and 0.9 < cal["mean_cosine"] <= 1.0 + 1e-6 and cal["min_cosine"] <= cal["mean_cosine"]
    monkeypatch.setitem(__import__("spanflow.tasks.embed.model").tasks.embed.model.MIN_MEAN_COSINE, "bf16", 1.01)
    with pytest.raises(ConfigError, match="below 1.01"):
        emb.check_precision(TEXTS)
    assert emb.check_precision(TEXTS, force=True)["mean_cosine"] < 1.01
    assert Embedder.load(st_dir, precision="fp32").check_precision(TEXTS) is None


def test_bf16_weights_cast_once_give_the_autocast_result(st_dir):
    emb = Embedder.load(st_dir, precision="bf16", device="cpu")
    linears = [m for m in emb.module.modules() if isinstance(m, torch.nn.Linear)]
    assert linears and all(m.weight.dtype == torch.bfloat16 for m in linears)
    assert all(p.dtype == torch.float32 for p in emb._fp32.parameters())  # the calibration reference
    ids, _ = emb.tokenize(TEXTS)
    batch = list(range(len(ids)))
    fast = emb._forward(emb.module, ids, batch, True)
    autocast_fp32 = emb._forward(emb._fp32, ids, batch, True)  # autocast casting fp32 weights per call
    assert torch.equal(fast, autocast_fp32)


def test_int8_is_a_cpu_quantization_not_a_precision(st_dir):
    emb = Embedder.load(st_dir, quantize="int8", device="cpu")
    assert any("quantized" in type(m).__module__ for m in emb.module.modules())
    assert emb.policy.name == "fp32" and emb.precision_name == "int8"
    cal = emb.calibrate(TEXTS)
    assert cal["precision"] == "int8" and cal["threshold"] == 0.99 and cal["mean_cosine"] > 0.99  # a sound model
    with pytest.raises(ConfigError, match="not a precision: use --quantize int8"):
        Embedder.load(st_dir, precision="int8")
    with pytest.raises(ConfigError, match="computes in fp32"):
        Embedder.load(st_dir, precision="bf16", quantize="int8")


def test_a_twin_in_another_precision_matches_a_fresh_load(st_dir):
    base = Embedder.load(st_dir, precision="fp32", device="cpu")
    for precision, quantize in (("bf16", None), ("fp32", "int8")):
        twin = base.with_precision(precision, quantize)
        fresh = Embedder.load(st_dir, precision=precision, quantize=quantize, device="cpu")
        assert twin.precision_name == fresh.precision_name and twin.max_length == fresh.max_length
        np.testing.assert_allclose(twin.encode(TEXTS), fresh.encode(TEXTS), atol=1e-6)
        assert twin._fp32.encoder is base.module.encoder  # the fp32 weights are shared, not read again
    np.testing.assert_allclose(base.encode(TEXTS), Embedder.load(st_dir, precision="fp32").encode(TEXTS), atol=1e-6)


@pytest.fixture(scope="module")
def int8_hurts_dir(tmp_path_factory):
    """A model int8 cannot hold: Linear layers that dominate the residual stream, each with one
    weight far above the rest, so that per-tensor int8 rounds every other weight to zero."""
    d = tmp_path_factory.mktemp("int8_hurts")
    enc, tok = tiny_bert(TEXTS, hidden=32, layers=2, heads=2, seed=0)
    with torch.no_grad():
        for m in enc.modules():
            if isinstance(m, torch.nn.Linear):
                m.weight.mul_(10)
                m.weight[0, 0] = 100.0
    enc.save_pretrained(d)
    tok.save_pretrained(d)
    return str(d)


def test_the_int8_gate_refuses_a_model_that_misses_it_unless_forced(int8_hurts_dir, st_dir, tmp_path, capsys):
    src = write_lines(tmp_path / "in.txt", TEXTS)
    out = tmp_path / "o.npy"
    args = ["embed", "--model", int8_hurts_dir, "--input", src, "--output", str(out), "--quantize", "int8"]
    assert main(args) == 2
    err = capsys.readouterr().err
    assert "int8 embeddings reach a mean cosine of 0." in err and "below 0.99" in err and "--force" in err
    assert "Traceback" not in err and not out.exists()
    assert main(args + ["--force"]) == 0
    captured = capsys.readouterr()
    assert np.load(out).shape[0] == len(TEXTS) and "quantize int8" in captured.out
    assert (f"on {len(TEXTS)} input texts and {64 - len(TEXTS)} built-in sentences (the input has fewer than 64), "
            "gate 0.99, accepted by --force") in captured.err
    # the same quantization of a sound model passes the gate without --force
    assert main(["embed", "--model", st_dir, "--input", src, "--output", str(out), "--quantize", "int8"]) == 0
    assert "accepted by --force" not in capsys.readouterr().err


def test_precision_int8_names_quantize(st_dir, tmp_path, capsys):
    src = write_lines(tmp_path / "in.txt", TEXTS[:3])
    assert main(["embed", "--model", st_dir, "--input", src, "--output", str(tmp_path / "o.npy"),
                 "--precision", "int8"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "--quantize int8" in err[0] and "not a precision" in err[0]


def write_lines(path, lines):
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return str(path)


def test_embed_file_npy_ids_and_error_rows(st_dir, tmp_path):
    emb = Embedder.load(st_dir)
    lines = [json.dumps({"id": f"d{i}", "text": t}) for i, t in enumerate(TEXTS[:9])]
    lines.insert(4, "{not json")
    src = write_lines(tmp_path / "in.jsonl", lines)
    out = str(tmp_path / "out.npy")
    s = embed_file(emb, EmbedSpec(input=src, output=out, chunk_size=4), progress=False, log=lambda m: None)
    arr = np.load(out)
    assert arr.shape == (10, emb.dim) and s["texts"] == 10 and s["errors"] == 1
    np.testing.assert_allclose(np.delete(arr, 4, axis=0), emb.encode(TEXTS[:9]), atol=1e-5)
    assert np.isnan(arr[4]).all()
    ids = (tmp_path / "out.ids.txt").read_text().split("\n")[:-1]
    assert ids[:4] == ["d0", "d1", "d2", "d3"] and ids[4] == "5" and ids[5] == "d4"
    err = [json.loads(x) for x in (tmp_path / "out.errors.jsonl").read_text().splitlines()]
    assert err == [{"id": "5", "line": 5, "error": err[0]["error"]}] and "invalid JSON" in err[0]["error"]
    assert not list(tmp_path.glob("*.partial")) and not list(tmp_path.glob("*.progress.json"))


def test_an_id_with_any_line_break_keeps_the_ids_file_one_line_per_vector(st_dir, tmp_path):
    """Only \\n was replaced: an id holding \\r or U+2028 gave an ids file of more lines than
    vectors (as splitlines or pandas read it), unsaid."""
    emb = Embedder.load(st_dir)
    ids = ["a\rb", "c\u2028d", "e\x85f", "g\r\nh", "plain"]
    src = write_lines(tmp_path / "in.jsonl", [json.dumps({"id": i, "text": t}) for i, t in zip(ids, TEXTS)])
    said = []
    embed_file(emb, EmbedSpec(input=src, output=str(tmp_path / "v.npy")), progress=False, log=said.append)
    got = (tmp_path / "v.ids.txt").read_text(encoding="utf-8").splitlines()
    assert got == ["a b", "c d", "e f", "g  h", "plain"] and len(np.load(tmp_path / "v.npy")) == 5
    assert any(s.startswith("note: 4 ids held line breaks, written as spaces in") for s in said), said


def test_a_text_of_invisible_characters_only_counts_as_empty(st_dir, tmp_path):
    """'\\u200b\\u200d\\ufeff' gets the empty text's vector, but the summary counted it as a text."""
    emb = Embedder.load(st_dir)
    src = write_lines(tmp_path / "in.jsonl", [json.dumps({"text": t}) for t in ["", "\u200b\u200d\ufeff", " ", "a b"]])
    s = embed_file(emb, EmbedSpec(input=src, output=str(tmp_path / "v.npy")), progress=False, log=lambda m: None)
    assert s["empty"] == 3 and s["texts"] == 4


def test_a_very_long_text_is_tokenized_only_as_far_as_its_max_length_reads(st_dir):
    """A megabyte line was tokenized whole (its overflowing pieces held: about 150 MiB a MB) for
    the 256 tokens the model reads; the ids it gets are the same."""
    from spanflow.batching.align import CHARS_PER_TOKEN
    from spanflow.tasks.embed.model import TokenIds

    emb = Embedder.load(st_dir)
    long = " ".join(TEXTS * 2000)
    nospace = "ab," * (emb.max_length * CHARS_PER_TOKEN)  # no white space to cut at: read whole
    whole = [e.ids for e in emb._backend.encode_batch([long, nospace, "a b"])]
    seen = []
    real = emb._backend

    class Recording:
        truncation = real.truncation

        def encode_batch(self, texts):
            seen.extend(len(t) for t in texts)
            return real.encode_batch(texts)

    emb._backend = Recording()
    ids, cut = emb.tokenize([long, nospace, "a b"])
    assert ids == whole and cut == 2
    assert seen[0] <= emb.max_length * CHARS_PER_TOKEN < len(long)
    got = TokenIds(Recording())([long, "a b"])
    assert got["input_ids"].to_pylist() == [whole[0], whole[2]] and got["truncated"].to_pylist() == [True, False]


def test_embed_file_csv_column_to_jsonl(st_dir, tmp_path):
    emb = Embedder.load(st_dir)
    src = tmp_path / "in.csv"
    src.write_text('a,"first, with comma",1\nb,second,2\n', encoding="utf-8")
    out = tmp_path / "out.jsonl"
    embed_file(emb, EmbedSpec(input=str(src), output=str(out), column=1, dtype="float32"), progress=False,
               log=lambda m: None)
    recs = [json.loads(x) for x in out.read_text().splitlines()]
    assert [r["id"] for r in recs] == ["1", "2"]
    np.testing.assert_allclose(np.array([r["embedding"] for r in recs]),
                               emb.encode(["first, with comma", "second"]), atol=1e-5)


def interrupt_at(call: int, emb, spec: EmbedSpec) -> None:
    """embed_file on `spec`, stopped by Ctrl-C at the embedder's `call`-th batch as a killed job
    stops (its finished chunks journaled); the embedder is left as it was."""
    real, calls = emb._embed_ids, []

    def dies(ids, *a, **kw):
        calls.append(ids)
        if len(calls) == call:
            raise KeyboardInterrupt
        return real(ids, *a, **kw)

    emb._embed_ids = dies
    try:
        with pytest.raises(KeyboardInterrupt):
            embed_file(emb, spec, progress=False, log=lambda m: None)
    finally:
        emb._embed_ids = real


def test_embed_file_resume_skips_finished_chunks(st_dir, tmp_path):
    src = write_lines(tmp_path / "in.txt", TEXTS[:23])
    out = str(tmp_path / "out.npy")
    spec = EmbedSpec(input=src, output=out, chunk_size=5, dtype="float16", model=st_dir)
    emb = Embedder.load(st_dir, precision="fp32")
    interrupt_at(3, emb, spec)  # a kill after two finished chunks
    journal = json.loads((tmp_path / "out.npy.progress.chunks.json").read_text())
    assert sorted(journal["done"]) == ["0", "1"] and not (tmp_path / "out.npy").exists()
    emb2 = Embedder.load(st_dir, precision="fp32")
    seen = []
    real2 = emb2._embed_ids
    emb2._embed_ids = lambda ids, *a, **kw: seen.append(len(ids)) or real2(ids, *a, **kw)
    said = []
    embed_file(emb2, spec, resume=True, progress=False, log=said.append)
    assert seen == [5, 5, 3]  # chunks 3..5 only
    assert not any(x.startswith("--resume: no interrupted job") for x in said)
    arr = np.load(out)
    assert arr.dtype == np.float16 and arr.shape[0] == 23
    np.testing.assert_allclose(arr.astype(np.float32), emb.encode(TEXTS[:23]), atol=2e-3)
    embed_file(emb2, spec, resume=True, progress=False, log=said.append)  # finished: nothing to go on with
    assert f"--resume: no interrupted job of {out} to go on with; embedding the whole input" in said
    interrupt_at(3, emb, spec)
    said.clear()
    embed_file(emb2, spec, progress=False, log=said.append)  # without --resume: starts over, and says so
    assert (f"note: {out} has an interrupted job's parts; this run starts over and replaces them (--resume goes on "
            "with them)") in said
    assert np.load(out).shape[0] == 23


def test_an_input_cut_while_it_is_read_is_an_error_not_rows_of_zeros(st_dir, tmp_path, monkeypatch):
    import spanflow.tasks.embed.job as job_module
    from spanflow.errors import DataError

    src = write_lines(tmp_path / "in.txt", TEXTS[:23])
    spec = EmbedSpec(input=src, output=str(tmp_path / "out.npy"), chunk_size=5, model=st_dir)
    real, reads = job_module._rows, []

    def cut_after_counting(s):  # the job counts 23 records; the file is cut to 12 before its chunks are read
        reads.append(s)
        return itertools.islice(real(s), 12) if len(reads) == 3 else real(s)  # (checked, counted, read)

    monkeypatch.setattr(job_module, "_rows", cut_after_counting)
    with pytest.raises(DataError, match=r"in\.txt: holds another number of records than when this job began \(23\)"):
        embed_file(Embedder.load(st_dir, precision="fp32"), spec, progress=False, log=lambda m: None)
    assert not (tmp_path / "out.npy").exists()


def test_embed_resume_refuses_an_input_that_changed(st_dir, tmp_path, capsys):
    lines = TEXTS[:23]
    src = write_lines(tmp_path / "in.txt", lines)
    out = str(tmp_path / "out.npy")
    spec = EmbedSpec(input=src, output=out, chunk_size=5, model=st_dir)
    emb = Embedder.load(st_dir, precision="fp32")
    interrupt_at(3, emb, spec)
    for changed in (lines[::-1], lines[:7]):  # the same lines reversed (same size), and fewer lines
        write_lines(tmp_path / "in.txt", changed)
        assert main(["embed", "--model", st_dir, "--input", src, "--output", out, "--chunk-size", "5", "--resume",
                     "--precision", "fp32"]) == 2
        err = capsys.readouterr().err
        assert "in.txt changed since the interrupted job began" in err and "Traceback" not in err
        assert not (tmp_path / "out.npy").exists()
    write_lines(tmp_path / "in.txt", lines)  # the original again: the resume goes on
    assert main(["embed", "--model", st_dir, "--input", src, "--output", out, "--chunk-size", "5", "--resume",
                 "--precision", "fp32"]) == 0
    np.testing.assert_allclose(np.load(out), emb.encode(lines), atol=1e-5)


def test_embed_cli(st_dir, tmp_path, capsys):
    src = write_lines(tmp_path / "in.txt", TEXTS[:5])
    out = tmp_path / "o.npy"
    assert main(["embed", "--model", st_dir, "--input", src, "--output", str(out)]) == 0
    assert np.load(out).shape[0] == 5 and "embedded 5 texts" in capsys.readouterr().out
    assert main(["embed", "--model", st_dir, "--input", str(tmp_path / "none.txt"), "--output", str(out)]) == 2
    assert "none.txt: file not found" in capsys.readouterr().err
    assert main(["embed", "--model", st_dir, "--input", src, "--output", str(tmp_path / "o.csv")]) == 2
    assert main(["embed", "--model", str(tmp_path / "nomodel"), "--input", src, "--output", str(out)]) == 2
    # side files are named by the stem: one that is the input, or another output's, is not written over
    side = tmp_path / "o2.ids.txt"
    side.write_text("\n".join(TEXTS[:5]) + "\n")
    assert main(["embed", "--model", st_dir, "--input", str(side), "--output", str(tmp_path / "o2.npy")]) == 2
    assert f"its side file {side} is the input" in capsys.readouterr().err and side.read_text().startswith(TEXTS[0])
    bad = tmp_path / "bad.txt"  # one error record: o.errors.jsonl
    bad.write_bytes(("\n".join(TEXTS[:2]) + "\n").encode() + b"\xff\n")
    assert main(["embed", "--model", st_dir, "--input", str(bad), "--output", str(tmp_path / "o.parquet")]) == 0
    errors = (tmp_path / "o.errors.jsonl").read_text()
    assert main(["embed", "--model", st_dir, "--input", src, "--output", str(tmp_path / "o.jsonl")]) == 0
    assert (tmp_path / "o.errors.jsonl").read_text() == errors  # o.parquet's, kept (a run without errors removed it)


def test_embed_cli_max_length_cuts_texts_and_is_part_of_the_job(st_dir, tmp_path, capsys):
    src = write_lines(tmp_path / "in.txt", TEXTS[:12])
    out = str(tmp_path / "o.npy")
    assert main(["embed", "--model", st_dir, "--input", src, "--output", out, "--max-length", "8",
                 "--precision", "fp32"]) == 0
    said = capsys.readouterr().out
    summary = json.loads(said.strip().splitlines()[-1])
    assert "max length 8," in said and summary["truncated"] == 12  # every text is longer than 6 word pieces
    emb = Embedder.load(st_dir, precision="fp32")
    whole = emb.encode(TEXTS[:12])
    emb.set_max_length(8)
    np.testing.assert_allclose(np.load(out), emb.encode(TEXTS[:12]), atol=1e-5)
    assert not np.allclose(np.load(out), whole, atol=1e-3)
    # under the floor, or over the model's limit: one line, before any work
    for n, said in (("4", "--max-length must be at least 8"), ("100000", "100000")):
        assert main(["embed", "--model", st_dir, "--input", src, "--output", str(tmp_path / "x.npy"),
                     "--max-length", n]) == 2
        err = capsys.readouterr().err
        assert said in err and "Traceback" not in err and not (tmp_path / "x.npy").exists()


def test_embed_resume_refuses_another_max_length(st_dir, tmp_path, capsys):
    src = write_lines(tmp_path / "in.txt", TEXTS[:23])
    out = str(tmp_path / "out.npy")
    emb = Embedder.load(st_dir, precision="fp32")
    interrupt_at(3, emb, EmbedSpec(input=src, output=out, chunk_size=5, model=st_dir, max_length=8))
    assert emb.max_length == 8  # the spec's length is the embedder's
    for other in ([], ["--max-length", "16"]):  # the model's own (24), or another
        assert main(["embed", "--model", st_dir, "--input", src, "--output", out, "--chunk-size", "5", "--resume",
                     "--precision", "fp32", *other]) == 2
        assert (f"max_length 8 then, {other[1] if other else 24} now); give --max-length 8 to go on with it"
                in capsys.readouterr().err)
        assert not (tmp_path / "out.npy").exists()
    assert main(["embed", "--model", st_dir, "--input", src, "--output", out, "--chunk-size", "5", "--resume",
                 "--precision", "fp32", "--max-length", "8"]) == 0
    np.testing.assert_allclose(np.load(out), emb.encode(TEXTS[:23]), atol=1e-5)


def test_a_resume_naming_the_field_as_a_column_goes_on(st_dir, tmp_path):
    """`--column text` of a JSONL input is its default `--field text`: the same job, resumed."""
    src = tmp_path / "in.jsonl"
    src.write_text("".join(json.dumps({"text": t}) + "\n" for t in TEXTS[:12]), encoding="utf-8")
    out = str(tmp_path / "out.npy")
    emb = Embedder.load(st_dir, precision="fp32")
    interrupt_at(2, emb, EmbedSpec(input=str(src), output=out, chunk_size=5, model=st_dir))
    said = []
    embed_file(emb, EmbedSpec(input=str(src), output=out, chunk_size=5, model=st_dir, column="text"), resume=True,
               progress=False, log=said.append)  # was refused: (field 'text' then, ...; column None then, 'text' now)
    np.testing.assert_allclose(np.load(out), emb.encode(TEXTS[:12]), atol=1e-5)


def test_embed_file_checks_what_the_command_line_checks(st_dir, tmp_path):
    """From Python: an output that is the input was written over it; a resume with another
    embedder (no spec.model) mixed two models' vectors; max_tokens=0 left the job's reserved
    files behind; log=None raised; texts_per_s counted error records, which the line leaves out."""
    src = tmp_path / "in.jsonl"
    src.write_text("".join(json.dumps({"text": t}) + "\n" for t in TEXTS[:12]) + '{"text": 5}\n', encoding="utf-8")
    emb = Embedder.load(st_dir, precision="fp32")
    with pytest.raises(ConfigError, match=r"embedder takes a loaded Embedder .*, got str"):  # was AttributeError
        embed_file(st_dir, EmbedSpec(input=str(src), output=str(tmp_path / "o.npy")), progress=False, log=None)
    with pytest.raises(ConfigError, match="spec takes an EmbedSpec, got dict"):
        embed_file(emb, {"input": str(src), "output": str(tmp_path / "o.npy")}, progress=False, log=None)
    with pytest.raises(ConfigError, match="is the input: the job would write over what it reads"):
        embed_file(emb, EmbedSpec(input=str(src), output=str(src)), progress=False, log=None)
    out = str(tmp_path / "out.npy")
    with pytest.raises(ConfigError, match="max_tokens"):
        embed_file(emb, EmbedSpec(input=str(src), output=out), max_tokens=0, progress=False, log=None)
    assert sorted(os.listdir(tmp_path)) == ["in.jsonl"]  # no reserved .npy left behind
    interrupt_at(2, emb, EmbedSpec(input=str(src), output=out, chunk_size=5))
    other = Embedder.load(st_dir, precision="fp32")  # the same settings, other weights
    with torch.no_grad():
        next(other.module.parameters()).add_(1.0)
    with pytest.raises(ConfigError, match=r"the model \(in memory\) changed .* \(its weights differ\)"):
        embed_file(other, EmbedSpec(input=str(src), output=out, chunk_size=5), resume=True, progress=False, log=None)
    s = embed_file(emb, EmbedSpec(input=str(src), output=out, chunk_size=5), resume=True, progress=False, log=None)
    assert s["errors"] == 1 and s["texts_per_s"] == pytest.approx((s["texts"] - 1) / s["seconds"])


def test_a_length_set_on_the_embedder_is_the_jobs_as_well(st_dir, tmp_path, capsys):
    """The journal keeps the length the texts were cut at, whether the spec or the embedder set it."""
    src = write_lines(tmp_path / "in.txt", TEXTS[:12])
    out = str(tmp_path / "out.npy")
    emb = Embedder.load(st_dir, precision="fp32")
    emb.set_max_length(8)
    interrupt_at(2, emb, EmbedSpec(input=src, output=out, chunk_size=5, model=st_dir))
    assert main(["embed", "--model", st_dir, "--input", src, "--output", out, "--chunk-size", "5", "--resume",
                 "--precision", "fp32"]) == 2
    assert "max_length 8 then, 24 now" in capsys.readouterr().err


def test_tune_embed_of_tiny_names_the_mode_that_takes_it(tmp_path, capsys):
    """tune's default for embeddings is inference, which 'tiny' (an untrained encoder) is not for:
    the refusal names --mode train (it said only 'tiny' is for training)."""
    src = write_lines(tmp_path / "in.txt", TEXTS)
    assert main(["tune", "--task", "embed", "--model", "tiny", "--data", src, "--out", str(tmp_path / "p")]) == 2
    assert "--mode train" in capsys.readouterr().err


def test_tune_embed_needs_no_mode(st_dir, tmp_path, monkeypatch, capsys):
    """embed only infers: `spanflow tune --task embed` with the required flags tunes inference."""
    monkeypatch.setenv("SPANFLOW_CACHE", str(tmp_path / "cache"))
    src = write_lines(tmp_path / "in.txt", TEXTS)
    assert main(["tune", "--task", "embed", "--model", st_dir, "--data", src, "--budgets", "256",
                 "--budget-seconds", "1", "--repeats", "1", "--no-backends", "--out", str(tmp_path),
                 "--max-lengths", "16"]) == 0
    assert json.loads((tmp_path / "profile.json").read_text())["mode"] == "infer"
    said = capsys.readouterr().out
    # its quality column is the cosine to the full-length embeddings, not an evaluate score
    assert "quality: mean cosine to the sample's embeddings at the model's max length" in said
    # the length swept goes to a command that takes it (embed does)
    assert "add --max-length 16 to that command (the profile sets the token budget only); serve reads the " \
           "model's own length" in said


def test_tune_takes_a_sentence_transformers_directory_for_embeddings(st_dir, tmp_path, monkeypatch, capsys):
    """`spanflow tune --model OUT/model` of a train embed run (a sentence-transformers directory) said
    `--task is needed`, while its help says the task defaults to the trained model's."""
    monkeypatch.setenv("SPANFLOW_CACHE", str(tmp_path / "cache"))
    assert os.path.exists(os.path.join(st_dir, "modules.json"))
    src = write_lines(tmp_path / "in.txt", TEXTS)
    assert main(["tune", "--model", st_dir, "--data", src, "--budgets", "256", "--budget-seconds", "1",
                 "--repeats", "1", "--no-backends", "--out", str(tmp_path)]) == 0
    assert json.loads((tmp_path / "profile.json").read_text())["task"] == "embed"
    assert f"task embed: {st_dir} is an encoder directory, which runs as it is as embeddings" in capsys.readouterr().err
    # training a task from it could be any task's: --task is asked for
    assert main(["tune", "--model", st_dir, "--data", src, "--mode", "train", "--out", str(tmp_path / "t")]) == 2
    assert "error: --task is needed:" in capsys.readouterr().err


def test_an_output_name_embed_does_not_write_names_the_ones_it_does(tmp_path):
    from spanflow.tasks.embed.job import check_spec

    src = tmp_path / "t.txt"
    src.write_text("a\n")
    for name, hint in (("v.arrow", "; Arrow output is written as Parquet: use .parquet"), ("v.txt", "")):
        with pytest.raises(ConfigError) as e:
            check_spec(EmbedSpec(input=str(src), output=str(tmp_path / name)))
        assert str(e.value) == (f"--output must end in .npy, .jsonl (.ndjson, .json) or .parquet (.pq), got "
                                f"{str(tmp_path / name)!r}{hint}")
    for name, fmt in (("v.ndjson", "jsonl"), ("v.json", "jsonl"), ("v.pq", "parquet"), ("v.NPY", "npy")):
        assert check_spec(EmbedSpec(input=str(src), output=str(tmp_path / name))) == fmt  # taken


def test_a_json_output_holds_json_lines_as_predict_writes_them(st_dir, tmp_path):
    src = write_lines(tmp_path / "in.txt", TEXTS[:5])
    emb = Embedder.load(st_dir, precision="fp32")
    for name in ("v.json", "v.jsonl"):
        embed_file(emb, EmbedSpec(input=src, output=str(tmp_path / name), model=st_dir), progress=False,
                   log=lambda m: None)
    assert (tmp_path / "v.json").read_bytes() == (tmp_path / "v.jsonl").read_bytes()


def test_encode_normalize_gives_unit_rows_in_the_same_direction(hf_dir):
    emb = Embedder.load(hf_dir)  # mean pooling, no Normalize module: rows are not unit length
    raw = emb.encode(TEXTS[:4])
    assert not np.allclose(np.linalg.norm(raw, axis=1), 1, atol=1e-3)
    unit = emb.encode(TEXTS[:4], normalize=True)
    np.testing.assert_allclose(np.linalg.norm(unit, axis=1), 1, atol=1e-5)
    np.testing.assert_allclose(unit, raw / np.linalg.norm(raw, axis=1, keepdims=True), atol=1e-5)
    np.testing.assert_allclose(emb.encode(TEXTS[0], normalize=True), unit[0], atol=1e-5)
    streamed = np.concatenate(list(emb.encode_stream(iter(TEXTS[:4]), chunk_size=3, normalize=True)))
    np.testing.assert_allclose(streamed, unit, atol=1e-5)
    with pytest.raises(ConfigError, match="normalize takes True or False, got 'no'"):
        emb.encode(TEXTS[:1], normalize="no")  # a truthy string would have normalised


def test_similarity_is_the_cosine_of_every_pair(hf_dir):
    emb = Embedder.load(hf_dir)
    a, b = emb.encode(TEXTS[:2]), emb.encode(TEXTS[2:5])
    sim = emb.similarity(a, b)
    assert sim.shape == (2, 3) and sim.dtype == np.float32
    want = [[float(x @ y / np.linalg.norm(x) / np.linalg.norm(y)) for y in b] for x in a]
    np.testing.assert_allclose(sim, want, atol=1e-5)
    np.testing.assert_allclose(emb.similarity(a[0], b), want[0], atol=1e-5)
    assert emb.similarity(a[0], a[0]) == pytest.approx(1, abs=1e-5)
    with pytest.raises(ConfigError, match="width"):  # the API's typed error, as its other checks raise
        emb.similarity(a, b[:, :3])


def test_embed_normalize_writes_unit_vectors_in_every_format_and_a_resume_keeps_to_it(hf_dir, tmp_path, capsys):
    import pyarrow.parquet as pq

    from spanflow.tasks.embed.metrics import unit_rows

    src = write_lines(tmp_path / "in.txt", TEXTS[:12])
    run = ["embed", "--model", hf_dir, "--input", src, "--precision", "fp32", "--output"]
    assert main(run + [str(tmp_path / "plain.npy")]) == 0
    raw = np.load(tmp_path / "plain.npy")
    assert not np.allclose(np.linalg.norm(raw, axis=1), 1.0, atol=1e-3)  # the model's own vectors are not unit
    want = unit_rows(raw)
    assert main(run + [str(tmp_path / "u.npy"), "--normalize"]) == 0
    np.testing.assert_allclose(np.load(tmp_path / "u.npy"), want, atol=1e-6)
    assert main(run + [str(tmp_path / "u.jsonl"), "--normalize"]) == 0
    got = [json.loads(x)["embedding"] for x in (tmp_path / "u.jsonl").read_text().splitlines()]
    np.testing.assert_allclose(np.array(got), want, atol=1e-6)
    assert main(run + [str(tmp_path / "u.parquet"), "--normalize"]) == 0
    np.testing.assert_allclose(np.array(pq.read_table(tmp_path / "u.parquet")["embedding"].to_pylist()), want, atol=1e-6)
    # a Ray job writes the model's raw vectors through arrow_results, which normalises them there
    emb = Embedder.load(hf_dir, precision="fp32")
    table = emb.arrow_results(TEXTS[:12], list(raw) + [None], normalize=True)
    np.testing.assert_allclose(np.array(table["embedding"].to_pylist()[:12]), want, atol=1e-6)
    assert table["embedding"].to_pylist()[12] is None
    # a resume under the other setting would mix raw and unit rows: refused, naming it
    out = str(tmp_path / "r.npy")
    interrupt_at(2, emb, EmbedSpec(input=src, output=out, chunk_size=5, model=hf_dir))
    capsys.readouterr()
    assert main(run + [out, "--chunk-size", "5", "--resume", "--normalize"]) == 2
    assert "(normalize False then, True now); leave out --normalize to go on with it" in capsys.readouterr().err
    assert not os.path.exists(out)
