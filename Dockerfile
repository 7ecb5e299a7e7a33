# lldmon service image: `server` and `postgres` extras only (no torch, TensorBoard or pyarrow: add the
# `formats` extra for `lldmon import --format tensorboard` / `export --format parquet`).
FROM python:3.11-slim
ENV PYTHONUNBUFFERED=1 PIP_DISABLE_PIP_VERSION_CHECK=1
WORKDIR /app
COPY pyproject.toml README.md ./
COPY contracts contracts
COPY lldmon_client lldmon_client
COPY monitor monitor
COPY lldmon_lab lldmon_lab
COPY dashboard dashboard
COPY trainer_hooks trainer_hooks
COPY migrations migrations
RUN pip install --no-cache-dir '.[server,postgres]' \
    && useradd --create-home --uid 10001 lldmon
USER lldmon
EXPOSE 8000
# `serve` exits 0 on SIGTERM (docker stop) after finishing the requests in flight.
STOPSIGNAL SIGTERM
CMD ["lldmon", "serve", "--host", "0.0.0.0", "--port", "8000"]
