"""Entry point: `python app.py [--port 7860] [--model tiny-flux] ...`; see `python app.py --help`."""

from tpu_demo.serve import main

if __name__ == "__main__":
    main()
