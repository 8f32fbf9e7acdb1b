"""The MCP door with the official ``mcp`` client over Gradio's streamable HTTP, against the real app on
loopback: the tools and their schemas, images that decode with their settings, compare, errors naming
the field, the admission limits by the caller's real address, and Stop owned by the session that started."""

import asyncio
import io
import json
import threading

import httpx
import numpy as np
import pytest
from gradio_client import Client
from mcp import ClientSession
from mcp.client.streamable_http import streamablehttp_client
from PIL import Image

from tpu_demo.core import pngmeta

from conftest import request_fields
from support import GOOD, pixels, reference, slow_steps, stopped_early, wait_until

FAST = dict(model="tiny-flux", mode="eager", resolution="64x64", num_inference_steps=2, guidance_scale=0.0)


async def _with_session(url: str, work, headers: dict | None = None, path: str = "gradio_api/mcp/"):
    async with streamablehttp_client(url + path, headers=headers) as (read, write, _):
        async with ClientSession(read, write) as session:
            await session.initialize()
            return await work(session)


def call(url: str, tool: str, arguments: dict, headers: dict | None = None, path: str = "gradio_api/mcp/"):
    return asyncio.run(_with_session(url, lambda s: s.call_tool(tool, arguments), headers, path))


def text_of(result) -> str:
    return "\n".join(c.text for c in result.content if c.type == "text")


def png_urls(text: str) -> list[str]:
    return [line.split("png: ", 1)[1] for line in text.splitlines() if line.strip().startswith("png: ")]


def test_tools_schemas_generate_compare_and_errors(launch_app):
    app, url = launch_app("--no-warmup")

    async def listed(session):
        return (await session.list_tools()).tools

    tools = {tool.name: tool for tool in asyncio.run(_with_session(url, listed))}
    # the tools and nothing else: no page handler (switches, restore, history) and no page event
    assert sorted(tools) == ["compare_execution_modes", "generate_images", "list_models"]
    schema = tools["generate_images"].inputSchema
    assert schema["required"] == ["prompt"]
    assert set(schema["properties"]) == {"prompt", "model", "mode", "resolution", "num_inference_steps",
                                         "guidance_scale", "seed", "num_images", "negative_prompt", "style",
                                         "style_scale", "upsample_prompt"}
    for name, prop in schema["properties"].items():
        assert prop.get("description"), f"{name} has no description"
    assert "64x64" in schema["properties"]["resolution"]["description"]  # this server's buckets, per model
    assert "1-4" in schema["properties"]["num_images"]["description"]
    assert "default" in schema["properties"]["num_inference_steps"]["description"]
    assert set(tools["compare_execution_modes"].inputSchema["properties"]) >= {"prompt", "model", "seed", "style",
                                                                               "style_scale"}
    style_doc = schema["properties"]["style"]["description"]
    assert "tiny-shapes: None, outline (" in style_doc and "shaded (" in style_doc and "default 'None'" in style_doc
    assert "tiny-flux: None only" in style_doc
    scale_doc = schema["properties"]["style_scale"]["description"]
    assert "0.0-2.0" in scale_doc and "outline 1" in scale_doc and "default" in scale_doc
    for endpoint in ("generate", "compare_modes", "stop", "switch_model"):  # public API or page handler: no tool
        refused = call(url, endpoint, {})
        assert refused.isError and text_of(refused).startswith("unknown tool"), text_of(refused)

    models = json.loads(text_of(call(url, "list_models", {})))
    tiny = next(m for m in models["models"] if m["id"] == "tiny-flux")
    assert "64x64" in tiny["buckets"] and tiny["steps"]["min"] >= 1 and set(tiny["warm_buckets"]) == set(models["modes"])
    assert tiny["styles"] == []
    shapes = next(m for m in models["models"] if m["id"] == "tiny-shapes")
    assert [(s["name"], s["trigger"], s["default_scale"]) for s in shapes["styles"]] == [("outline", "", 1.05),
                                                                                       ("shaded", "", 1.0)]
    assert shapes["style_scale"] == {"min": 0.0, "max": 2.0} and shapes["styles_refused"] is None

    result = call(url, "generate_images", dict(prompt="a red circle on a white background", seed=11, num_images=2, **FAST))
    assert not result.isError, text_of(result)
    text = text_of(result)
    assert text.startswith("Ran 2 image(s) of tiny-flux at 64x64 on CPU") and "bucket" in text and " s in all" in text
    urls = png_urls(text)
    assert len(urls) == 2
    for index, image_url in enumerate(urls):
        data = httpx.get(image_url).content
        with Image.open(io.BytesIO(data)) as image:
            assert image.size == (64, 64)
            settings = pngmeta.read_settings(image)
            assert np.array_equal(np.asarray(image.convert("RGB")), reference(app, seed=11 + index))
        assert settings["seed"] == 11 + index and settings["model"] == "tiny-flux" and settings["resolution"] == "64x64"
    assert "link: " + url + "?prompt=a+red+circle" in text

    compared = call(url, "compare_execution_modes", dict(prompt="a red circle", seed=3, **{k: v for k, v in FAST.items()
                                                                                           if k != "mode"}))
    assert not compared.isError, text_of(compared)
    lines = text_of(compared).splitlines()
    for mode in ("eager", "eager-fused", "compiled"):
        assert any(line.startswith(f"{mode} (") and "x strict eager" in line for line in lines), mode
    assert len(png_urls(text_of(compared))) == 3

    bad = call(url, "generate_images", dict(FAST, prompt="a red circle", resolution="4096x4096"))
    assert bad.isError and text_of(bad).startswith("resolution: ") and "choose one of" in text_of(bad)
    bad = call(url, "generate_images", dict(FAST, prompt="a red circle", num_images=99))
    assert bad.isError and text_of(bad).startswith("num_images: must be from 1 to 4")
    # a value of the wrong type names its argument too (the MCP server's own schema check would not)
    for arguments, message in ((dict(num_images="many"), 'num_images: must be a whole number, got "many"'),
                               (dict(seed=[1]), "seed: must be a whole number, got [1]"),
                               (dict(num_inference_steps=2.5),
                                "num_inference_steps: must be a whole number (or left out), got 2.5"),
                               (dict(guidance_scale="high"), 'guidance_scale: must be a number (or left out), got "high"'),
                               (dict(prompt=5), "prompt: must be text, got 5")):
        bad = call(url, "generate_images", dict(FAST, **dict(dict(prompt="a red circle"), **arguments)))
        assert bad.isError and text_of(bad) == message, text_of(bad)
    bad = call(url, "compare_execution_modes", dict(seed=1))
    assert bad.isError and text_of(bad) == "prompt: required", text_of(bad)
    assert not call(url, "list_models", {}).isError  # and the server keeps serving


def test_a_styled_generate_names_its_style_in_the_png_and_a_bad_style_names_the_field(launch_app):
    """tiny-shapes' trained styles through the official client: the PNG's settings and A1111 tag name the
    style, the pixels are the engine's for that style, the link carries it; bad values name their field."""
    app, url = launch_app("--no-warmup")
    shapes = dict(prompt="a large red square in the center on a white background", model="tiny-shapes", mode="eager",
                  resolution="64x64", num_inference_steps=4, guidance_scale=3.0)
    result = call(url, "generate_images", dict(shapes, seed=5, style="outline", style_scale=0.8))
    assert not result.isError, text_of(result)
    text = text_of(result)
    assert text.startswith("Ran 1 image(s) of tiny-shapes with style outline 0.8 at 64x64") and "style outline 0.8" in text
    (image_url,) = png_urls(text)
    with Image.open(io.BytesIO(httpx.get(image_url).content)) as image:
        settings = pngmeta.read_settings(image)
        assert image.text["parameters"].splitlines()[0].endswith("<lora:outline:0.8>")
        styled = np.asarray(image.convert("RGB"))
    assert (settings["style"], settings["style_scale"]) == ("outline", 0.8)
    assert np.array_equal(styled, reference(app, seed=5, style="outline", style_scale=0.8, **shapes))
    assert not np.array_equal(styled, reference(app, seed=5, **shapes))
    assert "&style=outline&style_scale=0.8" in text  # the reproduce link carries it

    default = call(url, "generate_images", dict(shapes, seed=5, style="shaded"))  # strength left out: the style's
    assert not default.isError and "style shaded 1" in text_of(default), text_of(default)
    for arguments, message in ((dict(style="watercolor"), "style: 'watercolor' is not a style of tiny-shapes"),
                               (dict(style="outline", style_scale=2.5), "style_scale: must be from 0.0 to 2.0")):
        bad = call(url, "generate_images", dict(shapes, **arguments))
        assert bad.isError and text_of(bad).startswith(message), text_of(bad)
    bad = call(url, "compare_execution_modes", dict({k: v for k, v in FAST.items() if k != "mode"},
                                                    prompt="a red circle", style="outline"))
    assert bad.isError and text_of(bad).startswith("style: 'outline' is not a style of tiny-flux"), text_of(bad)


def test_four_concurrent_calls_at_max_per_ip_1_one_runs_three_are_refused(launch_app, request_log):
    app, url = launch_app("--no-warmup", "--max-per-ip", "1")
    _, hook = slow_steps(app, 0.4)

    async def four():
        async def one(_):
            return await _with_session(url, lambda s: s.call_tool(
                "generate_images", dict(FAST, prompt="a red circle", num_inference_steps=4)))
        return await asyncio.gather(*(one(i) for i in range(4)))

    with hook:
        results = asyncio.run(four())
    ran = [r for r in results if not r.isError]
    refused = [text_of(r) for r in results if r.isError]
    assert len(ran) == 1 and len(refused) == 3, [text_of(r) for r in results]
    for reason in refused:
        assert reason.startswith("busy: your address already has 1 request(s) waiting or running (limit 1)"), reason
    lines = request_log()
    assert sum(1 for line in lines if line.get("via") == "mcp" and line["outcome"] == "busy") == 3
    assert sum(1 for line in lines if line["outcome"] == "ok" and "model" in line) == 1  # one line per request


def test_every_path_gradio_answers_mcp_on_is_guarded_the_same(launch_app):
    """Gradio's MCP transport answers any path under its mount that ends in /gradio_api/mcp: there too four
    concurrent calls at --max-per-ip 1 run one, only the tools are answered and arguments are checked."""
    app, url = launch_app("--no-warmup", "--max-per-ip", "1")
    _, hook = slow_steps(app, 0.4)
    alias = "gradio_api/mcp/x/gradio_api/mcp/"

    async def four():
        async def one(_):
            return await _with_session(url, lambda s: s.call_tool(
                "generate_images", dict(FAST, prompt="a red circle", num_inference_steps=4)), path=alias)
        return await asyncio.gather(*(one(i) for i in range(4)))

    with hook:
        results = asyncio.run(four())
    assert sum(not r.isError for r in results) == 1, [text_of(r) for r in results]
    assert all(text_of(r).startswith("busy: your address already has 1") for r in results if r.isError)
    for tool in ("stop", "generate"):  # public endpoints, not tools
        refused = call(url, tool, {}, path=alias)
        assert refused.isError and text_of(refused).startswith(f"unknown tool '{tool}'"), text_of(refused)
    bad = call(url, "generate_images", dict(FAST, prompt="a red circle", num_images="many"), path=alias)
    assert bad.isError and text_of(bad).startswith('num_images: must be a whole number'), text_of(bad)


def test_the_limit_counts_the_callers_real_address_not_the_loopback(launch_app):
    """Through a trusted proxy (X-Forwarded-For from loopback, uvicorn's default): the run is held by
    10.0.0.1, not by 127.0.0.1, so 10.0.0.2 is served beside it and 10.0.0.1 again is refused."""

    app, url = launch_app("--no-warmup", "--max-per-ip", "1")
    _, hook = slow_steps(app, 0.3)
    outcome = {}

    def first():
        outcome["first"] = call(url, "generate_images", dict(FAST, prompt="a red circle", num_inference_steps=8, num_images=2),
                                headers={"X-Forwarded-For": "10.0.0.1"})

    with hook:
        thread = threading.Thread(target=first)
        thread.start()
        wait_until(lambda: any(run.running for run in app.ui.runs), 60)
        hosts = {run.client_host for run in app.ui.runs}
        assert hosts == {"10.0.0.1"}, hosts
        again = call(url, "generate_images", dict(FAST, prompt="a blue square"), headers={"X-Forwarded-For": "10.0.0.1"})
        other = call(url, "generate_images", dict(FAST, prompt="a blue square"), headers={"X-Forwarded-For": "10.0.0.2"})
        thread.join(120)
    assert not other.isError, text_of(other)
    assert again.isError and text_of(again).startswith("busy: your address already has 1"), text_of(again)
    assert not outcome["first"].isError, text_of(outcome["first"])


def test_stop_of_another_sessions_run_is_refused(launch_app):
    app, url = launch_app("--no-warmup", "--max-per-session", "2")
    steps, hook = slow_steps(app, 0.1)
    owner = Client(url, verbose=False)
    with hook, httpx.Client(base_url=url) as stranger:
        job = owner.submit(**request_fields(seed=5, num_images=3, num_inference_steps=4, **GOOD), api_name="/generate")
        wait_until(lambda: len(steps) >= 2, 60)
        # the owner's session hash (as if it leaked), without the owner's secret: Stop reaches nothing
        answer = stranger.post("/gradio_api/run/stop", json={"data": [], "session_hash": owner.session_hash})
        assert answer.status_code == 200
        forged = stranger.post("/gradio_api/run/stop", json={"data": [], "session_hash": owner.session_hash},
                               headers={"x-tpu-demo-mcp-call": "a" * 32, "cookie": "tpu_demo_owner=" + "b" * 32})
        assert forged.status_code == 200
        wait_until(job.done, 120)
        final, _ = job.outputs()[-1]
        assert len(final) == 3  # the run finished every image
        assert np.array_equal(pixels(final[0]), reference(app, seed=5, num_inference_steps=4))
        # the owner's own Stop still works
        before = len(steps)
        job = owner.submit(**request_fields(seed=6, num_images=3, num_inference_steps=4, **GOOD), api_name="/generate")
        wait_until(lambda: len(steps) >= before + 2, 60)
        owner.predict(api_name="/stop")
        wait_until(job.done, 60)
        assert stopped_early(job, 3) < 3


def test_an_mcp_run_is_not_stopped_by_a_stranger_but_by_its_client_going_away(launch_app, request_log):
    app, url = launch_app("--no-warmup")
    steps, hook = slow_steps(app, 0.2)
    results = {}

    def run(name, arguments):
        results[name] = call(url, "generate_images", arguments)

    with hook:
        thread = threading.Thread(target=run, args=("kept", dict(FAST, prompt="a red circle", num_images=2)))
        thread.start()
        wait_until(lambda: len(steps) >= 1, 60)
        # a stranger's Stop, with a session and an owner cookie of its own: an MCP call is nobody's session
        stranger = httpx.Client(base_url=url)
        stranger.get("config")  # the server issues its owner cookie
        stranger.post("gradio_api/run/stop", json={"data": [], "session_hash": "mcp"})
        thread.join(120)
        assert not results["kept"].isError and len(png_urls(text_of(results["kept"]))) == 2

        async def cancelled(session):  # the client gives up mid-run: its connection closes
            with pytest.raises(TimeoutError):
                await asyncio.wait_for(session.call_tool("generate_images", dict(
                    FAST, prompt="a blue square", num_images=4, num_inference_steps=8)), timeout=3)

        before = len(steps)
        asyncio.run(_with_session(url, cancelled))
        wait_until(lambda: any(line.get("outcome") == "stopped" for line in request_log()), 60)
    stopped = [line for line in request_log() if line.get("outcome") == "stopped"]
    assert stopped[-1]["images_done"] < 4 and len(steps) - before < 32


def test_argument_problem_names_the_argument_a_schema_refuses():
    """The guard's check on its own, on a schema of the shapes Gradio writes (``int | None`` as oneOf)."""
    from tpu_demo.web.guard import argument_problem

    schema = {"type": "object", "required": ["prompt"],
              "properties": {"prompt": {"type": "string"}, "seed": {"type": "integer"},
                             "style_scale": {"oneOf": [{"type": "null"}, {"type": "number"}]},
                             "flag": {"type": "boolean"}}}
    assert argument_problem(schema, {"prompt": "a red circle", "seed": 3, "style_scale": None}) is None
    assert argument_problem(schema, {"prompt": "a", "style_scale": 0.5, "seed": 2.0}) is None  # 2.0 is whole
    assert argument_problem(schema, {"seed": 1}) == "prompt: required"
    assert argument_problem(schema, {"prompt": "a", "style_scale": "big"}) == \
        'style_scale: must be a number (or left out), got "big"'
    assert argument_problem(schema, {"prompt": "a", "flag": "yes"}) == 'flag: must be true or false, got "yes"'
    assert argument_problem(schema, {"prompt": "a", "seed": True}) == "seed: must be a whole number, got true"
    assert argument_problem(schema, ["a"]) == "arguments: must be an object of named arguments"
    # the first refused argument in name order, whatever order they came in
    assert argument_problem(schema, {"seed": "x", "prompt": 1}).startswith("prompt: must be text")


def _rpc(url: str, message: dict, timeout: float = 120) -> httpx.Response:
    """One raw JSON-RPC POST to the MCP endpoint (stateless streamable HTTP: no initialize needed)."""
    return httpx.post(url + "gradio_api/mcp/", json=message, timeout=timeout,
                      headers={"accept": "application/json, text/event-stream"})


def test_notifications_cancelled_stops_only_the_call_it_names(launch_app, request_log):
    """MCP's cancel (a separate POST, ``notifications/cancelled`` with the call's JSON-RPC id, as the
    TypeScript SDK sends on abort) stops that call's run at its next step; a cancel naming another id
    stops nothing. Raw HTTP, as a client that keeps its connection open would send it."""
    app, url = launch_app("--no-warmup")
    steps, hook = slow_steps(app, 0.2)
    answers = {}

    def run():
        answers["call"] = _rpc(url, {"jsonrpc": "2.0", "id": 41, "method": "tools/call", "params": {
            "name": "generate_images", "arguments": dict(FAST, prompt="a red circle", num_images=4,
                                                         num_inference_steps=8)}})

    with hook:
        thread = threading.Thread(target=run)
        thread.start()
        assert wait_until(lambda: len(steps) >= 2, 60)
        other = _rpc(url, {"jsonrpc": "2.0", "method": "notifications/cancelled", "params": {"requestId": 42}})
        assert other.status_code == 202
        at_wrong_cancel = len(steps)
        assert wait_until(lambda: len(steps) >= at_wrong_cancel + 3, 60), "a cancel of another id stopped the run"
        mine = _rpc(url, {"jsonrpc": "2.0", "method": "notifications/cancelled",
                          "params": {"requestId": 41, "reason": "user aborted"}})
        assert mine.status_code == 202
        thread.join(120)
    assert not thread.is_alive()
    assert wait_until(lambda: any(line.get("outcome") == "stopped" for line in request_log()), 30)
    [stopped] = [line for line in request_log() if line.get("outcome") == "stopped"]
    assert stopped["images_done"] < 4 and len(steps) < 32
    assert "Stopped" in answers["call"].text  # the tool's answer says so (an error naming how far it got)


def test_a_cancel_is_tied_to_one_running_call_of_that_address_or_to_none():
    """The run registry behind ``notifications/cancelled``: the id names a call only at the address that
    runs it; two calls of one address with the same id (two clients behind one NAT, each counting from
    1) make the cancel ambiguous, so it stops neither; when one ends, the other is named again."""
    import json

    from tpu_demo.web.runs import Runs

    runs = Runs()

    def call(host: str) -> object:
        run = runs.admit(None, None, host)
        run.mcp_call = (host, json.dumps(1))
        return run

    a = call("10.0.0.1")
    assert not runs.stop_mcp_call("10.0.0.2", json.dumps(1)) and not runs.stop_mcp_call("10.0.0.1", json.dumps(2))
    assert not runs.stop_mcp_call("10.0.0.1", json.dumps("1"))  # JSON-RPC ids keep their type
    assert not a.stop_flag.is_set()
    b = call("10.0.0.1")
    assert not runs.stop_mcp_call("10.0.0.1", json.dumps(1)) and not a.stop_flag.is_set() and not b.stop_flag.is_set()
    runs.drop_unclaimed(a.ticket)
    assert runs.stop_mcp_call("10.0.0.1", json.dumps(1)) and b.stop_flag.is_set()


def test_generate_takes_upsample_prompt_and_says_what_each_image_was_drawn_as(launch_app):
    """The prompt upsampler through the official client: on (tiny-shapes' default), each image's line
    says what it was drawn as, its PNG keeps the typed and the drawn prompt, its link carries upsample=1;
    off, the prompt is drawn as typed."""
    app, url = launch_app("--no-warmup")
    shapes = dict(prompt="a yellow triangle", model="tiny-shapes", mode="eager", resolution="64x64",
                  num_inference_steps=4, guidance_scale=3.0, seed=11, num_images=2)
    text = text_of(result := call(url, "generate_images", shapes))
    assert not result.isError, text
    drawn = [line.split("drawn as: ", 1)[1] for line in text.splitlines() if "drawn as: " in line]
    assert len(drawn) == 2 and drawn[0] != drawn[1] and all("yellow triangle" in d for d in drawn), text
    assert text.count("upsample=1&seed=") == 2
    with Image.open(io.BytesIO(httpx.get(png_urls(text)[1]).content)) as image:
        settings = json.loads(image.text[pngmeta.JSON_KEY])
    assert settings["prompt"] == "a yellow triangle" and settings["upsample_prompt"] is True
    assert settings["drawn_prompt"] == drawn[1].split(" ([")[0].replace("[", "").replace("]", "")
    plain = text_of(call(url, "generate_images", dict(shapes, upsample_prompt=False)))
    assert "drawn as" not in plain and "upsample=" not in plain, plain
