# specscribe web UI image: `docker build -t specscribe .`, then
# `docker run --rm -p 7860:7860 specscribe` and open http://localhost:7860.
#
# CPU by default. For NVIDIA GPUs, build on a CUDA image (Ubuntu 22.04, whose apt has Python
# 3.11) with PyTorch's CUDA wheels, and run with `--gpus all -e SPECSCRIBE_DEVICE=cuda`:
#   docker build -t specscribe:cuda \
#     --build-arg BASE_IMAGE=nvidia/cuda:12.8.1-cudnn-runtime-ubuntu22.04 \
#     --build-arg TORCH_INDEX_URL=https://download.pytorch.org/whl/cu128 .
ARG BASE_IMAGE=python:3.11-slim-bookworm
FROM ${BASE_IMAGE}

# An extra package index for torch: PyPI's Linux torch wheel is the multi-GB CUDA build.
ARG TORCH_INDEX_URL=https://download.pytorch.org/whl/cpu
# The embedded models baked into the image (`specscribe models list` names them all).
ARG MODELS="whisper-base whisper-tiny.en pyannote-segmentation-3.0 campplus-sv-zh-en"

ENV DEBIAN_FRONTEND=noninteractive \
    PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    SPECSCRIBE_CACHE_DIR=/opt/specscribe/cache \
    PATH=/opt/specscribe/venv/bin:$PATH

# 1. System packages: ffmpeg decodes every audio container (and torchcodec links to it). A CUDA
#    base image has no Python 3.11 of its own, so it gets one from apt.
RUN apt-get update \
    && apt-get install -y --no-install-recommends ffmpeg ca-certificates \
    && if ! command -v python3.11 >/dev/null; then \
         apt-get install -y --no-install-recommends python3.11 python3.11-venv; \
       fi \
    && rm -rf /var/lib/apt/lists/*

# 2. The project and its pinned dependencies, in a virtual environment.
WORKDIR /opt/specscribe/src
COPY pyproject.toml requirements.lock README.md ./
COPY app ./app
COPY asr ./asr
COPY diarize ./diarize
COPY decoding ./decoding
# torchaudio 2.11.0's compiled extension does not load with torch 2.13 (scripts/setup.sh step 4);
# without its .so files torchaudio falls back to pure Python, which is all pyannote.audio uses.
RUN python3.11 -m venv /opt/specscribe/venv \
    && pip install --extra-index-url "${TORCH_INDEX_URL}" -c requirements.lock . \
    && site=$(python -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])') \
    && rm -f "$site"/torchaudio/lib/*.so \
    && python -c 'import torchaudio, pyannote.audio, gradio'

# 3. Embedded models, fetched and converted at build time: the container needs no network.
RUN specscribe models pull ${MODELS}

# 4. Run as an unprivileged user; the model cache stays read-only to it.
RUN useradd --create-home --uid 1000 specscribe
USER specscribe
WORKDIR /home/specscribe

EXPOSE 7860
HEALTHCHECK --interval=30s --timeout=5s --start-period=120s \
    CMD python -c "import urllib.request; urllib.request.urlopen('http://127.0.0.1:7860/health', timeout=4)"
CMD ["specscribe", "serve", "--host", "0.0.0.0"]
