# gpu-share agent image: gpu-share-plugin (node agent) and gpu-share (admin CLI).
#
#   hack/build-image.sh          (buildah, no Docker, no registry: docs/e2e.md)
#   docker build -t gpu-share:dev .
#
# BASE_IMAGE must be a Debian-style Python 3.11 image (python3.11 + pip on PATH, pip allowed
# to install system-wide); hack/build-image.sh passes one made locally with debootstrap.
ARG BASE_IMAGE=python:3.11-slim-bookworm
# HAMi-core's pinned source (third-party, Apache-2.0): a folder in the build context
# holding its tarball, SHA256SUMS and LICENSE. hack/build-image.sh stages
# ../shared/vendor/hami-core there; elsewhere pass your own pinned copy.
ARG HAMI_CORE_SOURCE=.build/hami-core

# ---- build: one wheel for gpu-share and wheels for all its dependencies.
FROM ${BASE_IMAGE} AS build
ENV PIP_DISABLE_PIP_VERSION_CHECK=1 PIP_NO_CACHE_DIR=1 PYTHONDONTWRITEBYTECODE=1
WORKDIR /src
COPY pyproject.toml README.md* ./
COPY src ./src
RUN pip wheel --wheel-dir /wheels .

# ---- hami-core: libvgpu.so compiled from the pinned source (cuda.h and nvml.h come from
# pinned PyPI wheels; no CUDA toolkit). The runtime image carries the library, its
# checksum, licence and version; the chart's installer puts it on hami-core nodes.
FROM ${BASE_IMAGE} AS hami-core
ARG HAMI_CORE_SOURCE
ENV PIP_DISABLE_PIP_VERSION_CHECK=1 PIP_NO_CACHE_DIR=1
RUN apt-get update -qq \
    && apt-get install -y -qq --no-install-recommends gcc libc6-dev >/dev/null \
    && rm -rf /var/lib/apt/lists/*
WORKDIR /hami
COPY ${HAMI_CORE_SOURCE}/ ./source/
COPY hack/build-enforcement.sh ./hack/build-enforcement.sh
COPY hack/lib/common.sh ./hack/lib/common.sh
RUN GPU_SHARE_CACHE=/hami/cache \
    GPU_SHARE_HAMI_CORE_TARBALL="$(ls /hami/source/*.tar.gz)" \
    bash hack/build-enforcement.sh --hami-core /hami/out

# ---- runtime: the wheels installed, nothing else (no compiler, no sources, no pip cache).
FROM ${BASE_IMAGE}
ARG VERSION=0.1.0
ARG REVISION=unknown
LABEL org.opencontainers.image.title="gpu-share" \
      org.opencontainers.image.description="Kubernetes device plugin sharing GPUs by memory units and core percent" \
      org.opencontainers.image.version="${VERSION}" \
      org.opencontainers.image.revision="${REVISION}" \
      org.opencontainers.image.licenses="Apache-2.0" \
      org.opencontainers.image.source="https://github.com/gpu-share/gpu-share"
ENV PIP_DISABLE_PIP_VERSION_CHECK=1 PIP_NO_CACHE_DIR=1 \
    PYTHONDONTWRITEBYTECODE=1 PYTHONUNBUFFERED=1
COPY --from=hami-core /hami/out/ /opt/gpu-share/hami-core/
COPY --from=build /wheels /tmp/wheels
RUN pip install --no-index --find-links /tmp/wheels gpu-share \
    && rm -rf /tmp/wheels \
    && useradd --system --uid 10001 --no-create-home --shell /usr/sbin/nologin gpu-share
# Non-root by default, so the admin CLI and the helm test pod run unprivileged. The agent
# itself needs uid 0 (the kubelet's device-plugin dir and kubelet.sock are root-only);
# the chart sets runAsUser: 0 for it, with every capability dropped.
USER 10001
ENTRYPOINT ["gpu-share-plugin"]
CMD ["--config", "/etc/gpu-share/config.yaml"]
