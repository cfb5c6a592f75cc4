# syntax=docker/dockerfile:1
# llmsim, a vLLM-compatible inference simulator, as a small non-root image.
#
#   docker build -t llmsim .                          # or --build-arg EXTRAS=bench
#   docker run --rm -p 8000:8000 llmsim --model my-model --workers 2
#
# The entrypoint is `llmsim serve --host 0.0.0.0`: arguments after the image name are
# more `llmsim serve` flags.  Set the port with LLMSIM_PORT (the health check reads it
# too), not with --port.  docs/scaling.md has the Kubernetes side (deploy/, helm/).
ARG PYTHON_VERSION=3.12

FROM python:${PYTHON_VERSION}-slim AS build
# Extras of pyproject.toml to install beside llmsim, comma-separated; none by default.
ARG EXTRAS=""
WORKDIR /src
# gcc for llmsim._speedups, the compiled per-token path (setup.py, native/); the
# final stage takes only the built venv.
# hadolint ignore=DL3008
RUN apt-get update \
    && apt-get install --yes --no-install-recommends gcc libc6-dev \
    && rm -rf /var/lib/apt/lists/*
COPY pyproject.toml setup.py README.md ./
COPY native ./native
COPY llmsim ./llmsim
RUN python -m venv /opt/llmsim \
    && /opt/llmsim/bin/pip install --no-cache-dir --no-compile ".${EXTRAS:+[$EXTRAS]}" \
    && /opt/llmsim/bin/python -m pip uninstall --yes --quiet pip

FROM python:${PYTHON_VERSION}-slim
LABEL org.opencontainers.image.title="llmsim" \
      org.opencontainers.image.description="A vLLM-compatible LLM inference simulator" \
      org.opencontainers.image.licenses="Apache-2.0"
RUN groupadd --system --gid 10001 llmsim \
    && useradd --system --uid 10001 --gid llmsim --no-create-home --home-dir /nonexistent \
       --shell /usr/sbin/nologin llmsim
COPY --from=build /opt/llmsim /opt/llmsim
ENV PATH=/opt/llmsim/bin:$PATH \
    PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    LLMSIM_PORT=8000
USER 10001:10001
EXPOSE 8000
HEALTHCHECK --interval=10s --timeout=3s --start-period=15s --retries=3 \
    CMD ["python", "-c", "import os, urllib.request; urllib.request.urlopen('http://127.0.0.1:%s/health' % os.environ.get('LLMSIM_PORT', '8000'), timeout=2)"]
ENTRYPOINT ["llmsim", "serve", "--host", "0.0.0.0"]
