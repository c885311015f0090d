"""The Helm chart rendered and linted by Helm itself, every manifest validated strictly.

Helm v4 runs in-process through ``helm-python-sdk`` (its Go SDK as a C library: no helm
binary, no cluster). Each value set is linted (``helm lint --strict``), rendered, and every
rendered object is validated with ``kubernetes-validate --strict`` against the oldest and
the newest Kubernetes it bundles; the two CRDs the chart may render (KEDA's ScaledObject,
prometheus-operator's ServiceMonitor) against the strict schemas in ``helm/schemas/``,
written from their documentation for the fields the chart uses. Then each set's objects are
checked for what the values promise.
"""

from __future__ import annotations

import copy
import importlib.util
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import helm_python as helm
import jsonschema
import kubernetes_validate.utils as kv
import pytest
import yaml
from opentelemetry.exporter.prometheus import PrometheusMetricReader
from opentelemetry.sdk.metrics import MeterProvider
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from publisher.settings import PublisherSettings
from publisher.telemetry import Telemetry
from schema.settings import load_settings
from schema.upstreams_file import load_upstreams
from worker.settings import WorkerSettings, load_worker_settings

ROOT = Path(__file__).resolve().parents[1]
CHART = ROOT / "helm" / "fanout"
SCHEMAS = ROOT / "helm" / "schemas"
CRD_SCHEMAS = {
    ("keda.sh/v1alpha1", "ScaledObject"): SCHEMAS / "scaledobject-keda.sh-v1alpha1.json",
    ("monitoring.coreos.com/v1", "ServiceMonitor"): SCHEMAS / "servicemonitor-monitoring.coreos.com-v1.json",
}
KUBE_VERSIONS = (kv.all_versions()[0], kv.latest_version())
RELEASE, NAMESPACE = "rel", "ns"
TOKEN = "t" * 32

MINIMAL: dict[str, Any] = {"redis": {"url": "redis://redis:6379/0"}, "secrets": {"tokenSecret": TOKEN}}
EXISTING_SECRETS: dict[str, Any] = {
    "redis": {"existingSecret": "my-redis", "existingSecretKey": "url"},
    "secrets": {"existingSecret": "my-secrets"},
}
CLUSTER: dict[str, Any] = {
    "redis": {"url": "redis://node-0:6379/0", "cluster": True},
    "secrets": {"tokenSecret": TOKEN},
    "config": {"FANOUT_JOB_SHARDS": "16"},
    "keda": {"enabled": True, "address": "node-0:6379,node-1:6379,node-2:6379", "authenticationRef": "redis-auth"},
}
OBSERVED: dict[str, Any] = MINIMAL | {
    "metrics": {"enabled": True, "serviceMonitor": {"enabled": True, "labels": {"release": "prom"}},
                "dashboard": {"enabled": True, "annotations": {"grafana_folder": "fanout"}}},
}
EVERYTHING: dict[str, Any] = OBSERVED | {
    "keda": {"enabled": True, "address": "redis:6379", "behavior": {"scaleDown": {"stabilizationWindowSeconds": 600}}},
    "publisher": {"ingress": {"enabled": True, "tls": [{"hosts": ["fanout.example.com"], "secretName": "tls"}]},
                  "autoscaling": {"enabled": True, "connections": {"enabled": True}}},
    "otel": {"OTEL_TRACES_EXPORTER": "otlp"},
    "extraEnv": [{"name": "EXTRA", "value": "1"}],
}
UPSTREAMS_FILE = """
[endpoints.azure-east]
api = "openai_chat"
platform = "azure"
url = "https://myres.openai.azure.com/openai/v1"
auth = "api-key"
secret_env = "AZURE_OPENAI_KEY"

[endpoints.vertex]
api = "gemini"
platform = "vertex"
url = "https://aiplatform.googleapis.com/v1/projects/p/locations/global"
auth = "google"

[models."gpt-4o"]
endpoints = ["azure-east"]
"""
UPSTREAMS: dict[str, Any] = MINIMAL | {"upstreams": {
    "file": UPSTREAMS_FILE,
    "secretEnv": [{"name": "AZURE_OPENAI_KEY", "secretName": "azure-openai", "key": "api-key"}],
    "secretFiles": [{"name": "vertex", "secretName": "vertex-service-account"}]},
    "worker": {"extraEnv": [{"name": "GOOGLE_APPLICATION_CREDENTIALS",
                             "value": "/etc/fanout/secrets/vertex/key.json"}]},
}
VALUE_SETS = {"minimal": MINIMAL, "existing-secrets": EXISTING_SECRETS, "cluster": CLUSTER,
              "observed": OBSERVED, "everything": EVERYTHING, "upstreams": UPSTREAMS}

helm.disable_logging()
_CHART = helm.Chart.load(CHART)


def render(values: dict[str, Any]) -> list[dict[str, Any]]:
    """Every object ``helm template`` would print for ``values`` (NOTES.txt left out)."""
    manifests = _CHART.render(copy.deepcopy(values), name=RELEASE, namespace=NAMESPACE)
    return [doc for path, text in sorted(manifests.items()) if path.endswith(".yaml")
            for doc in yaml.safe_load_all(text) if doc]


def one(objects: list[dict[str, Any]], kind: str, name: str) -> dict[str, Any]:
    found = [o for o in objects if o["kind"] == kind and o["metadata"]["name"] == name]
    assert len(found) == 1, f"{kind}/{name}: {len(found)} rendered"
    return found[0]


def container_env(objects: list[dict[str, Any]], component: str) -> dict[str, str]:
    """A Deployment's resolved plain environment: its ConfigMap (envFrom), then ``value`` entries."""
    container = one(objects, "Deployment", f"{RELEASE}-fanout-{component}")["spec"]["template"]["spec"]["containers"][0]
    env: dict[str, str] = {}
    for source in container.get("envFrom", []):
        env |= one(objects, "ConfigMap", source["configMapRef"]["name"])["data"]
    for entry in container["env"]:
        env[entry["name"]] = entry.get("value", "<from secret>")
    return env


def validate(obj: dict[str, Any], kube_version: str) -> None:
    """Strict validation: Kubernetes' own schema, else the chart's CRD schema; raises on failure."""
    crd = CRD_SCHEMAS.get((obj["apiVersion"], obj["kind"]))
    if crd:
        jsonschema.Draft202012Validator(json.loads(crd.read_text())).validate(obj)
    else:
        kv.validate(obj, kube_version, strict=True)


@pytest.mark.parametrize("values", VALUE_SETS.values(), ids=VALUE_SETS.keys())
def test_helm_lint_strict_finds_nothing(values: dict[str, Any]) -> None:
    report = helm.lint(CHART, copy.deepcopy(values), strict=True, namespace=NAMESPACE)
    assert report["total_charts_linted"] == 1
    assert report["errors"] == []
    # Severity 1 is informational ("icon is recommended"); warnings (2) and errors (3) fail.
    assert [m for m in report["messages"] if m["severity"] >= 2] == []


@pytest.mark.parametrize("kube_version", KUBE_VERSIONS)
@pytest.mark.parametrize("values", VALUE_SETS.values(), ids=VALUE_SETS.keys())
def test_every_rendered_object_validates_strictly(values: dict[str, Any], kube_version: str) -> None:
    objects = render(values)
    assert objects
    for obj in objects:
        validate(obj, kube_version)


def test_strict_validation_rejects_an_unknown_field() -> None:
    deployment = one(render(MINIMAL), "Deployment", f"{RELEASE}-fanout-worker")
    deployment["spec"]["template"]["spec"]["containers"][0]["envFrm"] = []
    with pytest.raises(kv.ValidationError):
        validate(deployment, kv.latest_version())
    scaled = one(render(CLUSTER), "ScaledObject", f"{RELEASE}-fanout-worker")
    scaled["spec"]["triggers"][0]["metadata"]["databaseIndex"] = "0"  # no such key in cluster mode
    with pytest.raises(jsonschema.ValidationError):
        validate(scaled, kv.latest_version())


def test_minimal_set_renders_the_core_objects_only() -> None:
    kinds = sorted((o["kind"], o["metadata"]["name"]) for o in render(MINIMAL))
    assert kinds == sorted([
        ("ConfigMap", "rel-fanout"), ("Secret", "rel-fanout"), ("Deployment", "rel-fanout-worker"),
        ("Deployment", "rel-fanout-publisher"), ("Service", "rel-fanout-publisher"),
        ("PodDisruptionBudget", "rel-fanout-publisher"),
    ])


def test_existing_secrets_set_renders_no_secret_and_reads_the_named_ones() -> None:
    objects = render(EXISTING_SECRETS)
    assert not [o for o in objects if o["kind"] == "Secret"]
    refs = set()
    for component in ("worker", "publisher"):
        spec = one(objects, "Deployment", f"rel-fanout-{component}")["spec"]["template"]["spec"]
        for entry in spec["containers"][0]["env"]:
            if "valueFrom" in entry:
                ref = entry["valueFrom"]["secretKeyRef"]
                refs.add((entry["name"], ref["name"], ref["key"]))
    assert ("REDIS_URL", "my-redis", "url") in refs
    assert ("FANOUT_TOKEN_SECRET", "my-secrets", "FANOUT_TOKEN_SECRET") in refs
    assert {name for name, _, _ in refs} == {"REDIS_URL", "FANOUT_TOKEN_SECRET", "FANOUT_API_KEYS",
                                             "OPENAI_API_KEY", "ANTHROPIC_API_KEY", "GEMINI_API_KEY"}
    assert all(secret == "my-secrets" for name, secret, _ in refs if name != "REDIS_URL")


def test_cluster_set_puts_cluster_mode_and_shards_in_both_deployments() -> None:
    objects = render(CLUSTER)
    for component in ("worker", "publisher"):
        env = container_env(objects, component)
        assert env["FANOUT_REDIS_CLUSTER"] == "1", component
        assert env["FANOUT_JOB_SHARDS"] == "16", component
    env = container_env(objects, "worker") | {"FANOUT_TOKEN_SECRET": TOKEN}
    assert load_worker_settings(env).redis_prefix == load_settings(PublisherSettings, env).redis_prefix == "fanout"
    assert "FANOUT_REDIS_CLUSTER" not in container_env(render(MINIMAL), "worker")


def test_keda_cluster_triggers_cover_every_shard_stream_with_pending_and_lag() -> None:
    objects = render(CLUSTER)
    scaled = one(objects, "ScaledObject", "rel-fanout-worker")
    spec = scaled["spec"]
    assert spec["scaleTargetRef"] == {"apiVersion": "apps/v1", "kind": "Deployment", "name": "rel-fanout-worker"}
    assert (spec["minReplicaCount"], spec["maxReplicaCount"]) == (2, 20)
    triggers = spec["triggers"]
    assert {t["type"] for t in triggers} == {"redis-cluster-streams"}
    assert {t["authenticationRef"]["name"] for t in triggers} == {"redis-auth"}
    by_stream: dict[str, set[str]] = {}
    for trigger in triggers:
        meta = trigger["metadata"]
        assert meta["addresses"] == "node-0:6379,node-1:6379,node-2:6379"
        assert meta["consumerGroup"] == "workers"
        # 16 jobs per pod over 16 shards: each shard's trigger targets 1.
        mode = "lag" if "lagCount" in meta else "pending"
        assert meta["lagCount" if mode == "lag" else "pendingEntriesCount"] == "1"
        by_stream.setdefault(meta["stream"], set()).add(mode)
    assert by_stream == {f"fanout:jobs:{{{n}}}": {"pending", "lag"} for n in range(16)}
    assert len({t["name"] for t in triggers}) == len(triggers) == 32
    assert "replicas" not in one(objects, "Deployment", "rel-fanout-worker")["spec"]


def test_keda_single_node_uses_the_plain_scaler_on_one_stream_by_default() -> None:
    values = MINIMAL | {"redis": {"url": "redis://redis:6379/0", "prefix": "p"},
                        "keda": {"enabled": True, "address": "redis:6379"}}
    triggers = one(render(values), "ScaledObject", "rel-fanout-worker")["spec"]["triggers"]
    assert [(t["type"], t["metadata"]["stream"], t["name"]) for t in triggers] == [
        ("redis-streams", "p:jobs:{0}", "jobs-0-pending"), ("redis-streams", "p:jobs:{0}", "jobs-0-lag")]
    assert triggers[0]["metadata"] | triggers[1]["metadata"] == {
        "address": "redis:6379", "stream": "p:jobs:{0}", "consumerGroup": "workers", "pendingEntriesCount": "16",
        "lagCount": "16", "activationLagCount": "0", "databaseIndex": "0", "enableTLS": "false"}
    assert "authenticationRef" not in triggers[0]


def test_keda_shard_count_defaults_to_the_codes_default() -> None:
    """Without ``config.FANOUT_JOB_SHARDS`` the chart assumes 1 jobs stream; so must the code."""
    assert WorkerSettings().job_shards == 1


@pytest.mark.parametrize(("values", "message"), [
    (MINIMAL | {"keda": {"enabled": True}}, "keda.address"),
    (MINIMAL | {"keda": {"enabled": True, "address": "r:6379"}, "worker": {"autoscaling": {"enabled": True}}},
     "both create an HPA"),
    (MINIMAL | {"config": {"FANOUT_JOB_SHARDS": "0"}}, "FANOUT_JOB_SHARDS must be"),
    (MINIMAL | {"config": {"FANOUT_REDIS_CLUSTER": "1"}}, "set redis.cluster instead"),
    (MINIMAL | {"metrics": {"serviceMonitor": {"enabled": True}}}, "needs metrics.enabled"),
    (MINIMAL | {"metrics": {"enabled": True, "port": 8080}}, "metrics.port must differ"),
    (MINIMAL | {"metrics": {"enabled": True}, "otel": {"OTEL_METRICS_EXPORTER": "otlp"}},
     "otel.OTEL_METRICS_EXPORTER: metrics.enabled sets it"),
    ({"redis": {"url": "redis://redis:6379/0"}}, r"set secrets\.tokenSecret \(32\+ random characters"),
    (MINIMAL | {"secrets": {"tokenSecret": "short"}}, "secrets.tokenSecret must have at least 32 characters"),
    (MINIMAL | {"config": {"FANOUT_UPSTREAMS_FILE": "/x.toml"}}, "set upstreams.file"),
    (MINIMAL | {"upstreams": {"secretEnv": [{"name": "K"}]}}, "upstreams.secretEnv: each entry needs"),
    (MINIMAL | {"upstreams": {"secretFiles": [{"name": "Bad_Name", "secretName": "s"}]}},
     "upstreams.secretFiles: each entry needs a name"),
], ids=["keda-address", "keda-and-hpa", "zero-shards", "cluster-in-config", "monitor-without-metrics",
        "port-clash", "exporter-clash", "no-secret", "short-secret", "upstreams-in-config", "secret-env-incomplete",
        "secret-file-name"])
def test_values_that_cannot_work_fail_rendering_with_a_reason(values: dict[str, Any], message: str) -> None:
    with pytest.raises(helm.HelmRenderError, match=message):
        render(values)


def test_upstreams_file_is_a_mounted_configmap_and_its_secrets_are_references(tmp_path: Path) -> None:
    objects = render(UPSTREAMS)
    text = one(objects, "ConfigMap", "rel-fanout-upstreams")["data"]["upstreams.toml"]
    assert text == UPSTREAMS_FILE
    path = tmp_path / "upstreams.toml"
    path.write_text(text)
    assert list(load_upstreams({"FANOUT_UPSTREAMS_FILE": str(path)}).endpoints) == ["azure-east", "vertex"]
    for component in ("worker", "publisher"):
        assert container_env(objects, component)["FANOUT_UPSTREAMS_FILE"] == "/etc/fanout/upstreams/upstreams.toml"
        spec = one(objects, "Deployment", f"rel-fanout-{component}")["spec"]["template"]["spec"]
        mounts = {m["name"]: m["mountPath"] for m in spec["containers"][0]["volumeMounts"]}
        assert mounts["upstreams"] == "/etc/fanout/upstreams"
        volumes = {v["name"]: v for v in spec["volumes"]}
        assert volumes["upstreams"]["configMap"]["name"] == "rel-fanout-upstreams"
        refs = {e["name"]: e["valueFrom"]["secretKeyRef"] for e in spec["containers"][0]["env"] if "valueFrom" in e}
        if component == "worker":  # the endpoints' secrets reach the workers only, by reference
            assert refs["AZURE_OPENAI_KEY"] == {"name": "azure-openai", "key": "api-key", "optional": False}
            assert mounts["secret-vertex"] == "/etc/fanout/secrets/vertex"
            assert volumes["secret-vertex"]["secret"]["secretName"] == "vertex-service-account"
        else:
            assert "AZURE_OPENAI_KEY" not in refs
            assert "secret-vertex" not in mounts
    assert "FANOUT_UPSTREAMS_FILE" not in container_env(render(MINIMAL), "worker")


def test_metrics_expose_the_scrape_port_on_both_deployments_and_services() -> None:
    objects = render(OBSERVED)
    services = {}
    for component in ("worker", "publisher"):
        deployment = one(objects, "Deployment", f"rel-fanout-{component}")
        container = deployment["spec"]["template"]["spec"]["containers"][0]
        ports = {p["name"]: p["containerPort"] for p in container["ports"]}
        assert ports["metrics"] == 9464, component
        env = container_env(objects, component)
        assert (env["OTEL_METRICS_EXPORTER"], env["OTEL_EXPORTER_PROMETHEUS_HOST"],
                env["OTEL_EXPORTER_PROMETHEUS_PORT"]) == ("prometheus", "0.0.0.0", "9464")
        service = one(objects, "Service", f"rel-fanout-{component}")
        assert {"name": "metrics", "port": 9464, "targetPort": "metrics", "protocol": "TCP"} in service["spec"]["ports"]
        assert service["spec"]["selector"].items() <= deployment["spec"]["template"]["metadata"]["labels"].items()
        services[component] = service
    assert services["worker"]["spec"]["clusterIP"] == "None"
    monitor = one(objects, "ServiceMonitor", "rel-fanout")
    assert monitor["metadata"]["labels"]["release"] == "prom"
    assert monitor["spec"]["endpoints"] == [{"port": "metrics", "path": "/metrics", "interval": "30s",
                                             "scrapeTimeout": "10s"}]
    selector = monitor["spec"]["selector"]
    for service in services.values():
        labels = service["metadata"]["labels"]
        assert selector["matchLabels"].items() <= labels.items()
        assert all(labels[e["key"]] in e["values"] for e in selector["matchExpressions"])


def test_metrics_are_off_by_default() -> None:
    objects = render(MINIMAL)
    for component in ("worker", "publisher"):
        assert "OTEL_METRICS_EXPORTER" not in container_env(objects, component)
        container = one(objects, "Deployment", f"rel-fanout-{component}")["spec"]["template"]["spec"]["containers"][0]
        assert "metrics" not in {p["name"] for p in container.get("ports", [])}
    assert not [o for o in objects if o["kind"] == "ServiceMonitor"]


def load_dashboard_script() -> Any:
    spec = importlib.util.spec_from_file_location("fanout_dashboard", ROOT / "scripts" / "dashboard.py")
    assert spec
    assert spec.loader
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_dashboard_json_is_generated_and_every_panel_has_a_query() -> None:
    script = load_dashboard_script()
    path = CHART / "dashboards" / "fanout.json"
    assert path.read_text() == script.render(), "run python scripts/dashboard.py"
    dashboard = json.loads(path.read_text())
    panels = dashboard["panels"]
    assert len(panels) == len(script.PANELS) >= 6
    assert len({p["id"] for p in panels}) == len(panels)
    exprs = []
    for panel in panels:
        assert panel["targets"], panel["title"]
        assert all(t["expr"].strip() and t["refId"] for t in panel["targets"]), panel["title"]
        exprs += [t["expr"] for t in panel["targets"]]
    text = "\n".join(exprs)
    for metric in ("fanout_streams_ended_total", "fanout_time_to_first_delta_seconds_bucket",
                   "fanout_delivery_latency_seconds_bucket", "fanout_sse_readers", "fanout_jobs_pending",
                   "fanout_redis_errors_total"):
        assert metric in text, metric


def publisher_scrape_gauges() -> set[str]:
    """Names of the gauges a publisher's Prometheus scrape serves: its instruments through the real exporter."""
    registry = CollectorRegistry()
    provider = MeterProvider(metric_readers=[PrometheusMetricReader(registry=registry)])
    try:
        Telemetry(meter_provider=provider)
        families = text_string_to_metric_families(generate_latest(registry).decode())
        return {family.name for family in families if family.type == "gauge" and family.name.startswith("fanout_")}
    finally:
        provider.shutdown()


def test_publisher_autoscaling_metric_is_a_gauge_the_publisher_exports() -> None:
    hpa = one(render(EVERYTHING), "HorizontalPodAutoscaler", "rel-fanout-publisher")
    names = [m["pods"]["metric"]["name"] for m in hpa["spec"]["metrics"] if m["type"] == "Pods"]
    assert names == ["fanout_sse_readers"]
    assert set(names) <= publisher_scrape_gauges()


def test_helm_template_script_renders_what_helm_renders(tmp_path: Path) -> None:
    values = tmp_path / "values.yaml"
    values.write_text(yaml.safe_dump(MINIMAL))
    done = subprocess.run([sys.executable, str(ROOT / "scripts" / "helm_template.py"), "-f", str(values),
                           "--name", RELEASE, "--namespace", NAMESPACE], capture_output=True, text=True,
                          timeout=120, check=False)
    assert done.returncode == 0, done.stderr
    printed = [doc for doc in yaml.safe_load_all(done.stdout) if doc]
    assert sorted(printed, key=json.dumps) == sorted(render(MINIMAL), key=json.dumps)


def test_helm_template_script_without_redis_fails_with_helms_reason() -> None:
    done = subprocess.run([sys.executable, str(ROOT / "scripts" / "helm_template.py")], capture_output=True,
                          text=True, timeout=120, check=False)
    assert done.returncode == 1
    assert "set redis.url or redis.existingSecret" in done.stderr
    assert "Traceback" not in done.stderr


@pytest.mark.parametrize(("content", "expected"), [
    (None, "no such file; write it first"),
    ("a: [\n", "not valid YAML at line 2"),
    ("- a\n", "must be a YAML map"),
])
def test_helm_template_script_refuses_an_unusable_values_file_without_traceback(
        tmp_path: Path, content: str | None, expected: str) -> None:
    values = tmp_path / "my-values.yaml"
    if content is not None:
        values.write_text(content)
    done = subprocess.run([sys.executable, str(ROOT / "scripts" / "helm_template.py"), "-f", str(values)],
                          capture_output=True, text=True, timeout=120, check=False)
    assert done.returncode == 2
    assert done.stderr.startswith(f"helm_template: {values}: ")
    assert expected in done.stderr
    assert "Traceback" not in done.stderr


def test_dashboard_configmap_carries_the_json_and_the_sidecar_label() -> None:
    configmap = one(render(OBSERVED), "ConfigMap", "rel-fanout-dashboard")
    assert configmap["metadata"]["labels"]["grafana_dashboard"] == "1"
    assert configmap["metadata"]["annotations"] == {"grafana_folder": "fanout"}
    shipped = json.loads((CHART / "dashboards" / "fanout.json").read_text())
    assert json.loads(configmap["data"]["fanout.json"]) == shipped
    assert not [o for o in render(MINIMAL) if o["metadata"]["name"] == "rel-fanout-dashboard"]


def test_render_lint_and_validation_work_without_a_network() -> None:
    """Helm and kubernetes-validate load nothing at run time: the same checks in a new,
    empty network namespace (``unshare --net``: root only)."""
    code = (
        "import sys; sys.path[:0] = ['.', 'tests']\n"
        "import test_helm_render as t\n"
        "for values in t.VALUE_SETS.values():\n"
        "    t.helm.lint(t.CHART, values, strict=True)\n"
        "    for obj in t.render(values):\n"
        "        t.validate(obj, t.kv.latest_version())\n"
        "import socket\n"
        "try:\n"
        "    socket.create_connection(('pypi.org', 443), timeout=3)\n"
        "except OSError:\n"
        "    print('offline ok')\n"
    )
    try:
        done = subprocess.run(["unshare", "--net", "--", sys.executable, "-c", code], cwd=ROOT,
                              capture_output=True, text=True, timeout=300, check=False)
    except FileNotFoundError:
        pytest.skip("no unshare(1) here to make a namespace without a network")
    if done.returncode != 0 and "unshare failed" in done.stderr:
        pytest.skip(f"cannot make a network namespace here: {done.stderr.strip()}")
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip().endswith("offline ok"), done.stdout
