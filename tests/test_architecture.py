"""The layering the README promises: the UI never imports torch, the engine never imports Gradio."""

import subprocess
import sys


def _modules_after_import(module: str) -> set[str]:
    code = f"import sys, {module}; print(' '.join(sys.modules))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=True)
    return set(out.stdout.split())


def test_ui_layer_imports_no_torch():
    modules = _modules_after_import("tpu_demo.ui")
    assert "gradio" in modules and "torch" not in modules


def test_engine_imports_no_gradio():
    modules = _modules_after_import("tpu_demo.engine")
    assert "torch" in modules and "gradio" not in modules
