"""Training embeddings on scored pairs: CoSENT learns, the saved directory round-trips, the CLI trains."""
import copy
import json
import os
import random
import re

import numpy as np
import pytest
import torch

from spanflow.cli.main import main
from spanflow.data.synthetic import synthetic_ner
from spanflow.tasks.embed import Embedder
from spanflow.tasks.embed.cached import side_inputs
from spanflow.tasks.embed.pairs import Pair
from spanflow.tasks.embed.train import PairItem, cosent_loss, make_collate, train_embedder
from spanflow.training.options import TrainOptions

OPTS = dict(epochs=40, lr=3e-3, max_tokens=4096, log_every=0, patience=0)


def random_pairs(n: int, seed: int) -> list[Pair]:
    """Pairs of unrelated synthetic sentences with random scores: learnable only by memorising."""
    texts = [e.text for e in synthetic_ner(2 * n, seed=seed)]
    rng = random.Random(seed)
    return [Pair(texts[i], texts[n + i], round(rng.random(), 3)) for i in range(n)]


def test_cosent_is_low_when_cosines_follow_the_scores():
    class Fixed(torch.nn.Module):
        def __init__(self, rows):
            super().__init__()
            self.rows = rows

        def forward(self, input_ids, attention_mask):
            return self.rows

    a = torch.tensor([[1.0, 0.0], [1.0, 0.0], [1.0, 0.0]])
    b = torch.tensor([[1.0, 0.0], [1.0, 1.0], [0.0, 1.0]])  # cosines 1, 0.71, 0
    batch = {"part0_ids": None, "part0_mask": None}
    good = cosent_loss(Fixed(torch.cat([a, b])), {**batch, "scores": torch.tensor([1.0, 0.5, 0.0])})
    bad = cosent_loss(Fixed(torch.cat([a, b])), {**batch, "scores": torch.tensor([0.0, 0.5, 1.0])})
    assert good < 0.1 * 3 < bad  # summed over 3 pairs; ordered cosines cost next to nothing
    tied = cosent_loss(Fixed(torch.cat([a, b])), {**batch, "scores": torch.tensor([0.5, 0.5, 0.5])})
    assert tied == 0  # no ordered pair, nothing to learn


def test_pairs_batch_their_sides_apart_where_that_saves_padding():
    """A short side is padded to the other side's length only where splitting saves little: a
    question pads to questions, not to its passage; sides of one length stay one tensor (larger
    products). The padded tokens counted are the tensors' own; the budget's count (len) bounds them."""
    items = [PairItem(([1, 5, 2], [1, 6, 7, 8, 2, 3, 4]), 0.3), PairItem(([1, 9, 2], [1, 2]), 1.0)]
    assert [len(i) for i in items] == [14, 6]
    b = make_collate(0)(items)
    assert b["part0_ids"].tolist() == [[1, 5, 2], [1, 9, 2]]
    assert b["part1_ids"].tolist() == [[1, 6, 7, 8, 2, 3, 4], [1, 2, 0, 0, 0, 0, 0]]
    assert b["part1_mask"].tolist() == [[1] * 7, [1, 1, 0, 0, 0, 0, 0]]
    assert b["padded_tokens"] == 6 + 14 <= 2 * max(len(i) for i in items) and b["real_tokens"] == 15
    assert b["scores"].tolist() == pytest.approx([0.3, 1.0]) and b["n_targets"] == 2
    ids, masks = side_inputs(b)
    assert [t.shape for t in ids] == [(2, 3), (2, 7)] and masks[1] is b["part1_mask"]
    even = make_collate(0)([PairItem(([1, 5, 2], [1, 6, 2])), PairItem(([1, 9, 2], [1, 2]))])
    assert "part1_ids" not in even and even["part0_ids"].tolist() == [[1, 5, 2], [1, 9, 2], [1, 6, 2], [1, 2, 0]]
    assert even["padded_tokens"] == 12 and even["real_tokens"] == 11
    triplets = make_collate(0)([PairItem(([1, 2], [3], [4, 5, 6]))])
    assert len(PairItem(([1, 2], [3], [4, 5, 6]))) == 9 and triplets["sides"] == 3 and "scores" not in triplets
    assert [t.tolist() for t in side_inputs(triplets)[0]] == [[[1, 2]], [[3]], [[4, 5, 6]]]
    assert triplets["padded_tokens"] == triplets["real_tokens"] == 6


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    out = tmp_path_factory.mktemp("emb")
    train = random_pairs(24, seed=1)
    before = train_embedder(train, None, model="tiny", out_dir=str(out / "zero"), log_fn=lambda s: None,
                            options=TrainOptions(**{**OPTS, "epochs": 1, "lr": 1e-9}))
    model = train_embedder(train, train, model="tiny", out_dir=str(out / "run"), log_fn=lambda s: None,
                           options=TrainOptions(**OPTS))
    return train, before, model, str(out / "run" / "model")


def test_an_embedding_model_takes_padded_sides_in_one_call(trained):
    """The sides of a batch, each padded apart, embed in one call as each text would alone, the
    rows in side order (one forward: DDP's gradient hooks fire once)."""
    model = trained[2]
    texts = ["a short one", "a somewhat longer text than the first of them with more words", "hi",
             "another rather long text with many words in it"]
    ids, _ = model.tokenize(texts)
    b = make_collate(model.tokenizer.pad_token_id or 0)([PairItem((ids[0], ids[1])), PairItem((ids[2], ids[3]))])
    assert b["part0_ids"].shape[1] < b["part1_ids"].shape[1]  # padded apart
    module = copy.deepcopy(model.module).cpu().eval()
    with torch.inference_mode():
        rows = module(*side_inputs(b))
        alone = [module(torch.tensor([i]), torch.ones(1, len(i), dtype=torch.int64))
                 for i in (ids[0], ids[2], ids[1], ids[3])]
    torch.testing.assert_close(rows, torch.cat(alone), rtol=1e-4, atol=1e-5)


def test_cosent_training_learns_the_scores(trained):
    train, before, model, _ = trained
    assert before.evaluate(train)["spearman"] < 0.5
    assert model.evaluate(train)["spearman"] > 0.9


def test_the_saved_directory_is_a_sentence_transformers_directory_that_loads_the_same(trained):
    train, _, model, path = trained
    modules = json.load(open(os.path.join(path, "modules.json")))
    assert [m["type"].rsplit(".", 1)[-1] for m in modules] == ["Transformer", "Pooling"]
    pool = json.load(open(os.path.join(path, "1_Pooling", "config.json")))
    assert pool["pooling_mode_mean_tokens"] and not pool["pooling_mode_cls_token"]
    again = Embedder.load(path, device="cpu", precision="fp32")
    texts = [p.a for p in train[:6]]
    model.policy = again.policy  # the trained object ran in the training precision; compare in fp32
    model.module.to(again.policy.device)  # and on one device (it trained on a GPU where there is one)
    np.testing.assert_allclose(again.encode(texts), model.encode(texts), atol=1e-5)
    assert again.evaluate(train)["spearman"] == pytest.approx(model.evaluate(train)["spearman"], abs=1e-6)


def test_spanflow_train_embed_and_evaluate_from_the_command_line(tmp_path, capsys):
    pairs = random_pairs(12, seed=2)
    data = tmp_path / "pairs.csv"
    with open(data, "w", encoding="utf-8") as f:
        for p in pairs:
            f.write(f'"{p.a}","{p.b}",{p.score * 5:.2f}\n')  # scores 0-5, as STS-B has them
    out = tmp_path / "run"
    assert main(["train", "embed", "--train", str(data), "--dev", str(data), "--model", "tiny", "--out", str(out),
                 "--epochs", "2", "--log-every", "0"]) == 0
    said = capsys.readouterr().out
    assert "12 scored training pairs; CoSENT loss" in said
    # a tiny encoder is spanflow's own: the model is not said to load in sentence-transformers (it does not)
    assert "its encoder is spanflow's own `tiny`" in said and "a sentence-transformers directory" not in said
    assert main(["evaluate", "--model", str(out / "model"), "--data", str(data), "--device", "cpu"]) == 0
    assert "spearman" in capsys.readouterr().out
    assert main(["export", "--model", str(out / "model"), "--to", "hf", str(tmp_path / "exp")]) == 2
    assert "its encoder is spanflow's own `tiny`" in capsys.readouterr().err


def test_training_that_cannot_compare_pairs_is_refused_naming_the_file(tmp_path, capsys):
    one, two = tmp_path / "one.csv", tmp_path / "pairs.csv"
    one.write_text('"a cat sat","a cat lay",4.0\n')
    pairs = random_pairs(12, seed=2)
    two.write_text("".join(f'"{p.a}","{p.b}",{p.score * 5:.2f}\n' for p in pairs))
    base = ["--model", "tiny", "--out", str(tmp_path / "run"), "--epochs", "1", "--device", "cpu"]
    assert main(["train", "embed", "--train", str(one), *base]) == 2  # was "every pair has the same score"
    assert capsys.readouterr().err.strip() == f"error: {one} holds 1 pair; it needs at least 2"
    assert main(["train", "embed", "--train", str(two), "--dev", str(one), *base]) == 2  # was "dev holds 1 pair"
    assert capsys.readouterr().err.strip() == f"error: {one} holds 1 pair; it needs at least 2"
    assert main(["train", "embed", "--train", str(two), "--max-tokens", "8", *base]) == 2  # not one pair a batch
    longest = int(re.search(r"give --max-tokens (\d+) or more", capsys.readouterr().err)[1])
    assert main(["train", "embed", "--train", str(two), "--max-tokens", str(longest), *base]) == 2  # one an update
    err = capsys.readouterr().err
    assert err.startswith(f"error: --max-tokens {longest}: an update holds 1 pair of a typical") and \
        "so it needs at least 2" in err


def test_evaluate_takes_the_columns_training_took(tmp_path, capsys):
    from spanflow.errors import ConfigError

    wide = tmp_path / "wide.csv"  # an id column first: training reads it with --columns 1,2,3
    wide.write_text("".join(f'{i},"{p.a}","{p.b}",{p.score * 5:.2f}\n' for i, p in enumerate(random_pairs(12, seed=2))))
    out = tmp_path / "run"
    assert main(["train", "embed", "--train", str(wide), "--columns", "1,2,3", "--model", "tiny", "--out", str(out),
                 "--epochs", "1", "--device", "cpu"]) == 0
    capsys.readouterr()
    assert main(["evaluate", "--model", str(out / "model"), "--data", str(wide), "--columns", "1,2,3"]) == 0
    assert "spearman" in capsys.readouterr().out
    for flag in (["--format", "conll"], ["--scheme", "bio"]):  # NER's reading flags: refused, not ignored
        assert main(["evaluate", "--model", str(out / "model"), "--data", str(wide), "--columns", "1,2,3", *flag]) == 2
        assert f"{flag[0]} names the " in capsys.readouterr().err
    emb = Embedder.load(str(out / "model"))
    with pytest.raises(ConfigError, match=f"the model's limit {emb.limit}, got 100000"):  # was cut to the limit unsaid
        emb.set_max_length(100000)


def test_scored_pairs_train_with_grad_accum_and_no_max_tokens(tmp_path, capsys):
    """--grad-accum without --max-tokens: each micro-batch as training's defaults size it (a
    TypeError traceback before)."""
    data = tmp_path / "pairs.csv"
    data.write_text("".join(f'"{p.a}","{p.b}",{p.score * 5:.2f}\n' for p in random_pairs(12, seed=3)), encoding="utf-8")
    assert main(["train", "embed", "--train", str(data), "--model", "tiny", "--out", str(tmp_path / "run"),
                 "--grad-accum", "2", "--epochs", "1", "--device", "cpu"]) == 0
    assert (tmp_path / "run" / "model" / "modules.json").exists()
    # no --dev: the metric is the training data's (it named MRR@10 for scored pairs)
    assert json.loads((tmp_path / "run" / "train_options.json").read_text())["dev_metric"] == "Spearman"


def test_scored_pairs_take_the_grad_accum_and_max_tokens_given_and_say_how_they_rank(tmp_path):
    """--grad-accum 1 was taken for unset (the default's two micro-batches ran), a --max-tokens below
    the longest pair was accepted (ranking refused it), and a given --max-tokens left the run without
    its line on how the loss ranks."""
    from spanflow.errors import ConfigError

    pairs = random_pairs(12, seed=3)
    lines = []

    def run(name: str, **kw):
        return train_embedder(pairs, None, model="tiny", out_dir=str(tmp_path / name),
                              options=TrainOptions(epochs=1, log_every=0, **kw), log_fn=lines.append)

    run("one", grad_accum=1)
    said = [x for x in lines if "CoSENT loss over each update" in x]
    assert len(said) == 1 and "one micro-batch" in said[0], lines
    lines.clear()
    run("given", max_tokens=512)
    assert any("CoSENT loss over each update: one micro-batch of 512 tokens" in x for x in lines), lines
    with pytest.raises(ConfigError, match=r"^--max-tokens 4 is below the longest training item, \d+ tokens"):
        run("short", max_tokens=4)


def test_pairs_without_scores_train_with_the_ranking_loss(tmp_path):
    from spanflow.errors import ConfigError

    lines = []
    train_embedder([Pair("a b", "c d"), Pair("e f", "g h")], None, model="tiny", out_dir=str(tmp_path / "x"),
                   options=TrainOptions(epochs=1, log_every=0), log_fn=lines.append)
    assert any("2 training pairs; ranking loss" in x for x in lines), lines
    # a budget below a pair: was "micro-batches of 2 tokens", more of them than pairs, one pair each
    with pytest.raises(ConfigError, match=r"^--max-tokens 2 is below the longest training item, \d+ tokens"):
        train_embedder([Pair("a b", "c d"), Pair("e f", "g h")], None, model="tiny", out_dir=str(tmp_path / "y"),
                       options=TrainOptions(epochs=1, log_every=0, max_tokens=2), log_fn=lines.append)


def test_a_run_says_what_its_starting_model_scored_and_warns_when_never_beaten(tmp_path, capsys):
    data = tmp_path / "pairs.csv"
    data.write_text("".join(f'"{p.a}","{p.b}",{p.score * 5:.2f}\n' for p in random_pairs(12, seed=2)))
    base = ["--train", str(data), "--dev", str(data), "--epochs", "1", "--precision", "fp32", "--device", "cpu"]
    assert main(["train", "embed", *base, "--model", "tiny", "--out", str(tmp_path / "a")]) == 0
    assert "the starting model" not in capsys.readouterr().out  # a tiny encoder from scratch scores nothing yet
    ran = json.loads((tmp_path / "a" / "train_options.json").read_text())  # the task's own settings too
    assert (ran["loss"], ran["training_data_of"], ran["symmetric"]) == ("cosent", "scored pairs", False), ran
    assert not {"head_lr", "stride", "label_smoothing", "pack", "oversample"} & set(ran)  # no head, no windows
    start = str(tmp_path / "a" / "model")
    # an update too small to move fp32 weights: the run ends where it started, and says so
    assert main(["train", "embed", *base, "--model", start, "--out", str(tmp_path / "b"), "--lr", "1e-20"]) == 0
    said = capsys.readouterr().out
    line = next(x for x in said.splitlines() if x.startswith("the starting model, before this run's training: dev Spearman "))
    score = line.rsplit(" ", 1)[1]
    assert f"warning: training did not beat the starting model's dev Spearman {score} (the best {score})" in said
    # a run cut short before any evaluation has nothing to compare: no warning
    assert main(["train", "embed", *base, "--model", start, "--out", str(tmp_path / "c"), "--max-steps", "1"]) == 0
    assert "did not beat" not in capsys.readouterr().out


def test_the_default_scored_update_holds_two_pairs_of_a_typical_length():
    from spanflow.tasks.embed.train import size_scored_update, typical_pair

    class Sized:  # a pair item as the sizing reads it: its padded tokens
        def __init__(self, n):
            self.n = n

        def __len__(self):
            return self.n

    items = [Sized(200)] + [Sized(150)] * 149  # a small set of long pairs: 256 tokens an update by the table
    o = size_scored_update(TrainOptions(), items, torch.device("cpu"), 1)
    assert o.max_tokens * o.grad_accum >= 2 * typical_pair(items) == 300


def test_a_run_stopped_by_max_steps_returns_a_model_in_eval_mode_and_saves_take_no_other_files(tmp_path,
                                                                                              monkeypatch):
    from spanflow.errors import ConfigError, WriteError

    pairs = random_pairs(24, seed=5)
    emb = train_embedder(pairs, None, model="tiny", out_dir=str(tmp_path / "run"),
                         options=TrainOptions(max_steps=2, precision="fp32"), log_fn=None)
    texts = [p.a for p in pairs[:4]]
    assert not emb.module.training and np.array_equal(emb.encode(texts), emb.encode(texts))  # dropout off
    (tmp_path / "notes").mkdir()
    (tmp_path / "notes" / "todo.txt").write_text("mine")
    (tmp_path / "afile").write_text("mine")
    for there, said in (("notes", "holds 1 other file"), ("afile", "is a file; a model is saved as a directory")):
        with pytest.raises(ConfigError, match=said):
            emb.save(str(tmp_path / there))
    assert (tmp_path / "notes" / "todo.txt").read_text() == "mine" and (tmp_path / "afile").read_text() == "mine"
    (tmp_path / "m.old").mkdir()  # the user's own: a second save over m never takes it for its old copy
    (tmp_path / "m.old" / "keep.txt").write_text("mine")
    emb.save(str(tmp_path / "m"))
    emb.save(str(tmp_path / "m"))
    assert (tmp_path / "m.old" / "keep.txt").read_text() == "mine"
    assert np.allclose(Embedder.load(str(tmp_path / "m"), precision="fp32").encode(texts), emb.encode(texts),
                       atol=1e-5)

    def full(*a, **k):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr("spanflow.tasks.embed.st_dir.os.makedirs", full)
    with pytest.raises(WriteError, match=r"cannot write the model to .*/m2: No space left on device"):
        emb.save(str(tmp_path / "m2"))  # the API's own error type, naming the path given
    assert not (tmp_path / "m2").exists()


def test_int8_of_a_tiny_encoder_is_refused_as_a_change_it_would_not_make(trained, tmp_path, capsys):
    """int8 quantizes linear layers; the tiny encoder (a recurrence) has none: the vectors came out
    unchanged while the run said `quantize int8`."""
    from spanflow.errors import ConfigError

    with pytest.raises(ConfigError, match=r"--quantize int8 quantizes an encoder's linear layers, and this model's "
                                          r"encoder \(\w+\) has none"):
        Embedder.load(trained[3], quantize="int8", device="cpu")
    src = tmp_path / "in.txt"
    src.write_text("a b\n", encoding="utf-8")
    assert main(["embed", "--model", trained[3], "--input", str(src), "--output", str(tmp_path / "v.npy"),
                 "--quantize", "int8"]) == 2
    assert "leave --quantize out" in capsys.readouterr().err and not (tmp_path / "v.npy").exists()
