# qmdd, the qmd daemon, as a container image.
#
#   docker build -t qmd .
#   docker run -d --name qmd -p 127.0.0.1:8181:8181 \
#     -v qmd-data:/data -v "$HOME/notes:/notes:ro" qmd
#   docker exec qmd qmd collection add /notes --name notes
#
# The index, the config and the GGUF models live on the /data volume, so a new
# image keeps them. The builder stage compiles llama-cpp-python (a few minutes);
# the runtime stage has no compiler.

# BASE: a Python 3.11 Debian image. Where Docker Hub is out of reach, build one locally
# and pass it (`--build-arg BASE=localhost/debian-py311:bookworm`; deploy/check-image.sh).
ARG BASE=python:3.11-slim
FROM ${BASE} AS build
# Debian packages are not version-pinned (hadolint DL3008): the slim base image moves
# with Debian point releases, and a pin would break every build after one.
# hadolint ignore=DL3008
RUN apt-get update \
    && apt-get install -y --no-install-recommends build-essential cmake \
    && rm -rf /var/lib/apt/lists/*
WORKDIR /src
COPY pyproject.toml README.md ./
COPY qmd qmd
COPY server server
COPY client client
COPY mcp_bridge mcp_bridge
# GGML_NATIVE=OFF: without it llama.cpp compiles for the build machine's CPU
# (-march=native) and the image dies with SIGILL on an older host. LLAVA_BUILD=OFF skips
# the multimodal library (libmtmd), which qmd never loads: about a sixth of the compile.
# `[models]`: the image runs local models, so it gets llama-cpp-python.
# pip keeps its cache: this stage is thrown away, and a cache mounted at /root/.cache/pip
# (deploy/check-image.sh does) saves compiling llama.cpp again on every source change.
ENV CMAKE_ARGS="-DGGML_NATIVE=OFF -DLLAVA_BUILD=OFF"
# hadolint ignore=DL3042
RUN python3 -m venv /opt/qmd \
    && /opt/qmd/bin/pip install '.[models]'

FROM ${BASE}
# libgomp1: llama.cpp's OpenMP runtime, the one shared library the build links beyond libc;
# passwd: useradd, which a minimal Debian base lacks.
# hadolint ignore=DL3008
RUN apt-get update \
    && apt-get install -y --no-install-recommends libgomp1 passwd \
    && rm -rf /var/lib/apt/lists/* \
    && useradd --create-home --uid 10001 --user-group qmd \
    && mkdir -p /data/cache /data/config \
    && chown -R qmd:qmd /data
COPY --from=build /opt/qmd /opt/qmd
ENV PATH=/opt/qmd/bin:$PATH \
    XDG_CACHE_HOME=/data/cache \
    XDG_CONFIG_HOME=/data/config \
    PYTHONUNBUFFERED=1
VOLUME ["/data"]
# Numeric, so Kubernetes' runAsNonRoot can verify it without reading /etc/passwd.
USER 10001:10001
WORKDIR /home/qmd
EXPOSE 8181

# /health answers without a token and for any Host naming loopback, so this probe
# works whatever QMD_ALLOWED_HOSTS and QMD_TOKEN say. (No curl in slim images.)
HEALTHCHECK --interval=30s --timeout=5s --start-period=30s --retries=3 \
    CMD ["python", "-c", "import sys, urllib.request; sys.exit(urllib.request.urlopen('http://127.0.0.1:8181/health', timeout=4).status != 200)"]

# The same command the tests run (`qmdd` is qmd.server.daemon:main). Inside a container the
# daemon must listen on 0.0.0.0 to be reachable through the published port; that is a
# wildcard bind, so qmdd cannot know which Host names are legitimate and, unless told,
# does not check Host at all (it warns at start). Set QMD_ALLOWED_HOSTS to the names
# clients use to reach it, for example
#   docker run -e QMD_ALLOWED_HOSTS=localhost:8181,qmd.internal ...
# to keep DNS-rebinding protection on. Publish the port on 127.0.0.1 only, or set
# QMD_TOKEN (or /data/config/qmd/token, mode 600) when others can reach it.
CMD ["qmdd", "--host", "0.0.0.0", "--port", "8181"]
