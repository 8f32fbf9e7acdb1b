"""Keep the app off the network: set before gradio or huggingface_hub are imported.

Gradio's analytics/version check and the hub's telemetry would otherwise contact external
hosts at start-up; downloads at run time would stall a request for minutes, so real weights
come from the local hub cache (``hf download`` beforehand: ``ModelSpec.download_command``). An operator can still
override any of these in the environment.
"""

import os
import warnings

OFFLINE_DEFAULTS = {
    "GRADIO_ANALYTICS_ENABLED": "False",
    "HF_HUB_DISABLE_TELEMETRY": "1",
    "HF_HUB_OFFLINE": "1",
    "TRANSFORMERS_OFFLINE": "1",
    "DO_NOT_TRACK": "1",
    "DISABLE_TELEMETRY": "1",
    "TRANSFORMERS_NO_ADVISORY_WARNINGS": "1",
}


def apply_offline_defaults() -> None:
    for name, value in OFFLINE_DEFAULTS.items():
        os.environ.setdefault(name, value)
    # torch-tpu warns at import when tcmalloc is not preloaded; on hosts without chips it is noise
    warnings.filterwarnings("ignore", message=".*TorchTpu/Performance/TcMalloc.*")
