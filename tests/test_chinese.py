"""Chinese end to end: character-level BMES data, a Chinese-vocabulary tiny encoder built
in the test, training, prediction and evaluation in character offsets."""
import random

from spanflow.data.io import read_ner
from spanflow.tasks.ner import NerModel, train_ner
from spanflow.training.options import TrainOptions

NAMES = ["张伟", "王芳", "李娜", "刘洋", "陈静", "杨磊"]
ORGS = ["华为公司", "北京大学", "中国银行", "腾讯集团"]
PLACES = ["上海", "广州", "杭州", "成都"]
TEMPLATES = ["{n}在{o}工作。", "{n}毕业于{o}，现居{p}。",
             "{o}位于{p}，{n}任董事。", "{p}人{n}加入{o}"]


def bmes(sentence_parts):
    """(text, label or None) parts -> BMES lines."""
    lines = []
    for text, lab in sentence_parts:
        for i, ch in enumerate(text):
            if lab is None:
                tag = "O"
            elif len(text) == 1:
                tag = f"S-{lab}"
            else:
                tag = ("B" if i == 0 else "E" if i == len(text) - 1 else "M") + f"-{lab}"
            lines.append(f"{ch} {tag}")
    return "\n".join(lines) + "\n\n"


def make_file(path, n, seed):
    rng = random.Random(seed)
    with open(path, "w", encoding="utf-8") as f:
        for _ in range(n):
            t = rng.choice(TEMPLATES)
            vals = {"n": (rng.choice(NAMES), "NAME"), "o": (rng.choice(ORGS), "ORG"), "p": (rng.choice(PLACES), "LOC")}
            parts, rest = [], t
            while rest:
                k = rest.find("{")
                if k == -1:
                    parts.append((rest, None))
                    break
                if k:
                    parts.append((rest[:k], None))
                parts.append(vals[rest[k + 1]])
                rest = rest[k + 3:]
            f.write(bmes(parts))


def test_chinese_bmes_trains_and_predicts_char_offsets(tmp_path):
    make_file(tmp_path / "train.bmes", 80, seed=0)
    make_file(tmp_path / "dev.bmes", 30, seed=1)
    train, dev = read_ner(tmp_path / "train.bmes"), read_ner(tmp_path / "dev.bmes")
    assert " " not in train[0].text  # character-level lines are joined without spaces
    opts = TrainOptions(epochs=10, lr=2e-2, max_tokens=512, max_length=64, patience=0, log_every=0)
    model = train_ner(train, dev, model="tiny", out_dir=str(tmp_path / "run"), options=opts, log_fn=lambda s: None)
    tok = model.tokenizer
    ids = tok("华为公司", add_special_tokens=False)["input_ids"]
    assert len(ids) == 4 and tok.unk_token_id not in ids  # one token per character, all in the vocabulary
    assert model.evaluate(dev)["f1"] >= 0.9
    again = NerModel.load(str(tmp_path / "run" / "model"))
    text = "王芳在腾讯集团工作，现居杭州。"
    (spans,) = again.predict([text])
    assert [(text[s:e], lab) for s, e, lab in spans] == [("王芳", "NAME"), ("腾讯集团", "ORG"), ("杭州", "LOC")]


def test_training_says_what_it_read_and_the_tag_scheme_it_found(tmp_path, capsys):
    """BMES data trained with no word of its scheme; spanflow.json's tag_scheme is the model's (BIO)."""
    from spanflow.cli.main import main

    make_file(tmp_path / "train.bmes", 20, seed=0)
    assert main(["train", "ner", "--train", str(tmp_path / "train.bmes"), "--out", str(tmp_path / "o"),
                 "--max-steps", "1", "--log-every", "0"]) == 0
    out = capsys.readouterr().out
    n = len(read_ner(tmp_path / "train.bmes"))
    assert f"read {tmp_path / 'train.bmes'}: {n} sentences, " in out and "entities; tags BMES (detected)" in out
