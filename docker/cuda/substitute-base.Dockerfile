# A stand-in for docker/cuda's base image (pytorch/pytorch:2.11.0-cuda13.0-cudnn9-devel) where
# no registry is reachable: Debian + Python 3.11 + PyPI's torch 2.11.0 (the CUDA 13.0 build,
# with its nvidia-* library wheels and triton 3.6.0) + the CUDA 13.0 compiler, headers and
# runtime from PyPI's nvidia-cuda-* wheels, laid out as /usr/local/cuda like the devel image
# (bin/nvcc, include, lib64, lib64/stubs/libcuda.so). With it, everything after docker/cuda's
# FROM runs for real, the FlagCX USE_NVIDIA=1 build included; it cannot run a GPU here.
#   docker build -f docker/cuda/substitute-base.Dockerfile -t local/pytorch:2.11.0-cuda13.0-devel .
#   docker build -f docker/cuda/Dockerfile --build-arg BASE_IMAGE=local/pytorch:2.11.0-cuda13.0-devel ...
# (docs/deployment.md, "The CUDA image, built here once").
ARG BASE_IMAGE=debian:12.11-slim
FROM ${BASE_IMAGE}

ARG PIP_INDEX_URL
ARG PIP_EXTRA_INDEX_URL
ARG PIP_FIND_LINKS
ARG PIP_TRUSTED_HOST

SHELL ["/bin/bash", "-o", "pipefail", "-c"]
ENV DEBIAN_FRONTEND=noninteractive \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PATH=/opt/conda/bin:${PATH}

COPY docker/ca-certificates/ /usr/local/share/ca-certificates/sglang-fl/
# Python where the PyTorch images keep it (/opt/conda/bin, first on PATH); gcc for the stub.
# hadolint ignore=DL3008
RUN apt-get update \
    && apt-get install -y --no-install-recommends ca-certificates python3 python3-venv gcc libc6-dev \
    && update-ca-certificates \
    && rm -rf /var/lib/apt/lists/* \
    && python3 -m venv /opt/conda

# torch 2.11.0 from PyPI is the CUDA 13.0 build; the toolkit pieces match its cuda-toolkit 13.0.2.
RUN PIP_CERT=/etc/ssl/certs/ca-certificates.crt pip install --no-cache-dir torch==2.11.0 \
        "nvidia-cuda-nvcc==13.0.88.*" "nvidia-cuda-crt==13.0.88.*" "nvidia-nvvm==13.0.88.*" \
        "nvidia-cuda-cccl==13.0.85.*" "nvidia-cuda-runtime==13.0.96.*"

# /usr/local/cuda as in the devel image. libcuda.so is a driver library: like the toolkit's
# stub, an empty one with the driver's soname satisfies -lcuda at link time.
RUN cu=$(python -c 'import nvidia, os; print(os.path.join(list(nvidia.__path__)[0], "cu13"))') \
    && ln -s lib "${cu}/lib64" \
    && ln -s libcudart.so.13 "${cu}/lib/libcudart.so" \
    && mkdir -p "${cu}/lib/stubs" "${cu}/targets/x86_64-linux" \
    && ln -s ../../include "${cu}/targets/x86_64-linux/include" \
    && ln -s ../../lib "${cu}/targets/x86_64-linux/lib" \
    && echo 'void sglang_fl_libcuda_stub(void) {}' > /tmp/stub.c \
    && gcc -shared -fPIC -Wl,-soname,libcuda.so.1 -o "${cu}/lib/stubs/libcuda.so" /tmp/stub.c \
    && rm /tmp/stub.c \
    && ln -s "${cu}" /usr/local/cuda \
    && /usr/local/cuda/bin/nvcc --version
