"""Training runs whose options or data leave the loop an edge to fall off: an --eval-every past
the run's end, a loss that diverges, an early stop resumed with another patience, scores that
cannot be ordered, relation records without triples."""
import json
import os

import pytest

from spanflow.data.synthetic import synthetic_ner
from spanflow.errors import ConfigError
from spanflow.tasks.ner import train_ner
from spanflow.training.options import TrainOptions
from spanflow.training.outcome import next_command

DATA = synthetic_ner(40, seed=7, max_clauses=1)


def opts(**kw):
    base = dict(epochs=2, lr=2e-2, max_tokens=512, max_length=64, log_every=0, seed=0)
    return TrainOptions(**{**base, **kw})


def test_an_eval_every_past_the_runs_end_still_evaluates_and_keeps_a_model(tmp_path):
    lines = []
    train_ner(DATA, DATA, model="tiny", out_dir=str(tmp_path), options=opts(eval_every=10_000), log_fn=lines.append)
    last = [x for x in lines if "(the last): dev F1" in x]
    assert len(last) == 1 and (tmp_path / "model" / "spanflow.json").exists()
    assert any(x.startswith("best dev F1 ") for x in lines)


def test_an_eval_every_without_dev_prints_no_empty_step_lines(tmp_path):
    lines = []
    train_ner(DATA, None, model="tiny", out_dir=str(tmp_path), options=opts(eval_every=1), log_fn=lines.append)
    assert not [x for x in lines if x.startswith("step ") and ":" not in x], lines  # "step 3" alone said nothing
    assert (tmp_path / "model" / "spanflow.json").exists()


def test_a_diverged_loss_stops_the_run_before_it_keeps_a_model(tmp_path):
    with pytest.raises(ConfigError, match=r"^the training loss is nan by step \d+: training diverged; lower --lr"):
        train_ner(DATA, DATA, model="tiny", out_dir=str(tmp_path), log_fn=lambda s: None,
                  options=opts(lr=1e6, head_lr=1e6, max_grad_norm=0.0, warmup_ratio=0.0))
    assert not (tmp_path / "model").exists()  # no NaN model is kept as the best


def test_a_resumed_early_stop_follows_the_patience_given_now(tmp_path):
    still = dict(lr=1e-12, head_lr=1e-12, epochs=3)  # dev F1 cannot change: the second evaluation stops the run
    lines = []
    train_ner(DATA, DATA, model="tiny", out_dir=str(tmp_path), options=opts(patience=1, **still),
              log_fn=lines.append)
    assert any(x.startswith("early stop after epoch 2") for x in lines)
    state = json.loads((tmp_path / "checkpoint" / "state.json").read_text())
    lines.clear()
    train_ner(DATA, DATA, model="tiny", out_dir=str(tmp_path), options=opts(patience=0, resume=True, **still),
              log_fn=lines.append)
    resumed = json.loads((tmp_path / "checkpoint" / "state.json").read_text())
    assert resumed["epoch"] == 3 and resumed["global_step"] > state["global_step"]  # epoch 3 ran
    assert not any(x.startswith("early stop") for x in lines)


def test_a_resume_with_a_patience_already_spent_stops_before_training_further(tmp_path):
    still = dict(lr=1e-12, head_lr=1e-12)  # dev F1 cannot change: the second evaluation is one without gain
    train_ner(DATA, DATA, model="tiny", out_dir=str(tmp_path), options=opts(patience=0, **still), log_fn=lambda s: None)
    state = json.loads((tmp_path / "checkpoint" / "state.json").read_text())
    assert state["bad_evals"] == 1 and not state["stopped"]
    lines = []
    train_ner(DATA, DATA, model="tiny", out_dir=str(tmp_path), options=opts(patience=1, resume=True, epochs=3, **still),
              log_fn=lines.append)
    resumed = json.loads((tmp_path / "checkpoint" / "state.json").read_text())
    assert resumed["global_step"] == state["global_step"]  # no step of epoch 3 ran
    assert any(x.startswith("early stop after epoch 2: dev F1 did not improve for 1 evaluation (--patience 1)")
               for x in lines), lines


def test_an_early_stop_mid_epoch_leaves_the_epochs_other_steps_to_a_resume(tmp_path):
    still = dict(lr=1e-12, head_lr=1e-12, max_tokens=128)  # several steps an epoch; dev F1 cannot change
    full = tmp_path / "full"
    train_ner(DATA, DATA, model="tiny", out_dir=str(full), options=opts(patience=0, **still), log_fn=lambda s: None)
    steps = json.loads((full / "checkpoint" / "state.json").read_text())["global_step"]
    first = [json.loads(x) for x in (full / "train_report.jsonl").read_text().splitlines()][0]["step"]
    assert first > 2  # epoch 1's steps: else the stop below would not fall mid-epoch
    lines = []
    train_ner(DATA, DATA, model="tiny", out_dir=str(tmp_path), options=opts(patience=1, eval_every=1, **still),
              log_fn=lines.append)
    assert any(x.startswith("early stop after step 2 (epoch 1): dev F1") for x in lines), lines
    assert any(x.startswith("epoch 1 (partial) step 2 (") for x in lines), lines  # the epoch line says so
    state = json.loads((tmp_path / "checkpoint" / "state.json").read_text())
    assert (state["epoch"], state["step_in_epoch"], state["global_step"]) == (0, 2, 2)
    report = [json.loads(x) for x in (tmp_path / "train_report.jsonl").read_text().splitlines()]
    assert [(x["epoch"], x["step"], x.get("partial"), x.get("early_stop")) for x in report] == [(1, 2, True, True)]
    assert next_command(str(tmp_path), "spanflow predict --model {model}")  # the run ended: its model is the one
    train_ner(DATA, DATA, model="tiny", out_dir=str(tmp_path), options=opts(patience=0, eval_every=1, resume=True,
                                                                             **still), log_fn=lambda s: None)
    resumed = json.loads((tmp_path / "checkpoint" / "state.json").read_text())
    assert (resumed["epoch"], resumed["global_step"]) == (2, steps)  # the rest of epoch 1 ran, then epoch 2


def test_a_run_that_diverges_and_stops_mid_epoch_ends_in_the_divergence_error(tmp_path):
    with pytest.raises(ConfigError, match=r"^the (training loss is nan|weights are not finite) by step \d+: training "
                                          "diverged"):
        train_ner(DATA, DATA, model="tiny", out_dir=str(tmp_path), log_fn=lambda s: None,
                  options=opts(lr=1e6, head_lr=1e6, max_grad_norm=0.0, warmup_ratio=0.0, max_tokens=128,
                               eval_every=1, patience=2))  # 5 steps an epoch: the stop is at step 3
    assert not (tmp_path / "checkpoint").exists()  # no diverged weights to resume from


def test_a_run_that_diverges_before_its_max_steps_ends_in_the_error_not_a_checkpoint(tmp_path):
    diverging = dict(lr=1e6, head_lr=1e6, max_grad_norm=0.0, warmup_ratio=0.0, max_tokens=128)
    with pytest.raises(ConfigError, match=r"^the training loss is nan by step 3: training diverged"):
        train_ner(DATA, DATA, model="tiny", out_dir=str(tmp_path), log_fn=lambda s: None,
                  options=opts(max_steps=3, **diverging))
    assert not (tmp_path / "checkpoint").exists()


def test_weights_that_step_went_non_finite_never_replace_the_last_checkpoint(tmp_path, monkeypatch):
    from spanflow.training import loop

    real, steps = loop.optimizer_step, []

    def step_then_break_at_3(model, *a, **k):  # step 3's update leaves a NaN that no loss has seen yet
        real(model, *a, **k)
        steps.append(1)
        if len(steps) == 3:
            next(model.parameters()).data.view(-1)[0] = float("nan")

    monkeypatch.setattr(loop, "optimizer_step", step_then_break_at_3)
    with pytest.raises(ConfigError, match=r"^the weights are not finite by step 3: training diverged"):
        train_ner(DATA, DATA, model="tiny", out_dir=str(tmp_path), log_fn=lambda s: None,
                  options=opts(save_every=1, max_tokens=128))
    assert json.loads((tmp_path / "checkpoint" / "state.json").read_text())["global_step"] == 2


def test_weights_gone_non_finite_before_the_first_evaluation_are_never_kept_as_the_best(tmp_path, monkeypatch):
    from spanflow.training import loop

    real = loop.optimizer_step

    def step_then_break(model, *a, **k):  # the first update leaves a NaN that no loss has seen yet
        real(model, *a, **k)
        next(model.parameters()).data.view(-1)[0] = float("nan")

    monkeypatch.setattr(loop, "optimizer_step", step_then_break)
    with pytest.raises(ConfigError, match=r"^the weights are not finite by step 1: training diverged"):
        train_ner(DATA, DATA, model="tiny", out_dir=str(tmp_path), log_fn=lambda s: None,
                  options=opts(eval_every=1, max_tokens=128))
    assert not (tmp_path / "model").exists()  # a diverged model scores 0, not NaN: it would be the first best


@pytest.mark.parametrize("field, value, message", [
    ("seed", -1, "--seed must be between 0 and 2**63 - 1, got -1"),
    ("lr", float("inf"), "--lr must be a finite number, got inf"),
    ("weight_decay", float("inf"), "--weight-decay must be a finite number, got inf"),
    ("oversample", float("inf"), "--oversample must be a finite number, got inf"),
])
def test_options_out_of_every_range_are_refused_when_made(field, value, message):
    with pytest.raises(ConfigError) as e:
        TrainOptions(**{field: value})
    flag = "--" + field.replace("_", "-")  # the command line says the flag; the Python API names the field
    assert e.value.cli == message and str(e.value) == f"TrainOptions.{field}{message[len(flag):]}"


def test_training_pairs_of_one_score_are_refused_for_a_scored_loss(tmp_path):
    from spanflow import train_embedder
    from spanflow.tasks.embed.pairs import Pair

    same = [Pair(f"text number {i}", f"another text {i}", 1.0) for i in range(20)]
    with pytest.raises(ConfigError, match="every training pair has the same score: EmbedTraining.loss cosent") as e:
        train_embedder(same, None, model="tiny", out_dir=str(tmp_path), log_fn=lambda s: None)
    assert e.value.cli.startswith("every training pair has the same score: --loss cosent")  # the command line's


def test_training_pairs_of_one_answer_are_refused_for_the_ranking_loss(tmp_path):
    from spanflow import train_embedder
    from spanflow.tasks.embed.pairs import Pair

    for same in ([Pair("a cat sits", "a cat is sitting")] * 6, [Pair(f"q{i}", "same answer") for i in range(6)]):
        with pytest.raises(ConfigError, match="every training pair has the same second text"):
            train_embedder(same, None, model="tiny", out_dir=str(tmp_path), log_fn=lambda s: None)
    assert not os.path.exists(tmp_path / "model")


def test_a_relation_record_with_null_triples_is_a_text_without_any(tmp_path):
    from spanflow.data.io import read_re
    from spanflow.errors import DataError

    p = tmp_path / "re.json"
    p.write_text(json.dumps([{"text": "Ann lives in Rome .", "triple_list": None},
                             {"text": "Bob was born in Oslo .", "triple_list": [["Bob", "born_in", "Oslo"]]}]))
    got = read_re(p)
    assert [len(e.triples) for e in got] == [0, 1]
    p.write_text(json.dumps([{"text": "Ann .", "triple_list": "Ann"}]))
    with pytest.raises(DataError, match='record 1 .*"triple_list" is not a list of triples'):
        read_re(p)


@pytest.mark.parametrize("kw, said", [
    (dict(symmetric="no"), "EmbedTraining.symmetric must be True or False, got 'no'"),
    (dict(pairs_per_step=16.5), "EmbedTraining.pairs_per_step must be a whole number or None, got 16.5"),
    (dict(pairs_per_step="16"), "EmbedTraining.pairs_per_step must be a whole number or None, got '16'"),
    (dict(matryoshka_dims=64), "EmbedTraining.matryoshka_dims must be a tuple of whole sizes or None, got 64"),
    (dict(matryoshka_dims=(64.5,)),
     r"EmbedTraining.matryoshka_dims must be a tuple of whole sizes or None, got \(64.5,\)"),
])
def test_embed_training_options_of_the_wrong_type_are_refused_where_they_are_made(kw, said):
    from spanflow import EmbedTraining

    with pytest.raises(ConfigError, match=said):
        EmbedTraining(**kw)


def test_embed_training_takes_numpy_numbers_as_python_ones():
    import numpy as np

    from spanflow import EmbedTraining

    t = EmbedTraining(pairs_per_step=np.int64(32), matryoshka_dims=[np.int32(64), 32])
    assert t.pairs_per_step == 32 and type(t.pairs_per_step) is int and t.matryoshka_dims == (64, 32)


def test_a_relation_list_beside_the_data_that_lacks_its_relations_is_refused(tmp_path, capsys):
    from spanflow.cli.main import main

    records = [{"text": "Ann lives in Rome .", "triple_list": [["Ann", "lives_in", "Rome"]]},
               {"text": "Bob founded Hooli .", "triple_list": [["Bob", "founded", "Hooli"]]}]
    (tmp_path / "train.json").write_text(json.dumps(records))
    (tmp_path / "rel2id.json").write_text(json.dumps({"founded": 0, "makes": 1}))  # stale: no lives_in
    assert main(["train", "re", "--train", str(tmp_path / "train.json"), "--model", "tiny",
                 "--out", str(tmp_path / "out"), "--epochs", "1"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err == [f"error: {tmp_path / 'rel2id.json'}: the relation list (2) lacks 1 relation of the training "
                   "data, whose 1 triple would be left out: lives_in (1) (the relation list read beside --train)"]
    assert not (tmp_path / "out" / "model").exists()
    # a list that covers the data is the model's, in its order, and said so
    (tmp_path / "rel2id.json").write_text(json.dumps({"makes": 0, "lives_in": 1, "founded": 2}))
    assert main(["train", "re", "--train", str(tmp_path / "train.json"), "--model", "tiny",
                 "--out", str(tmp_path / "out"), "--epochs", "1", "--log-every", "0"]) == 0
    out = capsys.readouterr().out
    assert f"relations: the 3 of {tmp_path / 'rel2id.json'}, in its order" in out
    assert "2 training texts, 2 triples trained on, 3 relations of the list given" in out
    assert json.loads((tmp_path / "out" / "model" / "spanflow.json").read_text())["relations"] == [
        "makes", "lives_in", "founded"]


def test_embedding_training_counts_the_texts_it_cuts(tmp_path):
    from spanflow import train_embedder
    from spanflow.tasks.embed.pairs import Pair

    long = " ".join(["word"] * 80)
    pairs = [Pair(f"{long} {i}", f"short text {i}", float(i % 5)) for i in range(12)]
    lines = []
    train_embedder(pairs, None, model="tiny", out_dir=str(tmp_path), log_fn=lines.append,
                   options=TrainOptions(epochs=1, max_length=32, max_tokens=512, log_every=0))
    said = next(x for x in lines if "scored training pairs" in x)
    assert said.endswith("max length 32 (12 texts longer, cut there)"), said


def test_a_resume_into_another_tasks_run_names_what_differs_not_a_damaged_checkpoint(tmp_path, capsys):
    from spanflow.cli.main import main

    (tmp_path / "p.csv").write_text("sentence1,sentence2,score\na b,c d,1\ne f,g h,3\ni j,k l,4\nm n,o p,2\n")
    (tmp_path / "re.json").write_text(json.dumps([{"text": "Ann lives in Rome .",
                                                    "triple_list": [["Ann", "lives_in", "Rome"]]}]))
    out = str(tmp_path / "O")
    assert main(["train", "embed", "--train", str(tmp_path / "p.csv"), "--model", "tiny", "--out", out,
                 "--max-steps", "1"]) == 0
    capsys.readouterr()
    assert main(["train", "re", "--train", str(tmp_path / "re.json"), "--model", "tiny", "--out", out,
                 "--resume"]) == 2
    err = capsys.readouterr().err
    assert "is of a run with training data of 4 items" in err and "unreadable" not in err and "remove" not in err


def test_a_positive_listed_twice_is_one_candidate_in_retrieval(tmp_path):
    from spanflow.models.encoder import build_tiny
    from spanflow.tasks.embed import Embedder
    from spanflow.tasks.embed.pairs import Pair
    from spanflow.tasks.embed.pooling import Pooling

    texts = [f"text number {w} here" for w in ("one", "two", "three", "four", "five")]
    enc, tok = build_tiny(texts, hidden=16, embedding=16, bigram_buckets=101)
    emb = Embedder(encoder=enc, tokenizer=tok, pooling=Pooling(), device="cpu")
    same = [Pair(t, t) for t in texts]  # each query is its own positive: a perfect ranking
    assert emb.evaluate(same)["mrr@10"] == pytest.approx(1.0)
    assert emb.evaluate(same + same)["mrr@10"] == pytest.approx(1.0)  # twice over: still one candidate each


def test_a_max_length_above_what_the_encoder_reads_is_refused_not_cut(tmp_path):
    from spanflow.models.encoder import build_tiny

    enc, tok = build_tiny([e.text for e in DATA], hidden=16, embedding=16, bigram_buckets=101, max_length=64)
    enc.save_pretrained(tmp_path / "enc")
    tok.save_pretrained(tmp_path / "enc")
    with pytest.raises(ConfigError, match=f"^--max-length 128 is above what {tmp_path / 'enc'} reads: 64 tokens"):
        train_ner(DATA, None, model=str(tmp_path / "enc"), out_dir=str(tmp_path / "o"), log_fn=lambda s: None,
                  options=opts(max_length=128))


def test_the_api_is_told_of_embed_training_fields_and_the_command_line_of_flags(tmp_path):
    from spanflow import EmbedTraining, train_embedder
    from spanflow.tasks.embed.pairs import Pair

    scored = [Pair("a b", "c d", 1.0), Pair("e f", "g h", 0.0)]
    with pytest.raises(ConfigError) as e:
        train_embedder(scored, None, model="tiny", out_dir=str(tmp_path), log_fn=None,
                       config=EmbedTraining(symmetric=True))
    assert str(e.value) == "EmbedTraining.symmetric applies to the ranking loss (pairs and triplets)"
    assert e.value.cli == "--symmetric applies to the ranking loss (pairs and triplets)"


def test_a_step_line_whose_loss_is_nan_stops_the_run_there_and_quotes_the_peak_lr(tmp_path):
    """Divergence was caught at the epoch's end (an epoch of nan step lines, hours on real data),
    and the advice quoted the decayed rate ('lower --lr (0.00e+00 now)')."""
    lines = []
    with pytest.raises(ConfigError, match=r"^the training loss is nan by step (\d+): training diverged; lower --lr "
                                          r"\(its peak is 1e\+06\) or --head-lr") as e:
        train_ner(DATA, DATA, model="tiny", out_dir=str(tmp_path), log_fn=lines.append,
                  options=opts(lr=1e6, head_lr=1e6, max_grad_norm=0.0, warmup_ratio=0.0, max_tokens=128,
                               log_every=1, epochs=3))
    stop = int(str(e.value).split("by step ")[1].split(":")[0])
    steps = [x for x in lines if x.startswith("step ")]
    epoch_steps = int(steps[0].split("/")[1].split()[0])
    assert stop < epoch_steps and len(steps) == stop and "loss nan" in steps[-1]  # stopped at its first nan line


def test_a_resume_on_the_same_texts_relabelled_is_refused(tmp_path):
    """Only the items' lengths were compared: corrected labels (the likeliest change between a stop
    and a resume) continued the checkpoint's run on other data, unsaid."""
    from spanflow.data.examples import NerExample

    train_ner(DATA, None, model="tiny", out_dir=str(tmp_path), log_fn=lambda s: None, options=opts(max_steps=2))
    swap = {"PER": "LOC", "LOC": "PER"}
    relabelled = [NerExample(e.text, [(s, t, swap.get(lab, lab)) for s, t, lab in e.spans]) for e in DATA]
    with pytest.raises(ConfigError, match=r"other training data of the same lengths \(its labels, targets or tokens "
                                          r"differ\)"):
        train_ner(relabelled, None, model="tiny", out_dir=str(tmp_path), log_fn=lambda s: None,
                  options=opts(resume=True))
    lines = []  # the same data resumes
    train_ner(DATA, None, model="tiny", out_dir=str(tmp_path), log_fn=lines.append, options=opts(resume=True))
    assert any(x.startswith("resumed from ") for x in lines)


def test_a_resume_with_other_epochs_says_the_schedule_changed(tmp_path):
    """--epochs is no part of a run's identity (a larger one trains on), but leaving it out on a
    resume took the default and stretched the decay unsaid."""
    train_ner(DATA, None, model="tiny", out_dir=str(tmp_path), log_fn=lambda s: None, options=opts(max_steps=2))
    lines = []
    train_ner(DATA, None, model="tiny", out_dir=str(tmp_path), log_fn=lines.append,
              options=opts(resume=True, epochs=3, max_steps=3))
    assert any(x.startswith("note: the checkpoint's run had --epochs 2, this one 3: the learning rate's decay now runs "
                            "to the end of epoch 3 from step 2") for x in lines), lines
    lines.clear()
    train_ner(DATA, None, model="tiny", out_dir=str(tmp_path), log_fn=lines.append,
              options=opts(resume=True, epochs=3, max_steps=4))
    assert not any("--epochs" in x for x in lines)  # the same as the checkpoint's now


def test_a_resume_with_other_epochs_trains_at_the_new_schedules_rate(tmp_path, monkeypatch):
    """The first step after such a resume trained at the checkpoint's schedule's rate (0 where that
    run had ended), the next at the new one's: a jump."""
    from spanflow.training import loop

    used = []
    real = loop.lr_now
    monkeypatch.setattr(loop, "lr_now", lambda r: used.append((r.st["global_step"], real(r))) or used[-1][1])
    train_ner(DATA, None, model="tiny", out_dir=str(tmp_path / "a"), log_fn=lambda s: None, options=opts(epochs=1))
    ended = used[-1][0] + 1  # the one epoch's steps: the rate at its end is 0
    used.clear()
    train_ner(DATA, None, model="tiny", out_dir=str(tmp_path / "a"), log_fn=lambda s: None,
              options=opts(resume=True, epochs=3, max_steps=ended + 2))
    resumed = used[:2]
    used.clear()
    train_ner(DATA, None, model="tiny", out_dir=str(tmp_path / "b"), log_fn=lambda s: None,
              options=opts(epochs=3, max_steps=ended + 2))  # three epochs from the start: the rates wanted
    assert resumed == used[ended:ended + 2] and resumed[0][1] > 0, (resumed, used[ended:ended + 2])


def test_a_max_steps_stop_reports_the_score_of_its_weights_not_the_best_so_far(tmp_path):
    """The partial epoch's line (and train_report.jsonl) carried the best score so far, another
    model's, beside the last weights; evaluate on them gave another figure."""
    train_ner(DATA, DATA, model="tiny", out_dir=str(tmp_path / "a"), log_fn=lambda s: None,
              options=opts(max_steps=4, max_tokens=128, eval_every=1))  # inside epoch 1, of 5 steps
    reps = [json.loads(x) for x in (tmp_path / "a" / "train_report.jsonl").read_text().splitlines()]
    state = json.loads((tmp_path / "a" / "checkpoint" / "state.json").read_text())
    assert reps[-1]["partial"] and reps[-1]["step"] == 4 and reps[-1]["dev_f1"] == state["last_f1"]
    # no evaluation at the stop: no score for weights never scored
    train_ner(DATA, DATA, model="tiny", out_dir=str(tmp_path / "b"), log_fn=lambda s: None,
              options=opts(max_steps=7, max_tokens=128))
    reps = [json.loads(x) for x in (tmp_path / "b" / "train_report.jsonl").read_text().splitlines()]
    assert reps[-1]["partial"] and reps[-1]["dev_f1"] is None and reps[0]["dev_f1"] is not None


def test_a_max_steps_at_an_epochs_last_step_closes_that_epoch(tmp_path):
    """A --max-steps on an epoch's last step called the epoch partial, left it unscored (its weights
    never in the model kept) and said steps were left where none were."""
    train_ner(DATA, DATA, model="tiny", out_dir=str(tmp_path / "full"), log_fn=lambda s: None,
              options=opts(max_tokens=128))
    full = [json.loads(x) for x in (tmp_path / "full" / "train_report.jsonl").read_text().splitlines()]
    first, total = full[0]["step"], full[-1]["step"]  # epoch 1's steps, and the run's
    for cut in (first, total):
        lines = []
        out = tmp_path / f"cut{cut}"
        train_ner(DATA, DATA, model="tiny", out_dir=str(out), log_fn=lines.append, options=opts(max_tokens=128,
                                                                                            max_steps=cut))
        reps = [json.loads(x) for x in (out / "train_report.jsonl").read_text().splitlines()]
        closed = [r for r in full if r["step"] <= cut]
        assert [(r["epoch"], r["step"], r.get("partial"), r["dev_f1"]) for r in reps] == \
               [(r["epoch"], r["step"], r.get("partial"), r["dev_f1"]) for r in closed]  # scored, not partial
        stopped = [x for x in lines if x.startswith("stopped by --max-steps")]
        assert bool(stopped) == (cut < total), lines  # at the last step of all: the run simply ended
        if stopped:
            assert stopped[0].startswith(f"stopped by --max-steps after step {cut} (epoch 1): "), stopped
            lines.clear()  # the same command resumed trains on to the end, as that line says
            train_ner(DATA, DATA, model="tiny", out_dir=str(out), log_fn=lines.append,
                      options=opts(max_tokens=128, max_steps=cut, resume=True))
            assert not any(x.startswith("stopped by --max-steps") for x in lines), lines
            assert json.loads((out / "train_report.jsonl").read_text().splitlines()[-1])["step"] == total


def test_a_resume_on_data_of_other_labels_is_told_as_a_resume(tmp_path):
    """The refusal advised starting from OUT/checkpoint/model/encoder, which fits no resume."""
    from spanflow.data.examples import NerExample

    train_ner(DATA, None, model="tiny", out_dir=str(tmp_path), log_fn=lambda s: None, options=opts(max_steps=2))
    fewer = [NerExample(e.text, [s for s in e.spans if s[2] != "DATE"]) for e in DATA]
    with pytest.raises(ConfigError, match=r"^--resume: the checkpoint in .*checkpoint is of a run with labels "
                                          r"\['DATE', .*\(the data has \['LOC', .*; resume with the data it was "
                                          r"started with, or start a new run") as e:
        train_ner(fewer, None, model="tiny", out_dir=str(tmp_path), log_fn=lambda s: None, options=opts(resume=True))
    assert "encoder" not in str(e.value)


def test_training_leaves_the_callers_random_state_as_it_was(tmp_path):
    """A run seeds torch with its own seed: a seeded notebook drew the run's numbers after it."""
    import torch

    from spanflow.data.synthetic import synthetic_ner
    from spanflow.tasks.ner import train_ner
    from spanflow.training.options import TrainOptions

    draws = []
    for seed in (1, 2):
        torch.manual_seed(seed)
        train_ner(synthetic_ner(20, seed=1, max_clauses=1), None, model="tiny", out_dir=str(tmp_path / str(seed)),
                  options=TrainOptions(epochs=1, max_tokens=512, log_every=0), log_fn=None)
        draws.append(torch.rand(3).tolist())
        torch.manual_seed(seed)
        assert draws[-1] == torch.rand(3).tolist()  # as if no training had run
    assert draws[0] != draws[1]


def test_a_stray_world_size_is_a_config_error_not_a_hang_or_a_traceback(monkeypatch):
    """WORLD_SIZE alone (a cluster's or notebook image's variable) failed inside torch.distributed
    with an untyped error, after the process had been set to die with its parent."""
    from spanflow.errors import ConfigError
    from spanflow.training.distributed import init_from_env

    for k in ("RANK", "MASTER_ADDR", "MASTER_PORT"):
        monkeypatch.delenv(k, raising=False)
    monkeypatch.setenv("WORLD_SIZE", "2")
    with pytest.raises(ConfigError, match="WORLD_SIZE='2' is set, but not RANK, MASTER_ADDR, MASTER_PORT"):
        init_from_env()
    monkeypatch.setenv("WORLD_SIZE", "two")
    with pytest.raises(ConfigError, match="unset WORLD_SIZE"):
        init_from_env()
    monkeypatch.setenv("WORLD_SIZE", "1")
    assert not init_from_env().enabled
