"""The improve loop's timeline as a PNG: every attempt's gate, canary and decision on one time axis,
with the gate's lower bound and the canary's bounds (from `WORK/decisions.jsonl`)."""

from __future__ import annotations

from pathlib import Path

from teamtr.graphs.run_layout import read_records

STYLE = {  # event -> (colour, marker)
    "gate": ("tab:blue", "o"),
    "canary_started": ("tab:orange", ">"),
    "promoted": ("tab:green", "*"),
    "rolled_back": ("tab:red", "x"),
    "no_change": ("tab:gray", "."),
    "abandoned": ("black", "x"),
}


def write_timeline(decisions: Path, out: Path) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    records = read_records(decisions)
    fig, ax = plt.subplots(figsize=(10, 3.5))
    t0 = records[0]["time_ns"] if records else 0
    for r in records:
        colour, marker = STYLE.get(r["event"], ("black", "."))
        x = (r["time_ns"] - t0) / 1e9
        refused = r["event"] == "gate" and r.get("decision") == "refused"
        ax.scatter([x], [r["attempt"]], color="tab:red" if refused else colour, marker=marker, s=60)
        figures = r.get("figures") or {}
        if r["event"] == "gate":
            ax.annotate(
                f"LB {figures.get('lower_bound', float('nan')):+.2f}", (x, r["attempt"] + 0.15), fontsize=7
            )
        elif r["event"] in ("promoted", "rolled_back") and figures.get("pairs"):
            text = f"[{figures['lower_bound']:+.2f}, {figures['upper_bound']:+.2f}] n={figures['pairs']}"
            ax.annotate(text, (x, r["attempt"] - 0.3), fontsize=7)
    for event, (colour, marker) in STYLE.items():
        ax.scatter([], [], color=colour, marker=marker, label=event.replace("_", " "))
    ax.set_xlabel("seconds since the first record")
    ax.set_ylabel("attempt")
    ax.legend(loc="upper left", fontsize=7, ncol=3)
    ax.set_title("teamtr improve: gate (lower bound), canary, decision (bounds, pairs)")
    fig.tight_layout()
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=100)
    plt.close(fig)
    return out
