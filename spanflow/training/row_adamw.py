"""RowAdamW: AdamW for a model whose vocabulary table takes sparse gradients (training/optim.py
says which tables, and why).

A step updates the rows its gradient holds. A row it does not hold is left alone that step,
though AdamW, given the dense gradient (zero in that row), would have decayed its weight and
moved it by its old momentum: about ten steps' worth of movement with beta1 = 0.9, which a
rare word, seen once in many steps, would lose almost whole. Those missed updates are owed,
not dropped: they are applied in closed form when the row is next seen, and to every row by
`catch_up()`, which the training loop calls before an evaluation and before handing the
model back. A checkpoint writes its model inside `paid()`, every row paid, and keeps the table
as training left it and what its rows owe in the optimizer's state (see `state_dict`). The weights then
equal AdamW's on the dense gradient, to within what `_missed` approximates; what stays
different is that a row's gradient is taken at its weight before the updates it is owed.
"""
from __future__ import annotations

import contextlib
import math
from collections.abc import Callable, Iterator

import torch

TAIL = 1e-7  # the momentum's move is summed over missed steps until r**i falls below this
CHUNK = 8192  # rows caught up at once: bounds catch_up's temporaries


def _unhooked(step: Callable) -> Callable:
    """AdamW.step without the hook wrapper torch puts on an optimizer class's step (RowAdamW's
    own wrapper already ran the hooks once); a RuntimeError where that wrapper is not as known."""
    if not getattr(step, "hooked", False):
        return step
    inner = getattr(step, "__wrapped__", None)
    if inner is None or getattr(inner, "hooked", False):
        raise RuntimeError("RowAdamW: torch's optimizer step hook wrapper has changed; step hooks would run twice")
    return inner


def _ratio(b1: float, b2: float) -> float:
    """r = beta1 / sqrt(beta2): the momentum's move shrinks by r each missed step; the closed
    form needs it below 1 (AdamW's defaults: 0.9005)."""
    r = b1 / math.sqrt(b2) if b2 > 0 else math.inf
    if not r < 1:
        raise ValueError(f"sparse gradients: RowAdamW needs beta1 < sqrt(beta2), got betas ({b1}, {b2})")
    return r


def _window(r: float) -> int:
    """How many missed steps the momentum's move is summed over: r**i < TAIL beyond them."""
    k = 1 if r == 0 else math.ceil(math.log(TAIL) / math.log(r))
    if k > 4096:
        raise ValueError(f"sparse gradients: beta1 / sqrt(beta2) = {r:.6f} is too close to 1 for RowAdamW")
    return max(1, k)


class _Rows:
    """The bookkeeping of one sparse parameter: the step each row was last brought to (`last`),
    and for every step j since the oldest of those (`base`), at index j - base:
    `keep`: the sum over base < i <= j of log(1 - lr_i wd), the running log of weight decay;
    `cw`: lr_j sqrt(1 - b2^j) / (1 - b1^j) exp(-keep_j), the momentum's move at step j but for
    r^i, m and v, undecayed to `base`; zero past step t;
    `full`: the sum over i = 1..K of cw_(j+i) r^i, what a row last brought to step j owes (times
    exp(keep) of the step it is brought to) once K steps have missed it, filled in when step
    j + K is recorded: a row missed that long costs one lookup."""

    def __init__(self, n_rows: int, step: int, b1: float, b2: float):
        self.b1, self.b2 = b1, b2
        r = _ratio(b1, b2)
        self.k = _window(r)
        self.powers = r ** torch.arange(1, self.k + 1, dtype=torch.float64)  # (K,) r^i
        self.t = self.base = step  # a Python int beside the state's step tensor: no host sync to read it
        self.log_keep = 0.0  # keep at step t, as a Python float: the per-step record reads no tensor
        self.last = torch.full((n_rows,), step, dtype=torch.long)
        self.keep, self.cw, self.full = (torch.zeros(256 + self.k, dtype=torch.float64) for _ in range(3))

    def record(self, lr: float, wd: float) -> None:
        """Step t + 1 is being taken with learning rate `lr`."""
        self.t += 1
        j = self.t - self.base
        if j + self.k >= len(self.cw):  # room for a K-step window after any step
            self.keep, self.cw, self.full = (torch.cat([x, torch.zeros_like(x)])
                                             for x in (self.keep, self.cw, self.full))
        self.log_keep += math.log1p(-lr * wd)
        self.keep[j] = self.log_keep
        self.cw[j] = lr * math.sqrt(1 - self.b2 ** self.t) / (1 - self.b1 ** self.t) * math.exp(-self.log_keep)
        if j >= self.k:  # the K steps after step j - K are all known now
            self.full[j - self.k] = self.cw[j - self.k + 1:j + 1] @ self.powers

    def settled(self) -> None:
        """Every row is at step t: the history before it is no longer needed."""
        self.base, self.log_keep = self.t, 0.0
        for x in (self.keep, self.cw, self.full):
            x.zero_()

    def as_dict(self) -> dict:
        return {"t": self.t, "base": self.base, "last": self.last, "keep": self.keep, "cw": self.cw,
                "full": self.full}

    @classmethod
    def from_dict(cls, d: dict, b1: float, b2: float) -> _Rows:
        book = cls(len(d["last"]), int(d["base"]), b1, b2)
        book.t, book.last = int(d["t"]), d["last"].to("cpu", torch.long)  # bookkeeping lives on the CPU
        book.keep, book.cw, book.full = (d[k].to("cpu", torch.float64) for k in ("keep", "cw", "full"))
        book.log_keep = float(book.keep[book.t - book.base])
        return book


@torch.no_grad()
def _missed(rows: _Rows, idx: torch.Tensor, p: torch.Tensor, state: dict, eps: float, *,
            weights_only: bool = False) -> None:
    """Apply to the rows `idx` AdamW's updates with a zero gradient for the steps after each
    row's last one, through step t: weight decay, the momentum's move, the moments' decay
    (`weights_only`: the weights alone, the moments and the bookkeeping left as they are).

    At missed step j = s + i AdamW moves a row by lr_j / bc1_j * b1^i m / (b2^(i/2) sqrt(v) /
    sqrt(bc2_j) + eps) (m, v as at step s). That is summed here as coef_j r^i (coef_j: `cw`
    without its decay, r = b1 / sqrt(b2)) times m / (sqrt(v / bc2_s) + eps) / sqrt(bc2_s):
    exact but for eps, which is
    scaled with sqrt(v) from step s on (the same while sqrt(v) is far above eps), and for the
    steps past the window, whose r^i is below TAIL. Weight decay multiplies the row's weight and
    each step's move by the steps after it, as AdamW's decay before each step's move does."""
    b1, b2, upto = rows.b1, rows.b2, rows.t
    s = rows.last.index_select(0, idx)
    owed = s < upto  # rows seen on the step before owe nothing
    idx, s = idx[owed], s[owed]  # (n,) sized by the mask, as nonzero is (sparse tables are on the CPU)
    if not len(idx):
        return
    sr, top = s - rows.base, upto - rows.base
    end = rows.keep[top]
    far = top - sr >= rows.k
    move = torch.where(far, rows.full[sr], 0.0)  # (n,) filled where K steps have passed
    near = (~far).nonzero()[:, 0]
    if len(near):  # missed fewer than K steps: cw is zero past step t, so the window ends there
        windows = rows.cw.unfold(0, rows.k, 1).index_select(0, sr[near] + 1)  # (m, K) cw_(s+1 .. s+K)
        move[near] = windows @ rows.powers
    move *= torch.exp(end)
    bc2_s = torch.where(s > 0, 1 - b2 ** s.double(), torch.ones((), dtype=torch.float64))
    decay = torch.exp(end - rows.keep[sr])  # (n,)
    k = (upto - s).double()[:, None]  # (n, 1) missed steps
    if not weights_only:
        rows.last.index_fill_(0, idx, upto)
    # the bookkeeping stays on the CPU; the parameter is there too, but for a CPU checkpoint's
    # owed rows paid where the run resumed on an accelerator (its table dense there)
    dev = p.device
    idx = idx.to(dev)
    m, v = state["exp_avg"].index_select(0, idx), state["exp_avg_sq"].index_select(0, idx)  # (n, D)
    step_dir = m / ((v / bc2_s[:, None].to(dev, v.dtype)).sqrt() + eps)
    w = p.index_select(0, idx).mul_(decay[:, None].to(dev, p.dtype))
    w.sub_(step_dir * (move / bc2_s.sqrt())[:, None].to(dev, p.dtype))
    p.index_copy_(0, idx, w)
    if not weights_only:
        state["exp_avg"].index_copy_(0, idx, m.mul_((b1 ** k).to(dev, m.dtype)))
        state["exp_avg_sq"].index_copy_(0, idx, v.mul_((b2 ** k).to(dev, v.dtype)))


@torch.no_grad()
def _decayed(rows: _Rows, idx: torch.Tensor, p: torch.Tensor) -> None:
    """_missed for rows whose moments are zero (never seen, or seen only as zero gradients): their
    step is zero and their moments stay zero, so what they owe is the weight decay alone, the
    same product _missed multiplies them by."""
    s = rows.last.index_select(0, idx)
    owed = s < rows.t
    idx, s = idx[owed], s[owed]
    if len(idx):
        decay = torch.exp(rows.keep[rows.t - rows.base] - rows.keep[s - rows.base])
        idx = idx.to(p.device)
        p.index_copy_(0, idx, p.index_select(0, idx).mul_(decay[:, None].to(p.device, p.dtype)))


def _pay_all(rows: _Rows, p: torch.Tensor, state: dict, eps: float, *, weights_only: bool = False) -> None:
    """_missed over every row of `p`, CHUNK rows at a time; rows whose moments are zero (most of a
    large vocabulary's) take the weight decay alone, which is what _missed would apply them."""
    for lo in range(0, p.shape[0], CHUNK):
        hi = min(lo + CHUNK, p.shape[0])
        live = (state["exp_avg"][lo:hi] != 0).any(1) | (state["exp_avg_sq"][lo:hi] != 0).any(1)
        idx, live = torch.arange(lo, hi), live.cpu()  # the bookkeeping's indices are on the CPU
        _missed(rows, idx[live], p, state, eps, weights_only=weights_only)
        _decayed(rows, idx[~live], p)
    if not weights_only:
        rows.last.fill_(rows.t)


class RowAdamW(torch.optim.AdamW):
    """AdamW whose sparse-gradient parameters are updated in the rows their gradient holds, the
    updates a row missed applied when it is next seen or at `catch_up()`.

    Dense parameters take AdamW's own step (fused where it can be); the state of a sparse one
    has AdamW's keys and shapes, so checkpoints read either way; what rows are still owed, and
    the table as it stands, go under the state dict's own key "row_adamw" (none once caught
    up). No loss scaler with sparse gradients: a skipped step would need AdamW's found-inf
    check in the row update too."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self._rows: dict[torch.Tensor, _Rows] = {}

    @torch.no_grad()
    def step(self, closure: Callable[[], torch.Tensor] | None = None) -> torch.Tensor | None:
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        rows = [(g, p, p.grad) for g in self.param_groups for p in g["params"]
                if p.grad is not None and p.grad.is_sparse]
        for group, _, _ in rows:
            for key in ("amsgrad", "maximize", "capturable", "differentiable"):
                if group.get(key):
                    raise ValueError(f"sparse gradients: RowAdamW has no {key}")
            _ratio(*group["betas"])
        if rows and (getattr(self, "grad_scale", None) is not None or getattr(self, "found_inf", None) is not None):
            raise ValueError("sparse gradients: RowAdamW takes no loss scaler (tables are sparse on the CPU only)")
        for group in self.param_groups if self._rows else ():  # a parameter that comes dense pays its rows first
            for p in group["params"]:
                if p in self._rows and p.grad is not None and not p.grad.is_sparse:
                    self._settle(p, group)
                    del self._rows[p]
        for _, p, _ in rows:
            p.grad = None  # AdamW takes no sparse gradient; without one it leaves the parameter alone
        try:
            _unhooked(torch.optim.AdamW.step)(self)
        finally:
            for _, p, grad in rows:
                p.grad = grad
        for group, p, grad in rows:
            self._row_step(p, grad, group)
        return loss

    def _row_step(self, p: torch.Tensor, grad: torch.Tensor, group: dict) -> None:
        """Bring the rows `grad` holds up to date, then one AdamW update of them. Bias correction
        follows the parameter's step count, as AdamW's; no host sync."""
        state = self.state[p]
        if not state:
            state["step"] = torch.zeros((), dtype=torch.float32)
            state["exp_avg"] = torch.zeros_like(p, memory_format=torch.preserve_format)
            state["exp_avg_sq"] = torch.zeros_like(p, memory_format=torch.preserve_format)
        book = self._book(p, group)
        (b1, b2), lr, wd, eps = group["betas"], group["lr"], group["weight_decay"], group["eps"]
        grad = grad.coalesce()  # one row per index, repeats summed
        idx, g = grad.indices()[0], grad.values().to(p.dtype)
        _missed(book, idx, p, state, eps)
        book.record(lr, wd)
        state["step"].add_(1)  # torch's count, for the state dict; book.t is the same count as a Python int
        t = book.t  # bias corrections in double from it, as AdamW computes them
        m = state["exp_avg"].index_select(0, idx).mul_(b1).add_(g, alpha=1 - b1)
        v = state["exp_avg_sq"].index_select(0, idx).mul_(b2).addcmul_(g, g, value=1 - b2)
        state["exp_avg"].index_copy_(0, idx, m)
        state["exp_avg_sq"].index_copy_(0, idx, v)
        denom = v.sqrt().div_(math.sqrt(1 - b2 ** t)).add_(eps)
        w = p.index_select(0, idx).mul_(1 - lr * wd)
        w.sub_(m.div_(denom).mul_(lr / (1 - b1 ** t)))
        p.index_copy_(0, idx, w)
        book.last.index_fill_(0, idx, book.t)

    def _book(self, p: torch.Tensor, group: dict) -> _Rows:
        book = self._rows.get(p)
        if book is not None and (book.b1, book.b2) != tuple(group["betas"]):
            self._settle(p, group)  # what was owed, under the betas it was owed under
            book = None
        if book is None:  # a fresh or loaded state: every row is at its step count
            book = self._rows[p] = _Rows(p.shape[0], int(self.state[p]["step"]), *group["betas"])
        return book

    def _settle(self, p: torch.Tensor, group: dict) -> None:
        book = self._rows[p]
        if book.t != book.base:
            _pay_all(book, p, self.state[p], group["eps"])
            book.settled()

    @torch.no_grad()
    def catch_up(self) -> None:
        """Apply every row's missed updates: the weights and moments are then AdamW's."""
        for group in self.param_groups:
            for p in group["params"]:
                if p in self._rows:
                    self._settle(p, group)

    @contextlib.contextmanager
    def paid(self) -> Iterator[None]:
        """Inside, every row is paid, as after `catch_up()`; after it, the tables, their moments
        and what their rows owe are as they were, and training goes on as if it had not
        happened. A checkpoint saves its model inside: weights a user can run (AdamW's), while
        the optimizer's state, read after, resumes exactly. Costs a copy of each owing table
        while inside; the moments and what the rows owe are not touched."""
        owing = [(p, g) for g in self.param_groups for p in g["params"]
                 if p in self._rows and self._rows[p].t != self._rows[p].base]
        kept = [(p, p.detach().clone()) for p, _ in owing]
        try:
            for p, group in owing:
                _pay_all(self._rows[p], p, self.state[p], group["eps"], weights_only=True)
            yield
        finally:
            with torch.no_grad():
                for p, weights in kept:
                    p.copy_(weights)

    def state_dict(self) -> dict:
        """AdamW's state dict, and under "row_adamw" what each sparse parameter's rows are still
        owed (by its index in the state) and the table as it stands ("table"; a checkpoint's
        model holds it paid), so a load resumes exactly; a caught-up one has none."""
        sd = super().state_dict()
        params = [p for g in self.param_groups for p in g["params"]]
        owed = {i: {**self._rows[p].as_dict(), "table": p.detach()} for i, p in enumerate(params)
                if p in self._rows and self._rows[p].t != self._rows[p].base}
        if owed:
            sd["row_adamw"] = owed
        return sd

    def load_state_dict(self, state_dict: dict) -> None:
        """AdamW's load; an owing table takes back its weights as the state dict has them
        (a checkpoint's model holds them paid) and what its rows owe."""
        state_dict = dict(state_dict)
        owed = state_dict.pop("row_adamw", {})
        groups = [(p, g) for g in self.param_groups for p in g["params"]]
        for i, d in owed.items():  # before anything is loaded: a refused state leaves this optimizer as it was
            p, table = groups[int(i)][0], d.get("table")  # none in an older checkpoint: its model is the table
            if table is not None and table.shape != p.shape:
                raise ValueError(f"the optimizer state's table {i} has shape {tuple(table.shape)}, the model's "
                                 f"parameter {tuple(p.shape)}: not this model's optimizer state")
        super().load_state_dict(state_dict)
        with torch.no_grad():
            for i, d in owed.items():
                if d.get("table") is not None:
                    groups[int(i)][0].copy_(d["table"])
        self._rows = {groups[int(i)][0]: _Rows.from_dict(d, *groups[int(i)][1]["betas"]) for i, d in owed.items()}

    def __getstate__(self) -> dict:
        return {**super().__getstate__(), "_rows": self._rows}  # a copy owes its rows what this one does


def catch_up(optimizer: torch.optim.Optimizer) -> None:
    """Apply the updates a RowAdamW owes its rows (nothing for another optimizer)."""
    if isinstance(optimizer, RowAdamW):
        optimizer.catch_up()


def paid(optimizer: torch.optim.Optimizer) -> contextlib.AbstractContextManager:
    """RowAdamW.paid() (nothing for another optimizer)."""
    return optimizer.paid() if isinstance(optimizer, RowAdamW) else contextlib.nullcontext()
