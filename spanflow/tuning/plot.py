"""The tune plot: throughput and memory vs token budget; quality vs max length."""
from __future__ import annotations


def plot_profile(profile: dict, path: str) -> str | None:
    """Save a PNG; None when matplotlib (the `plot` extra) is not installed."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return None
    pts = [p for p in profile["points"] if not p["oom"]]
    lengths = sorted({p["max_length"] for p in pts})
    fig, axes = plt.subplots(1, 3, figsize=(15, 4))
    for L in lengths:
        row = sorted((p for p in pts if p["max_length"] == L), key=lambda p: p["max_tokens"])
        x = [p["max_tokens"] for p in row]
        axes[0].plot(x, [p["real_tokens_per_s"] for p in row], marker="o", label=f"max_length {L}")
        axes[1].plot(x, [p["peak_memory_bytes"] / 2**20 for p in row], marker="o", label=f"max_length {L}")
    for ax, title in ((axes[0], "real tokens/s"), (axes[1], "peak memory (MiB)")):
        ax.set_xscale("log", base=2)
        ax.set_xlabel("token budget (padded tokens per batch)")
        ax.set_title(title)
        ax.legend()
    best = profile.get("best")
    if best:
        axes[0].axvline(best["max_tokens"], color="grey", linestyle=":")
    q = [(L, next((p["quality"] for p in pts if p["max_length"] == L and p["quality"] is not None), None))
         for L in lengths]
    q = [(L, v) for L, v in q if v is not None]
    if q:
        axes[2].plot([L for L, _ in q], [v for _, v in q], marker="o")
    axes[2].set_xlabel("max length")
    axes[2].set_title("quality vs max length" if q else "quality (inference mode only)")
    fig.suptitle(f"spanflow tune: {profile['task']} {profile['mode']} on {profile['device']}")
    fig.tight_layout()
    from spanflow.atomic import atomic_path

    with atomic_path(path, suffix=".png") as tmp:  # a stopped run leaves no half a picture
        fig.savefig(tmp, dpi=90, format="png")
    plt.close(fig)
    return path
