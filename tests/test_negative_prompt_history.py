"""Negative prompt (validation, PNG settings, reuse) and the per-session history store."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
from gradio_client import Client
from PIL import Image

from conftest import request_fields
from tpu_demo.core import pngmeta
from tpu_demo.core.request import RequestError, validate_request
from tpu_demo.web.history import SessionHistory


def test_negative_prompt_is_validated_like_the_prompt():
    sd3 = dict(model="tiny-sd3", guidance_scale=4.5)
    assert validate_request(request_fields(negative_prompt="  blurry  ", **sd3)).negative_prompt == "blurry"
    assert validate_request(request_fields(**sd3)).negative_prompt == ""
    assert validate_request(request_fields(model="tiny-shapes", guidance_scale=3.0,
                                           negative_prompt="a circle")).negative_prompt == "a circle"
    bad = [({"negative_prompt": "blurry"}, "does not take a negative prompt"),  # tiny-flux takes none
           ({"negative_prompt": "x" * 1001, **sd3}, "characters long"),
           ({"negative_prompt": "bad\x00text", **sd3}, "control"),
           ({"negative_prompt": ["a"], **sd3}, "must be text")]
    for fields, message in bad:
        with pytest.raises(RequestError, match=message) as error:
            validate_request(request_fields(**fields))
        assert error.value.field == "negative_prompt"


def test_png_parameters_carry_the_negative_prompt():
    settings = {"prompt": "a green square", "negative_prompt": "blurry", "model": "tiny-sd3", "mode": "eager",
                "resolution": "64x64", "num_inference_steps": 2, "guidance_scale": 4.5, "seed": 1}
    assert pngmeta.a1111_parameters(settings).split("\n")[:2] == ["a green square", "Negative prompt: blurry"]
    assert "Negative prompt" not in pngmeta.a1111_parameters({**settings, "negative_prompt": ""})
    image = pngmeta.attach(Image.new("RGB", (8, 8)), settings)
    assert pngmeta.read_settings(image)["negative_prompt"] == "blurry"


def test_negative_prompt_changes_the_image_and_reuse_restores_it(launch_app):
    app, url = launch_app("--model", "tiny-sd3", "--models", "tiny-sd3,tiny-flux", "--no-warmup")
    client = Client(url, verbose=False)
    fields = request_fields(model="tiny-sd3", guidance_scale=4.5, previews=False)
    [plain], _ = client.predict(**fields, api_name="/generate")
    [negative], _ = client.predict(**{**fields, "negative_prompt": "blurry"}, api_name="/generate")
    pixels = [np.asarray(Image.open(item["image"]), dtype=np.int16) for item in (plain, negative)]
    assert np.abs(pixels[0] - pixels[1]).max() > 0
    restored = app.ui.restore.restore_settings(negative["image"], "eager")
    # (prompt, ..., details, upsample prompt, negative prompt, style, style strength): the negative prompt is
    # the twelfth
    assert restored[0] == fields["prompt"] and restored[11]["value"] == "blurry" and restored[11]["visible"]


def _png(tmp_path: Path, name: str, kilobytes: int = 1) -> str:
    path = tmp_path / f"{name}.png"
    side = max(8, int((kilobytes * 1024 / 3) ** 0.5))
    Image.fromarray(np.random.default_rng(len(name)).integers(0, 255, (side, side, 3), dtype=np.uint8)).save(path)
    return str(path)


def test_history_is_newest_first_bounded_and_freed(tmp_path):
    history = SessionHistory(max_images=3, max_mb=1.0, max_sessions=2)
    visitor = SimpleNamespace(session_hash="visitor")
    first = history.add([(_png(tmp_path, "a"), "seed 1"), (_png(tmp_path, "p"), "preview · image 1")], visitor)
    assert [caption for _, caption in first] == ["seed 1"]  # previews are not history
    items = history.add([(_png(tmp_path, "b"), "seed 2"), (_png(tmp_path, "c"), "seed 3"),
                         (_png(tmp_path, "d"), "seed 4")], visitor)
    assert [caption for _, caption in items] == ["seed 4", "seed 3", "seed 2"]  # newest first, at most 3
    folder = Path(items[0][0]).parent
    assert sorted(path.name for path in folder.iterdir()) == [Path(p).name for p, _ in reversed(items)]
    # megabytes bound: a 0.6 MB image twice is over 1 MB, the older one goes
    big = history.add([(_png(tmp_path, "big1", 600), "big 1"), (_png(tmp_path, "big2", 600), "big 2")], visitor)
    assert [caption for _, caption in big] == ["big 2"]
    # the session ends: its folder is gone
    history.drop(visitor)
    assert not folder.exists() and history.sessions() == 0
    # session bound: a third session drops the oldest one's folder
    folders = [Path(history.add([(_png(tmp_path, f"s{i}"), "x")], SimpleNamespace(session_hash=f"s{i}"))[0][0]).parent
               for i in range(3)]
    assert [f.exists() for f in folders] == [False, True, True] and history.sessions() == 2
    history.close()
    assert not history.root.exists()


def test_a_session_hash_alone_neither_reads_nor_frees_another_visitors_history(tmp_path):
    """A page visitor's requests carry its owner cookie: a stranger naming the same session hash (Gradio runs
    the unload handler for whichever hash a heartbeat or join names) sees and frees nothing of it."""
    history = SessionHistory()
    cookie = "tpu_demo_owner=" + "a" * 32

    def caller(headers: dict) -> SimpleNamespace:
        return SimpleNamespace(session_hash="visit", headers=headers)

    owner = caller({"cookie": cookie})
    [(path, _)] = history.add([(_png(tmp_path, "mine"), "seed 1")], owner)
    for stranger in (caller({}), caller({"cookie": "tpu_demo_owner=" + "b" * 32})):
        assert history.earlier(stranger) == []
        history.drop(stranger)
        assert Path(path).exists() and history.earlier(owner) == [(path, "seed 1")]
    history.drop(owner)
    assert not Path(path).exists() and history.sessions() == 0


def test_history_view_shows_earlier_runs_only(tmp_path):
    """The run in the gallery and the comparison on show are kept but left out of the view until replaced."""
    history = SessionHistory()
    visitor = SimpleNamespace(session_hash="visitor")
    assert history.after_generate([(_png(tmp_path, "a"), "run 1")], visitor) == []  # it is in the gallery
    assert history.after_compare([(_png(tmp_path, "c"), "compare 1")], visitor) == []  # in the comparison
    view = history.after_generate([(_png(tmp_path, "b"), "run 2")], visitor)
    assert [caption for _, caption in view] == ["run 1"]
    view = history.after_compare([(_png(tmp_path, "d"), "compare 2")], visitor)
    assert [caption for _, caption in view] == ["compare 1", "run 1"]  # newest first
    assert len(history.add([], visitor)) == 4  # every copy is kept
    history.close()


def test_a_session_counted_as_gone_has_no_folder_left(tmp_path, monkeypatch):
    """Closing a tab frees the folder before the session stops being counted (CI once saw the count first)."""
    import shutil
    import threading
    import time

    import tpu_demo.web.history as history_module

    real_rmtree = shutil.rmtree

    def slow_rmtree(path, *args, **kwargs):  # a slow disk: the removal takes a visible while
        time.sleep(0.5)
        real_rmtree(path, *args, **kwargs)

    history = SessionHistory()
    visitor = SimpleNamespace(session_hash="visitor")
    folder = Path(history.add([(_png(tmp_path, "a"), "seed 1")], visitor)[0][0]).parent
    monkeypatch.setattr(history_module.shutil, "rmtree", slow_rmtree)
    closing = threading.Thread(target=history.drop, args=(visitor,))
    closing.start()
    deadline = time.monotonic() + 5
    while history.sessions() and time.monotonic() < deadline:
        time.sleep(0.01)
    assert history.sessions() == 0 and not folder.exists()
    closing.join(5)
    monkeypatch.undo()
    history.close()
