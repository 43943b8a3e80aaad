import json
import re

import pytest
import torch
from helpers import padded_batch

from spanflow.batching.align import encode_texts
from spanflow.cli.main import main
from spanflow.data.formats.casrel import locate
from spanflow.data.io import read_re
from spanflow.data.synthetic import synthetic_re
from spanflow.errors import DataError
from spanflow.tasks.re.casrel import CasRelHead, CasRelModel, extract, next_true
from spanflow.models.encoder import build_tiny
from spanflow.data.examples import ReExample
from spanflow.tasks.re import ReModel, train_re
from spanflow.tasks.re.metrics import re_metrics
from spanflow.training.options import TrainOptions


def test_casrel_json_locates_closest_pair_and_keeps_unlocated(tmp_path, caplog):
    recs = [{"text": "Ann met Bob . Later Bob met Carl .", "triple_list": [["Bob", "met", "Carl"], ["Ann", "met", "Bob"]]},
            {"text": "Bacon sandwich has Bacon", "triple_list": [["Bacon sandwich", "ingredient", "Bacon"],
                                                            ["Ham", "ingredient", "Bacon"]]}]
    p = tmp_path / "d.json"
    p.write_text(json.dumps(recs))
    ex = read_re(str(p))
    t = ex[0].text
    got = [(t[s[0]:s[1]], s[0], r, t[o[0]:o[1]]) for s, r, o in ex[0].triples]
    assert got == [("Bob", 20, "met", "Carl"), ("Ann", 0, "met", "Bob")]  # the Bob next to Carl
    assert ex[1].triples == [((0, 14), "ingredient", (19, 24))]  # the Bacon that stands alone
    assert ex[1].unlocated == [("Ham", "ingredient", "Bacon")]
    assert ("Ham", "ingredient", "Bacon") in ex[1].string_triples()
    assert "1 of 4 triples" in caplog.text and "repeat" not in caplog.text
    caplog.clear()
    p.write_text(json.dumps([{"text": "Ann met Bob", "triple_list": [["Ann", "met", "Bob"]] * 3}]))
    assert len(read_re(str(p))[0].triples) == 1
    assert f"{p}: 2 of 3 triples repeat another of the same text; each is kept once" in caplog.text


def test_locate_places_an_object_outside_its_subject_where_the_text_allows():
    # the closest occurrence would be the one inside the subject: the model would learn that as the object
    assert locate("The Texas Rangers play in Texas .", "Texas Rangers", "Texas") == ((4, 17), (26, 31))
    # no exact occurrence apart from the subject, a case-blind one is
    assert locate("Bacon explosion is made with bacon", "Bacon explosion", "Bacon") == ((0, 15), (29, 34))
    assert locate("Bacon explosion is made with bacon", "Bacon", "Bacon") == ((0, 5), (29, 34))
    # nowhere else: inside the subject, but never the subject's own span
    assert locate("Bacon sandwich", "Bacon sandwich", "Bacon") == ((0, 14), (0, 5))
    assert locate("Bacon is eaten", "Bacon", "Bacon") is None


def test_locate_prefers_whole_words():
    assert locate("Berlin is in Germany , Germ is not", "Germ", "Berlin") == ((23, 27), (0, 6))


def test_re_jsonl_and_errors(tmp_path, caplog):
    p = tmp_path / "r.jsonl"
    p.write_text(json.dumps({"text": "Ann works for Acme", "relations": [{"head": [0, 3], "type": "works_for",
                                                                         "tail": [14, 18]}]}) + "\n")
    ex = read_re(str(p))
    assert ex[0].string_triples() == {("Ann", "works_for", "Acme")}
    p.write_text(json.dumps({"text": "Ann works for Acme", "relations": [{"head": [0, 3], "type": "works_for",
                                                                         "tail": [14, 18]}] * 2}) + "\n")
    with caplog.at_level("WARNING", logger="spanflow"):
        assert read_re(str(p))[0].triples == [((0, 3), "works_for", (14, 18))]  # given twice: one triple
    assert f"{p}: 1 of 2 triples repeat another of the same text; each is kept once" in caplog.text
    p.write_text(json.dumps({"text": "Ann", "relations": [{"head": [0, 9], "type": "x", "tail": [0, 1]}]}) + "\n")
    with pytest.raises(DataError, match="out of range") as e:
        read_re(str(p))
    assert e.value.line == 1
    q = tmp_path / "bad.json"
    q.write_text("[{\"text\": 1}]")
    with pytest.raises(DataError, match="no string"):
        read_re(str(q))
    for rel in ("", "  "):  # no relation name: refused naming the file and record, in either format
        q.write_text(json.dumps([{"text": "Ann met Bob", "triple_list": [["Ann", "met", "Bob"]]},
                                 {"text": "Ann met Bob", "triple_list": [["Ann", rel, "Bob"]]}]))
        with pytest.raises(DataError, match="record 2 .*has no relation name") as e:
            read_re(str(q))
        assert e.value.path == str(q)
        p.write_text(json.dumps({"text": "Ann", "relations": [{"head": [0, 1], "type": rel, "tail": [1, 2]}]}) + "\n")
        with pytest.raises(DataError, match='"type" must be a non-empty string') as e:
            read_re(str(p))
        assert e.value.line == 1


def test_a_span_the_cut_crosses_is_lost_not_trained_in_part(caplog):
    from spanflow.batching.align import Encoded
    from spanflow.data.examples import ReExample
    from spanflow.tasks.re.features import prepare_features, token_span

    # "a b c d e": five one-letter tokens; a limit of 3 keeps "a b c"
    enc = Encoded(ids=[5, 6, 7, 8, 9], offsets=[(0, 1), (2, 3), (4, 5), (6, 7), (8, 9)], first=[True] * 5)
    assert token_span(enc, (2, 5), 3) == (2, 3)  # "b c": kept whole (positions count [CLS])
    assert token_span(enc, (4, 7), 3) is None  # "c d": crosses the cut
    assert token_span(enc, (8, 9), 3) is None  # "e": beyond it

    class Tok:
        cls_token_id, sep_token_id = 1, 2

    ex = [ReExample("a b c d e", [((0, 1), "r", (4, 7)), ((0, 1), "r", (2, 3))])]
    with caplog.at_level("WARNING", logger="spanflow"):
        f = prepare_features(ex, Tok(), {"r": 0}, max_length=5, encs=[enc])[0]
    assert f.subjects == {(1, 1): [(0, 2, 2)]} and "1 triple fell outside the tokens kept" in caplog.text
    assert "1 text longer than 5 tokens was cut" in caplog.text
    assert "outside the model's set" not in caplog.text  # no relation unknown: not said
    assert "does not start and end on the model's words" not in caplog.text


def test_a_measurements_sample_cut_at_its_lengths_warns_of_nothing(tmp_path, caplog):
    """predict --max-tokens auto (and tune) on a relation model warned "texts were cut; triples
    are not trained on": its measuring sample, cut at the lengths it sweeps, trains nothing."""
    from spanflow.runtime.policy import resolve_policy
    from spanflow.tasks.registry import get

    data = tmp_path / "d.json"
    data.write_text(json.dumps([{"text": "Ann lives in Rome " * 20 + "Ann lives in Rome",
                                 "triple_list": [["Ann", "lives_in", "Rome"]]}] * 4))
    w = get("re").workload("tiny", str(data), mode="train", policy=resolve_policy("fp32", "cpu"), sample=4)
    with caplog.at_level("WARNING", logger="spanflow"):
        feats = w.items_at(16)
    assert len(feats) == 4 and max(len(f.input_ids) for f in feats) == 16  # cut at 16
    assert "cut" not in caplog.text


def test_a_subject_or_object_inside_a_word_is_said_with_what_it_trains_as(caplog):
    from spanflow.batching.align import Encoded
    from spanflow.data.examples import ReExample
    from spanflow.tasks.re.features import prepare_features, trained_triples

    class Tok:
        cls_token_id, sep_token_id = 1, 2

    text = "Stanford hired Ada ."  # "Ford" found inside "Stanford"
    enc = Encoded(ids=[5, 6, 7, 8], offsets=[(0, 8), (9, 14), (15, 18), (19, 20)], first=[True] * 4)
    ex = [ReExample(text, [((15, 18), "works_for", (4, 8))])]
    with caplog.at_level("WARNING", logger="spanflow"):
        feats = prepare_features(ex, Tok(), {"works_for": 0}, max_length=16, encs=[enc])
    assert feats[0].subjects == {(3, 3): [(0, 1, 1)]} and trained_triples(feats) == 1
    assert ("1 triple with a subject or object that does not start and end on the model's words (found inside a "
            "word, or offsets that cut one): the first, 'ford' in 'Stanford hired Ada .' trains as 'Stanford'"
            ) in caplog.text


def test_next_true():
    x = torch.tensor([[False, True, False, False, True, False]])
    assert next_true(x).tolist() == [[1, 1, 4, 4, 4, 6]]


def reference_loop(model, ids, content, att, thr):
    """Per sentence, per subject: the reference implementation's way."""
    out = set()
    for b in range(ids.shape[0]):
        n = int(att[b].sum())
        h = model(ids[b:b + 1, :n], att[b:b + 1, :n])
        p = torch.sigmoid(model.head.subjects(h).float())[0]
        keep = content[b, :n].bool()
        starts = [i for i in range(n) if p[i, 0] > thr and keep[i]]
        ends = [i for i in range(n) if p[i, 1] > thr and keep[i]]
        for s in starts:
            e = next((j for j in ends if j >= s), None)
            if e is None:
                continue
            q = torch.sigmoid(model.head.objects(h, torch.tensor([0]), torch.tensor([s]), torch.tensor([e])).float())[0]
            for r in range(q.shape[1]):
                os_ = [i for i in range(n) if q[i, r, 0] > thr and keep[i]]
                oe = [i for i in range(n) if q[i, r, 1] > thr and keep[i]]
                for o in os_:
                    oend = next((j for j in oe if j >= o), None)
                    if oend is not None:
                        out.add((b, s, e, r, o, oend))
    return out


def test_batched_cascade_equals_per_subject_loop():
    texts = [e.text for e in synthetic_re(20, seed=3)]
    enc, tok = build_tiny(texts, hidden=32, embedding=32, bigram_buckets=1009)
    torch.manual_seed(0)
    model = CasRelModel(enc, CasRelHead(hidden_size=32, num_relations=5)).eval()
    batch = padded_batch(tok, texts[:6])
    att = batch["attention_mask"]
    content = att.clone()
    content[:, 0] = 0
    content[torch.arange(6), att.sum(1) - 1] = 0
    with torch.inference_mode():
        got = set(zip(*[x.tolist() for x in extract(model, batch["input_ids"], content, att, 0.5)]))
        want = reference_loop(model, batch["input_ids"], content, att, 0.5)
    assert len(want) > 10  # a random model fires often at 0.5: the comparison is not vacuous
    assert got == want


def test_metrics_exact_and_partial():
    gold = [{("New York City", "in", "USA"), ("Ann", "born", "Paris")}]
    pred = [{("York City", "in", "USA"), ("Ann", "born", "Paris")}]
    m = re_metrics(gold, pred)
    assert m["f1"] == 0.5 and m["partial"]["f1"] == 1.0
    assert m["per_relation"]["in"]["f1"] == 0.0 and m["per_relation"]["born"]["f1"] == 1.0


def test_overfit_and_save_load(tmp_path):
    # one clause per text: a 2-layer encoder trained from scratch on 40 texts cannot yet tell
    # apart several subjects of one sentence (that takes a pretrained encoder)
    data = synthetic_re(40, seed=1, max_clauses=1)
    opts = TrainOptions(epochs=40, lr=5e-3, max_tokens=160, max_length=64, patience=0, log_every=0,
                        warmup_ratio=0.05)
    model = train_re(data, data, model="tiny", out_dir=str(tmp_path), options=opts, all_subjects=True,
                     log_fn=lambda s: None)
    m = model.evaluate(data)
    assert m["f1"] >= 0.95, m["f1"]
    assert "warnings" not in m  # every gold span on the model's words
    (s, rel, o), text = data[0].triples[0], data[0].text
    cut = ReExample(text, [((s[0] + 1, s[1]), rel, o)])  # a subject that starts inside its first word
    said = model.evaluate([cut, *data[1:]])["warnings"]
    assert said == [f"1 of the data's {1 + sum(len(e.triples) for e in data[1:])} gold triples has a subject or object that "
                    "does not start and end on the model's words, so no prediction can match them and each counts "
                    f"as a miss; the first: {text[s[0] + 1:s[1]]!r} in {text[:s[1] + 30]!r} can only be found as "
                    f"{text[s[0]:s[1]]!r}"]
    # the same strings placed twice, once off the tokens: one gold triple, which a prediction can match
    at = len(text) + 1  # the cut subject's strings again, as words of their own
    longer = f"{text} {text[s[0] + 1:s[1]]}"
    twice = ReExample(longer, [((s[0] + 1, s[1]), rel, o), ((at, at + s[1] - s[0] - 1), rel, o)])
    assert "can only be found as" in model.evaluate([ReExample(longer, twice.triples[:1])])["warnings"][0]
    assert "warnings" not in model.evaluate([twice])
    again = ReModel.load(str(tmp_path / "model"))
    texts = [e.text for e in data]
    assert again.predict(texts) == model.predict(texts)
    encs = encode_texts(model.tokenizer, texts)  # the server pads lengths up to a multiple of 8
    assert model.predict_encoded(encs, pad_multiple=8) == model.predict_encoded(encs) != [[]] * len(texts)
    seen = []  # what predict's progress bar is fed: texts done and tokens per batch
    streamed = list(again.predict_stream(texts, max_tokens=160, on_batch=lambda *a: seen.append(a)))
    assert streamed == model.predict(texts)
    assert sum(n for n, _, _ in seen) == len(texts)
    assert sum(r for _, r, _ in seen) == sum(len(x) + 2 for x in [e.ids[:62] for e in encs])
    assert all(0 < r <= p for _, r, p in seen if r)


def test_cli_train_evaluate_predict_re(tmp_path, capsys):
    data = synthetic_re(30, seed=2)
    train = tmp_path / "train.jsonl"
    with open(train, "w") as f:
        for e in data:
            f.write(json.dumps({"text": e.text, "relations": [{"head": list(s), "type": r, "tail": list(o)}
                                                              for s, r, o in e.triples]}) + "\n")
    out = tmp_path / "run"
    assert main(["train", "re", "--train", str(train), "--dev", str(train), "--out", str(out), "--epochs", "3",
                 "--max-tokens", "256", "--max-length", "64"]) == 0
    said = capsys.readouterr().out.splitlines()  # what it read, first, as train ner says it
    n = sum(len(e.triples) for e in data)
    assert said[:2] == [f"read {train}: 30 texts, {n} triples"] * 2
    kinds = {r for e in data for _, r, _ in e.triples}
    [closing] = [x for x in said if x.startswith("the model extracts ")]
    assert closing.startswith(f"the model extracts {len(kinds)} relations: ")  # named, as NER names its labels
    assert set(closing.split(": ", 1)[1].split(", ")) == kinds
    assert main(["evaluate", "--model", str(out / "model"), "--data", str(train), "--json"]) == 0
    m = json.loads(capsys.readouterr().out)
    assert {"f1", "precision", "recall", "partial", "per_relation"} <= set(m) and "f1" in m["partial"]
    assert main(["evaluate", "--model", str(out / "model"), "--data", str(train), "--scheme", "bio"]) == 2
    assert "--scheme names the tag scheme of NER CoNLL data, which the data of a model of task 're' does not take" in \
        capsys.readouterr().err
    ran = json.loads((out / "train_options.json").read_text())  # RE's options: no NER-only one
    assert {"head_lr", "label_smoothing", "oversample", "subjects"} <= set(ran)
    assert not {"stride", "class_weights", "pack", "pack_span"} & set(ran)
    reps = [json.loads(x) for x in open(out / "train_report.jsonl")]
    assert len(reps) == 3 and "padding_efficiency" in reps[0] and "dev_f1" in reps[0]
    src = tmp_path / "in.txt"
    src.write_text(data[0].text + "\n")
    assert main(["predict", "--model", str(out / "model"), "--input", str(src), "--output",
                 str(tmp_path / "o.jsonl")]) == 0
    rec = json.loads((tmp_path / "o.jsonl").read_text())
    assert rec["text"] == data[0].text and isinstance(rec["relations"], list)
    for r in rec["relations"]:
        assert rec["text"][r["head"][0]:r["head"][1]] == r["head_text"]
    assert "note:" not in capsys.readouterr().out  # a short text is read whole
    src.write_text(data[0].text + "\n" + " ".join([data[1].text] * 40) + "\n")  # the second past 64 tokens
    assert main(["predict", "--model", str(out / "model"), "--input", str(src), "--output",
                 str(tmp_path / "o.jsonl")]) == 0
    assert "note: 1 text(s) were longer than the 64 tokens the model reads: only their start was read" in \
        capsys.readouterr().out
    long = tmp_path / "long.jsonl"  # evaluate says so too: the triples past the cut count as misses
    long.write_text(train.read_text().splitlines()[0] + "\n" + json.dumps({"text": " ".join([data[1].text] * 40)})
                    + "\n")
    assert main(["evaluate", "--model", str(out / "model"), "--data", str(long), "--json"]) == 0
    assert ("warning: 1 text(s) were longer than the 64 tokens the model reads: only their start was scored"
            in capsys.readouterr().err)
    same = tmp_path / "same.jsonl"  # the reader's warnings join --json's list, said once on stderr
    same.write_text(json.dumps({"text": "Ann met Bob", "relations": [{"head": [0, 3], "type": "r", "tail": [0, 3]}]})
                    + "\n")
    assert main(["evaluate", "--model", str(out / "model"), "--data", str(same), "--json"]) == 0
    got = capsys.readouterr()
    said = json.loads(got.out)["warnings"]
    assert said[0].startswith(f"{same}: 1 of 1 relations have a head and tail that are the same span")
    assert "the same span" not in got.err  # logged once by the reader (pytest keeps logs), not printed again


def test_re_recipes_train_and_class_weights_are_rejected(tmp_path):
    from spanflow.errors import ConfigError
    from spanflow.tasks.re.features import feature_relations, make_casrel_loss

    data = synthetic_re(40, seed=1, max_clauses=1)
    opts = TrainOptions(epochs=40, lr=2e-3, max_tokens=160, max_length=64, patience=0, log_every=0,
                        warmup_ratio=0.05, label_smoothing=0.05, oversample=1.0, llrd=0.9, grad_checkpointing=True)
    model = train_re(data, data, model="tiny", out_dir=str(tmp_path), options=opts, all_subjects=True,
                     log_fn=lambda s: None)
    assert model.evaluate(data)["f1"] >= 0.9
    from spanflow.tasks.re.features import prepare_features

    feats = prepare_features(data[:4], model.tokenizer, model.rel2id, max_length=64)
    assert all(rels for rels in feature_relations(feats))
    with pytest.raises(ConfigError, match=r"TrainOptions.class_weights \(--class-weights\) applies to NER training; "
                                          "re training would ignore it"):
        train_re(data, None, model="tiny", out_dir=str(tmp_path / "b"),
                 options=TrainOptions(epochs=1, class_weights="auto", log_every=0), log_fn=lambda s: None)
    # smoothed targets: the loss of a batch is higher than with 0/1 targets for a confident model
    from spanflow.tasks.re.features import make_collate

    batch = make_collate(model.tokenizer.pad_token_id, len(model.relations), all_subjects=True)(feats)
    batch = {k: v.to(model.policy.device) for k, v in batch.items() if hasattr(v, "shape")}
    model.module.eval()
    with torch.no_grad():
        plain, smooth = (make_casrel_loss(label_smoothing=e)(model.module, batch) for e in (0.0, 0.1))
    assert smooth > plain


def test_continued_model_takes_given_max_length(tmp_path):
    from spanflow.errors import ConfigError
    from spanflow.runtime.policy import resolve_policy
    from spanflow.tasks.re.train import start_model

    data, policy = synthetic_re(20, seed=1), resolve_policy("fp32", "cpu")
    relations = sorted({r for e in data for _, r, _ in e.triples})
    start_model("tiny", data, relations, TrainOptions(max_length=48), policy).save(str(tmp_path / "m"))
    m = str(tmp_path / "m")
    assert start_model(m, data, relations, TrainOptions(), policy).limit == 48  # unset: as it was trained
    assert start_model(m, data, relations, TrainOptions(max_length=24), policy).limit == 24
    with pytest.raises(ConfigError, match="--max-length 64 is above"):
        start_model(m, data, relations, TrainOptions(max_length=64), policy)


def test_a_resume_on_data_of_other_relations_is_told_as_a_resume(tmp_path):
    from spanflow.errors import ConfigError

    data = synthetic_re(20, seed=1)
    opts = dict(epochs=1, max_tokens=256, max_length=64, log_every=0)
    train_re(data, None, model="tiny", out_dir=str(tmp_path), options=TrainOptions(max_steps=1, **opts),
             log_fn=lambda s: None)
    other = [e for e in data if all(r != data[0].triples[0][1] for _, r, _ in e.triples)]
    with pytest.raises(ConfigError, match=r"^--resume: the checkpoint in .*checkpoint is of a run with other "
                                          r"relations \(\d+; the data has \d+\); resume with what it was started"):
        train_re(other, None, model="tiny", out_dir=str(tmp_path), options=TrainOptions(resume=True, **opts),
                 log_fn=lambda s: None)


def test_training_data_with_no_placed_triple_is_named_with_the_logged_warning(tmp_path):
    import subprocess
    import sys

    data = tmp_path / "t.json"
    data.write_text(json.dumps([{"text": "a b", "triple_list": [["x", "r", "y"]]}]))
    got = subprocess.run([sys.executable, "-m", "spanflow", "train", "re", "--train", str(data), "--out",
                          str(tmp_path / "run")], capture_output=True, text=True)
    assert got.returncode == 2 and not (tmp_path / "run").exists()
    # the logged warning reads as the command's own lines: `warning:`, not `WARNING:`
    assert got.stderr.splitlines() == [
        f"warning: {data}: 1 of 1 triples cannot be placed in their text; 1 name a subject or object not found in "
        "the text (e.g. record 1: ['x', 'r', 'y']); they count as gold in scoring, and training leaves them out",
        f"error: {data}: holds no triples to train on: its 1 could not be placed in their texts (the warning above "
        "says why)"]
    data.write_text("[]")
    with pytest.raises(DataError, match="is an empty list: no records found"):
        read_re(str(data))


@pytest.mark.parametrize("rec, said", [
    ({"text": "Ada was born in Paris", "relations": [{"head": [0, 3], "type": "born_in", "tail": [16, 21]}]},
     "has \"relations\" and no \"triple_list\": CasRel JSON's triples are [subject, relation, object] lists under "
     "\"triple_list\"; JSONL relations ({\"text\", \"relations\"}) are one object a line: jq -c '.[]'"),
    ({"text": "Ada was born in Paris", "triples": [["Ada", "born_in", "Paris"]]}, "has \"triples\" and no"),
    ({"text": "Ada was born in Paris", "triplets": [["Ada", "born_in", "Paris"]]}, "has \"triplets\" and no"),
    ({"text": "Ada was born in Paris", "spo": [{"subject": "Ada", "predicate": "born_in", "object": "Paris"}]},
     "has \"spo\" and no"),
])
def test_a_list_with_triples_under_another_key_is_named_not_read_as_texts(tmp_path, rec, said):
    """Read as texts without triples, such a file trained nothing ("holds no triples") or, as --dev,
    scored 0 each epoch."""
    path = tmp_path / "data.json"
    path.write_text(json.dumps([{"text": "Bob ran", "triple_list": []}, rec]))
    with pytest.raises(DataError) as e:
        read_re(str(path))
    assert "record 2 (of the list, from 1) " + said in str(e.value)
    path.write_text(json.dumps([{"text": "Bob ran"}, {"text": "no triples", "relations": []}]))  # texts: as before
    assert [x.triples for x in read_re(str(path))] == [[], []]


@pytest.mark.parametrize("key", ["triples", "spo_list", "rels"])
def test_jsonl_relations_under_another_key_are_named_not_read_as_none(tmp_path, key):
    """A misspelt "relations" read the record as a text with none: trained as a negative, and as
    --dev scored each of its relations as missing, without a word."""
    rel = {"head": [0, 3], "type": "born_in", "tail": [16, 21]}
    ok = {"text": "Ada was born in Paris", "relations": [rel]}
    path = tmp_path / "data.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in (ok, {"text": "Ada was born in Paris", key: [rel]})))
    with pytest.raises(DataError, match=f':2: the record has "{key}" and no "relations": JSONL relations are') as e:
        read_re(str(path))
    assert (e.value.path, e.value.line) == (str(path), 2)
    path.write_text(json.dumps(ok) + "\n" + json.dumps({"text": "no relations here"}) + "\n")  # a text with none
    assert [len(x.triples) for x in read_re(str(path))] == [1, 0]


@pytest.mark.parametrize("span, said", [([12, 0], "reversed"), ([3, 3], "empty"), ([0, 99], "out of range")])
def test_a_jsonl_span_says_what_is_wrong_with_it(tmp_path, span, said):
    path = tmp_path / "data.jsonl"
    path.write_text(json.dumps({"text": "Ada was born in Paris", "relations": [
        {"head": span, "type": "born_in", "tail": [16, 21]}]}) + "\n")
    with pytest.raises(DataError, match=f'"head" span {re.escape(str(span))} is {said}'):
        read_re(str(path))


def test_a_lone_surrogate_in_a_json_text_is_refused_at_its_record(tmp_path):
    from spanflow.data.io import read_ner

    casrel = tmp_path / "s.json"
    casrel.write_text('[{"text": "Ada \\ud800 Lovelace", "triple_list": [["Ada", "r", "Lovelace"]]}]')
    with pytest.raises(DataError, match=r"s\.json:1: record 1 \(of the list, from 1\): \"text\" is not valid Unicode: "
                                        r"a lone surrogate '\\ud800' at character 4"):
        read_re(str(casrel))
    for name, rec in (("r.jsonl", '{"text": "Ada \\udfff", "relations": []}'),
                      ("n.jsonl", '{"text": "Ada \\udfff", "entities": []}')):
        (tmp_path / name).write_text('{"text": "fine", "relations": [], "entities": []}\n' + rec + "\n")
        with pytest.raises(DataError, match="is not valid Unicode") as e:
            (read_re if name == "r.jsonl" else read_ner)(str(tmp_path / name))
        assert e.value.line == 2


def test_a_jsonl_relation_of_one_span_to_itself_is_gold_not_trained(tmp_path, caplog):
    p = tmp_path / "same.jsonl"
    p.write_text(json.dumps({"text": "Ada Lovelace works for Globex .", "relations": [
        {"head": [0, 12], "type": "works_for", "tail": [0, 12]},
        {"head": [0, 12], "type": "works_for", "tail": [23, 29]}]}) + "\n")
    with caplog.at_level("WARNING", logger="spanflow"):
        (ex,) = read_re(str(p))
    assert ex.triples == [((0, 12), "works_for", (23, 29))]
    assert ex.unlocated == [("Ada Lovelace", "works_for", "Ada Lovelace")]
    assert "1 of 2 relations have a head and tail that are the same span (e.g. line 1:" in caplog.text


def test_trainings_scoring_of_each_epoch_leaves_the_span_check_out(monkeypatch, tmp_path):
    """The per-epoch dev score does not tokenize the dev data again for a warning training never prints."""
    checked = []
    monkeypatch.setattr(ReModel, "_off_tokens", lambda self, ex, total: checked.append(len(ex)))
    data = synthetic_re(12, seed=1, max_clauses=1)
    model = train_re(data, data, model="tiny", out_dir=str(tmp_path), log_fn=lambda s: None,
                     options=TrainOptions(epochs=2, max_tokens=160, max_length=64, log_every=0))
    assert checked == []
    model.evaluate(data)  # as spanflow evaluate asks
    assert checked == [12]


def test_a_gold_span_the_extracted_span_widens_past_is_said_as_the_model_extracts_it():
    """The model extracts a subject over the characters its tokens are widened to (a variation
    selector the tokenizer dropped); a gold 'Ada' there is a miss, and evaluate's check said nothing."""
    from spanflow.batching.align import Encoded
    from spanflow.tasks.re.features import off_tokens

    text = "Ada\ufe0f met Bob"
    enc = Encoded(ids=[5, 6, 7], offsets=[(0, 3), (5, 8), (9, 12)], first=[True] * 3, starts=[0, 5, 9],
                  ends=[4, 8, 12])
    assert off_tokens(text, enc, ((9, 12), (3, 3)), verb="can only be found as") is None
    assert off_tokens(text, enc, ((0, 3), (1, 1)), verb="can only be found as") == \
        "'Ada' in 'Ada\ufe0f met Bob' can only be found as 'Ada\ufe0f'"


def test_a_very_long_text_is_tokenized_only_as_far_as_the_max_length_reads():
    """RE read 512 tokens of a megabyte line after tokenizing all of it (Python lists per token):
    about 200 MiB a MB. The encodings it reads are the same."""
    from spanflow.batching.align import CHARS_PER_TOKEN, encode_heads, encode_texts

    ex = synthetic_re(30, seed=2)
    tok = build_tiny([e.text for e in ex])[1]
    long = " ".join(e.text for e in ex) * 40
    got = encode_heads(tok, [long, "short one"], 64)
    full = encode_texts(tok, [long, "short one"])
    assert got[0].ids[:65] == full[0].ids[:65] and got[0].offsets[:65] == full[0].offsets[:65]
    assert len(got[0].ids) > 64 and len(got[0].ids) < len(full[0].ids) // 4
    assert got[1].ids == full[1].ids
    nospace = "ab," * (64 * CHARS_PER_TOKEN)  # no white space near the cut: tokenized whole
    assert encode_heads(tok, [nospace], 64)[0].ids == encode_texts(tok, [nospace])[0].ids


def test_a_budget_below_the_longest_training_text_is_refused_as_ners_is(tmp_path):
    """A --max-tokens set to cap memory ran every longer text in a batch over it, unsaid."""
    from spanflow.errors import ConfigError

    data = synthetic_re(20, seed=1)
    with pytest.raises(ConfigError, match=r"^--max-tokens 8 is below the longest training text, \d+ tokens"):
        train_re(data, None, model="tiny", out_dir=str(tmp_path), log_fn=lambda s: None,
                 options=TrainOptions(epochs=1, max_tokens=8, max_length=64, log_every=0))


def test_a_casrel_record_at_fault_is_named_with_the_line_it_starts_on(tmp_path):
    """A pretty-printed list's record errors named a record number only: counted by hand."""
    recs = [{"text": "Ada was born in Paris", "triple_list": [["Ada", "born_in", "Paris"]]},
            {"text": "Bo ran", "triple_list": []},
            {"text": "Foo bar", "triple_list": [["Foo", "born_in"]]}]
    path = tmp_path / "pretty.json"
    path.write_text(json.dumps(recs, indent=2))
    line = [k for k, x in enumerate(json.dumps(recs, indent=2).splitlines(), 1) if x == "  {"][2]  # the third's
    with pytest.raises(DataError, match=rf"pretty\.json:{line}: record 3 \(of the list, from 1\): triple "
                                        r"\['Foo', 'born_in'\] is not \[subject, relation, object\]"):
        read_re(str(path))


def test_subjects_and_objects_are_whole_words_in_training_and_prediction(monkeypatch, caplog):
    """A subword model extracted a subject of the tokens it marked: 'Th' of 'Theodora' (NER's labels
    sit on words, so its spans never cut one). Spans now widen to the words they touch, in what
    training marks and in what predict reads, so both speak of the same words."""
    from spanflow.batching.align import Encoded
    from spanflow.data.examples import ReExample
    from spanflow.models.encoder import build_tiny
    from spanflow.runtime.policy import resolve_policy
    from spanflow.tasks.re import model as re_model
    from spanflow.tasks.re.features import prepare_features, token_span, word_span

    text = "Theodora met Bob ."  # "Th" "##eo" "##dora" "met" "Bob" "."
    enc = Encoded(ids=[5, 6, 7, 8, 9, 10], offsets=[(0, 2), (2, 4), (4, 8), (9, 12), (13, 16), (17, 18)],
                  first=[True, False, False, True, True, True])
    assert word_span(enc, 1, 1) == (0, 8) and word_span(enc, 0, 0) == (0, 8) and word_span(enc, 4, 4) == (13, 16)
    assert token_span(enc, (0, 2), 6) == (1, 3)  # gold 'Th': the tokens of 'Theodora'
    assert token_span(enc, (2, 4), 2) is None  # the word runs past the cut
    # a token of white space alone after a word (SentencePiece's lone `▁`, left empty) is no part of it
    blank = Encoded(ids=[5, 6, 7], offsets=[(0, 3), (3, 3), (4, 7)], first=[True, False, True])
    assert word_span(blank, 0, 0) == (0, 3) and token_span(blank, (0, 3), 1) == (1, 1)

    class Tok:
        cls_token_id, sep_token_id = 1, 2

    with caplog.at_level("WARNING", logger="spanflow"):
        feats = prepare_features([ReExample(text, [((0, 2), "met", (13, 16))])], Tok(), {"met": 0},
                                 max_length=16, encs=[enc])
    assert feats[0].subjects == {(1, 3): [(0, 5, 5)]}
    assert "'Th' in 'Theodora met Bob .' trains as 'Theodora'" in caplog.text

    encoder, tok = build_tiny([text] * 2, hidden=16, embedding=16, bigram_buckets=101, max_length=64)
    model = re_model.ReModel(encoder=encoder, tokenizer=tok, relations=["met"], limit=64,
                             policy=resolve_policy("fp32", "cpu"))
    # the cascade marks the subject from '##eo' to '##eo' and the object from 'Bob' to 'Bob'
    # (input positions: [CLS] is 0)
    marked = tuple(torch.tensor([v]) for v in (0, 2, 2, 0, 5, 5))
    monkeypatch.setattr(re_model, "extract", lambda *a, **k: marked)
    assert model.predict_encoded([enc]) == [[((0, 8), "met", (13, 16))]]


def test_a_closing_line_names_the_first_relations_and_counts_the_rest():
    from spanflow.tasks.re.task import _some

    assert _some(["a", "b"]) == "a, b"
    assert _some([f"r{i}" for i in range(10)], shown=3) == "r0, r1, r2 and 7 more (the model's spanflow.json lists them)"
