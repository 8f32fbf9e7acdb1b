"""The speed chart: measured seconds per image by mode and bucket, from this server's recent warm runs.

Requests and comparisons both feed it (the engine records every warm image); the page asks for
a new frame on its status timer and gets one only when something finished since.
"""

from __future__ import annotations

from statistics import median
from typing import Any, Sequence

import gradio as gr
import pandas as pd

from tpu_demo.core.modes import ExecutionMode
from tpu_demo.core.recent import RecentRuns, TimedRun

#: bar labels stay short on a phone
SHORT = {ExecutionMode.EAGER.value: "strict", ExecutionMode.EAGER_FUSED.value: "optimized",
         ExecutionMode.COMPILED.value: "compiled"}
COLUMNS = ["shape", "mode", "seconds per image", "images"]


def speed_frame(runs: Sequence[TimedRun], model_id: str) -> pd.DataFrame:
    """One bar per (bucket, steps, mode) of ``model_id``: the median warm denoise seconds per image."""
    groups: dict[tuple[str, int, str], list[float]] = {}
    for run in runs:
        if run.model == model_id:
            groups.setdefault((run.resolution, run.num_inference_steps, run.mode), []).append(run.denoise_seconds)
    order = [mode.value for mode in ExecutionMode]
    rows = [{"shape": f"{SHORT[mode]} {resolution} \u00b7 {steps} st",
             "mode": ExecutionMode(mode).title, "seconds per image": round(median(seconds), 4), "images": len(seconds)}
            for (resolution, steps, mode), seconds in sorted(groups.items(), key=lambda g: (g[0][0], g[0][1],
                                                                                              order.index(g[0][2])))]
    # typed even when empty: the browser keeps the axis types of the first frame it gets
    return pd.DataFrame(rows, columns=COLUMNS).astype({"shape": str, "mode": str, "seconds per image": float,
                                                      "images": int})


def speed_plot(runs: RecentRuns, model_id: str) -> gr.BarPlot:
    # one colour: Gradio 6.31 fixes a colour scale's domain at the first frame, often still empty here
    # "-x": strict, optimized, compiled (the labels' reverse alphabet); a data-dependent order would be
    # fixed by the browser at the first frame, like the colours
    return gr.BarPlot(speed_frame(runs.snapshot(), model_id), x="shape", y="seconds per image", sort="-x",
                      y_lim=[0, None], x_title="mode, bucket \u00b7 steps",
                      y_title="s per image (warm median)", x_label_angle=-25, height=300,
                      tooltip=["mode", "seconds per image", "images"], label="Speed on this server",
                      caption="Warm runs of recent requests and comparisons; refreshed as they finish.",
                      elem_id="speed-chart")


def refresh(runs: RecentRuns, model_id: str, seen: Any) -> tuple[Any, Any]:
    """(new chart value, new seen marker), or skips when nothing finished and the model is the same."""
    marker = (model_id, runs.version)
    if marker == seen:
        return gr.skip(), gr.skip()
    return speed_frame(runs.snapshot(), model_id), marker
