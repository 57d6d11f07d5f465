"""The results figure: quality gain over dense against ms/query."""

from __future__ import annotations

import itertools
from pathlib import Path
from typing import Any


def figure(results: dict[str, Any], path: Path) -> Path:
    """Quality gain (primary metric, with its 95% interval) against ms/query at B = batch, log x."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.lines import Line2D

    fig, ax = plt.subplots(figsize=(9, 5.5), dpi=120)
    labels = list(dict.fromkeys(label for ds in results["datasets"].values() for label in ds["methods"]))
    colors = {label: plt.cm.tab10(i % 10) for i, label in enumerate(labels)}
    markers = dict(zip(results["datasets"], itertools.cycle("osD^v")))
    for name, ds in results["datasets"].items():
        for label, row in ds["methods"].items():
            x = row["speed"]["Bbatch_ms"]
            ci = row.get("vs_dense", {}).get(ds["primary"], {"diff": 0.0, "low": 0.0, "high": 0.0})
            ax.errorbar(
                [x],
                [ci["diff"]],
                yerr=[[ci["diff"] - ci["low"]], [ci["high"] - ci["diff"]]],
                fmt=markers[name],
                color=colors[label],
                capsize=3,
                ms=7,
            )
    handles = [Line2D([], [], color=colors[label], marker="o", ls="", label=label) for label in labels]
    handles += [
        Line2D([], [], color="black", marker=m, ls="", label=f"{name} ({results['datasets'][name]['primary']})")
        for name, m in markers.items()
    ]
    ax.legend(handles=handles, fontsize=7, loc="lower left")
    ax.axhline(0.0, color="grey", lw=0.8, ls="--")
    ax.set_xscale("log")
    ax.set_xlabel(f"ms/query at B={results['config']['speed']['batch']} (log scale)")
    ax.set_ylabel("gain over dense in the primary metric (95% CI)")
    ax.set_title("geograph bench run: gain over dense vs cost (one point per method and data set)")
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)
    return path
