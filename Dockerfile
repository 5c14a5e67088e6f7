# dmq broker image: `docker build -t dmq .` then `docker run -p 8080:8080 dmq`.
# For a 3-node cluster see docker-compose.yml.
#
# The base tag is pinned to a patch release and a Debian release so that a rebuild does not
# silently move to another Python or libc; bump it on purpose.
FROM python:3.11.13-slim-bookworm

# No .pyc files in the image layers, unbuffered logs, no pip cache or version check.
ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1

# A fixed, unprivileged uid/gid so that the volume's ownership is predictable on the host.
RUN groupadd --system --gid 10001 dmq \
    && useradd --system --uid 10001 --gid dmq --home-dir /var/lib/dmq --no-create-home \
       --shell /usr/sbin/nologin dmq \
    && mkdir -p /var/lib/dmq \
    && chown dmq:dmq /var/lib/dmq

# Install what `make run` installs: the project and the dependencies a broker needs, no
# extras (`pip install .`; `make run` installs the same in editable mode, `make test` adds
# the dev extras). Every directory in pyproject.toml's [tool.setuptools.packages.find] include
# is copied; tests/test_dockerfile.py fails if one is missing. README.md is copied because
# pyproject.toml names it as the package's readme and the build reads it.
WORKDIR /src
COPY pyproject.toml README.md ./
COPY dmq/ dmq/
COPY log/ log/
COPY raft/ raft/
COPY http_api/ http_api/
COPY groups/ groups/
COPY spark_io/ spark_io/
COPY bench/ bench/
RUN pip install --no-cache-dir .

ENV DMQ_DATA_DIR=/var/lib/dmq \
    DMQ_HTTP_ADDR=0.0.0.0:8080
VOLUME ["/var/lib/dmq"]
WORKDIR /var/lib/dmq
# Numeric so that tools (and Kubernetes' runAsNonRoot) can tell it is not root without
# reading /etc/passwd inside the image.
USER 10001:10001

# 8080: HTTP/JSON API. 9090: Raft transport between brokers (used once the Raft flags land).
EXPOSE 8080 9090

# The slim image has no curl: ask Python. urlopen raises on a refused connection, a timeout or
# a non-2xx status, and the uncaught exception exits non-zero. The port is read from
# DMQ_HTTP_ADDR so that the check follows the address the broker listens on.
HEALTHCHECK --interval=10s --timeout=5s --start-period=20s --retries=3 \
    CMD ["python", "-c", "import os, urllib.request; port = os.environ.get('DMQ_HTTP_ADDR', ':8080').rpartition(':')[2]; urllib.request.urlopen(f'http://127.0.0.1:{port}/healthz', timeout=4)"]

# Exec form: dmq is PID 1 and receives `docker stop`'s SIGTERM itself. The kernel gives PID 1
# no default action for SIGTERM, so `dmq serve` must handle it (aiohttp's run_app does), or
# run the container with `--init` as docker-compose.yml does.
CMD ["dmq", "serve"]
