"""A spaCy pipeline component that runs a spanflow NER model inside `nlp.pipe`.

    nlp.add_pipe("spanflow_ner", config={"model": "runs/ner/model"})

Registered through spaCy's `spacy_factories` entry point, so installing spanflow is enough.
Each batch of docs spaCy passes goes through spanflow's token-budget batching, on the same
words `predict` uses (tasks.ner.words). Entities are character spans. A model that labels
whitespace-separated words gives spans that start and end at whitespace, which every spaCy
tokenizer that splits at whitespace also cuts at: they align exactly and equal `predict`'s.
One that starts or ends inside a spaCy token (a model on the tokenizer's words, or a spaCy
token that holds a space) is aligned as config "alignment" says (spaCy's `alignment_mode`):
expanded to the tokens around it (the default), contracted to the tokens inside it, or left
out (strict); one that would overlap an earlier entity after that, or one an earlier component
of the pipeline set (which stay), is left out. Each is counted (`expanded`, `contracted`,
`unaligned`, `overlapping`) and said in one warning per batch, never dropped in silence.
"""
from __future__ import annotations

import functools
import logging
import os
import sys
import uuid

from spacy.language import Language

log = logging.getLogger("spanflow")
ALIGNMENTS = ("expand", "contract", "strict")  # spaCy's alignment modes of Doc.char_span
CONFIG_FLAGS = {"--max-tokens": "max_tokens", "--device": "device", "--precision": "precision"}
OFF = "did not end on spaCy token boundaries and were"
# what each of the component's counts (_counts' order) says of the entities it counts
COUNTED = (f"{OFF} expanded to the tokens around them", f"{OFF} contracted to the tokens inside them",
           f"{OFF} left out (alignment {{}})", "overlapped another entity (the model's or one set before it) and "
           "were left out")


def _one_thread_after_fork() -> None:
    """`nlp.pipe(n_process=N)` forks workers from a process whose torch has run: the thread pool
    the parent started is not in the child, and the child's first parallel product waits for it
    for ever. On one thread a product never enters the pool; N processes are N threads."""
    import torch

    torch.set_num_threads(1)


@functools.cache
def _fork_on_one_thread() -> None:
    """Register _one_thread_after_fork, once per process."""
    if hasattr(os, "register_at_fork"):
        os.register_at_fork(after_in_child=_one_thread_after_fork)


class SpanflowNer:
    """Sets `doc.ents` from a spanflow NER model (any directory `spanflow predict` takes)."""

    def __init__(self, nlp: Language, name: str, model: str, max_tokens: int | None = None, device: str = "auto",
                 precision: str = "auto", alignment: str = "expand"):
        from spanflow.errors import ConfigError

        _fork_on_one_thread()
        if alignment not in ALIGNMENTS:
            raise ConfigError(f"spanflow_ner: alignment must be one of {', '.join(ALIGNMENTS)}, got {alignment!r}",
                              field="alignment")
        self.name, self.alignment = name, alignment
        self._asked = (max_tokens, device, precision)  # what from_disk loads a saved copy with
        self.expanded = self.contracted = self.unaligned = self.overlapping = 0
        self._token = uuid.uuid4().hex  # this component's mark on the docs it ran over (another's, a copy's, differ)
        self.model_dir, self.model, self.max_tokens = model, None, max_tokens
        if not _from_config():  # spacy.load builds from config.cfg, then from_disk loads the saved copy:
            self._load(model)    # the config's path (perhaps another machine's) only where no copy comes

    def _load(self, path: str) -> None:
        self.model, self.max_tokens = _load(path, *self._asked)
        self.model_dir = path

    def to_disk(self, path, *, exclude=()) -> None:
        """nlp.to_disk: a copy of the model directory in the pipeline's own (`<name>/model`), so
        that spacy.load finds it wherever the pipeline is moved; written aside, then renamed in."""
        import shutil

        from spanflow.atomic import atomic_dir

        self._loaded()
        os.makedirs(path, exist_ok=True)
        with atomic_dir(os.path.join(path, "model"), "spacy") as tmp:
            shutil.copytree(self.model_dir, tmp, dirs_exist_ok=True)

    def from_disk(self, path, *, exclude=()):
        """nlp.from_disk / spacy.load: the model copy to_disk saved, else (a pipeline saved without
        one) the model its config names."""
        saved = os.path.join(path, "model")
        self._load(saved if os.path.isdir(saved) else self.model_dir)
        return self

    def _loaded(self) -> None:
        """The model, loaded from the config's path where the pipeline was built from a config
        that no from_disk followed (a missing path raises here, naming it)."""
        if self.model is None:
            self._load(self.model_dir)

    @property
    def labels(self) -> tuple[str, ...]:
        """The entity types the model tags, as spaCy's own ner gives them (none while spacy.load
        builds the pipeline, which asks before from_disk has loaded the model)."""
        return tuple(self.model.labels) if self.model is not None else ()

    def __call__(self, doc):
        self._loaded()
        (doc,) = self.pipe([doc])  # the whole batch: its warning is said after the last doc
        return doc

    def score(self, examples, **kwargs) -> dict:
        """`nlp.evaluate`'s entity scores (ents_p, ents_r, ents_f, ents_per_type), as spaCy's ner gives."""
        from spacy.scorer import get_ner_prf

        return get_ner_prf(examples, **kwargs)

    def pipe(self, docs, batch_size: int = 1000):
        from spanflow.batching.prefetch import chunked

        self._loaded()
        for chunk in chunked(docs, batch_size):
            chunk = list(chunk)
            results = list(self.model.predict_stream((d.text for d in chunk), max_tokens=self.max_tokens))
            before = self._counts()
            for doc, spans in zip(chunk, results):
                self._set_ents(doc, spans)
                yield doc
            grown = [now - was for now, was in zip(self._counts(), before)]
            said = [f"{n} {what.format(self.alignment)}" for n, what in zip(grown, COUNTED) if n]
            if said:
                log.warning("%s: of the model's entities, %s", self.name, "; ".join(said))

    def _counts(self) -> tuple[int, int, int, int]:
        return self.expanded, self.contracted, self.unaligned, self.overlapping

    def _set_ents(self, doc, spans) -> None:
        # entities an earlier component set (an entity_ruler's, a preset's) stay, as they do before
        # spaCy's own ner; the model's that would overlap one are left out
        kept = list(doc.ents)
        taken = {i for ent in kept for i in range(ent.start, ent.end)}
        same = {(ent.start, ent.end, ent.label_) for ent in kept}  # a doc run through twice: its own, no overlap
        # a doc this component ran over already: its spans were counted (and warned of) then
        counts = doc.user_data.get(SEEN) != self._token
        ents, last_end = [], -1
        for s, e, label in spans:
            span = doc.char_span(s, e, label=label)
            if span is None and self.alignment != "strict":
                span = doc.char_span(s, e, label=label, alignment_mode=self.alignment)
                if span is not None and len(span):
                    self.expanded += counts and self.alignment == "expand"
                    self.contracted += counts and self.alignment == "contract"
            if span is None or not len(span):  # no token holds it (contracted: none inside it)
                self.unaligned += counts
                continue
            if (span.start, span.end, span.label_) in same:
                continue
            if span.start < last_end or any(i in taken for i in range(span.start, span.end)):
                self.overlapping += counts
                continue
            ents.append(span)
            last_end = span.end
        doc.ents = sorted(kept + ents, key=lambda x: x.start)
        doc.user_data[SEEN] = self._token


SEEN = "spanflow_ner"  # doc.user_data's key: the mark of the component that set its entities last


def _from_config() -> bool:
    """Whether spaCy is building this component from a pipeline's config (Language.from_config, as
    spacy.load does before from_disk), not from a user's add_pipe: spaCy passes its factories no
    sign of it, so its frames are asked (spaCy 3's spacy.language.Language.from_config)."""
    frame = sys._getframe(1)
    while frame is not None:
        if frame.f_code.co_name == "from_config" and frame.f_globals.get("__name__") == "spacy.language":
            return True
        frame = frame.f_back
    return False


def _load(model: str, max_tokens, device: str, precision: str):
    """The NER model at `model` and the budget it runs with; an error names the config's keys (a
    spaCy user sets `max_tokens`, not `--max-tokens`), and a relative path the directory it was
    taken from (a config.cfg loaded elsewhere keeps the path as it was given)."""
    from spanflow.errors import ConfigError, ModelDirError
    from spanflow.runtime.loads import Loads
    from spanflow.runtime.resolve import Asked, resolve_runtime
    from spanflow.tasks.registry import check_model_for, task_of_dir

    if precision == "int8":  # the commands' message points at --quantize, which NER models do not take
        from spanflow.runtime.policy import PRECISIONS

        raise ConfigError("spanflow_ner: config 'precision' int8 is a quantization, which NER models do not take; "
                          f"precision is one of {', '.join(PRECISIONS)}", field="precision")
    try:
        # an encoder (an embedding model's) or a model of another task is told as the commands tell it
        check_model_for(model, "ner")
        # auto: the precision an earlier predict or evaluate checked for this model (cached), else checked now
        loads = Loads(task_of_dir(model), model)
        rt = resolve_runtime(loads.task, model, Asked(device=device, precision=precision, max_tokens=max_tokens),
                             loads=loads)  # its runtime line names the budget the component runs with
        ner = loads.take(rt)
    except ConfigError as e:
        message = str(e)
        for flag, key in CONFIG_FLAGS.items():
            message = message.replace(flag, f"config {key!r}")
        raise ConfigError(f"spanflow_ner: {message}", field=e.field) from e
    except ModelDirError as e:
        missing = not os.path.exists(model) and not os.path.isabs(model)
        where = f" (a relative path, taken from {os.getcwd()})" if missing else ""
        raise ModelDirError(f"spanflow_ner: {e}{where}") from e
    return ner, rt.max_tokens


@Language.factory("spanflow_ner", default_config={"model": None, "max_tokens": None, "device": "auto",
                                                   "precision": "auto", "alignment": "expand"})
def make_spanflow_ner(nlp: Language, name: str, model: str | None, max_tokens: int | None, device: str,
                      precision: str, alignment: str) -> SpanflowNer:
    """The `spanflow_ner` factory: config "model" is a spanflow NER model directory (typed to take
    None, its default, so a missing one meets this message, not spaCy's validation dump)."""
    if not model:
        from spanflow.errors import ConfigError

        raise ConfigError('spanflow_ner needs config={"model": "path/to/model"}', field="model")
    return SpanflowNer(nlp, name, model, max_tokens=max_tokens, device=device, precision=precision,
                       alignment=alignment)
