"""Plain unit tests of the pure decisions behind the guards: request validation, admission, the
call-shape check, the warmup throttle, the request log record, the health payload, PNG reading."""

import json
import math
import struct
import zlib

import pytest
from PIL import Image

from tpu_demo.core import pngmeta
from tpu_demo.core.events import ImageResult
from tpu_demo.core.request import RequestError, RequestLimits, validate_request
from tpu_demo.web.admission import AdmissionLimits, EventInputs, QueuedEvent, WarmupThrottle, arity_error, busy_reason
from tpu_demo.web.health import health_payload
from tpu_demo.core.readiness import Readiness
from tpu_demo.web.request_log import RequestRecord

from conftest import engine_images, request_fields

FIELDS = list(request_fields())


@pytest.mark.parametrize("model", ["tiny-flux", "tiny-sd3"])  # guidance fixed / used
@pytest.mark.parametrize("field", FIELDS)
@pytest.mark.parametrize("value", [math.nan, math.inf, -math.inf, None, [], [1], {}, {"a": 1}, 1e400])
def test_every_field_refuses_non_finite_null_and_wrong_types(model, field, value):
    with pytest.raises(RequestError) as error:
        validate_request(request_fields(**{"model": model, field: value}))
    assert error.value.field == field and str(error.value).startswith(f"{field}: ")


def test_a_fixed_guidance_model_still_checks_guidance_then_ignores_it():
    assert validate_request(request_fields(model="tiny-flux", guidance_scale=7.5)).guidance_scale == 0.0
    for value in (math.nan, 1e30, -1, "high"):
        with pytest.raises(RequestError, match="guidance_scale: "):
            validate_request(request_fields(model="tiny-flux", guidance_scale=value))


def test_optional_fields_may_be_left_out_but_required_ones_not():
    fields = request_fields()
    for optional in ("num_inference_steps", "guidance_scale", "seed", "num_images", "previews"):
        validate_request({k: v for k, v in fields.items() if k != optional})
    for required in ("prompt", "model", "mode", "resolution"):
        with pytest.raises(RequestError, match=f"{required}: .*null"):
            validate_request({k: v for k, v in fields.items() if k != required})


def test_busy_reason_counts_waiting_sessions_and_addresses():
    limits = AdmissionLimits(max_waiting=2, max_per_session=1, max_per_ip=2)
    running = QueuedEvent("s1", "10.0.0.1", running=True)
    waiting = QueuedEvent("s2", "10.0.0.1", running=False)
    assert busy_reason(limits, "s3", "10.0.0.2", [running]) is None
    assert "this session already has 1" in busy_reason(limits, "s1", "10.0.0.2", [running])
    assert "your address already has 2" in busy_reason(limits, "s3", "10.0.0.1", [running, waiting])
    full = [QueuedEvent(f"w{i}", f"10.0.1.{i}", running=False) for i in range(2)]
    assert "the queue is full (2 requests waiting)" in busy_reason(limits, "new", "10.0.0.9", full)
    assert busy_reason(AdmissionLimits(0, 0, 0), "s1", "10.0.0.1", [running, waiting, *full]) is None
    # a call without a session is still counted by address
    assert busy_reason(limits, None, "10.0.0.1", [running, waiting]) is not None


def test_arity_error_names_the_missing_input_or_the_extra_count():
    inputs = EventInputs("generate", ("prompt", "model", "mode"))
    assert arity_error(inputs, ["a", "b", "c"]) is None
    assert arity_error(inputs, ["a"]).startswith("model: missing; generate takes 3 value(s): prompt, model, mode")
    assert arity_error(inputs, ["a", "b", "c", "d"]).startswith("data: 4 value(s), 1 too many")
    assert arity_error(inputs, {"prompt": "a"}).startswith("data: must be a list")
    with_state = EventInputs("restore", ("gallery", "selected", "mode"), server_side=1)
    assert arity_error(with_state, ["g", "m"], simple_format=True) is None  # /call/ leaves the State out
    assert arity_error(EventInputs("stop", ()), [1]) == "data: 1 value(s), 1 too many; stop takes no values"


def test_warmup_throttle_allows_one_per_address_per_interval():
    throttle = WarmupThrottle(interval=3600)
    assert throttle.allow("10.0.0.1") and not throttle.allow("10.0.0.1")
    assert throttle.allow("10.0.0.2") and throttle.allow(None) and not throttle.allow(None)
    assert WarmupThrottle(interval=0).allow("x") and WarmupThrottle(interval=0).allow("x")


def test_request_record_counts_images_and_keeps_prompts_out(make_engine):
    engine = make_engine()
    request = validate_request(request_fields(prompt="private words", num_images=2, previews=False))
    record = RequestRecord(request=request, queue_wait_seconds=0.5)
    for event in engine.generate(request):
        record.observe(event)
    line = record.as_dict()
    assert line["images_done"] == 2 and line["outcome"] == "ok" and line["queue_wait_s"] == 0.5
    assert line["denoise_s"] > 0 and "prompt" not in line and "private words" not in json.dumps(line)
    assert record.as_dict(log_prompt=True)["prompt"] == "private words"
    assert RequestRecord(outcome="invalid", error="seed: bad").as_dict()["error"] == "seed: bad"


def test_health_payload_of_a_real_engine(make_engine):
    engine = make_engine(offered_models=("tiny-flux",))
    assert engine_images(engine, previews=False)
    health = health_payload(engine, queue_length=3, running=1, readiness=Readiness(False, "compiling bucket 1 of 4"))
    assert health["status"] == "ok" and health["models_offered"] == ["tiny-flux"] and health["ready"] is False
    assert health["queue_length"] == 3 and health["running"] == 1 and health["warm_buckets"] >= 1
    assert "tiny-flux" in health["models_loaded"] and health["device"]["kind"] == "cpu"


def test_warmups_are_coalesced_and_never_evict_a_model_for_a_visitor(make_engine):
    from tpu_demo.core.modes import ExecutionMode

    engine = make_engine(offered_models=("tiny-flux", "tiny-sd3"))
    engine.load("tiny-flux")
    threads = {engine.warmup_in_background("tiny-flux", ExecutionMode.EAGER, may_evict=False) for _ in range(20)}
    assert len(threads) <= 2  # the same pending warmup, asked again (a second only once the first ended)
    for thread in threads:
        thread.join(60)
    skipped = engine.warmup_in_background("tiny-sd3", ExecutionMode.EAGER, may_evict=False)
    skipped.join(60)
    assert list(engine.status().models) == ["tiny-flux"]  # not evicted for a visitor's warmup
    assert not engine.pending_warmups()


def _png_chunk(kind: bytes, data: bytes) -> bytes:
    return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))


def _crafted_png(path, width, height, text: bytes = b"") -> str:
    """A PNG's header and chunks as an attacker writes them (the image data is never valid or read)."""
    ihdr = struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)
    chunks = _png_chunk(b"IHDR", ihdr) + (_png_chunk(b"tEXt", text) if text else b"")
    path.write_bytes(b"\x89PNG\r\n\x1a\n" + chunks + _png_chunk(b"IDAT", zlib.compress(b"\0" * 1024)) +
                     _png_chunk(b"IEND", b""))
    return str(path)


def test_png_settings_are_read_from_chunk_headers_within_bounds(tmp_path):
    image = Image.new("RGB", (64, 64), "white")
    pngmeta.attach(image, {**request_fields(), "num_inference_steps": 3})
    image.save(tmp_path / "ok.png", pnginfo=pngmeta.png_info(image))
    assert pngmeta.read_settings_file(str(tmp_path / "ok.png"))["num_inference_steps"] == 3
    with pytest.raises(pngmeta.PngRejected, match="20000x20000 \\(400 megapixels\\)"):
        pngmeta.read_settings_file(_crafted_png(tmp_path / "bomb.png", 20000, 20000))
    with pytest.raises(pngmeta.PngRejected, match="KiB text chunk"):
        pngmeta.read_settings_file(_crafted_png(tmp_path / "text.png", 64, 64, b"tpu_demo\0" + b"x" * (1 << 20)))
    (tmp_path / "not.png").write_bytes(b"GIF89a....")
    with pytest.raises(pngmeta.PngRejected, match="not a PNG"):
        pngmeta.read_settings_file(str(tmp_path / "not.png"))
    assert pngmeta.read_settings_file(_crafted_png(tmp_path / "plain.png", 64, 64)) is None


def test_stop_reaches_only_the_owners_oldest_run(make_engine):
    from types import SimpleNamespace

    from tpu_demo.core.modes import ExecutionMode
    from tpu_demo.web import handlers as web_handlers

    ui = web_handlers.PageHandlers(make_engine(), web_handlers.UiSettings("tiny-flux", ExecutionMode.EAGER,
                                                                          RequestLimits()))
    runs = ui.runs
    anonymous = [runs.admit(None, None, "10.0.0.1") for _ in range(2)]
    ui.stop(None)
    assert not any(run.stop_flag.is_set() for run in anonymous)  # callers without a session share nothing
    owner, other = "o" * 32, "x" * 32  # the server-issued owner secrets (web/callers.py) of two clients

    def caller(session: str, secret: str | None = owner) -> SimpleNamespace:
        return SimpleNamespace(session_hash=session, headers={"cookie": f"tpu_demo_owner={secret}"} if secret else {})

    mine = runs.admit("mine", f"{owner}/mine", "10.0.0.2")
    later = runs.admit("mine", f"{owner}/mine", "10.0.0.2") if runs.limits.max_per_session > 1 else None
    ui.stop(caller("someone-else"))
    ui.stop(caller("mine", other))  # the same session hash from another client: its own runs, not mine
    ui.stop(caller("mine", None))  # or from a caller without the secret
    assert not mine.stop_flag.is_set()
    ui.stop(caller("mine"))
    assert mine.stop_flag.is_set() and (later is None or not later.stop_flag.is_set())


def test_a_bucket_is_ready_when_every_batch_size_of_it_is_warm():
    from tpu_demo.core.events import BucketState, BucketStatus
    from tpu_demo.core.readiness import bucket_readiness

    def shape(resolution: str, batch: int, state: BucketState) -> BucketStatus:
        return BucketStatus(model="tiny-flux", mode="compiled", resolution=resolution, batch=batch, state=state)

    sizes = [shape(r, n, BucketState.WARM) for n in (1, 2) for r in ("64x64", "128x128")]
    assert bucket_readiness(sizes, True, "tiny-flux", "compiled").reason == "ready: 2 of 2 buckets of tiny-flux (compiled) warm"
    sizes[-1] = shape("128x128", 2, BucketState.COMPILING)
    verdict = bucket_readiness(sizes, True, "tiny-flux", "compiled")
    assert not verdict.ready and verdict.reason.endswith("; 1 warm")


def test_a_random_seed_does_not_come_from_pythons_shared_random_state():
    """torch.compile saves ``random``'s shared state before a compile and restores it after, on whichever thread
    compiles: a seed drawn from that state meanwhile would be drawn again by the next visitor. Every draw here
    starts from the same shared state, and the seeds still differ."""
    import random

    from tpu_demo.core.request import MAX_SEED
    from tpu_demo.web.handlers import PageHandlers

    state = random.getstate()
    seeds = set()
    for _ in range(6):
        random.setstate(state)
        seeds.add(PageHandlers.pick_seed(0, True))
    assert len(seeds) == 6 and all(0 <= seed <= MAX_SEED for seed in seeds)
    # not randomized: the seed goes on as given, and Generate names the field when it is out of range
    assert PageHandlers.pick_seed(-5, False) == -5 and PageHandlers.pick_seed(7, None) == 7


def test_a_drawn_caption_shows_no_control_characters():
    """A text encoder's upsampler can write any bytes (tiny-flux2's random one does): the caption stays text."""
    from tpu_demo.web.handlers import drawn_caption

    caption = drawn_caption({"drawn_marked": "3\x1c3\x0e\x00a [red] circle", "seed_chose": True})
    assert caption.startswith("\ndrawn as: 3") and "a [red] circle" in caption
    assert all(char.isprintable() for char in caption[1:])


def test_progress_counts_each_images_own_steps_when_a_batch_steps_together():
    """Four images in one batched call report step 3 of 8 one by one: the request is 12 of 32 steps along (not
    image 4's 27 of 32), and the text names the images denoising together; one at a time, the same sums."""
    from tpu_demo.core.events import StepProgress
    from tpu_demo.web.handlers import step_progress

    steps_done: dict[int, int] = {}
    for index in range(4):
        done, text = step_progress(steps_done, StepProgress(index, 3, 8, 1.5), images=4)
    assert done == (12, 32) and text.startswith("images 1-4/4 \u00b7 step 3/8 \u00b7 ETA 2.5 s image, 2.5 s request")
    one_by_one: dict[int, int] = {0: 8}  # image 1 finished; image 2 of 3 denoising alone
    done, text = step_progress(one_by_one, StepProgress(1, 2, 8, 1.0), images=3)
    assert done == (10, 24) and text.startswith("image 2/3 \u00b7 step 2/8 \u00b7 ETA 3.0 s image, 7.0 s request")
