# DraftLab dashboard + local worker on a CUDA-capable base (CPU-only hosts run it too, on the CPU).
#   docker build -t draftlab .
#   docker run --gpus all -p 8501:8501 --env-file draftlab.env -v draftlab-data:/data draftlab
# where draftlab.env holds DRAFTLAB_PASSWORD=<a long shared password> (an env file keeps it out of your shell
# history). The container listens on 0.0.0.0, so `draftlab ui` refuses to start without a login:
#   - DRAFTLAB_PASSWORD: a password form in front of every page (compared in constant time, never printed); or
#   - Streamlit's OIDC login: mount a secrets.toml with an [auth] section (redirect_uri, cookie_secret, client_id,
#     client_secret, server_metadata_url) at /opt/draftlab/.streamlit/secrets.toml; it wins over the password.
# Only behind something that already authenticates (a VPN, an authenticating proxy) override the command with
#   docker run ... draftlab draftlab ui --host 0.0.0.0 --port 8501 --insecure
FROM pytorch/pytorch:2.7.1-cuda12.8-cudnn9-runtime

ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    DRAFTLAB_DB=sqlite:////data/draftlab.db \
    DRAFTLAB_UPLOAD_DIR=/data/uploads \
    HF_HOME=/data/huggingface

WORKDIR /opt/draftlab
COPY . .
# The base image's CUDA torch already satisfies the torch requirement, so pip keeps it. Authlib: st.login (OIDC).
RUN pip install ".[postgres]" "Authlib>=1.3.2"

VOLUME /data
EXPOSE 8501
# Refuses to start unless DRAFTLAB_PASSWORD is set or secrets.toml configures [auth] (see above).
CMD ["draftlab", "ui", "--host", "0.0.0.0", "--port", "8501"]
