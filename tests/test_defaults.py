"""Defaults sized from the data, the not-learning line, the inference window, training precision."""
import math
import os
import random

import pytest
import torch
from torch import nn

from spanflow.data.synthetic import synthetic_ner
from spanflow.errors import ConfigError
from spanflow.tasks.ner import NerModel, train_ner
from spanflow.runtime import policy as precision
from spanflow.training.defaults import (REFERENCE_TOKENS, UPDATES_PER_EPOCH, TaskDefaults, device_budget,
                                        fill_defaults, update_tokens)
from spanflow.training.loop import TaskHooks, train_loop
from spanflow.training.plan import epoch_plan
from spanflow.training.options import TrainOptions

CPU = torch.device("cpu")
D = TaskDefaults(lr=5e-5, head_lr=1e-3, epochs=7)


def test_update_size_follows_the_data_within_device_bounds():
    small = [32] * 3000  # 96k tokens: about 100 updates of 1024
    assert update_tokens(small, CPU) == 1024
    assert len(small) * 32 / update_tokens(small, CPU) == pytest.approx(UPDATES_PER_EPOCH, rel=0.5)
    assert update_tokens([32] * 10, CPU) == 256  # never below the floor
    assert update_tokens([300] * 5, CPU) == 300  # nor below the longest item
    assert update_tokens([32] * 10 ** 6, CPU) == device_budget(CPU)  # large data: as large as the device runs well
    assert update_tokens([32] * 10 ** 6, torch.device("cuda")) > device_budget(CPU)
    # two processes share one update: each takes half
    assert update_tokens(small, CPU, world=2) == 512
    # the floor is the job's: 2 processes take as many updates an epoch as one (not half as many)
    assert update_tokens([32] * 800, CPU) == 256 and update_tokens([32] * 800, CPU, world=2) == 128
    assert update_tokens([32] * 3300, CPU, world=8) * 8 == update_tokens([32] * 3300, CPU) == 1024


def test_fill_defaults_fills_only_what_is_unset():
    lines = []
    o = fill_defaults(TrainOptions(), D, lengths=[32] * 3000, device=CPU, log=lines.append)
    assert (o.max_tokens, o.epochs, o.lr, o.head_lr) == (1024, 7, 5e-5, 1e-3)
    assert lines and "max_tokens 1024" in lines[0] and "epochs 7" in lines[0]
    assert "(about 94 updates per epoch)" in lines[0]  # 96,000 tokens in updates of 1024: this data's count
    lines.clear()
    fill_defaults(TrainOptions(), D, lengths=[32] * 6000, device=CPU, log=lines.append)
    assert "max_tokens 2048 (about 94 updates per epoch)" in lines[0]
    lines.clear()
    fill_defaults(TrainOptions(), D, lengths=[32] * 1_000_000, device=CPU, log=lines.append)
    assert "max_tokens 4096 (about 7813 updates per epoch)" in lines[0]  # capped by the CPU's budget
    lines.clear()  # a long pair alone in its update, left out by a loss that needs two: not counted
    fill_defaults(TrainOptions(), D, lengths=[32] * 31 + [256], device=CPU, log=lines.append, min_update=2)
    assert "max_tokens 256 (about 4 updates per epoch)" in lines[0]  # the plan trains 4 (5 with the lone pair)
    lines.clear()
    fill_defaults(TrainOptions(), D, lengths=[32] * 5, device=CPU, log=lines.append)
    assert "max_tokens 256 (about 1 update per epoch)" in lines[0]
    lines.clear()
    fill_defaults(TrainOptions(), D, lengths=[32] * 3000, device=CPU, world=2, log=lines.append)
    assert "max_tokens 512 on each of 2 processes (about 94 updates per epoch)" in lines[0]  # a rank's share
    lines.clear()
    varied = [random.Random(0).randint(5, 90) for _ in range(4000)]  # batches seldom full: more than tokens / budget
    o = fill_defaults(TrainOptions(), D, lengths=varied, device=CPU, log=lines.append)
    steps = len(epoch_plan(varied, o, 0))
    assert f"(about {steps} updates per epoch)" in lines[0] and steps > sum(varied) / o.max_tokens
    given = fill_defaults(TrainOptions(max_tokens=4096, lr=1e-4, head_lr=2e-3, epochs=2), D, lengths=[32] * 3000,
                          device=CPU, log=lines.append)
    assert (given.max_tokens, given.epochs, given.lr, given.head_lr) == (4096, 2, 1e-4, 2e-3)


def test_options_of_several_processes_given_to_one_are_said():
    lines = []
    o = fill_defaults(TrainOptions(lr_scaling="sqrt", grad_compression="fp16"), D, lengths=[32] * 300, device=CPU,
                      log=lines.append)
    assert o.grad_compression == "none"  # its dense tables (compression's need) would only slow one process
    assert lines[-1] == ("warning: --lr-scaling sqrt and --grad-compression fp16 apply to runs of several processes "
                         "(torchrun); this one has one: nothing to scale or compress")
    fill_defaults(TrainOptions(grad_compression="fp16"), D, lengths=[32] * 300, device=CPU, log=lines.append)
    assert lines[-1].startswith("warning: --grad-compression fp16 applies to runs of several processes")
    lines.clear()
    fill_defaults(TrainOptions(lr_scaling="sqrt"), D, lengths=[32] * 300, device=CPU, world=2, log=lines.append)
    assert not any(x.startswith("warning:") for x in lines)


def test_options_of_evaluation_given_without_dev_are_said():
    lines = []
    fill_defaults(TrainOptions(eval_every=50, patience=2), D, lengths=[32] * 300, device=CPU, log=lines.append,
                  dev=False)
    assert lines[-1] == ("warning: --eval-every 50 and --patience 2 act on evaluations of --dev data; this run has "
                         "none: nothing is evaluated or stopped early")
    lines.clear()
    fill_defaults(TrainOptions(eval_every=50, patience=2), D, lengths=[32] * 300, device=CPU, log=lines.append)
    assert not any(x.startswith("warning:") for x in lines)
    fill_defaults(TrainOptions(), D, lengths=[32] * 300, device=CPU, log=lines.append, dev=False)
    assert not any(x.startswith("warning:") for x in lines)


def test_default_rates_follow_the_update_size_by_square_root():
    o = fill_defaults(TrainOptions(max_tokens=4 * REFERENCE_TOKENS), D, lengths=[32] * 1000, device=CPU,
                      log=lambda s: None)
    assert o.lr == pytest.approx(2 * D.lr) and o.head_lr == pytest.approx(2 * D.head_lr)
    # --lr-scaling scales a given rate by the world; a default one already counts the world's tokens
    o = fill_defaults(TrainOptions(max_tokens=REFERENCE_TOKENS, lr=1e-4, lr_scaling="sqrt"), D,
                      lengths=[32] * 1000, device=CPU, world=4, log=lambda s: None)
    assert o.lr == pytest.approx(2e-4) and o.head_lr == pytest.approx(D.head_lr * 2)
    with pytest.raises(ConfigError):
        fill_defaults(TrainOptions(llrd=0.0), D, lengths=[32], device=CPU, log=lambda s: None)


class _Constant(nn.Module):
    def __init__(self):
        super().__init__()
        self.w = nn.Parameter(torch.ones(()))


def _loop(tmp_path, loss, lr, n=16, score=0.0, **kw):
    items = [[0] * 8 for _ in range(n)]
    hooks = TaskHooks(collate=lambda ws: {"x": torch.zeros(len(ws)), "n_targets": len(ws), "real_tokens": 8 * len(ws),
                                          "padded_tokens": 8 * len(ws)},
                      loss_fn=loss, evaluate=lambda m: {"f1": score},
                      save_model=lambda p: os.makedirs(p, exist_ok=True))
    lines = []
    opts = TrainOptions(**{**dict(epochs=2, lr=lr, max_tokens=32, patience=0, log_every=0, warmup_ratio=0.0,
                                  weight_decay=0.0, max_grad_norm=0.0), **kw})
    train_loop(_Constant(), items, hooks, opts=opts, policy=precision.resolve_policy("fp32", "cpu"),
               out_dir=str(tmp_path), log=lines.append)
    return lines


def _scored_0(saved: list) -> TaskHooks:
    """Hooks of a run whose loss falls while every evaluation scores 0; the paths saved go to `saved`."""
    return TaskHooks(collate=lambda ws: {"x": torch.zeros(len(ws)), "n_targets": len(ws), "real_tokens": 8 * len(ws),
                                         "padded_tokens": 8 * len(ws)},
                     loss_fn=lambda m, b: m.w.square() * b["x"].numel(), evaluate=lambda m: {"f1": 0.0},
                     save_model=lambda p: saved.append(p) or os.makedirs(p, exist_ok=True))


def test_a_run_at_dev_f1_0_throughout_keeps_its_last_model_not_its_first(tmp_path):
    """Ties at 0 kept the first epoch's model: 14 epochs of a falling loss thrown away, and "train
    longer" could not help. --patience still counts them as evaluations without a gain."""
    items = [[0] * 8 for _ in range(16)]
    saved = []
    hooks = _scored_0(saved)
    base = dict(lr=0.3, max_tokens=32, log_every=0, warmup_ratio=0.0, weight_decay=0.0, max_grad_norm=0.0)
    s = train_loop(_Constant(), items, hooks, opts=TrainOptions(epochs=3, patience=0, **base),
                   policy=precision.resolve_policy("fp32", "cpu"), out_dir=str(tmp_path / "a"), log=lambda x: None)
    best = [p for p in saved if p == str(tmp_path / "a" / "model")]  # (the checkpoints save one too)
    assert s["best_f1"] == 0.0 and s["best_step"] == s["global_step"] and len(best) == 3
    s = train_loop(_Constant(), items, hooks, opts=TrainOptions(epochs=5, patience=2, **base),
                   policy=precision.resolve_policy("fp32", "cpu"), out_dir=str(tmp_path / "b"), log=lambda x: None)
    assert s["global_step"] == 3 * 4  # stopped after two evaluations without a gain, as before


def test_a_resumed_run_at_dev_f1_0_goes_on_keeping_its_latest_model(tmp_path):
    """The rule that keeps the latest model while every evaluation scored 0 holds across a resume:
    the checkpoint's best score (0) is read back as a score, not as "none yet"."""
    items = [[0] * 8 for _ in range(16)]
    saved = []
    hooks = _scored_0(saved)
    base = dict(lr=0.3, max_tokens=32, log_every=0, warmup_ratio=0.0, weight_decay=0.0, max_grad_norm=0.0,
                patience=0)
    run = dict(policy=precision.resolve_policy("fp32", "cpu"), out_dir=str(tmp_path), log=lambda x: None)
    s = train_loop(_Constant(), items, hooks, opts=TrainOptions(epochs=2, **base), **run)
    assert (s["best_f1"], s["best_step"], s["global_step"]) == (0.0, 8, 8)
    saved.clear()
    s = train_loop(_Constant(), items, hooks, opts=TrainOptions(epochs=4, resume=True, **base), **run)
    assert (s["best_f1"], s["best_step"], s["global_step"]) == (0.0, 16, 16)
    assert saved.count(str(tmp_path / "model")) == 2  # epochs 3 and 4 each kept


def test_the_learning_line_says_a_score_below_0_and_never_compares_a_step_with_itself(tmp_path):
    """A Spearman of -0.1608 was said as "dev Spearman is still 0"; an epoch of one step compared its
    loss with itself ("8.6720 -> 8.6720 ... in 1 optimizer steps")."""
    flat = _loop(tmp_path / "a", lambda m, b: (m.w * 0 + 2.0) * b["x"].numel(), lr=0.1, score=-0.1608)
    said = [x for x in flat if "not learning" in x]
    assert len(said) == 1 and said[0].startswith("not learning: dev F1 is -0.1608 and the loss barely moved")
    one = _loop(tmp_path / "b", lambda m, b: (m.w * 0 + 2.0) * b["x"].numel(), lr=0.1, n=4, epochs=1)
    assert not any("loss" in x and "->" in x for x in one), one  # one step: nothing to compare
    two = _loop(tmp_path / "c", lambda m, b: (m.w * 0 + 2.0) * b["x"].numel(), lr=0.1, n=4, epochs=2)
    assert sum("not learning" in x for x in two) == 1  # its second step against its first


def test_a_run_that_does_not_learn_says_so(tmp_path):
    flat = _loop(tmp_path / "a", lambda m, b: (m.w * 0 + 2.0) * b["x"].numel(), lr=0.1)
    assert sum("not learning" in x for x in flat) == 1 and "--max-tokens" in [x for x in flat if "not learning" in x][0]
    # once while the verdict holds: a 3-epoch run said it after each epoch
    flat5 = _loop(tmp_path / "a5", lambda m, b: (m.w * 0 + 2.0) * b["x"].numel(), lr=0.1, epochs=5)
    assert sum("not learning" in x for x in flat5) == 1
    falling = _loop(tmp_path / "b", lambda m, b: m.w.square() * b["x"].numel(), lr=0.3)
    assert not any("not learning" in x for x in falling)
    # two epochs: after the first there is one to go, after the last the run names its fixes
    assert [x for x in falling if "loss fell" in x][0].endswith("still learning, 1 epoch to go")
    assert "--epochs" in [x for x in falling if "loss fell" in x][1]
    # more epochs: "still learning" once, not at every epoch; the last epoch's fixes still said
    longer = [x for x in _loop(tmp_path / "f", lambda m, b: m.w.square() * b["x"].numel(), lr=0.3, epochs=5)
              if "loss fell" in x]
    assert len(longer) == 2 and longer[0].endswith("still learning, 4 epochs to go") and "--epochs" in longer[1]
    # stopped early inside an epoch (--eval-every, --patience) at F1 0: said as at a last epoch
    # (after step 6: the first 4 steps' loss is then compared with that of steps 3-6)
    early = _loop(tmp_path / "c", lambda m, b: (m.w * 0 + 2.0) * b["x"].numel(), lr=0.1, n=32, eval_every=3,
                  patience=1)
    assert any(x.startswith("early stop after step 6 (epoch 1)") for x in early), early
    assert sum("not learning" in x for x in early) == 1
    assert "a larger --patience" in [x for x in early if "not learning" in x][0]  # not "more --epochs": it stopped
    # said once while it holds, and again where --patience ends the run: with what would train longer there
    held = [x for x in _loop(tmp_path / "h", lambda m, b: (m.w * 0 + 2.0) * b["x"].numel(), lr=0.1, epochs=5,
                             patience=2) if "not learning" in x]
    assert len(held) == 2 and "more --epochs" in held[0] and "a larger --patience" in held[1], held
    # stopped by --patience at an epoch's end while the loss falls: no "epochs to go" beside the stop
    patient = _loop(tmp_path / "e", lambda m, b: m.w.square() * b["x"].numel(), lr=0.3, epochs=4, patience=1)
    fell = [x for x in patient if "loss fell" in x]
    assert any(x.startswith("early stop after epoch 2") for x in patient), patient
    assert len(fell) == 2 and "to go" not in fell[1] and "a larger --patience" in fell[1], fell
    calls = []

    def climbing(m, b):  # a loss that grows with every step: no slow start, an overshoot
        calls.append(1)
        return (m.w * 0 + float(len(calls))) * b["x"].numel()

    rising = [x for x in _loop(tmp_path / "d", climbing, lr=0.1) if "not learning" in x]
    assert rising and all("the loss rose" in x and x.endswith("try a lower --lr") for x in rising)


def test_training_auto_precision_is_bf16_only_on_native_bf16_cpus(monkeypatch):
    monkeypatch.setattr(precision, "cpu_has_bf16", lambda: True)
    assert precision.resolve_policy("auto", "cpu", cpu_bf16=True).name == "bf16"
    assert precision.resolve_policy("auto", "cpu").name == "fp32"  # inference keeps fp32 unless asked
    monkeypatch.setattr(precision, "cpu_has_bf16", lambda: False)
    assert precision.resolve_policy("auto", "cpu", cpu_bf16=True).name == "fp32"


def test_inference_window_is_the_trained_length(tmp_path):
    data = synthetic_ner(40, seed=1, max_clauses=1)
    opts = TrainOptions(epochs=12, lr=2e-2, max_tokens=512, warmup_ratio=0.05, patience=0, log_every=0)
    model = train_ner(data, None, model="tiny", out_dir=str(tmp_path), options=opts, log_fn=lambda s: None)
    longest = max(len(model.tokenizer(e.text)["input_ids"]) for e in data)
    assert model.max_length == math.ceil(longest / 8) * 8 < model.limit
    again = NerModel.load(str(tmp_path / "model"))
    assert again.max_length == model.max_length
    long = " ".join(e.text for e in data[:12])  # far longer than any training window
    assert len(model.tokenizer(long)["input_ids"]) > 3 * model.max_length
    spans = again.predict([long])[0]
    assert max(e for _, e, _ in spans) > len(long) - len(data[11].text)  # the last sentence is still tagged
    # trained on single lines, it reads each line of a document on its own
    assert again.lines
    lines = [e.text for e in data[:12]]
    doc = "\n".join(lines)
    units, _, encs = again.units([doc])
    line_of = [doc.count("\n", 0, s) for s, _ in encs[0].offsets]
    assert len(units) >= len(lines) and all(len(set(line_of[w.start:w.end])) == 1 for w, _ in units)
    want, base = [], 0
    for line, spans in zip(lines, again.predict(lines)):
        want += [(s + base, e + base, lab) for s, e, lab in spans]
        base += len(line) + 1
    assert again.predict([doc])[0] == want
    again.set_max_length(16, 4)
    assert (again.max_length, again.stride) == (16, 4)
    for bad in ((2, None), (10 ** 6, None), (16, 14)):
        with pytest.raises(ConfigError):
            again.set_max_length(*bad)
    with pytest.raises(ConfigError, match="half the window's 30 tokens"):
        again.set_max_length(32, 16)  # more than half a window: refused, not cut unsaid
    # a kept overlap wider than a shorter window is cut to half of it where windows are made
    again.set_max_length(32, 15)
    again.set_max_length(12)
    assert (again.max_length, again.stride) == (12, 15)
    wins = again.units([long])[0]
    assert all(b.start - a.start == 10 - 5 for (a, _), (b, _) in zip(wins, wins[1:]))  # 10 content tokens, step 5
    again.set_max_length(32)
    assert (again.max_length, again.stride) == (32, 15)


def test_a_model_trained_on_multi_line_texts_reads_lines_together(tmp_path):
    from spanflow.data.examples import join_examples

    data = synthetic_ner(20, seed=1, max_clauses=1)
    docs = [join_examples(data[i:i + 2], sep="\n") for i in range(0, 20, 2)]
    opts = TrainOptions(epochs=1, max_tokens=512, log_every=0)
    model = train_ner(docs, None, model="tiny", out_dir=str(tmp_path), options=opts, log_fn=lambda s: None)
    again = NerModel.load(str(tmp_path / "model"))
    assert not model.lines and not again.lines
    units, _, _ = again.units([docs[0].text])
    assert len(units) == 1  # both lines in one window, as in training


def test_flops_per_token_skip_lookup_tables():
    from spanflow.models.encoder import build_tiny
    from spanflow.tasks.ner.heads import EncoderWithHead, TokenClassificationHead
    from spanflow.monitor.report import train_flops_per_token

    enc, _ = build_tiny([e.text for e in synthetic_ner(20, seed=1)], hidden=32, embedding=16, bigram_buckets=1009)
    model = EncoderWithHead(enc, TokenClassificationHead(hidden_size=32, num_labels=3))
    dense = sum(p.numel() for p in enc.lstm.parameters()) + sum(p.numel() for p in model.head.parameters())
    assert train_flops_per_token(model, 30) == 6 * dense  # no bigram or token table, no attention term
    model.head.requires_grad_(False)  # frozen (as a pooler kept to be saved back): no training work of its own
    assert train_flops_per_token(model, 30) == 6 * sum(p.numel() for p in enc.lstm.parameters())


def test_pack_examples_joins_neighbours_within_the_longest_text():
    from spanflow.data.examples import NerExample, join_examples
    from spanflow.tasks.ner.features import pack_examples

    a = NerExample("Ada met Bob", [(0, 3, "PER"), (8, 11, "PER")], words=[(0, 3), (4, 7), (8, 11)])
    b = NerExample("in Oslo", [(3, 7, "LOC")], words=[(0, 2), (3, 7)])
    j = join_examples([a, b])
    assert j.text == "Ada met Bob in Oslo" and j.entities() == [("Ada", "PER"), ("Bob", "PER"), ("Oslo", "LOC")]
    assert [j.text[s:e] for s, e in j.words] == ["Ada", "met", "Bob", "in", "Oslo"]
    data = synthetic_ner(200, seed=3)
    assert pack_examples(data, 0.0) == data
    packed = pack_examples(data, 0.5, seed=1)
    assert len(packed) < len(data) and len(packed) > len(data) // 5
    assert max(len(e.text) for e in packed) <= max(len(e.text) for e in data)
    # nothing lost: the texts and entities come back in order
    assert " ".join(e.text for e in packed) == " ".join(e.text for e in data)
    assert [x for e in packed for x in e.entities()] == [x for e in data for x in e.entities()]
    assert pack_examples(data, 0.5, seed=1) == packed  # deterministic for a seed
    longer = pack_examples(data, 0.5, span=4, seed=1)
    assert len(longer) < len(packed) and max(len(e.text) for e in longer) > max(len(e.text) for e in data)
    assert max(len(e.text) for e in longer) <= 4 * max(len(e.text) for e in data)
    assert [x for e in longer for x in e.entities()] == [x for e in data for x in e.entities()]


def test_a_budget_below_the_texts_scales_the_rates_to_what_a_batch_holds():
    """A batch holds one text at least: --max-tokens 1 on texts of 64 tokens updates on 64 tokens,
    and the unset rates follow that, not 1 (they were scaled to 1 token: 31 times too small)."""
    lines = []
    tiny_budget = fill_defaults(TrainOptions(max_tokens=1), D, lengths=[64] * 200, device=CPU, log=lines.append)
    text_budget = fill_defaults(TrainOptions(max_tokens=64), D, lengths=[64] * 200, device=CPU, log=lambda s: None)
    assert (tiny_budget.lr, tiny_budget.head_lr) == (text_budget.lr, text_budget.head_lr)
    assert tiny_budget.max_tokens == 1  # as asked: the batcher still packs as few texts as it can
    assert any("a budget of 1 tokens a batch (--max-tokens) is below the median training text (64 tokens)" in x
               for x in lines), lines
    lines.clear()
    fill_defaults(TrainOptions(max_tokens=64), D, lengths=[64] * 200, device=CPU, log=lines.append)
    assert not any("below the median" in x for x in lines)


@pytest.mark.parametrize("asked", [dict(max_tokens=100_000), dict(max_tokens=256, grad_accum=100)])
def test_an_update_larger_than_the_data_scales_the_rates_to_the_data_and_says_so(asked):
    """A budget past the whole training set makes one update an epoch of the whole set: the unset
    rates followed the budget asked (20x too high for 40 texts under --max-tokens 100000)."""
    lines = []
    big = fill_defaults(TrainOptions(**asked), D, lengths=[30] * 40, device=CPU, log=lines.append)
    whole = fill_defaults(TrainOptions(max_tokens=1200), D, lengths=[30] * 40, device=CPU, log=lambda s: None)
    assert big.lr == pytest.approx(whole.lr) and big.head_lr == pytest.approx(whole.head_lr)
    assert any("holds the whole training set (1200 padded tokens): 1 update per epoch, and unset learning rates "
               "follow 1200 tokens" in x for x in lines), lines
    lines.clear()
    fill_defaults(TrainOptions(**asked, lr=1e-4, head_lr=1e-3), D, lengths=[30] * 40, device=CPU, log=lines.append)
    assert any(x.endswith("1 update per epoch") for x in lines), lines  # rates given: nothing follows


@pytest.mark.parametrize("asked, said", [
    (TrainOptions(), "an update of 2 micro-batches of 128 tokens holds"),
    (TrainOptions(grad_accum=2), "an update of --grad-accum 2 micro-batches of 128 tokens holds"),
    (TrainOptions(max_tokens=128, grad_accum=2), "an update of --max-tokens 128 x --grad-accum 2 tokens holds"),
    (TrainOptions(max_tokens=128), "an update of 2 micro-batches of --max-tokens 128 tokens holds"),  # accum sized
])
def test_the_whole_set_note_names_only_the_flags_given(asked, said):
    """A task that sized the update (train embed) passes what it sized: the note named
    --max-tokens and --grad-accum the user never gave."""
    lines = []
    fill_defaults(TrainOptions(max_tokens=128, grad_accum=2), D, lengths=[12] * 6, device=CPU, log=lines.append,
                  asked=asked)
    note = next(x for x in lines if "holds the whole training set" in x)
    assert said in note, note
