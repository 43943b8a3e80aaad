"""The spanflow_ner spaCy component: found through spaCy's entry points, sets doc.ents from a
spanflow model with token-budget batching, for English and Chinese tokenizers."""
import json
import logging
import re
import subprocess
import sys

import pytest

spacy = pytest.importorskip("spacy")

from spanflow.cli.main import main  # noqa: E402
from spanflow.data.formats.jsonl import write_jsonl_record  # noqa: E402
from spanflow.data.io import read_ner  # noqa: E402
from spanflow.data.synthetic import synthetic_ner  # noqa: E402


def train(tmp_path, examples, name):
    data = tmp_path / f"{name}.jsonl"
    with open(data, "w", encoding="utf-8") as f:
        for e in examples:
            write_jsonl_record(f, e.text, e.spans)
    assert main(["train", "ner", "--train", str(data), "--out", str(tmp_path / name), "--epochs", "8",
                 "--max-tokens", "512", "--log-every", "0"]) == 0
    return str(tmp_path / name / "model")


def predict(model, texts, tmp_path):
    src, out = tmp_path / "in.txt", tmp_path / "out.jsonl"
    src.write_text("\n".join(texts) + "\n", encoding="utf-8")
    assert main(["predict", "--model", model, "--input", str(src), "--output", str(out), "--precision", "fp32"]) == 0
    return [[(x["start"], x["end"], x["label"]) for x in json.loads(line)["entities"]] for line in open(out)]


def test_english_pipe_sets_the_entities_predict_finds(tmp_path, capsys):
    model = train(tmp_path, synthetic_ner(80, seed=31, max_clauses=2), "en")
    texts = [e.text for e in synthetic_ner(30, seed=32, max_clauses=2)]
    nlp = spacy.blank("en")
    capsys.readouterr()
    comp = nlp.add_pipe("spanflow_ner", config={"model": model, "precision": "fp32",  # found through the entry point
                                                "max_tokens": 768})
    assert "max_tokens 768 (as asked)" in capsys.readouterr().err  # the runtime line names the config's budget
    assert comp.max_tokens == 768
    docs = list(nlp.pipe(texts, batch_size=8))
    want = predict(model, texts, tmp_path)
    assert sum(map(len, want)) > 5
    got = [[(e.start_char, e.end_char, e.label_) for e in d.ents] for d in docs]
    assert got == want and comp.expanded == 0 and comp.overlapping == 0
    assert [(e.start_char, e.end_char) for e in nlp(texts[0]).ents] == [s[:2] for s in want[0]]
    # nlp.evaluate scores the entities, as spaCy's own ner does: against gold that lacks one of the model's
    # entities, precision is one short of all and recall whole
    from spacy.training import Example

    gold = [w[1:] if k == next(j for j, x in enumerate(want) if x) else w for k, w in enumerate(want)]
    scores = nlp.evaluate([Example.from_dict(nlp.make_doc(t), {"entities": g}) for t, g in zip(texts, gold)])
    n = sum(map(len, want))
    assert scores["ents_p"] == pytest.approx((n - 1) / n) and scores["ents_r"] == 1.0
    assert {w[2] for ws in want for w in ws} == set(scores["ents_per_type"])
    # worker processes forked after the model ran (its thread pool started) answer as one process does
    code = (f"import json, spacy; nlp = spacy.blank('en'); nlp.add_pipe('spanflow_ner', config={{'model': {model!r}, "
            f"'precision': 'fp32'}}); nlp({texts[0]!r}); print(json.dumps([[[e.start_char, e.end_char, e.label_] "
            f"for e in d.ents] for d in nlp.pipe({texts[:4]!r}, batch_size=2, n_process=2)]))")
    forked = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert forked.returncode == 0 and json.loads(forked.stdout) == [[list(x) for x in w] for w in want[:4]]
    # entities an earlier component set stay; the model's that overlap one are left out, and counted
    first = next(k for k, w in enumerate(want) if w)
    text, (s, e, _) = texts[first], want[first][0]
    dots = [(m.start(), m.end(), "EVENT") for m in re.finditer(r"(?<= )\.(?= |$)", text)]  # the "." tokens
    assert dots and not {d[0] for d in dots} & {i for a, b, _ in want[first] for i in range(a, b)}  # no entity's
    ruled = spacy.blank("en")
    ruled.add_pipe("entity_ruler").add_patterns([{"label": "RULED", "pattern": text[s:e]},
                                                 {"label": "EVENT", "pattern": "."}])
    comp = ruled.add_pipe("spanflow_ner", config={"model": model, "precision": "fp32"})
    doc = ruled(text)
    ents = [(x.start_char, x.end_char, x.label_) for x in doc.ents]
    assert ents == sorted([(s, e, "RULED"), *want[first][1:], *dots])
    assert comp.overlapping == 1  # the model's own entity at the ruled span
    doc = comp(doc)  # a second pass: the same entities, its overlap counted once (it was counted again)
    assert [(x.start_char, x.end_char, x.label_) for x in doc.ents] == ents and comp.overlapping == 1


def test_chinese_characters_and_expansion_is_counted_and_said(asset, tmp_path, caplog):
    model = train(tmp_path, read_ner(asset("resume_like.bmes")), "zh")
    texts = [e.text for e in read_ner(asset("resume_like.bmes"))]
    nlp = spacy.blank("zh")
    nlp.add_pipe("spanflow_ner", config={"model": model, "precision": "fp32"})
    docs = list(nlp.pipe(texts))
    assert all(d.ents == tuple(sorted(d.ents, key=lambda e: e.start)) for d in docs)
    assert [[(e.start_char, e.end_char, e.label_) for e in d.ents] for d in docs] == predict(model, texts, tmp_path)
    # a tokenizer whose tokens are coarser than the entities: spans grow to whole tokens, with a warning
    en = spacy.blank("en")
    comp = en.add_pipe("spanflow_ner", config={"model": model})
    glued = [t.replace(" ", "") for t in texts]
    with caplog.at_level(logging.WARNING, logger="spanflow"):
        out = list(en.pipe(glued))
    found = sum(len(d.ents) for d in out)
    assert comp.expanded + comp.overlapping > 0 and found + comp.overlapping >= comp.expanded
    assert "expanded" in caplog.text
    caplog.clear()  # docs run through it again: the same entities, nothing counted nor said again
    counted = (comp.expanded, comp.overlapping)
    set_first = [[(e.start_char, e.end_char, e.label_) for e in d.ents] for d in out]
    with caplog.at_level(logging.WARNING, logger="spanflow"):
        again = list(comp.pipe(out))
    assert [[(e.start_char, e.end_char, e.label_) for e in d.ents] for d in again] == set_first
    assert (comp.expanded, comp.overlapping) == counted and "expanded" not in caplog.text
    caplog.clear()  # nlp(text) says it too, of its one doc
    before = comp.expanded + comp.overlapping
    with caplog.at_level(logging.WARNING, logger="spanflow"):
        for t in glued:
            en(t)
            if comp.expanded + comp.overlapping > before:
                break
    assert comp.expanded + comp.overlapping > before and caplog.text.count("expanded") == 1
    # the other alignments: contracted to the tokens inside a span, or left out (strict); each of the model's
    # entities is set or counted as left out
    want = predict(model, glued, tmp_path)
    for mode in ("contract", "strict"):
        other = spacy.blank("en")
        comp = other.add_pipe("spanflow_ner", config={"model": model, "alignment": mode})
        out = list(other.pipe(glued))
        found = sum(len(d.ents) for d in out)
        assert comp.expanded == 0 and comp.unaligned > 0, mode
        assert found + comp.unaligned + comp.overlapping == sum(map(len, want)), mode
        if mode == "strict":  # only the entities spaCy's tokens hold as they are
            assert comp.contracted == 0
            assert all((e.start_char, e.end_char, e.label_) in w for d, w in zip(out, want) for e in d.ents)


def test_labels_and_config_errors_name_what_a_spacy_user_set(tmp_path):
    from spanflow.errors import ConfigError, ModelDirError

    model = train(tmp_path, synthetic_ner(40, seed=5, max_clauses=1), "en")
    nlp = spacy.blank("en")
    comp = nlp.add_pipe("spanflow_ner", config={"model": model})
    assert comp.labels and set(comp.labels) == {x for e in synthetic_ner(40, seed=5, max_clauses=1)
                                                for _, _, x in e.spans}
    with pytest.raises(ConfigError, match=r'needs config=\{"model"'):  # spaCy's validation dump before
        spacy.blank("en").add_pipe("spanflow_ner")
    with pytest.raises(ConfigError, match="config 'max_tokens' must be positive"):
        spacy.blank("en").add_pipe("spanflow_ner", config={"model": model, "max_tokens": 0})
    with pytest.raises(ConfigError, match="alignment must be one of expand, contract, strict"):
        spacy.blank("en").add_pipe("spanflow_ner", config={"model": model, "alignment": "loose"})
    with pytest.raises(ConfigError, match="config 'precision' int8 is a quantization, which NER models do not take; "
                                          "precision is one of auto, fp32, bf16, fp16"):
        spacy.blank("en").add_pipe("spanflow_ner", config={"model": model, "precision": "int8"})
    from helpers import tiny_bert

    enc, tok = tiny_bert(["an encoder of its own"], hidden=16, layers=1, heads=2)
    enc.save_pretrained(tmp_path / "enc")
    tok.save_pretrained(tmp_path / "enc")
    # a plain encoder is no trained model (it was called "an 'embed' model"), said as the commands say it
    with pytest.raises(ModelDirError, match=re.escape(f"spanflow_ner: {tmp_path / 'enc'} is an encoder directory, "
                                                      "not a spanflow 'ner' model: train one with 'spanflow train ner "
                                                      f"--model {tmp_path / 'enc'}'")):
        spacy.blank("en").add_pipe("spanflow_ner", config={"model": str(tmp_path / "enc")})
    with pytest.raises(ModelDirError, match="a relative path, taken from"):
        spacy.blank("en").add_pipe("spanflow_ner", config={"model": "no/such/model"})


def test_a_saved_pipeline_carries_its_model_and_loads_where_the_model_path_is_gone(tmp_path):
    import shutil

    from spanflow.errors import ModelDirError

    model = train(tmp_path, synthetic_ner(40, seed=7, max_clauses=1), "en")
    texts = [e.text for e in synthetic_ner(10, seed=8, max_clauses=1)]
    nlp = spacy.blank("en")
    nlp.add_pipe("spanflow_ner", config={"model": model, "precision": "fp32"})
    want = [[(e.start_char, e.end_char, e.label_) for e in d.ents] for d in nlp.pipe(texts)]
    assert sum(map(len, want)) >= 3  # a model that finds entities: the comparison is not between empty lists
    nlp.to_disk(tmp_path / "pipeline")
    assert (tmp_path / "pipeline" / "spanflow_ner" / "model" / "spanflow.json").is_file()
    nlp.to_disk(tmp_path / "pipeline")  # saved over: the copy replaced whole
    shutil.move(model, tmp_path / "elsewhere")  # the pipeline on another machine: the config's path is gone
    moved = spacy.load(tmp_path / "pipeline")
    docs = list(moved.pipe(texts))
    got = [[(e.start_char, e.end_char, e.label_) for e in d.ents] for d in docs]
    assert got == want
    comp = moved.get_pipe("spanflow_ner")
    again = [moved.get_pipe("spanflow_ner")(d) for d in docs]  # run twice: its own entities are no overlap
    assert [[(e.start_char, e.end_char, e.label_) for e in d.ents] for d in again] == want and comp.overlapping == 0
    # a pipeline whose saved copy is gone too names the config's path, as add_pipe does
    shutil.rmtree(tmp_path / "pipeline" / "spanflow_ner" / "model")
    with pytest.raises(ModelDirError, match=re.escape(model)):
        spacy.load(tmp_path / "pipeline")
    with pytest.raises(ModelDirError):  # by hand, outside a config: at once
        spacy.blank("en").add_pipe("spanflow_ner", config={"model": model})
