"""``--warm all`` on the real app: every offered model warmed before /ready, one model at a time,
the start model left loaded; and a switch to a model that is not loaded says "loading <model>,
<size> ..." on the page (the generate progress and the Buckets panel) while its weights load.

The compile-cache side (a switch after ``--warm all`` compiles nothing with inductor) is measured
by ``benchmarks/switch_probe.py`` and checked end to end with replicas in tests/test_chips.py.
"""

import time

import httpx

from conftest import request_fields
from tpu_demo.core.events import BucketState, Loading
from tpu_demo.core.modes import ExecutionMode
from tpu_demo.core.request import validate_request
from tpu_demo.engine.warm_all import warm_order
from tpu_demo.launch.config import parse_config


def test_warm_all_is_a_flag_with_an_environment_twin():
    assert parse_config([], environ={}).warm == "start"
    assert parse_config([], environ={"TPU_DEMO_WARM": "all"}).warm == "all"
    assert parse_config(["--warm", "start"], environ={"TPU_DEMO_WARM": "all"}).warm == "start"
    assert warm_order(("tiny-shapes", "tiny-flux", "tiny-sd3"), "tiny-flux") == ("tiny-shapes", "tiny-sd3", "tiny-flux")


def test_ready_only_after_every_offered_model_is_warm_and_the_start_model_stays_loaded(launch_app):
    app, url = launch_app("--models", "tiny-flux,tiny-sd3", "--model", "tiny-flux", "--mode", "compiled",
                          "--warm", "all")
    reasons, loaded_seen = [], set()
    deadline = time.monotonic() + 600
    with httpx.Client(timeout=10) as http:
        while time.monotonic() < deadline:
            ready = http.get(url + "ready")
            loaded_seen |= set(http.get(url + "health").json()["models_loaded"])
            reasons.append(ready.json()["reason"])
            if ready.status_code == 200:
                break
            time.sleep(0.05)
    assert reasons[-1].startswith("ready: "), reasons[-5:]
    waiting = reasons[:-1]
    # the other model first, then the start model, each in every mode, the start mode last; /ready named each
    assert any(r.startswith("warming tiny-sd3 (model 1 of 2, eager: mode 1 of 3)") for r in waiting), sorted(set(waiting))
    assert all(r.startswith(("warming tiny-sd3 (model 1 of 2, ", "warming tiny-flux (model 2 of 2, ")) for r in waiting)
    assert app.warm_all.finished.is_set() and app.warm_all.failures() == []
    for model in ("tiny-sd3", "tiny-flux"):  # every offered mode: what Compare modes runs finds them warm
        statuses = app.warm_all.results[model]
        assert [s.mode for s in statuses] == [mode.value for mode in (ExecutionMode.EAGER, ExecutionMode.EAGER_FUSED,
                                                                       ExecutionMode.COMPILED)
                                               for _ in app.engine.configured_shapes(model, mode)]
        assert all(s.state is BucketState.WARM for s in statuses)
    health = httpx.get(url + "health").json()
    assert set(health["warmed"]) == {"tiny-sd3", "tiny-flux"}  # what was warmed, loaded now or not
    assert health["warmed"]["tiny-sd3"]["compiled"]["warm"] == 4 and set(health["models_loaded"]) == {"tiny-flux"}
    assert app.warm_all.describe() == ("--warm all: tiny-sd3, tiny-flux (one at a time, tiny-flux last), each in "
                                       "eager, eager-fused, compiled: 24 shapes (every bucket x batch size)")
    # one model at a time (no memory budget), and the start model is the one left loaded and warm
    assert "tiny-sd3" in loaded_seen or waiting == []
    assert set(app.engine.status().models) == {"tiny-flux"}
    for mode in ExecutionMode:  # the page's every mode is warm for the model it shows first
        assert all(b.state is BucketState.WARM for b in app.engine.buckets_for("tiny-flux", mode)[:4])


def test_a_switch_says_loading_the_model_and_its_size_while_it_loads(launch_app, monkeypatch):
    app, url = launch_app("--models", "tiny-flux,tiny-shapes", "--model", "tiny-flux", "--no-warmup")
    app.engine.load("tiny-flux")
    request = validate_request(request_fields(model="tiny-shapes", num_inference_steps=2, guidance_scale=3.0,
                                              previews=False), app.ui.settings.limits)
    # the Buckets panel, read while the device thread loads (the pool says what it is loading)
    seen_in_panel = []
    real_load = app.engine.pool._load

    def load_and_look(spec, keep):
        seen_in_panel.append(app.ui.bucket_table("tiny-shapes", "eager"))
        return real_load(spec, keep)

    monkeypatch.setattr(app.engine.pool, "_load", load_and_look)
    events = list(app.engine.generate(request))
    loading = [e for e in events if isinstance(e, Loading)]
    assert [e.model for e in loading] == ["tiny-shapes"]
    # the committed weights' size on disk (a real model shows the catalog's GB)
    assert loading[0].text.startswith("loading Tiny Shapes") and loading[0].text.endswith(" MB ...")
    assert loading[0].text in seen_in_panel[0]
    assert app.engine.status().loading is None  # done: the panel no longer says it
