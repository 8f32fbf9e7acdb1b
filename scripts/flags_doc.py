"""Write docs/flags.md from the flags themselves (``python app.py --help``); a test checks it is current.

    python scripts/flags_doc.py
"""

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from tpu_demo.launch.config import help_text  # noqa: E402

HEADER = """# Flags

For operators: every setting of the app. Each flag has an environment twin `TPU_DEMO_<NAME>`
(`--memory-budget` -> `TPU_DEMO_MEMORY_BUDGET`; switches take `1`/`true`/`yes`/`on` or `0`/`false`/`no`/`off`); the command line
wins. `--host` and `--port` also read Gradio's `GRADIO_SERVER_NAME` / `GRADIO_SERVER_PORT` (what
Hugging Face Spaces sets) after their twin: flag, then `TPU_DEMO_HOST`, then `GRADIO_SERVER_NAME`,
then the default. A bad value exits with status 2 and one line naming the flag. This page is generated from
the flags' single declaration (`AppConfig` in `tpu_demo/launch/config.py`) by
`python scripts/flags_doc.py`, and a test fails when it is out of date.

```text
"""


def render() -> str:
    return HEADER + help_text() + "```\n"


if __name__ == "__main__":
    (ROOT / "docs" / "flags.md").write_text(render(), encoding="utf-8")
