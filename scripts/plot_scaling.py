"""Plot scaling series written by ``scaling.py --json``: rate and efficiency against ranks.

    python scripts/plot_scaling.py results.json [more.json ...] --out docs/scaling.png

One line per (series, model, precision, atoms of the first row); left panel atom-steps/s
(log-log, with the ideal line from the first point), right panel parallel efficiency.
"""
from __future__ import annotations

import argparse
import json
import sys
from collections import defaultdict
from pathlib import Path


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("files", type=Path, nargs="+")
    ap.add_argument("--out", type=Path, default=Path("scaling.png"))
    ap.add_argument("--title", default="ShardMD scaling")
    a = ap.parse_args(argv)
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    groups: dict[tuple, list[dict]] = defaultdict(list)
    for f in a.files:
        for r in json.loads(f.read_text()):
            key = (r["series"], r["model"], r["precision"], r["device"])
            groups[key].append(r)
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(10, 4))
    for (series, model, prec, _dev), rows in sorted(groups.items()):
        rows.sort(key=lambda r: r["ranks"])
        # a group may hold several sizes: split strong series by atom count
        by_size: dict[int, list[dict]] = defaultdict(list)
        for r in rows:
            by_size[rows[0]["atoms"] if series == "weak" else r["atoms"]].append(r)
        for atoms, rs in by_size.items():
            label = f"{model} {series} {prec} " + (f"{atoms / 1e6:.3g}M atoms" if series == "strong"
                                                    else f"{atoms / 1e6:.3g}M atoms/rank")
            x = [r["ranks"] for r in rs]
            line, = ax1.loglog(x, [r["rate"] for r in rs], "o-", label=label)
            base = rs[0]["rate"] / rs[0]["ranks"]
            ax1.loglog(x, [base * n for n in x], ":", color=line.get_color(), alpha=0.6)
            ax2.plot(x, [r.get("efficiency", float("nan")) for r in rs], "o-", color=line.get_color(), label=label)
    ax1.set_xlabel("GPUs (ranks)")
    ax1.set_ylabel("atom-steps/s")
    ax1.set_title("throughput (dotted: ideal)")
    ax2.set_xlabel("GPUs (ranks)")
    ax2.set_ylabel("parallel efficiency")
    ax2.set_ylim(0, 1.15)
    ax2.axhline(1.0, color="grey", lw=0.5)
    ax2.legend(fontsize=7)
    fig.suptitle(a.title)
    fig.tight_layout()
    fig.savefig(a.out, dpi=120)
    print(f"wrote {a.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
