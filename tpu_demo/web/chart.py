"""The speed chart: measured seconds per image by mode and bucket, from this server's recent warm runs.

Requests and comparisons both feed it (the engine records every warm image); the page asks for
a new frame on its status timer and gets one only when something finished since. The chart takes
no room until it has a bar, and its figures are also a table (``figures_html``): the text
alternative to the drawing, for screen readers and anyone who wants the numbers.
"""

from __future__ import annotations

import html
from statistics import median
from typing import Any, Sequence

import gradio as gr
import pandas as pd

from tpu_demo.core.modes import ExecutionMode
from tpu_demo.core.recent import RecentRuns, TimedRun

#: the frame's columns, typed even when empty: the browser keeps the axis types of the first frame it gets
COLUMNS = {"shape": str, "mode": str, "seconds per image": float, "images": int}


def speed_frame(runs: Sequence[TimedRun], model_id: str) -> pd.DataFrame:
    """One bar per (bucket, steps, mode) of ``model_id``: the median warm denoise seconds per image."""
    groups: dict[tuple[str, int, str], list[float]] = {}
    for run in runs:
        if run.model == model_id:
            groups.setdefault((run.resolution, run.num_inference_steps, run.mode), []).append(run.denoise_seconds)
    order = [mode.value for mode in ExecutionMode]
    rows = [{"shape": f"{ExecutionMode(mode).traits.short} {resolution} \u00b7 {steps} st",
             "mode": ExecutionMode(mode).title, "seconds per image": round(median(seconds), 4), "images": len(seconds)}
            for (resolution, steps, mode), seconds in sorted(groups.items(), key=lambda g: (g[0][0], g[0][1],
                                                                                              order.index(g[0][2])))]
    return pd.DataFrame(rows, columns=list(COLUMNS)).astype(COLUMNS)


def figures_html(frame: pd.DataFrame) -> str:
    """The chart's figures as a table under a native disclosure (keyboard and screen-reader friendly); "" when empty."""
    if frame.empty:
        return ""
    rows = "".join(f"<tr><th scope='row'>{html.escape(row['shape'])}</th><td>{html.escape(row['mode'])}</td>"
                   f"<td>{row['seconds per image']:.4f}</td><td>{int(row['images'])}</td></tr>"
                   for row in frame.to_dict("records"))
    return ("<details class='speed-figures'><summary>The chart's figures as a table</summary><table>"
            "<caption>Speed on this server: median seconds per image of warm runs</caption><thead><tr>"
            "<th scope='col'>mode, bucket \u00b7 steps</th><th scope='col'>mode</th>"
            "<th scope='col'>s per image (warm median)</th><th scope='col'>images</th></tr></thead>"
            f"<tbody>{rows}</tbody></table></details>")


#: runs on page load (``launch(js=...)``): each refresh replaces the table's HTML, which would close a
#: ``<details>`` the visitor opened; the page remembers that they did and opens the new one too
KEEP_FIGURES_OPEN_JS = """() => {
  let open = false;
  document.addEventListener("toggle", (event) => {
    if (event.target.matches && event.target.matches("details.speed-figures")) open = event.target.open;
  }, true);
  new MutationObserver(() => {
    const figures = document.querySelector("details.speed-figures");
    if (open && figures && !figures.open) figures.open = true;
  }).observe(document.body, {childList: true, subtree: true});
}"""


def speed_plot(frame: pd.DataFrame) -> gr.BarPlot:
    """The chart of ``speed_frame``'s bars."""
    # one colour: Gradio 6.31 fixes a colour scale's domain at the first frame, often still empty here
    # "-x": strict, optimized, compiled (the labels' reverse alphabet); a data-dependent order would be
    # fixed by the browser at the first frame, like the colours
    # hidden (not in the page) while empty: an empty chart is a box with axes and nothing to read
    return gr.BarPlot(frame, visible=not frame.empty, x="shape", y="seconds per image", sort="-x",
                      y_lim=[0, None], x_title="mode, bucket \u00b7 steps",
                      y_title="s per image (warm median)", x_label_angle=-25, height=300,
                      tooltip=["mode", "seconds per image", "images"], label="Speed on this server",
                      caption="Warm runs of recent requests and comparisons; refreshed as they finish.",
                      elem_id="speed-chart")


def refresh(runs: RecentRuns, model_id: str, seen: Any) -> tuple[Any, Any, Any]:
    """(chart update, figures table, new seen marker), or skips when nothing finished and the model is the same."""
    marker = (model_id, runs.version)
    if marker == seen:
        return gr.skip(), gr.skip(), gr.skip()
    frame = speed_frame(runs.snapshot(), model_id)
    return gr.update(value=frame, visible=not frame.empty), figures_html(frame), marker
