"""docker-compose.yml is a valid Compose file (checked against the compose-spec JSON schema, since no
Docker engine runs here) and has the topology the README promises: one-shot migrations, restart
policies, healthchecks with start periods, `serve` replicas, an optional `monitoring` profile."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import jsonschema_rs
import yaml

ROOT = Path(__file__).resolve().parents[2]
# https://github.com/compose-spec/compose-spec/blob/170098ba07d9f53c383a41bfd4c5166b0a4529a6/schema/compose-spec.json
# (Apache-2.0), vendored: no PyPI package ships it.
SCHEMA = Path(__file__).with_name("compose-spec.json")


def _compose() -> dict[str, Any]:
    loaded: dict[str, Any] = yaml.safe_load((ROOT / "docker-compose.yml").read_text())
    return loaded


def test_compose_file_matches_the_compose_spec() -> None:
    validator = jsonschema_rs.validator_for(json.loads(SCHEMA.read_text()))
    errors = [
        f"{'/'.join(map(str, e.instance_path))}: {e.message}" for e in validator.iter_errors(_compose())
    ]
    assert errors == []


def test_the_schema_check_catches_mistakes() -> None:
    """The check is not vacuous: a misspelt key and a wrong type are reported."""
    validator = jsonschema_rs.validator_for(json.loads(SCHEMA.read_text()))
    broken = _compose()
    broken["services"]["lldmon"]["restart_policy"] = "always"
    broken["services"]["postgres"]["healthcheck"]["retries"] = ["many"]
    assert len(list(validator.iter_errors(broken))) >= 2


def test_stack_topology() -> None:
    services = _compose()["services"]
    migrate, serve = services["migrate"], services["lldmon"]
    assert migrate["command"][:3] == ["lldmon", "db", "upgrade"] and migrate["restart"] == "no"
    assert serve["depends_on"]["migrate"]["condition"] == "service_completed_successfully"
    assert serve["deploy"]["replicas"] >= 2 and "--workers" in serve["command"]
    for name, service in services.items():
        if name == "migrate":
            continue
        assert service["restart"] == "unless-stopped", name
        assert service["healthcheck"]["start_period"], name
    monitoring = {name for name, s in services.items() if "monitoring" in s.get("profiles", [])}
    assert monitoring == {"prometheus", "alertmanager", "grafana"}
    for service in services.values():  # every file the stack mounts is in the repository
        for volume in service.get("volumes", []):
            source = volume.split(":")[0]
            if source.startswith("./"):
                assert (ROOT / source).exists(), source
    mounts = dict(v.split(":")[:2] for v in services["prometheus"]["volumes"] if v.startswith("./"))
    prometheus = yaml.safe_load((ROOT / "deploy" / "prometheus.yml").read_text())
    assert mounts["./monitor/alerting/prometheus-rules.yml"] in prometheus["rule_files"]


def test_grafana_dashboard_queries_lldmon_series() -> None:
    dashboard = json.loads((ROOT / "deploy" / "grafana" / "dashboards" / "lldmon.json").read_text())
    exprs = [t["expr"] for p in dashboard["panels"] for t in p["targets"]]
    for series in (
        "lldmon_run_phase",
        "lldmon_ingest_batches_total",
        "lldmon_alerts_open",
        "lldmon_notifications_total",
    ):
        assert any(series in e for e in exprs), series
    datasources = yaml.safe_load(
        (ROOT / "deploy/grafana/provisioning/datasources/prometheus.yml").read_text()
    )
    assert {p["datasource"]["uid"] for p in dashboard["panels"]} == {datasources["datasources"][0]["uid"]}
