"""The scenario commands' plot: the latency CDF of every workflow and function of a result.

Who calls it: ``scenario_sim.simulate`` (``gshare simulate``) and ``scenario_load`` (``gshare
load``) put ``latency_cdf_plot(title, stem)`` in their result's plots; the experiment runner
calls it with the result and the output folder.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import numpy as np

from gshare.experiments.results import ExperimentResult


def latency_cdf_plot(title: str, file_stem: str) -> Callable[[ExperimentResult, Path], Path]:
    """A PNG: the latency CDF of every workflow and function (answered requests), its SLO a
    dashed line, and the hit rate in the legend."""

    def plot(result: ExperimentResult, folder: Path) -> Path:
        import matplotlib.pyplot as plt

        groups = [
            (kind, name, st)
            for kind in ("workflows", "functions")
            for name, st in result.summary.get(kind, {}).items()
        ]
        n = max(1, len(groups))
        fig, axes = plt.subplots(1, n, figsize=(4.4 * n, 3.4), squeeze=False)
        for ax, (kind, name, st) in zip(axes.flat, groups, strict=False):
            lat = np.sort(
                [
                    float(r["latency_ms"])
                    for r in result.rows
                    if r["kind"] == kind[:-1]
                    and r["name"] == name
                    and r["measured"]
                    and r["status"] == "ok"
                ]
            )
            total = max(1, int(st["requests"]))
            if len(lat):
                ax.step(lat, np.arange(1, len(lat) + 1) / total, where="post", label="latency")
            if st.get("slo_ms"):
                hit = st.get("slo_hit_rate")
                label = f"SLO {st['slo_ms']:g} ms" + (
                    f" (hit {hit:.1%})" if hit is not None else ""
                )
                ax.axvline(float(st["slo_ms"]), color="red", linestyle="--", label=label)
            ax.set_ylim(0, 1.02)
            ax.set_title(f"{kind[:-1]} {name}", fontsize=9)
            ax.set_xlabel("latency (ms)")
            ax.set_ylabel("fraction of requests")
            ax.legend(fontsize=7, loc="lower right")
        fig.suptitle(title, fontsize=10)
        fig.tight_layout()
        out = folder / f"{file_stem}_latency_cdf.png"
        fig.savefig(out, dpi=100)
        plt.close(fig)
        return out

    return plot


__all__ = ["latency_cdf_plot"]
