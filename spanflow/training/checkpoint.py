"""Checkpoints: a full model directory plus optimizer/scheduler/RNG state, written aside and
renamed into place: a kill or a full disk leaves the last good checkpoint as it was, and a
full disk says so in one WriteError."""
from __future__ import annotations

import dataclasses
import functools
import json
import os

import torch

from spanflow.atomic import recover_dir, writing
from spanflow.errors import ModelDirError
from spanflow.models.directory import write_aside
from spanflow.schemas.fields import json_quote

STATE = "state.json"
TRAINER = "trainer.pt"


def save_checkpoint(ckpt_dir: str, *, save_model, optimizer, scheduler, scaler, state: dict,
                    rng_states: list | None = None) -> None:
    """Write model (via `save_model(path)`), optimizer, scheduler, scaler, RNG and loop state; a
    WriteError naming `ckpt_dir` when the disk is full (or read-only, or not ours)."""
    with writing("the checkpoint", ckpt_dir), write_aside(ckpt_dir, "ckpt") as tmp:
        save_model(os.path.join(tmp, "model"))
        trainer = {
            "optimizer": _packed(optimizer.state_dict()),
            "scheduler": scheduler.state_dict(),
            "scaler": scaler.state_dict() if scaler is not None else {},
            "torch_rng": torch.get_rng_state(),
            "torch_rng_ranks": rng_states or [torch.get_rng_state()],
        }
        if torch.cuda.is_available():
            trainer["cuda_rng"] = torch.cuda.get_rng_state_all()
        _torch_save(trainer, os.path.join(tmp, TRAINER))
        with open(os.path.join(tmp, STATE), "w", encoding="utf-8") as f:
            json.dump(state, f, indent=2)


# a vocabulary table's optimizer moments are zero in every row training has not reached (most of a
# large vocabulary's): a checkpoint writes the other rows and their indices, a load puts the zeros back
PACKED = "spanflow_packed_rows"
PACK_MIN_ROWS, PACK_MAX_LIVE = 64, 0.75  # tables this tall, where at most this share of rows is not zero
_BITS = {2: torch.int16, 4: torch.int32, 8: torch.int64}


def _pack_rows(t):
    """`t`, or where it is a float table most of whose rows are zero, those rows left out. A row is
    zero by its bits: -0.0 is kept, so a load gives back `t` bit for bit."""
    if not (torch.is_tensor(t) and t.dim() == 2 and t.shape[0] >= PACK_MIN_ROWS and t.is_floating_point()
            and t.element_size() in _BITS):
        return t
    live = t.detach().contiguous().view(_BITS[t.element_size()]).ne(0).any(1)
    rows = live.nonzero()[:, 0]
    if len(rows) > PACK_MAX_LIVE * t.shape[0]:
        return t
    return {PACKED: rows.cpu(), "values": t.detach().index_select(0, rows).cpu(), "shape": list(t.shape)}


def _unpack_rows(v):
    if not (isinstance(v, dict) and PACKED in v):
        return v
    out = torch.zeros(v["shape"], dtype=v["values"].dtype)
    return out.index_copy_(0, v[PACKED], v["values"])


def _packed(sd: dict) -> dict:
    """An optimizer's state dict with its mostly-zero tables packed (_pack_rows)."""
    return {**sd, "state": {i: {k: _pack_rows(x) for k, x in st.items()} for i, st in sd["state"].items()}}


def _unpacked(sd: dict) -> dict:
    """_packed undone; a checkpoint written before packing is read as it is."""
    return {**sd, "state": {i: {k: _unpack_rows(x) for k, x in st.items()} for i, st in sd["state"].items()}}


def _torch_save(obj, path: str) -> None:
    """torch.save, with a full disk raised as the OSError it is. Given a path, torch's zip writer
    reports it as its own RuntimeError ("unexpected pos ..."), the errno lost; given a file opened
    here, the file's write raises the OSError, which torch either lets through or keeps as the
    context of that RuntimeError, raised when the writer closes."""
    with open(path, "wb") as f:
        try:
            torch.save(obj, f)
        except RuntimeError as e:
            if isinstance(e.__context__, OSError):
                raise e.__context__ from None
            raise


def has_checkpoint(ckpt_dir: str) -> bool:
    recover_dir(ckpt_dir)
    return os.path.exists(os.path.join(ckpt_dir, STATE)) and os.path.exists(os.path.join(ckpt_dir, TRAINER))


CHECKPOINT_FILES = (STATE, TRAINER, "model")


def check_checkpoint(ckpt_dir: str) -> None:
    """A ModelDirError where --resume finds a checkpoint with a part missing (a copy cut short, a
    file removed by hand): resuming without it would start over and replace the rest."""
    if not os.path.isdir(ckpt_dir) or has_checkpoint(ckpt_dir):
        return
    here = [n for n in CHECKPOINT_FILES if os.path.exists(os.path.join(ckpt_dir, n))]
    if here:
        gone = [n for n in (STATE, TRAINER) if n not in here]
        raise ModelDirError(f"the checkpoint in {ckpt_dir} has no {' or '.join(gone)}: it is incomplete; remove the "
                            "checkpoint to start over, or run without --resume")


def check_checkpoint_destination(ckpt_dir: str) -> None:
    """A ConfigError where a run's checkpoint would replace what is no checkpoint: a file, a
    directory of other files, or a checkpoint with files of the user's beside it (a run replaces,
    and a fresh one removes, its checkpoint whole)."""
    from spanflow.models.directory import check_destination

    check_destination(ckpt_dir, what="checkpoint", marks=CHECKPOINT_FILES, ours=CHECKPOINT_FILES.__contains__)


# what a checkpoint's state must hold, as the loop reads it back
STATE_KEYS = {"epoch": int, "step_in_epoch": int, "global_step": int, "bad_evals": int, "stopped": bool}


def _check_state(state: dict, path: str) -> None:
    for key, kind in STATE_KEYS.items():
        v = state.get(key)
        if not isinstance(v, kind) or (kind is int and (isinstance(v, bool) or v < 0)):
            what = ("missing" if key not in state
                    else f"{json_quote(v, 40)}, not a {'count' if kind is int else kind.__name__}")
            raise ModelDirError(f"{path} is not a checkpoint's state: {key!r} is {what}; remove the checkpoint to "
                                "start over")
    best = state.get("best_f1")
    if best is not None and (isinstance(best, bool) or not isinstance(best, (int, float))):
        raise ModelDirError(f"{path} is not a checkpoint's state: 'best_f1' is {json_quote(best, 40)}; remove the "
                            "checkpoint to start over")


def load_checkpoint(ckpt_dir: str, *, optimizer, scheduler, scaler, rank: int = 0,
                    identity: dict | None = None) -> dict:
    """Restore optimizer, scheduler, scaler and RNG state; return the loop state dict. `identity`
    (run_identity of the run resuming): a checkpoint of another run is refused before its state
    is applied, naming what differs."""
    path = os.path.join(ckpt_dir, TRAINER)
    try:
        trainer = torch.load(path, map_location="cpu", weights_only=True)
        path = os.path.join(ckpt_dir, STATE)
        with open(path, encoding="utf-8") as f:
            state = json.load(f)
    except Exception as e:  # truncated by a full disk or a copy; torch and json each fail their own way
        why = str(e).strip().splitlines()[0] if str(e).strip() else ""  # torch's first line says what; the rest is advice
        raise ModelDirError(f"the checkpoint in {ckpt_dir} is unreadable: {path} ({type(e).__name__}"
                            f"{': ' + why[:160] if why else ''}); remove the checkpoint to start over, or run "
                            "without --resume") from None
    if not isinstance(state, dict):
        raise ModelDirError(f"{os.path.join(ckpt_dir, STATE)} is not a JSON object; remove the checkpoint to start "
                            "over")
    _check_state(state, os.path.join(ckpt_dir, STATE))
    if identity is not None:
        check_same_run(state.get("run"), identity, ckpt_dir)
    try:
        optimizer.load_state_dict(_unpacked(trainer["optimizer"]))
        scheduler.load_state_dict(trainer["scheduler"])
        if scaler is not None and trainer["scaler"]:
            scaler.load_state_dict(trainer["scaler"])
        ranks = trainer.get("torch_rng_ranks") or [trainer["torch_rng"]]
        torch.set_rng_state(ranks[rank] if rank < len(ranks) else trainer["torch_rng"])
        if "cuda_rng" in trainer and torch.cuda.is_available():
            torch.cuda.set_rng_state_all(trainer["cuda_rng"])
    except Exception as e:  # read whole, but of another model: another task's run, or one from before the record
        raise ModelDirError(f"the checkpoint in {ckpt_dir} does not fit this run's model ({type(e).__name__}: "
                            f"{str(e)[:200]}): it is of another run; start a new run (another --out, or no --resume)"
                            ) from None
    return state


# the options that set a run's course: a resume under other values would continue one run as another
COURSE = ("lr", "head_lr", "weight_decay", "warmup_ratio", "max_grad_norm", "grad_accum", "max_tokens", "max_length",
          "stride", "seed", "label_smoothing", "class_weights", "llrd", "pack", "pack_span", "oversample")


# options a continued model keeps as it was trained where they are unset (None)
MODEL_OWN = ("max_length", "stride")


def run_identity(items: list, opts, origin: str | None, processes: int = 1, course: dict | None = None) -> dict:
    """What a checkpoint's run was: the model it started from (`origin` as given, and what its
    files are: the same encoder copied elsewhere is the same model), its training items (how many,
    their tokens, a digest of their lengths and one of their content), the options that set its
    course, as JSON holds them, and its processes (the global batch, and the learning rate scaled
    to it, follow their number), and the task's own `course` (its loss and the kind of data it
    trains on)."""
    import hashlib

    import numpy as np

    lengths = np.fromiter((len(it) for it in items), dtype=np.int64, count=len(items))
    options = json.loads(json.dumps({k: getattr(opts, k) for k in COURSE}, default=_plain))  # numpy scalars too
    return {"model": origin, "model_files": _model_files(origin), "items": len(items), "tokens": int(lengths.sum()),
            "digest": hashlib.sha1(lengths.tobytes()).hexdigest()[:16], "content": _content(items),
            "options": options, "processes": processes, "course": json.loads(json.dumps(course or {}, default=_plain))}


def _content(items: list) -> str | None:
    """A digest of what the training items hold, their targets too (labels, triples, scores): the
    same texts relabelled are other data, which a digest of their lengths does not tell. Hashed
    item by item (no copy of the data in memory); None where an item has no stable plain form
    (a class of a task plugged in from elsewhere, say): then it is not compared."""
    import hashlib

    h = hashlib.sha1()
    try:
        for it in items:
            h.update(repr(_fields(it)).encode())
    except (_NoPlainForm, RecursionError):  # a cycle (a parent pointer) has no plain form either
        return None
    return h.hexdigest()[:16]


class _NoPlainForm(Exception):
    pass


PLAIN = (int, float, str, bool, bytes, type(None))


def _fields(x):
    """An item as plain values, recursively: a dataclass's fields, a class's attributes (its
    __dict__ or __slots__, beside its list's items for a list subclass): an object's default repr
    is its address, which no other process shares."""
    if isinstance(x, PLAIN):
        return x
    if dataclasses.is_dataclass(x):
        return [_fields(getattr(x, f.name)) for f in dataclasses.fields(x)]
    if hasattr(x, "tolist"):  # numpy arrays and scalars, tensors
        return x.tolist()
    slots = _slots(type(x))
    own = sorted(vars(x).items()) if hasattr(x, "__dict__") else []
    own += [(k, getattr(x, k, None)) for k in slots]
    if isinstance(x, (list, tuple)):  # token ids and labels: plain already (ends checked), the bulk of the data
        items = x if not x or isinstance(x[0], PLAIN) and isinstance(x[-1], PLAIN) else [_fields(v) for v in x]
        return [list(items), [(k, _fields(v)) for k, v in own]] if own else items
    if isinstance(x, dict):
        return sorted((repr(k), _fields(v)) for k, v in x.items())
    if isinstance(x, (set, frozenset)):
        return sorted(repr(_fields(v)) for v in x)
    if own or slots:
        return [(k, _fields(v)) for k, v in own]
    raise _NoPlainForm(type(x).__name__)


@functools.lru_cache(maxsize=None)  # once a class, not once an item
def _slots(cls) -> tuple[str, ...]:
    """The __slots__ of `cls` and the classes it derives from (one name may stand alone as a str)."""
    names = []
    for c in cls.__mro__:
        own = c.__dict__.get("__slots__", ())
        names += [n for n in ((own,) if isinstance(own, str) else own) if n not in ("__dict__", "__weakref__")]
    return tuple(names)


def _said(value) -> str:
    """A course value as a flag reads: lists comma-joined, on/off, unset."""
    if isinstance(value, bool):
        return "on" if value else "off"
    return "unset" if value is None else ",".join(map(str, value)) if isinstance(value, list) else str(value)


def _num(value) -> str:
    """An option's value as a message shows it: a rate to 3 significant digits, not 0.0003535533905932738."""
    return f"{value:.3g}" if isinstance(value, float) else "unset" if value is None else str(value)


def _plain(value):
    return value.item() if hasattr(value, "item") else str(value)


def _model_files(origin: str | None) -> str | None:
    """A digest of a model directory's configs and its files' sizes (not its path); None for `tiny`."""
    import hashlib

    if not origin or not os.path.isdir(origin):
        return None
    h = hashlib.sha1()
    for root, dirs, files in os.walk(origin):
        dirs.sort()
        for name in sorted(files):
            path = os.path.join(root, name)
            h.update(f"{os.path.relpath(path, origin)}:{os.path.getsize(path)};".encode())
            if name.endswith(".json") and os.path.getsize(path) < 1 << 20:
                with open(path, "rb") as f:
                    h.update(f.read())
    return h.hexdigest()[:16]


def check_same_run(saved: dict | None, now: dict, ckpt_dir: str) -> None:
    """A ConfigError naming what differs where --resume would continue the checkpoint's run with
    another model, other data or other options (a checkpoint from before this record: nothing)."""
    from spanflow.errors import ConfigError

    if not isinstance(saved, dict):
        return
    changed = []
    was, course = saved.get("course") or {}, now.get("course") or {}
    for k in course:  # first: another loss or data kind changes the options derived below
        if k in was and was[k] != course[k]:
            changed.append(f"{k} {_said(was[k])} (now {_said(course[k])})")
    processes = saved.get("processes", now["processes"]) != now["processes"]
    if processes:  # before options: it changes the update and its lr
        n = saved["processes"]
        changed.append(f"{n} process{'es' if n != 1 else ''} (now {now['processes']}: --devices, or torchrun's "
                       "--nproc-per-node)")
    if saved.get("model") != now["model"] and saved.get("model_files", "") != now["model_files"]:
        changed.append(f"--model {saved.get('model')} (now {now['model']}, another model)")
    if (saved.get("items"), saved.get("tokens"), saved.get("digest")) != (now["items"], now["tokens"], now["digest"]):
        changed.append(f"training data of {saved.get('items')} items, {saved.get('tokens')} tokens "
                       f"(now {now['items']}, {now['tokens']})")
    elif None not in (saved.get("content"), now.get("content")) and saved["content"] != now["content"]:
        changed.append("other training data of the same lengths (its labels, targets or tokens differ)")
    for k, v in (saved.get("options") or {}).items():
        if k in MODEL_OWN and now["options"].get(k) is None:
            continue  # unset: the checkpoint's model's own, which the resumed run continues with
        if k in ("lr", "head_lr", "max_tokens", "grad_accum") and processes:
            # a rate, and the budget and accumulation sized per process, follow the processes' update: said
            # above, not blamed on a flag never given (`--max-tokens 256 (now 128)`)
            continue
        if k in now["options"] and now["options"][k] != v:
            was, is_ = _num(v), _num(now["options"][k])
            was, is_ = (was, is_) if was != is_ else (repr(v), repr(now["options"][k]))  # rates 3 digits alike
            changed.append(f"--{k.replace('_', '-')} {was} (now {is_})")
    if changed:
        raise ConfigError(f"--resume: the checkpoint in {ckpt_dir} is of a run with {'; '.join(changed)}; resume with "
                          "what it was started with, or start a new run (another --out, or no --resume)")
