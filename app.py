"""Entry point: `python app.py [--port 7860] [--model tiny-flux] ...`; see `python app.py --help`."""

import os
import sys

from tpu_demo.engine.compile_cache import use_compile_cache
from tpu_demo.host import skip_torch_tpu_autoload_without_tpu
from tpu_demo.launch.config import parse_config

if __name__ == "__main__":
    config = parse_config(sys.argv[1:])
    if config.check:
        # the check reads the chips with the PCI scan; it must not start torch-tpu's runtime and hold them
        os.environ["TORCH_DEVICE_BACKEND_AUTOLOAD"] = "0"
        from tpu_demo.launch.check import main as check

        sys.exit(check(config))
    if config.chips and not config.tensor_parallel:
        # the launcher of one engine per chip: it must not import torch (torch-tpu would hold the chips)
        from tpu_demo.launch.fleet import main as serve_chips

        sys.exit(serve_chips(sys.argv[1:], config))
    # Before torch is imported: torch-tpu reads its persistent compile cache location once, at init,
    # and a host with no chip need not load it at all.
    use_compile_cache(config.resolved_cache_dir)
    skip_torch_tpu_autoload_without_tpu()
    from tpu_demo.launch.cli import main

    main()
