"""The engine on real tiny diffusers pipelines: sizes, determinism, compile-once per bucket."""

import numpy as np

from tpu_demo.core.buckets import Bucket
from tpu_demo.core.events import BucketState
from tpu_demo.core.modes import ExecutionMode
from tpu_demo.core.events import ShapeKey

from conftest import engine_images


def test_returns_n_images_of_the_bucket_size_seeded_seed_plus_i(make_engine):
    engine = make_engine()
    results = engine_images(engine, resolution="96x64", num_images=3, seed=10)
    assert [r.image.size for r in results] == [(96, 64)] * 3
    assert [r.seed for r in results] == [10, 11, 12]
    assert [r.index for r in results] == [0, 1, 2]
    pixels = [np.asarray(r.image) for r in results]
    assert not np.array_equal(pixels[0], pixels[1])  # different seeds draw different images


def test_same_seed_same_pixels(make_engine):
    engine = make_engine()
    first = engine_images(engine, seed=42)[0].image
    again = engine_images(engine, seed=42)[0].image
    other = engine_images(engine, seed=43)[0].image
    assert np.array_equal(np.asarray(first), np.asarray(again))
    assert not np.array_equal(np.asarray(first), np.asarray(other))


def test_compiled_mode_compiles_each_bucket_once_then_never(make_engine):
    engine = make_engine(bucket_overrides={"tiny-flux": (Bucket(64, 64), Bucket(128, 128))})
    warm = engine.warmup("tiny-flux", ExecutionMode.COMPILED)
    assert [s.state for s in warm] == [BucketState.WARM, BucketState.WARM]
    assert [s.compiles for s in warm] == [1, 1]  # one graph per static shape
    after_warmup = engine.counter.count
    for fields in (dict(resolution="64x64"), dict(resolution="64x64", num_inference_steps=5),
                   dict(resolution="128x128", seed=99), dict(resolution="128x128", prompt="another prompt"),
                   dict(resolution="64x64", num_images=2, seed=3)):
        results = engine_images(engine, mode="compiled", **fields)
        assert all(r.warm and r.timings["compiles"] == 0 for r in results)
    assert engine.counter.count == after_warmup


def test_cold_bucket_compiles_once_on_first_request(make_engine):
    engine = make_engine()
    first = engine_images(engine, mode="compiled", resolution="128x128")[0]
    assert not first.warm and first.timings["compiles"] == 1
    second = engine_images(engine, mode="compiled", resolution="128x128", seed=5)[0]
    assert second.warm and second.timings["compiles"] == 0
    status = engine.bucket_status(ShapeKey("tiny-flux", ExecutionMode.COMPILED.value, "128x128"))
    assert status.state is BucketState.WARM and status.compiles == 1 and status.compile_seconds > 0


def test_eager_and_compiled_agree(make_engine):
    engine = make_engine()
    eager = np.asarray(engine_images(engine, mode="eager", seed=3)[0].image, dtype=float)
    compiled = np.asarray(engine_images(engine, mode="compiled", seed=3)[0].image, dtype=float)
    assert np.abs(eager - compiled).max() <= 2  # same graph, up to float rounding in uint8


def test_recompile_limit_covers_the_buckets(make_engine):
    import torch

    engine = make_engine()
    buckets = sum(len(spec.buckets) for spec in engine.specs.values())
    assert torch._dynamo.config.recompile_limit >= 2 * buckets
    # dynamo's config is per thread: the device thread, which compiles, must see it too
    assert engine.submit(lambda: torch._dynamo.config.recompile_limit).result() >= 2 * buckets


def test_buckets_start_cold_and_show_compile_results(make_engine):
    engine = make_engine(bucket_overrides={"tiny-flux": (Bucket(64, 64), Bucket(128, 128))})
    assert [s.state for s in engine.buckets_for("tiny-flux", ExecutionMode.COMPILED)] == [BucketState.COLD] * 2
    engine.warmup("tiny-flux", ExecutionMode.COMPILED, (Bucket(64, 64),))
    first, second = engine.buckets_for("tiny-flux", ExecutionMode.COMPILED)
    assert (first.resolution, first.state, first.compiles) == ("64x64", BucketState.WARM, 1)
    assert first.compile_seconds > 0
    assert (second.resolution, second.state) == ("128x128", BucketState.COLD)
