"""The benchmark's report: the markdown table of figures beside their targets, and where results go."""

from __future__ import annotations

import datetime
import re
from pathlib import Path
from typing import Any

#: Targets (reported next to the measurement, not asserted).
TARGETS = {
    "engine_overhead": "<= 1.02x",
    "app_overhead": "<= 1.10x and <= 25 ms",
    "recompiles_after_warmup": "0",
    "memory": "<= 1.15x",
    "previews": "<= 1.05x",
    "restart": "<= 0.35x",
}


def _met(value: bool) -> str:
    return "yes" if value else "**no**"


def markdown_table(results: dict[str, Any]) -> str:
    """The README table: one row per figure, measured value next to its target."""
    f = results["figures"]
    rows = []
    e = f["engine_overhead"]
    rows.append(("engine overhead: `Engine.generate` / bare pipeline call", f"{e['ratio']:.3f}x ({e['median_extra_ms']:+.1f} ms/image, "
                 f"{e['median_b_ms']:.0f} ms bare, {e['pairs']} pairs; fastest/fastest {e['best_ratio']:.3f}x)", TARGETS["engine_overhead"], _met(e["ratio"] <= 1.02)))
    a = f["app_overhead"]
    rows.append(("app overhead: `gradio_client` `/generate` on loopback / bare call", f"{a['ratio']:.3f}x ({a['median_extra_ms']:+.1f} ms/request, "
                 f"{a['pairs']} pairs; fastest/fastest {a['best_ratio']:.3f}x)", TARGETS["app_overhead"], _met(a["ratio"] <= 1.10 and a["median_extra_ms"] <= 25)))
    rows.append(("Gradio's own floor: same client, bare Gradio app yielding one ready PNG",
                 f"{a['gradio_floor_ms']:.0f} ms/request; the app adds {a['app_beyond_gradio_floor_ms']:+.0f} ms beyond it",
                 "\u2013", "\u2013"))
    for mode, w in f["warm_vs_cold"].items():
        rows.append((f"warm vs cold, {mode} ({w['described_as']})", f"first request {w['cold_s']:.2f} s, then {1000 * w['warm_median_s']:.0f} ms "
                     f"({w['ratio']:.1f}x; {w['compiles_first']} graph compiled)", "\u2013", "\u2013"))
    if f["other_buckets_cold"]:
        cold = ", ".join(f"{b} {v['cold_s']:.1f} s" for b, v in f["other_buckets_cold"].items())
        rows.append(("first request of each other bucket (compiled)", cold, "\u2013", "\u2013"))
    r = f["recompiles_after_warmup"]
    rows.append(("recompiles after warmup", f"**{r['compiles']}** over {r['requests']} requests ({r['images']} images, "
                 f"{r['images_not_warm']} not warm; buckets "
                 f"{', '.join(r['buckets'])}; steps {', '.join(map(str, r['steps']))}; modes {', '.join(r['modes'])}; seeds varied)",
                 TARGETS["recompiles_after_warmup"], _met(r["compiles"] == 0 and r["images_not_warm"] == 0)))
    m = f["memory"]
    rows.append(("peak RSS, all buckets warm / one bucket warm", f"{m['ratio']:.3f}x ({m['all_buckets_peak_rss_mb']:.0f} MB / "
                 f"{m['one_bucket_peak_rss_mb']:.0f} MB, {m['warm_buckets']} buckets; weights {m['weights_mb']} MB held once)",
                 TARGETS["memory"], _met(m["ratio"] <= 1.15)))
    p = f["previews"]
    for label, e2e in p["end_to_end"].items():
        d, w = e2e["denoise_per_image"], e2e["whole_request"]
        rows.append((f"previews on / off through the app, {label}: denoise per image (whole request)",
                     f"{d['ratio']:.3f}x (pairs {d['pair_ratio_min']:.2f}-{d['pair_ratio_max']:.2f}; whole request "
                     f"{w['ratio']:.3f}x; {e2e['preview_frames_per_request']:g} previews/request, {e2e['pairs']} pairs)",
                     TARGETS["previews"], _met(d["ratio"] <= 1.05)))
    rows.append(("step preview on the device thread (project + start copy) / denoising step",
                 f"{100 * p['fraction_of_step']:.1f}% ({p['capture_ms_median']:.3f} ms / {p['step_ms_median']:.1f} ms); "
                 f"rendering it in the UI thread: {p['render_ms_median']:.3f} ms", "\u2013", "\u2013"))
    t = f["throughput"]
    rows.append((f"throughput, queue saturated by {t['clients']} clients", f"{t['images_per_minute']:.0f} images/min "
                 f"({t['ratio_to_bare']:.2f}x of back-to-back bare calls; {t['images']} images, {len(t['errors'])} errors)", "\u2013", "\u2013"))
    for row in f["load"]["configs"].values():
        if row["client"] == "floor":
            rows.append((f"Gradio's raw-HTTP floor: {row['clients']} visitor(s), bare Gradio app yielding one ready PNG",
                         f"{row['images_per_minute']:.0f} requests/min; p50 {1000 * row['p50_latency_s']:.1f} ms, "
                         f"p95 {1000 * row['p95_latency_s']:.1f} ms per request", "\u2013", "\u2013"))
            continue
        rows.append((f"load: {row['clients']} client(s), max batch {row['max_batch']} ({row['client']} clients)",
                     f"{row['images_per_minute']:.0f} images/min ({row['ratio_to_bare']:.2f}x of bare calls; p50 "
                     f"{1000 * row['p50_latency_s']:.0f} ms, p95 {1000 * row['p95_latency_s']:.0f} ms; "
                     f"{row['error_count']} errors)",
                     ">= 0.6x at 4 clients, batching on" if row["clients"] == 4 and row["max_batch"] > 1 else "\u2013",
                     _met(row["ratio_to_bare"] >= 0.6) if row["clients"] == 4 and row["max_batch"] > 1 else "\u2013"))
    for name, target in f["load"].get("targets", {}).items():
        if isinstance(target, dict) and "goal" in target:
            held = f"; held back by {target['held_back_by']}" if "held_back_by" in target else ""
            rows.append((f"request path: {name}", f"{target['figure']}{held}", target["goal"], _met(target["met"])))
    if "targets" in f["load"]:
        stages = ", ".join(f"{name} {ms:g}" for name, ms in f["load"]["targets"]["one_visitor_stages_ms"].items())
        rows.append(("request path: one visitor's median stages, ms (the app's request log)", stages, "\u2013", "\u2013"))
    s = f["restart"]
    rows.append(("restart: start-up to all buckets warm, with cache / cold", f"{s['ratio']:.3f}x ({s['with_cache']['seconds_to_all_warm']:.1f} s / "
                 f"{s['cold']['seconds_to_all_warm']:.1f} s, {len(s['cold']['buckets'])} buckets)", TARGETS["restart"], _met(s["ratio"] <= 0.35)))
    w = f["switch"]
    pre, never = w["pre_warmed"], w["never_warmed"]
    rows.append((f"switch {pre['from']} -> {pre['to']}: pre-warmed (--warm all) / never warmed, seconds to the first image",
                 f"{w['ratio']:.3f}x ({pre['switch_seconds']:.2f} s / {never['switch_seconds']:.2f} s); compiled afresh "
                 f"after the switch: {pre['fresh_compiles']} (never warmed: {never['fresh_compiles']}; graphs traced "
                 f"{pre['graphs_captured']} / {never['graphs_captured']})", "0 compiled afresh",
                 _met(pre["fresh_compiles"] == 0) if pre["fresh_compiles"] is not None else "\u2013"))
    if "style_switch" in f:
        from benchmarks.styles import table_row

        rows.append(table_row(f["style_switch"]))
    header = (f"{results['device']} \u00b7 {results['model']} \u00b7 {results['resolution']} \u00b7 {results['steps']} steps \u00b7 "
              f"compiled = {results['compile_backend']} \u00b7 torch threads {results['threads']} \u00b7 load average "
              f"{results['load_average_start']} \u2192 {results['load_average_end']}")
    lines = [header, "", "| figure | measured | target | met |", "|---|---|---|---|"]
    lines += [f"| {name} | {value} | {target} | {met} |" for name, value, target, met in rows]
    return "\n".join(lines)


def output_path(results: dict[str, Any], output_dir: Path) -> Path:
    device = re.sub(r"[^a-z0-9]+", "-", results["device"].lower()).strip("-") or results["device_kind"]
    return Path(output_dir) / f"{device}-{datetime.date.today().isoformat()}.json"
