"""Compare modes: one click runs the prompt in all three execution modes and shows them side by side.

The visitor needs no mode names: each image says in plain words what ran, how long its
denoising took warm, how many times faster than one-op-at-a-time (strict eager) it was, and how
far its pixels are from strict eager's. The figures come from the engine (engine/compare.py);
this module validates the inputs, supervises the run like Generate, and renders the result.
"""

from __future__ import annotations

import html
import threading
from typing import TYPE_CHECKING, Any, Iterator

import gradio as gr

from tpu_demo.core.comparison import ComparePhase, Comparison, ModeRun
from tpu_demo.core.events import ImageResult, Stopped
from tpu_demo.core.modes import ExecutionMode
from tpu_demo.core.request import validate_request
from tpu_demo.web.outputs import RequestFiles, gallery_data

if TYPE_CHECKING:
    from tpu_demo.web.handlers import PageHandlers

EMPTY_SUMMARY = ("<p class='compare-empty'>Compare runs your prompt with the same seed in all three ways to run "
                 "diffusers on a TPU and shows how much faster each is.</p>")


def caption(run: ModeRun) -> str:
    title = ExecutionMode(run.mode).title
    return (f"{title} ({ExecutionMode(run.mode).traits.plain_words}) \u00b7 {run.denoise_seconds:.2f} s \u00b7 "
            f"{run.speedup:.2f}\u00d7 \u00b7 max pixel diff {run.max_pixel_difference}")


def _what_ran(run: ModeRun) -> str:
    """"plain eager on cpu" from "strict eager (plain eager on cpu)"."""
    return run.description.partition("(")[2].rstrip(")") or run.description


def summary_html(comparison: Comparison) -> str:
    """The figures next to the images, with the notes a reader needs in words (no tooltips)."""
    rows = []
    for run in comparison.runs:
        bucket = "warm" if run.warm_before else f"cold: warmed first in {run.warmup_seconds or 0:.2f} s"
        if not run.warm_before and run.graphs_compiled:
            bucket += f" ({run.graphs_compiled} graph{'s' if run.graphs_compiled != 1 else ''} compiled)"
        rows.append(
            f"<tr><th scope='row'>{html.escape(ExecutionMode(run.mode).title)}<span class='compare-what'>"
            f"{html.escape(ExecutionMode(run.mode).traits.plain_words)}; here: {html.escape(_what_ran(run))}</span></th>"
            f"<td>{run.denoise_seconds:.3f}</td><td>{run.steps_per_second:.1f}</td>"
            f"<td class='compare-speedup'>{run.speedup:.2f}\u00d7</td><td>{html.escape(bucket)}</td>"
            f"<td>{run.max_pixel_difference}</td></tr>")
    notes = ["<strong>Warm against warm:</strong> every mode's bucket was warmed before timing, so compile "
             "time is not in the seconds above; a cold bucket's warmup is shown on its own. Each mode ran "
             f"{comparison.timed_rounds} times, interleaved with the others; its fastest run is shown."]
    for group in comparison.same_code:
        titles = " and ".join(ExecutionMode(mode).title for mode in group)
        notes.append(f"<strong>Same code here:</strong> on this device {titles} run identical code (plain "
                     "eager; operation fusion is torch-tpu's), so their difference is measurement noise.")
    # the table scrolls sideways inside a focusable region on a phone (keyboard users can scroll it too)
    return ("<div class='compare-summary'><div class='table-scroll' role='region' tabindex='0' aria-label="
            "'Comparison figures'><table><thead><tr><th scope='col'>mode</th><th scope='col'>denoise s"
            "</th><th scope='col'>steps/s</th><th scope='col'>speedup vs strict eager</th><th scope='col'>bucket "
            "before</th><th scope='col'>max pixel diff</th></tr></thead><tbody>" + "".join(rows) +
            "</tbody></table></div>" + "".join(f"<p class='compare-note'>{note}</p>" for note in notes) + "</div>")


class CompareHandler:
    """The Compare button and ``/compare_modes``: runs like Generate's (the page's ``Runs``); it yields what
    Gradio sends (``gallery_data``: the event has ``postprocess=False``, as Generate's)."""

    def __init__(self, page: "PageHandlers"):
        self.page = page
        #: one comparison at a time, whichever door (its timings interleave the modes; another would skew them)
        self._one_at_a_time = threading.Lock()

    def compare_modes(self, request: gr.Request = None, progress: gr.Progress = gr.Progress(),
                      **inputs: Any) -> Iterator[tuple[list, str, dict | None]]:
        """Stream (images so far, summary HTML, figures as JSON) for the named inputs ``COMPARE_INPUTS``;
        the last update holds every mode."""
        runs = self.page.runs
        generation = runs.checked(request, lambda: validate_request(dict(
            inputs, mode=ExecutionMode.EAGER.value, num_images=1, previews=False), self.page.settings.limits))
        files = RequestFiles()
        events = runs.supervise(request, generation, self.page.engine.compare_modes, "Comparison failed", files,
                                images=len(ExecutionMode))
        gallery: list[tuple[str, str]] = []
        progress(0, desc="waiting for the device")
        try:
            with self._one_at_a_time:
                for event in events:
                    if isinstance(event, ComparePhase):
                        progress(len(gallery) / len(ExecutionMode), desc=event.text)
                    elif isinstance(event, ImageResult):
                        title = ExecutionMode(event.parameters["mode"]).title
                        gallery.append((files.save(event.image, event.parameters["mode"]), f"{title} (timing others...)"))
                        yield gallery_data(gallery), EMPTY_SUMMARY, None  # the figures come with the last mode
                    elif isinstance(event, Stopped):
                        # like Generate: the finished modes stay on the page, and the run's next step raises
                        # the error saying how many of the three were finished
                        yield gallery_data(gallery), EMPTY_SUMMARY, None
                    elif isinstance(event, Comparison):
                        final = [(path, caption(mode_run)) for (path, _), mode_run in zip(gallery, event.runs)]
                        yield gallery_data(final), summary_html(event), event.as_dict()
        finally:
            files.remove()
