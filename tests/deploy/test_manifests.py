"""deploy/ and helm/llmsim, checked without a cluster: every object against the
Kubernetes 1.30 OpenAPI schema (kubernetes-validate, strict: unknown fields fail), the
simulator's configuration as llmsim itself loads it, and the probes, downward-API
variables and labels that tie the objects together.  The chart is rendered by
tests/deploy/gotemplate.py (no helm binary here); with ``helm`` on PATH it is also
linted and rendered by Helm."""

from __future__ import annotations

import shutil
import subprocess
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import pytest
import yaml

from llmsim import __version__
from llmsim.cli import config_from_args, parse_args
from llmsim.config import Config, load_config
from tests.deploy.gotemplate import TemplateError, render_chart

kubernetes_validate = pytest.importorskip("kubernetes_validate")

ROOT = Path(__file__).resolve().parents[2]
CHART = ROOT / "helm" / "llmsim"
KUBERNETES = "1.30"
DOWNWARD = {"POD_NAME": "metadata.name", "POD_NAMESPACE": "metadata.namespace", "POD_IP": "status.podIP"}


def _validate(document: Mapping[str, Any]) -> None:
    if document["apiVersion"] == "monitoring.coreos.com/v1":  # a CRD: not in the core schema
        assert document["kind"] == "ServiceMonitor"
        assert set(document["spec"]) == {"selector", "endpoints"}
        return
    try:
        kubernetes_validate.validate(dict(document), KUBERNETES, strict=True)
    except kubernetes_validate.ValidationError as error:
        pytest.fail(f"{document['kind']} {document['metadata']['name']}: {error.message} at {list(error.path)}")


def _documents(texts: Iterator[str]) -> list[dict[str, Any]]:
    return [doc for text in texts for doc in yaml.safe_load_all(text) if doc]


def _plain() -> list[dict[str, Any]]:
    docs = _documents(path.read_text() for path in sorted((ROOT / "deploy").rglob("*.yaml")))
    return [doc for doc in docs if doc["kind"] != "Kustomization"]


def _chart(**overrides: Any) -> list[dict[str, Any]]:
    chart = yaml.safe_load((CHART / "Chart.yaml").read_text())
    values = _merge(yaml.safe_load((CHART / "values.yaml").read_text()), overrides)
    templates = {path.name: path.read_text() for path in (CHART / "templates").iterdir()}
    rendered = render_chart(chart, values, templates)
    return _documents(text for name, text in rendered.items() if name.endswith(".yaml"))


def _merge(base: dict[str, Any], changes: Mapping[str, Any]) -> dict[str, Any]:
    merged = dict(base)
    for key, value in changes.items():
        merged[key] = _merge(merged[key], value) if isinstance(value, Mapping) else value
    return merged


ALL_ON = {
    "workers": 4,
    "replicaCount": 3,
    "config": {
        "model": "meta-llama/Llama-3.1-8B-Instruct",
        "servedModelName": ["llama", "llama-8b"],
        "latencyProfile": "small-l40s-edge-per-token",
        "kvCache": {"enabled": True, "size": 2048, "blockSize": 32},
        "lora": {"maxLoras": 2, "modules": ['{"name":"lora1","path":"/path/to/lora1"}', "lora2=/path/to/lora2"]},
        "extraConfig": {"max-num-batched-tokens": 4096},
    },
    "metrics": {"serviceMonitor": {"enabled": True, "labels": {"release": "prometheus"}}},
    "podLabels": {"team": "inference"},
    "nodeSelector": {"kubernetes.io/os": "linux"},
    "imagePullSecrets": [{"name": "registry"}],
}

SETS = {
    "deploy/": _plain,
    "helm defaults": _chart,
    "helm everything on": lambda: _chart(**ALL_ON),
    "helm no metrics annotations": lambda: _chart(metrics={"podAnnotations": False}, config={"latencyProfile": ""}),
}


@pytest.fixture(params=list(SETS))
def documents(request: pytest.FixtureRequest) -> list[dict[str, Any]]:
    return SETS[request.param]()  # type: ignore[no-any-return]


def test_every_object_matches_the_kubernetes_schema(documents: list[dict[str, Any]]) -> None:
    assert {doc["kind"] for doc in documents} >= {"Deployment", "Service"}
    for document in documents:
        _validate(document)


def _containers(documents: list[dict[str, Any]]) -> Iterator[tuple[dict[str, Any], dict[str, Any]]]:
    for doc in documents:
        if doc["kind"] == "Deployment":
            for container in doc["spec"]["template"]["spec"]["containers"]:
                if container["image"].startswith("llmsim"):
                    yield doc, container


def _config_of(container: dict[str, Any], documents: list[dict[str, Any]], tmp_path: Path) -> Config:
    """The Config the container's llmsim builds: its arguments, and the ConfigMap's file."""
    args = list(container.get("args", []))
    if "--config" in args:
        (text,) = [doc["data"]["config.yaml"] for doc in documents if doc["kind"] == "ConfigMap"]
        path = tmp_path / "config.yaml"
        path.write_text(text)
        args[args.index("--config") + 1] = str(path)
    return config_from_args(parse_args(["serve", *args]), {})


def test_llmsim_reads_every_configuration(documents: list[dict[str, Any]], tmp_path: Path) -> None:
    containers = list(_containers(documents))
    assert containers
    for deployment, container in containers:
        config = _config_of(container, documents, tmp_path)
        assert config.server.workers >= 2
        ports = {port["name"]: port["containerPort"] for port in container["ports"]}
        assert config.server.port in ports.values()
        grace = deployment["spec"]["template"]["spec"].get("terminationGracePeriodSeconds", 30)
        assert grace > config.server.shutdown_grace_period  # SIGTERM drains before SIGKILL


def test_probes_downward_api_and_resources(documents: list[dict[str, Any]]) -> None:
    for _, container in _containers(documents):
        assert container["readinessProbe"]["httpGet"]["path"] == "/health/ready"
        assert container["livenessProbe"]["httpGet"]["path"] == "/health"
        env = {var["name"]: var.get("valueFrom", {}).get("fieldRef", {}).get("fieldPath") for var in container["env"]}
        assert {name: env.get(name) for name in DOWNWARD} == DOWNWARD
        requests = container["resources"]["requests"]
        assert {"cpu", "memory"} <= set(requests)
        assert "cpu" not in container["resources"].get("limits", {})  # throttling would delay tokens


def test_services_select_the_pods(documents: list[dict[str, Any]]) -> None:
    pod_labels = [doc["spec"]["template"]["metadata"]["labels"] for doc in documents if doc["kind"] == "Deployment"]
    for doc in documents:
        if doc["kind"] == "Deployment":
            selector = doc["spec"]["selector"]["matchLabels"]
            assert selector.items() <= doc["spec"]["template"]["metadata"]["labels"].items()
        elif doc["kind"] == "Service":
            assert any(doc["spec"]["selector"].items() <= labels.items() for labels in pod_labels)
        elif doc["kind"] == "ServiceMonitor":
            services = [d for d in documents if d["kind"] == "Service"]
            chosen = doc["spec"]["selector"]["matchLabels"].items()
            assert any(chosen <= s["metadata"]["labels"].items() for s in services)
            port_names = {p["name"] for s in services for p in s["spec"]["ports"]}
            assert {endpoint["port"] for endpoint in doc["spec"]["endpoints"]} <= port_names


def test_the_chart_values_reach_the_objects() -> None:
    documents = _chart(**ALL_ON)
    (deployment,) = [doc for doc in documents if doc["kind"] == "Deployment"]
    assert deployment["spec"]["replicas"] == 3
    assert deployment["spec"]["template"]["metadata"]["labels"]["team"] == "inference"
    (configmap,) = [doc for doc in documents if doc["kind"] == "ConfigMap"]
    config = yaml.safe_load(configmap["data"]["config.yaml"])
    assert config["workers"] == 4 and config["max-num-batched-tokens"] == 4096
    assert config["lora-modules"] == ['{"name":"lora1","path":"/path/to/lora1"}', "lora2=/path/to/lora2"]
    assert config["served-model-name"] == ["llama", "llama-8b"]
    (monitor,) = [doc for doc in documents if doc["kind"] == "ServiceMonitor"]
    assert monitor["metadata"]["labels"]["release"] == "prometheus"
    assert not [doc for doc in _chart() if doc["kind"] == "ServiceMonitor"]
    annotations = deployment["spec"]["template"]["metadata"]["annotations"]
    assert annotations["prometheus.io/path"] == "/metrics"


def test_the_chart_and_the_config_file_agree_with_llmsim(tmp_path: Path) -> None:
    chart = yaml.safe_load((CHART / "Chart.yaml").read_text())
    assert chart["apiVersion"] == "v2" and chart["appVersion"] == __version__
    path = tmp_path / "config.yaml"
    (configmap,) = [doc for doc in _plain() if doc["kind"] == "ConfigMap" and "config.yaml" in doc["data"]]
    path.write_text(configmap["data"]["config.yaml"])
    config = load_config(config_path=str(path), environ={})
    assert (config.server.workers, config.engine.enable_kvcache) == (2, True)


def test_the_renderer_refuses_what_it_does_not_know() -> None:
    chart = {"name": "c", "version": "1"}
    with pytest.raises(TemplateError, match=r"no \.Values\.missing"):
        render_chart(chart, {}, {"a.yaml": "x: {{ .Values.missing }}"})
    with pytest.raises(TemplateError, match="unknown function"):
        render_chart(chart, {}, {"a.yaml": "x: {{ lookup 1 }}"})
    text = "a:{{- if .Values.on }}\n  b: {{ .Values.n | quote }}\n{{- else }} none{{- end }}\n"
    assert render_chart(chart, {"on": True, "n": 3}, {"a.yaml": text})["a.yaml"] == 'a:\n  b: "3"\n'
    assert render_chart(chart, {"on": False, "n": 3}, {"a.yaml": text})["a.yaml"] == "a: none\n"


@pytest.mark.skipif(shutil.which("helm") is None, reason="no helm binary on this machine")
def test_helm_lints_and_renders_the_chart(tmp_path: Path) -> None:
    subprocess.run(["helm", "lint", str(CHART)], check=True)
    rendered = subprocess.run(["helm", "template", "test", str(CHART)], check=True, capture_output=True, text=True)
    for document in _documents(iter([rendered.stdout])):
        _validate(document)
