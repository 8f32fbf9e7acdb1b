# syntax=docker/dockerfile:1
# The app for one TPU host (or slice): python app.py, or scripts/serve_tp.sh N for tensor parallel.
# Slim, non-root, nothing secret inside: the Hugging Face cache (weights) and the compile cache are
# mounted volumes, and HF_TOKEN (only the step that downloads weights needs it) comes from a Secret.
# docs/scaling.md shows the Kubernetes side (deploy/k8s/); tests/test_deploy.py lints this file.
FROM python:3.11-slim-bookworm

ENV PYTHONUNBUFFERED=1 \
    PYTHONDONTWRITEBYTECODE=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    HOME=/home/app \
    HF_HOME=/data/hf \
    HF_HUB_OFFLINE=1 \
    GRADIO_ANALYTICS_ENABLED=False \
    TPU_DEMO_CACHE_DIR=/data/tpu-demo \
    TPU_DEMO_HOST=0.0.0.0 \
    TPU_DEMO_PORT=7860

RUN useradd --create-home --uid 10001 --home-dir /home/app app \
    && mkdir -p /data/hf /data/tpu-demo \
    && chown 10001:10001 /data/hf /data/tpu-demo

WORKDIR /app
# The CPU build of torch: a TPU host needs no CUDA libraries (torch-tpu brings the TPU runtime).
# For a CUDA image, drop the extra index.
COPY requirements.txt .
RUN pip install --no-cache-dir --extra-index-url https://download.pytorch.org/whl/cpu -r requirements.txt

COPY --chown=10001:10001 app.py pyproject.toml ./
COPY --chown=10001:10001 tpu_demo ./tpu_demo
COPY --chown=10001:10001 assets ./assets
COPY --chown=10001:10001 scripts/serve_tp.sh ./scripts/serve_tp.sh

USER 10001
VOLUME ["/data/hf", "/data/tpu-demo"]
EXPOSE 7860
# liveness only: /ready (503 until the start model's buckets are warm) is for the balancer
HEALTHCHECK --interval=30s --timeout=5s --start-period=120s \
    CMD ["python", "-c", "import urllib.request; urllib.request.urlopen('http://127.0.0.1:7860/health', timeout=4)"]
ENTRYPOINT ["python", "app.py"]
