# DraftLab dashboard + local worker on a CUDA-capable base (CPU-only hosts run it too, on the CPU).
#   docker build -t draftlab .
#   docker run --gpus all -p 8501:8501 -v draftlab-data:/data draftlab
FROM pytorch/pytorch:2.7.1-cuda12.8-cudnn9-runtime

ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    DRAFTLAB_DB=sqlite:////data/draftlab.db \
    DRAFTLAB_UPLOAD_DIR=/data/uploads \
    HF_HOME=/data/huggingface

WORKDIR /opt/draftlab
COPY . .
# The base image's CUDA torch already satisfies the torch requirement, so pip keeps it.
RUN pip install ".[postgres]"

VOLUME /data
EXPOSE 8501
CMD ["draftlab", "ui", "--host", "0.0.0.0", "--port", "8501"]
