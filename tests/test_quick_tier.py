"""The quick tier covers every layer of tpu_demo, and each of its entries names a real test."""

import ast
from pathlib import Path

from quick_tier import QUICK_TIER, selects

TESTS = Path(__file__).resolve().parent
PACKAGE = TESTS.parent / "tpu_demo"


def test_every_layer_of_the_package_has_quick_tests():
    layers = {path.stem for path in PACKAGE.iterdir()
              if (path.is_dir() and (path / "__init__.py").is_file()) or path.name == "device.py"}
    assert layers == {"core", "device", "distributed", "engine", "launch", "models", "web"}
    assert layers | {"architecture"} <= {layer for layer, entries in QUICK_TIER.items() if entries}


def test_every_entry_names_a_test_that_exists():
    missing = []
    for entries in QUICK_TIER.values():
        for entry in entries:
            file, _, name = entry.partition("::")
            path = TESTS / file
            if not path.is_file():
                missing.append(entry)
                continue
            defined = {node.name for node in ast.walk(ast.parse(path.read_text(encoding="utf-8")))
                       if isinstance(node, ast.FunctionDef) and node.name.startswith("test_")}
            if name and name not in defined:
                missing.append(entry)
    assert missing == []


def test_a_real_app_start_with_a_generation_is_in_the_tier():
    assert selects("tests/test_app.py::test_generate_streams_one_gallery_update_per_image")
    assert selects("tests/test_buckets_and_config.py::test_bad_buckets_are_refused[64x]")
    assert not selects("tests/test_app.py::test_generate_streams_one_gallery_update_per_image_twice")
