"""train_embedder: embeddings' part of training (pairs -> token ids, CoSENT loss); fit() does the rest."""
from __future__ import annotations

from collections.abc import Callable

import torch
import torch.nn.functional as F

from spanflow.batching.collate import pad_rows
from spanflow.errors import ConfigError
from spanflow.models.encoder import start_encoder
from spanflow.tasks.embed.model import Embedder
from spanflow.tasks.embed.pairs import Pair
from spanflow.tasks.embed.pooling import Pooling
from spanflow.tasks.embed.st_dir import read_embedding_config
from spanflow.training.defaults import TaskDefaults, for_encoder
from spanflow.training.fit import Plan, fit
from spanflow.training.options import TrainOptions
from spanflow.training.setup import Run

# measured for time to dev Spearman (docs/defaults.md): STS-B en with all-MiniLM-L6-v2
DEFAULTS = {"pretrained": TaskDefaults(lr=5e-5, head_lr=None, epochs=4, patience=2),
            "tiny": TaskDefaults(lr=2e-3, head_lr=None, epochs=20, patience=0)}
COSENT_SCALE = 20.0  # the CoSENT paper's (and sentence-transformers') temperature


class PairItem:
    """A scored pair's token ids; len() is what the batcher counts: both sides padded to the longer."""

    __slots__ = ("a", "b", "score")

    def __init__(self, a: list[int], b: list[int], score: float):
        self.a, self.b, self.score = a, b, score

    def __len__(self) -> int:
        return 2 * max(len(self.a), len(self.b))


def make_collate(pad_id: int) -> Callable[[list], dict]:
    """Both sides of n pairs as one (2n, T) batch, sides a then b, so one forward encodes both."""
    def collate(items: list[PairItem]) -> dict:
        rows = [it.a for it in items] + [it.b for it in items]
        x, m = pad_rows(rows, pad_id)
        return {"input_ids": torch.from_numpy(x), "attention_mask": torch.from_numpy(m),
                "scores": torch.tensor([it.score for it in items], dtype=torch.float32),
                "n_targets": len(items), "real_tokens": sum(len(r) for r in rows), "padded_tokens": int(x.size)}
    return collate


def cosent_loss(module, batch: dict, scale: float = COSENT_SCALE) -> torch.Tensor:
    """CoSENT (Su, 2022): log(1 + sum over pairs i, j with score_i > score_j of exp(scale * (cos_j - cos_i))),
    times the pairs in the batch (the loop divides by the step's targets)."""
    emb = module(batch["input_ids"], batch["attention_mask"]).float()  # (2n, H)
    n = emb.shape[0] // 2
    cos = F.cosine_similarity(emb[:n], emb[n:], dim=-1) * scale  # (n,)
    y = batch["scores"]
    diff = cos[None, :] - cos[:, None]  # diff[i, j] = cos_j - cos_i
    diff = diff.masked_fill(~(y[:, None] > y[None, :]), float("-inf"))
    return torch.logsumexp(torch.cat([diff.new_zeros(1), diff.flatten()]), 0) * n


def start_embedder(source: str, texts: list[str], opts: TrainOptions, policy) -> Embedder:
    """The model to train: an embedding directory's encoder, pooling and normalisation (a plain
    encoder: mean pooling), or `tiny`; fp32 weights, the loop's autocast doing the casting."""
    cfg = read_embedding_config(source) if source != "tiny" else {"encoder_dir": "tiny", "pooling": "mean",
                                                                  "normalize": False, "max_seq_length": None}
    encoder, tokenizer, _ = start_encoder(cfg["encoder_dir"], texts, max_length=opts.max_length, seed=opts.seed)
    pooling = Pooling(mode=cfg["pooling"], normalize=cfg["normalize"])
    emb = Embedder(encoder=encoder, tokenizer=tokenizer, pooling=pooling, precision="fp32", device=str(policy.device),
                   max_length=opts.max_length or cfg["max_seq_length"])
    emb.policy = policy  # evaluation during training runs in the training precision's autocast
    return emb


def train_embedder(train: list[Pair], dev: list[Pair] | None, *, model: str, out_dir: str,
                   options: TrainOptions | None = None, log_fn: Callable[[str], None] = print) -> Embedder:
    """Fine-tune a sentence embedder on scored pairs with CoSENT; the best by dev Spearman is saved
    to `<out_dir>/model` as a sentence-transformers directory and returned."""
    if any(p.score is None for p in train):
        raise ConfigError("training embeddings takes scored pairs (s1, s2, score) so far; pairs and triplets "
                          "for a ranking loss are not supported yet")
    if options is not None and (options.class_weights is not None or options.label_smoothing):
        raise ConfigError("--class-weights and --label-smoothing apply to NER, not to embeddings")

    def setup(run: Run) -> Plan:
        emb = start_embedder(run.source, [t for p in train for t in (p.a, p.b)], run.opts, run.policy)
        a, _ = emb.tokenize([p.a for p in train])
        b, _ = emb.tokenize([p.b for p in train])
        items = [PairItem(x, y, p.score) for x, y, p in zip(a, b, train)]
        run.log(f"{len(train)} scored training pairs; CoSENT loss; {emb.module.pooling.mode} pooling, "
                f"max length {emb.max_length}")
        return Plan(model=emb, items=items, collate=make_collate(emb.tokenizer.pad_token_id or 0),
                    loss_fn=cosent_loss, defaults=for_encoder(DEFAULTS, emb.module.encoder), targets=lambda it: 1,
                    metric="Spearman")

    return fit(setup, dev=dev, model=model, out_dir=out_dir, options=options, load=Embedder.load, log_fn=log_fn)
