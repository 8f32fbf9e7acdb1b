"""The Gradio Blocks page, top to bottom as a visitor sees it; what each control does is in handlers.py."""

from __future__ import annotations

from typing import Any

import gradio as gr

from tpu_demo.core.catalog import ASSETS_DIR
from tpu_demo.core.examples import example_rows
from tpu_demo.core.request import COMPARE_INPUTS, GENERATE_INPUTS, MAX_SEED
from tpu_demo.core.styles import default_scale
from tpu_demo.web import chart
from tpu_demo.web.about import about_markdown
from tpu_demo.web.api import (COMPARE_API, COMPARE_CONCURRENCY_ID, DEVICE_CONCURRENCY_ID, DEVICE_TOOLS, GENERATE_API,
                              ApiEndpoints)
from tpu_demo.web.compare import EMPTY_SUMMARY, CompareHandler
from tpu_demo.web.handlers import PageHandlers
from tpu_demo.web.history import SessionHistory
from tpu_demo.web.gradio_internals import hide_from_mcp
from tpu_demo.web.outputs import NO_PREVIEW
from tpu_demo.web.restore import COPY_JS, QUERY_JS
from tpu_demo.web.styles import style_controls, style_example_samples, style_examples, style_updates

#: the page's own events of the device handlers (undocumented: programs call /generate and /compare_modes;
#: the guard names their inputs from the API info all the same)
PAGE_GENERATE, PAGE_COMPARE = "page_generate", "page_compare"
#: every endpoint that runs the device: admission limits apply to them together
GUARDED_APIS = (PAGE_GENERATE, PAGE_COMPARE, GENERATE_API, COMPARE_API, *DEVICE_TOOLS)
#: the page's own small events: not in the API, answered at once outside the queue
LOCAL: dict[str, Any] = {"api_visibility": "private", "queue": False}
#: ... with no pending state: Gradio would dim a refreshing Markdown to 20% or show an empty gallery as loading
QUIET: dict[str, Any] = {**LOCAL, "show_progress": "hidden"}
#: the page's small events that tell the visitor something (gr.Info, gr.Warning, gr.Error): Gradio shows those
#: only for an event that runs through its queue (each answers at once: no concurrency limit)
TOLD: dict[str, Any] = {"api_visibility": "private", "show_progress": "hidden", "concurrency_limit": None}
#: runs in the browser before the seed is picked (its inputs pass through): on a phone the results sit below the
#: example list (assets/style.css), so Generate and Compare bring them into view. The browser's scroll anchoring
#: would then hold a setting below them in place as the gallery grows, carrying the images off the screen.
SHOW_RESULTS_JS = """(seed, randomize) => {
  if (window.matchMedia("(max-width: 640px)").matches) {
    document.scrollingElement.style.overflowAnchor = "none";
    document.querySelector("#%s")?.scrollIntoView({block: "start"});
  }
  return [seed, randomize];
}"""


def build_page(handlers: PageHandlers, history: SessionHistory | None = None) -> gr.Blocks:
    history = history or SessionHistory()
    comparer = CompareHandler(handlers)
    settings = handlers.settings
    spec = handlers.engine.spec(settings.start_model)
    modes = [(m.title, m.value) for m in settings.limits.offered_modes]
    # delete_cache: generated files older than an hour are removed hourly (public demos run for weeks)
    with gr.Blocks(title="TPU Diffusion Demo", analytics_enabled=False, delete_cache=(3600, 3600)) as demo:
        header = gr.HTML(handlers.header_html(spec.id), elem_id="demo-header")
        with gr.Row(equal_height=False, elem_id="main-row"):
            with gr.Column(scale=2, min_width=300, elem_id="controls-column"):
                # rendered below the examples, which set them: created first so they can name them
                resolution = gr.Dropdown(label="Resolution", choices=handlers.resolution_choices(spec),
                                         value=str(spec.buckets[0]), elem_id="resolution", render=False)
                num_images = gr.Slider(label="Number of images", minimum=1, maximum=settings.limits.max_images,
                                       step=1, value=settings.start_images, elem_id="num-images",
                                       render=False)
                # one line to start (it grows to six): Gradio submits on Enter only there (Shift+Enter: a new line)
                prompt = gr.Textbox(label="Prompt", lines=1, max_lines=6, autofocus=True,
                                    placeholder="Describe the image, then press Enter",
                                    max_length=settings.limits.max_prompt_chars, elem_id="prompt")
                # words outside the model's declared vocabulary (tiny-shapes declares one), if any
                vocabulary = gr.Markdown("", visible=False, elem_id="vocabulary-note")
                # the model's prompt upsampler (tiny-shapes: its sentence form, the seed choosing what the
                # prompt leaves out; FLUX.2: its text encoder); each caption says what was drawn
                upsampler = spec.prompt_upsampler
                upsample = gr.Checkbox(label="Upsample prompt", value=upsampler is not None and upsampler.default_on,
                                       visible=upsampler is not None, info=upsampler.cost_note if upsampler else None,
                                       elem_id="upsample-prompt")
                # a page opened from a reproduce link: what it filled (or which parameter is wrong)
                link_note = gr.HTML("", visible=False, elem_id="link-note")
                generate_this = gr.Button("Generate this", variant="primary", visible=False, elem_id="generate-this")
                with gr.Row(elem_id="actions"):
                    generate_button = gr.Button("Generate", variant="primary", scale=3, elem_id="generate")
                    compare_button = gr.Button("Compare modes", variant="secondary", scale=2, min_width=120,
                                               elem_id="compare")
                    stop_button = gr.Button("Stop", variant="stop", scale=1, min_width=70, elem_id="stop")
                # right under the prompt, so a phone's first screen holds prompt, buttons and examples
                examples = example_list(spec, prompt, resolution, num_images, settings.limits.max_images)
                style, style_scale = style_controls(handlers.engine, spec)
                styled_examples = style_examples(spec, prompt, resolution, style, style_scale)
                model = gr.Dropdown(label="Model", choices=[(handlers.engine.spec(m).title, m) for m in handlers.engine.specs],
                                    value=spec.id, elem_id="model")
                mode = gr.Radio(label="Execution mode", choices=modes, value=settings.start_mode.value,
                                elem_id="mode")
                resolution.render()
                with gr.Accordion("Advanced", open=False, elem_id="advanced"):
                    negative_prompt = gr.Textbox("", label="Negative prompt", lines=1, max_lines=3,
                                                 placeholder="What the image should not show",
                                                 max_length=settings.limits.max_prompt_chars,
                                                 visible=spec.negative_prompt, elem_id="negative-prompt")
                    steps = gr.Slider(label="Steps (num_inference_steps)", minimum=spec.min_steps,
                                      maximum=spec.max_steps, step=1, value=spec.default_steps, elem_id="steps")
                    low, high = spec.guidance_range or (spec.default_guidance, spec.default_guidance + 1)
                    guidance = gr.Slider(label="Guidance scale", minimum=low, maximum=high, step=0.1,
                                         value=spec.default_guidance, interactive=not spec.guidance_fixed)
                    with gr.Row():
                        # no minimum / maximum: Gradio would refuse an out-of-range seed with a bare "Error";
                        # Generate names the field instead
                        seed = gr.Number(label="Seed", value=0, precision=0, info=f"0 to {MAX_SEED}", elem_id="seed")
                        randomize = gr.Checkbox(label="Randomize seed", value=True)
                    num_images.render()
                    previews = gr.Checkbox(label="Live previews while denoising", value=True)
                    style.render(), style_scale.render()  # LoRA adapters, hot-swapped on the warm graph
                details = gr.Markdown(handlers.details_markdown(spec.id, settings.start_mode.value), elem_id="run-details")
            with gr.Column(scale=3, min_width=300, elem_id="results-column"):
                # the image denoising now, replaced about every --preview-seconds (inline: web/outputs.py)
                live_preview = gr.HTML(NO_PREVIEW, elem_id="live-preview")
                gallery = gr.Gallery(label="Images", format="png", type="filepath", columns=2, height="auto",
                                     object_fit="contain", show_label=False, interactive=False, elem_id="gallery")
                with gr.Column(min_width=160, elem_id="comparison"):
                    compare_gallery = gr.Gallery(label="Same prompt and seed in each execution mode", format="png",
                                                 type="filepath", columns=3, height="auto", object_fit="contain",
                                                 interactive=False, elem_id="compare-gallery")
                    compare_summary = gr.HTML(EMPTY_SUMMARY, elem_id="compare-summary")
                    with gr.Accordion("Comparison figures (JSON)", open=False, elem_id="compare-json"):
                        compare_figures = gr.JSON(label="figures", elem_id="compare-figures")
                speeds = chart.speed_frame(handlers.engine.recent.snapshot(), spec.id)
                speed_plot = chart.speed_plot(speeds)
                speed_table = gr.HTML(chart.figures_html(speeds), elem_id="speed-figures")
                chart_seen = gr.State(None)
                history_view = gr.Gallery(label="Earlier in this visit (newest first)", format="png", type="filepath",
                                          columns=6, height="auto", object_fit="contain", interactive=False,
                                          elem_id="history", value=[])
                selected = gr.State(None)
                with gr.Row(elem_id="reuse-row"):
                    reuse_button = gr.Button("Reuse settings of the selected image", size="sm", elem_id="reuse")
                    copy_link = gr.Button("Copy link to the selected image", size="sm", elem_id="copy-link")
                link_box = gr.Textbox(label="Link that reproduces the image", interactive=False, visible=False,
                                      buttons=["copy"], elem_id="image-link")
                page_query = gr.Textbox(visible=False, elem_id="page-query")
                # a File, not an Image: Gradio's Image opens uploads with PIL; the PNG is read here
                # from its chunk headers only (bounded size, never decoded: pngmeta.read_settings_file)
                dropped = gr.File(label="Drop a PNG made here to restore its settings", type="filepath",
                                  file_types=[".png"], file_count="single", height=140, elem_id="restore-png")
        with gr.Accordion("Buckets (static shapes) and warmup", open=True, elem_id="buckets"):
            status = gr.Markdown(handlers.bucket_table(spec.id, settings.start_mode.value), elem_id="bucket-status")
        with gr.Accordion("About this server", open=False, elem_id="about") as about_panel:
            about = gr.Markdown(about_markdown(handlers.engine.about()), elem_id="about-facts")
        timer = gr.Timer(settings.status_refresh_seconds)

        # each control by the request field it fills: Generate, /generate and Compare take them by name
        controls = dict(prompt=prompt, model=model, mode=mode, resolution=resolution, num_inference_steps=steps,
                        guidance_scale=guidance, seed=seed, num_images=num_images, previews=previews,
                        negative_prompt=negative_prompt, style=style, style_scale=style_scale, upsample_prompt=upsample)
        generation = gr.on(triggers=[generate_button.click, prompt.submit, generate_this.click], fn=handlers.pick_seed,
                           inputs=[seed, randomize], outputs=[seed], js=SHOW_RESULTS_JS % "live-preview", **LOCAL).then(
            handlers.generate, inputs_kwargs={name: controls[name] for name in GENERATE_INPUTS},
            outputs=[gallery, live_preview], api_name=PAGE_GENERATE, api_visibility="undocumented", preprocess=False,
            postprocess=False, concurrency_id=DEVICE_CONCURRENCY_ID, concurrency_limit=settings.generate_concurrency)
        # the history shows earlier runs only: never the run in the gallery or in the comparison
        generation.success(history.after_generate, [gallery], [history_view], **QUIET)
        comparison = compare_button.click(handlers.pick_seed, inputs=[seed, randomize], outputs=[seed],
                                          js=SHOW_RESULTS_JS % "comparison", **LOCAL).then(
            comparer.compare_modes, inputs_kwargs={name: controls[name] for name in COMPARE_INPUTS},
            outputs=[compare_gallery, compare_summary, compare_figures], api_name=PAGE_COMPARE,
            api_visibility="undocumented", preprocess=False, postprocess=False,
            # its own id: Gradio gives a shared id the lowest limit, which would serialise every generate
            # handler again; the engine's device thread still runs one pipeline call at a time
            concurrency_id=COMPARE_CONCURRENCY_ID, concurrency_limit=1)
        comparison.success(history.after_compare, [compare_gallery], [history_view], **QUIET)
        gr.on([prompt.change, model.change, upsample.change], handlers.vocabulary_line, [prompt, model, upsample],
              [vocabulary], trigger_mode="always_last", **QUIET)
        model.input(lambda model_id: gr.update(visible=handlers.engine.spec(model_id).negative_prompt, value=""),
                    [model], [negative_prompt], **LOCAL)
        timer.tick(lambda model_id, seen: chart.refresh(handlers.engine.recent, model_id, seen), [model, chart_seen],
                   [speed_plot, speed_table, chart_seen], **QUIET)
        about_panel.expand(lambda: about_markdown(handlers.engine.about()), None, [about], **QUIET)
        demo.unload(history.drop)
        stop_button.click(handlers.stop, None, None, queue=False, api_name="stop")
        hide_from_mcp(handlers.stop)  # public for gradio_client callers, not an MCP tool
        restored = [prompt, model, mode, resolution, steps, guidance, seed, randomize, header, details, upsample,
                    negative_prompt, style, style_scale]
        copy_link.click(handlers.restore.link_query, [gallery, selected], [link_box], **TOLD).then(
            None, [link_box], [link_box], js=COPY_JS, **LOCAL)
        demo.load(handlers.restore.open_link, [page_query], [*restored, num_images, link_note, generate_this],
                  js=QUERY_JS, **LOCAL)
        # /generate, /compare_modes and the MCP tools: the endpoints programs call (web/api.py)
        ApiEndpoints(handlers, comparer, gallery).add()
        model.input(handlers.switch_model, [model, mode], [resolution, steps, guidance, header, details, upsample],
                    **LOCAL)
        model.input(lambda model_id: style_updates(handlers.engine, handlers.engine.spec(model_id)), [model],
                    [style, style_scale], **LOCAL)
        # the examples are the chosen model's (another's would set a bucket or a style it does not have)
        for shown, samples in ((examples, lambda spec: example_samples(spec, settings.limits.max_images)),
                               (styled_examples, style_example_samples)):
            if shown is not None:
                model.input(lambda model_id, samples=samples: _example_update(*samples(handlers.engine.spec(model_id))),
                            [model], [shown.dataset], **QUIET)
        # a style picked by the visitor comes at its own default strength (examples, links and
        # "Reuse settings" set both, and do not fire .input)
        style.input(lambda model_id, name: default_scale(handlers.engine.spec(model_id).styles, name), [model, style],
                    [style_scale], **QUIET)
        gallery.select(handlers.restore.remember_selection, None, [selected], **LOCAL)
        reuse_button.click(handlers.restore.restore_from_gallery, [gallery, selected, mode], restored, **TOLD)
        dropped.upload(handlers.restore.restore_settings, [dropped, mode], restored, **TOLD)
        mode.change(handlers.switch_mode, [model, mode], [details], **LOCAL)
        timer.tick(handlers.bucket_table, [model, mode], [status], **QUIET)
    return demo


def example_samples(spec: Any, max_images: int) -> tuple[list[list], list[str]]:
    """The model's example prompts as (prompt, bucket, images) samples, and their labels: a prompt that leaves
    attributes to the seed is listed with several images."""
    rows = example_rows(spec)
    # Gradio cuts a label at 60 characters: bucket and count go first
    return ([[text, size, min(n, max_images)] for text, size, n in rows],
            [example_label(text, size, n, str(spec.buckets[0])) for text, size, n in rows])


def example_list(spec: Any, prompt: Any, resolution: Any, num_images: Any, max_images: int) -> gr.Examples | None:
    """"Try" for the start model: each example sets the prompt, its bucket and how many images show it."""
    samples, labels = example_samples(spec, max_images)
    if not samples:
        return None
    # labelled, Gradio lays them out as buttons (Tab reaches each); unlabelled, several inputs make a
    # table whose rows no key reaches
    return gr.Examples(examples=samples, inputs=[prompt, resolution, num_images], label="Try", elem_id="examples",
                       example_labels=labels)


def _example_update(samples: list[list], labels: list[str]) -> Any:
    """An example list showing another model's samples (hidden when it has none)."""
    return gr.Dataset(samples=samples, sample_labels=labels, visible=bool(samples))


def example_label(text: str, size: str, images: int, first_bucket: str) -> str:
    """"96x64 \u00d74 \u00b7 a prompt": what the example sets besides the prompt, first."""
    tags = ([size] if size != first_bucket else []) + ([f"\u00d7{images}"] if images > 1 else [])
    return f"{' '.join(tags)} \u00b7 {text}" if tags else text


def launch_kwargs() -> dict[str, Any]:
    """Theme, CSS and the page-load script (Gradio 6 takes them in ``launch``); built-in theme fonts are local."""
    css_path = ASSETS_DIR / "style.css"
    theme = gr.themes.Soft(font=[gr.themes.Font("ui-sans-serif"), "system-ui", "sans-serif"],
                           font_mono=[gr.themes.Font("ui-monospace"), "monospace"])
    # WCAG AA (4.5:1), checked by axe-core in tests/test_accessibility.py: the Soft theme's labels (primary 500
    # on primary 100) read at 3.6:1, its light subdued text (neutral 400: chip labels, table heads, the upload
    # box's "or", the footer) at 2.5:1 and white on the selected radio (primary 500) at 4.46:1
    theme = theme.set(block_label_text_color="*primary_700", block_title_text_color="*primary_700",
                      body_text_color_subdued="*neutral_600", checkbox_label_background_fill_selected="*primary_600")
    return {"theme": theme, "css": css_path.read_text() if css_path.is_file() else None,
            "js": chart.KEEP_FIGURES_OPEN_JS}
