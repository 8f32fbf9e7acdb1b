"""The layering README and docs/architecture.md promise, checked on the source and on real imports.

Layers, lowest first: ``core`` (plain data) -> ``device`` -> ``models`` -> ``distributed`` -> ``engine``;
``web`` (Gradio) sits beside the engine and talks to it through ``core`` types only; ``launch``
wires everything. Imports only go down, there is no cycle (function-level and type-checking imports
included),
only ``device.py`` touches torch-tpu, the runtime never imports the training package, and no module
is past the point where it surely does several jobs (600 lines; files are split by job, never to meet a
line count: docs/architecture.md).
"""

from __future__ import annotations

import ast
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PACKAGE = ROOT / "tpu_demo"

#: what each layer may import from the package (itself included)
ALLOWED = {
    "offline": {"offline"},
    "host": {"host"},
    "__init__": {"offline"},
    "core": {"core"},
    "device": {"core", "host"},
    "models": {"core", "device", "host", "models"},
    "distributed": {"core", "device", "host", "models", "distributed"},
    "engine": {"core", "device", "host", "models", "distributed", "engine"},
    "web": {"core", "web"},
    "launch": {"core", "device", "host", "models", "distributed", "engine", "web", "launch", "offline"},
}


def _module_name(path: Path) -> str:
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _layer(module: str) -> str:
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else "__init__"


def _imports(path: Path) -> list[str]:
    """Every module the file imports, at any depth (in functions, under ``if TYPE_CHECKING:``)."""
    found = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            found += [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found.append(node.module)
            found += [f"{node.module}.{alias.name}" for alias in node.names]
    return found


def _graph() -> dict[str, set[str]]:
    """Module -> the package modules it imports; an import made only for type checking is an edge too
    (a name a module needs, even for a hint, is a dependency a reader must follow)."""
    modules = {_module_name(path): path for path in PACKAGE.rglob("*.py")}
    return {module: {name for name in _imports(path) if name in modules} for module, path in modules.items()}


def test_no_relative_imports():
    """Absolute imports name the layer they come from."""
    relative = [str(path.relative_to(ROOT)) for path in PACKAGE.rglob("*.py")
                if any(isinstance(n, ast.ImportFrom) and n.level for n in ast.walk(ast.parse(path.read_text())))]
    assert relative == []


def test_import_graph_has_no_cycle():
    graph = _graph()
    state: dict[str, int] = {}
    cycles: list[list[str]] = []

    def visit(module: str, trail: list[str]) -> None:
        state[module] = 1
        for target in sorted(graph[module]):
            if state.get(target) == 1:
                cycles.append(trail[trail.index(target):] + [target] if target in trail else [module, target])
            elif target not in state:
                visit(target, trail + [target])
        state[module] = 2

    for module in sorted(graph):
        if module not in state:
            visit(module, [module])
    assert cycles == []


def test_imports_only_go_down():
    graph = _graph()
    upward = [f"{module} -> {target}" for module, targets in graph.items() for target in targets
              if _layer(target) not in ALLOWED[_layer(module)]]
    assert upward == []


def test_no_helper_of_the_engine_imports_the_engine():
    """Engine helpers are handed the collaborators they use (docs/architecture.md), never ``Engine``."""
    graph = _graph()
    users = sorted(module for module, targets in graph.items()
                   if module.startswith("tpu_demo.engine.") and "tpu_demo.engine.engine" in targets)
    assert users == []


@pytest.mark.parametrize("module", sorted(_graph()))
def test_every_module_belongs_to_a_layer(module):
    assert _layer(module) in ALLOWED


def test_only_device_module_touches_torch_tpu():
    touching = []
    for path in PACKAGE.rglob("*.py"):
        tree = ast.parse(path.read_text(encoding="utf-8"))
        names = set(_imports(path))
        uses_torch_tpu = any(isinstance(n, ast.Attribute) and ast.unparse(n).startswith("torch.tpu") for n in ast.walk(tree))
        if any(name.startswith("torch_tpu") for name in names) or uses_torch_tpu:
            touching.append(_module_name(path))
    assert touching == ["tpu_demo.device"]


def _top_level_names(path: Path) -> set[str]:
    names: set[str] = set()
    for node in ast.parse(path.read_text(encoding="utf-8")).body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.add(node.name)
        elif isinstance(node, (ast.Assign, ast.AnnAssign)):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            names |= {n.id for target in targets for n in ast.walk(target) if isinstance(n, ast.Name)}
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            names |= {(alias.asname or alias.name).split(".")[0] for alias in node.names}
    return names


def test_every_name_the_scripts_benchmarks_and_tests_import_from_the_package_exists():
    """A script run by hand (pick_examples, train_*) is not started by any test: its imports are checked here."""
    users = [*ROOT.glob("scripts/*.py"), *ROOT.glob("benchmarks/*.py"), *ROOT.glob("tests/*.py"),
             *ROOT.glob("tiny_shapes/*.py")]
    missing = []
    for user in users:
        for node in ast.walk(ast.parse(user.read_text(encoding="utf-8"))):
            if not (isinstance(node, ast.ImportFrom) and node.level == 0 and node.module
                    and node.module.split(".")[0] in ("tpu_demo", "tiny_shapes", "benchmarks")):
                continue
            base = ROOT.joinpath(*node.module.split("."))
            source = base / "__init__.py" if base.is_dir() else base.with_suffix(".py")
            defined = _top_level_names(source) if source.is_file() else set()
            missing += [f"{user.relative_to(ROOT)}: {node.module}.{alias.name}" for alias in node.names
                        if alias.name not in defined and not (base / alias.name).exists()
                        and not (base / f"{alias.name}.py").exists()]
    assert missing == []


def test_runtime_never_imports_the_training_package():
    users = [_module_name(p) for p in PACKAGE.rglob("*.py") if any(n.startswith("tiny_shapes") for n in _imports(p))]
    assert users == []


def _modules_after_import(module: str) -> set[str]:
    code = f"import sys, {module}; print(' '.join(sys.modules))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=True,
                         cwd=ROOT)
    return set(out.stdout.split())


def test_web_layer_imports_no_torch():
    modules = _modules_after_import("tpu_demo.web.page, tpu_demo.web.handlers, tpu_demo.web.health")
    assert "gradio" in modules and "torch" not in modules


def test_engine_imports_no_gradio():
    modules = _modules_after_import("tpu_demo.engine.engine")
    assert "torch" in modules and "gradio" not in modules


def test_compile_cache_is_importable_before_torch():
    """app.py points the compile caches at their directory, and reads the PCI bus, before torch (and
    torch-tpu) initialise."""
    modules = _modules_after_import("tpu_demo.engine.compile_cache, tpu_demo.launch.config, tpu_demo.host")
    assert "torch" not in modules


#: lines past which a module under tpu_demo/ surely does more than one job (split it by job). A ceiling,
#: not a target: a module is as long as its one job (docs/architecture.md gives ~350 as advice)
MAX_MODULE_LINES = 600


def test_every_module_fits_its_job():
    """No module under tpu_demo/ is over MAX_MODULE_LINES lines."""
    long = {str(path.relative_to(ROOT)): lines for path in PACKAGE.rglob("*.py")
            if (lines := len(path.read_text(encoding="utf-8").splitlines())) > MAX_MODULE_LINES}
    assert long == {}


#: README.md is the newcomer's page: the detail lives in docs/
MAX_README_LINES = 160


def test_readme_is_short_and_gives_the_two_set_up_commands_first():
    """README.md fits MAX_README_LINES and its first two code blocks are the two set-up commands."""
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    assert len(readme.splitlines()) <= MAX_README_LINES
    blocks = re.findall(r"```(?:bash)?\n(.*?)```", readme, flags=re.S)
    assert [b.strip() for b in blocks[:2]] == ["pip install -r requirements.txt && python app.py", "bash scripts/test.sh"]
