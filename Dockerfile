# The turboinfer server image: `turboinfer serve` over a model repository, the Open
# Inference Protocol (KServe v2) on HTTP 8080 and gRPC 8081. The KServe ServingRuntime
# written by `turboinfer deploy kserve` runs this image.
#
#   docker build -t turboinfer:0.1.0 .
#   docker run -p 8080:8080 -v "$PWD/repo:/models:ro" turboinfer:0.1.0
FROM python:3.11-slim

ENV PIP_NO_CACHE_DIR=1 PYTHONUNBUFFERED=1
WORKDIR /opt/turboinfer
COPY pyproject.toml README.md ./
COPY src ./src
# The CPU build of torch first, so that the project's `torch>=2.1` never pulls a CUDA one.
RUN pip install torch==2.13.0 --index-url https://download.pytorch.org/whl/cpu \
    && pip install . \
    && useradd --uid 1000 --create-home turboinfer
USER 1000
EXPOSE 8080 8081
ENTRYPOINT ["turboinfer", "serve"]
CMD ["/models", "--host", "0.0.0.0", "--http-port", "8080", "--grpc-port", "8081", "--model-control", "none"]
