# lldmon service image (no torch: the service never imports it).
FROM python:3.11-slim
WORKDIR /app
COPY pyproject.toml README.md ./
COPY contracts contracts
COPY monitor monitor
COPY dashboard dashboard
COPY trainer_hooks trainer_hooks
COPY migrations migrations
RUN pip install --no-cache-dir '.[server,postgres]'
EXPOSE 8000
CMD ["lldmon", "serve", "--host", "0.0.0.0", "--port", "8000"]
