"""Deployment under deploy/: render every kustomize overlay, validate it offline, cross-check it with the code.

Needs `kubectl` (renders with its built-in kustomize) and PyPI `kubernetes-validate` (Kubernetes JSON
schemas, offline). A missing tool fails these tests with the install hint; it never skips them.
`promtool` (Debian package `prometheus`) is optional: only the promtool checks skip without it.
"""

from __future__ import annotations

import functools
import json
import re
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

from modpipe.serving import tensorrt
from modpipe.settings import SETTINGS_SPEC, Settings

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10
    import tomli as tomllib

ROOT = Path(__file__).resolve().parents[2]
DEPLOY = ROOT / "deploy"
K8S = DEPLOY / "k8s"
OVERLAYS = ("dev", "prod")
TARGETS = {"base": K8S / "base", **{name: K8S / "overlays" / name for name in OVERLAYS}}
ALERTS = DEPLOY / "prometheus" / "alerts.yaml"
PROMETHEUS_YML = DEPLOY / "prometheus" / "prometheus.yml"

# Kubernetes version whose schemas the objects are validated against (kubernetes-validate ships 1.25+).
K8S_VERSION = "1.31.0"
KUBERNETES_VALIDATE_PIN = "kubernetes-validate==1.37.0"
# Custom resources: kubernetes-validate has schemas for built-in kinds only; these get structural checks below.
NO_SCHEMA = {("monitoring.coreos.com/v1", "ServiceMonitor"), ("monitoring.coreos.com/v1", "PrometheusRule"),
             ("keda.sh/v1alpha1", "ScaledObject"),
             ("keda.sh/v1alpha1", "TriggerAuthentication")}  # custom resources: checked field by field below

# Environment variables set in manifests that are not modpipe settings, and why they are needed.
K8S_ONLY_ENV = {
    "HOME": "read-only root filesystem: anything caching under ~ (CUDA's ~/.nv kernel cache, library "
            "caches) must land on the writable /tmp emptyDir",
}
SETTING_ENVS = {spec.env for spec in SETTINGS_SPEC.values()}
WORKLOAD_KINDS = ("StatefulSet", "Deployment", "Job")
BARE_IMAGES = {"modpipe", "modpipe-model"}  # the names the base uses; every overlay maps them
# the folders pyproject installs as the one import package, modpipe (its package-dir)
PACKAGES = tuple(tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["package-dir"].values())

# Series that alert rules may use besides streams/metrics.py: Triton's own, Prometheus' `up`, and the
# resident memory of prometheus_client's process collector (every worker exports it).
SYNTHETIC_SERIES = {"up", "process_resident_memory_bytes"}


# -- rendering --------------------------------------------------------------------------------------

def kubectl() -> str:
    path = shutil.which("kubectl") or ("/usr/bin/kubectl" if Path("/usr/bin/kubectl").exists() else None)
    if path is None:
        pytest.fail("kubectl not found: the deploy tests render the kustomize overlays with `kubectl kustomize`. "
                    "Install it (Debian/Ubuntu: apt package `kubectl` from the Kubernetes apt repository "
                    "pkgs.k8s.io, or from Google's cloud-sdk repository; Debian's own `kubernetes-client` "
                    "1.20 is too old for these kustomizations).")
    return path


@functools.cache
def _render(target: str) -> tuple[dict, ...]:
    proc = subprocess.run([kubectl(), "kustomize", str(TARGETS[target])], capture_output=True, text=True,
                          timeout=120)
    if proc.returncode != 0:
        pytest.fail(f"kubectl kustomize {TARGETS[target]} failed:\n{proc.stderr}")
    return tuple(doc for doc in yaml.safe_load_all(proc.stdout) if doc)


def render(target: str) -> list[dict]:
    return list(_render(target))


def objects(docs: list[dict], kind: str) -> list[dict]:
    return [d for d in docs if d["kind"] == kind]


def one(docs: list[dict], kind: str, name: str) -> dict:
    found = [d for d in docs if d["kind"] == kind and d["metadata"]["name"] == name]
    assert len(found) == 1, f"expected one {kind}/{name}, found {len(found)}"
    return found[0]


def pod_spec(workload: dict) -> dict:
    return workload["spec"]["template"]["spec"]


def all_containers(workload: dict) -> list[dict]:
    spec = pod_spec(workload)
    return spec.get("initContainers", []) + spec["containers"]


def config_maps(docs: list[dict]) -> dict[str, dict[str, str]]:
    return {cm["metadata"]["name"]: cm.get("data", {}) for cm in objects(docs, "ConfigMap")}


def container_env(docs: list[dict], container: dict) -> dict[str, str | None]:
    """Env of a container as the kubelet builds it: envFrom ConfigMaps, then env (None = from a ref)."""
    cms = config_maps(docs)
    env: dict[str, str | None] = {}
    for source in container.get("envFrom", []):
        name = source["configMapRef"]["name"]
        assert name in cms, f"container {container['name']} reads missing ConfigMap {name}"
        env.update(cms[name])
    for var in container.get("env", []):
        env[var["name"]] = var.get("value")
    return env


def worker(docs: list[dict]) -> dict:
    return one(docs, "StatefulSet", "modpipe-worker")


def worker_container(docs: list[dict]) -> dict:
    return next(c for c in pod_spec(worker(docs))["containers"] if c["name"] == "worker")


def modpipe_containers(docs: list[dict]) -> list[tuple[dict, dict]]:
    """(workload, container) pairs that run the modpipe image (the ones that read the settings)."""
    out = []
    for kind in WORKLOAD_KINDS:
        for wl in objects(docs, kind):
            for c in pod_spec(wl)["containers"]:
                if c["image"] == "modpipe" or "/modpipe/worker" in c["image"]:
                    out.append((wl, c))
    return out


def keda_scaled(docs: list[dict]) -> set[tuple[str, str]]:
    """(kind, name) of every workload a ScaledObject of this render scales."""
    return {(so["spec"]["scaleTargetRef"]["kind"], so["spec"]["scaleTargetRef"]["name"])
            for so in objects(docs, "ScaledObject")}


def worker_settings(docs: list[dict]) -> Settings:
    env = {k: v for k, v in container_env(docs, worker_container(docs)).items() if v is not None}
    env["MODPIPE_WORKER_NAME"] = "modpipe-worker-0"
    return Settings.from_env(env)


# -- rendering and schemas ----------------------------------------------------------------------------

@pytest.mark.parametrize("target", list(TARGETS))
def test_renders_every_expected_object(target):
    docs = render(target)
    kinds = {(d["kind"], d["metadata"]["name"]) for d in docs}
    expected = {("StatefulSet", "modpipe-worker"), ("Service", "modpipe-worker"),
                ("PodDisruptionBudget", "modpipe-worker"), ("Job", "modpipe-topics")}
    if target != "dev":  # dev points at an external Triton
        expected |= {("Deployment", "triton"), ("Service", "triton")}
    assert expected <= kinds
    assert not objects(docs, "Secret"), "no Secret in the manifests: credentials are created out of band"
    for d in docs:
        assert "namespace" not in d["metadata"] or target != "base", "base must stay namespace-agnostic"


@pytest.mark.parametrize("target", list(TARGETS))
def test_objects_validate_against_kubernetes_schemas(target):
    try:
        import kubernetes_validate
    except ImportError:
        pytest.fail(f"PyPI package kubernetes-validate is needed for the offline schema checks: pip install "
                    f"{KUBERNETES_VALIDATE_PIN}")
    errors = []
    for doc in render(target):
        if (doc["apiVersion"], doc["kind"]) in NO_SCHEMA:
            continue
        where = f"{target}: {doc['kind']}/{doc['metadata']['name']}"
        try:
            kubernetes_validate.validate(doc, K8S_VERSION, strict=True)
        except kubernetes_validate.ValidationError as exc:
            errors.append(f"{where} invalid at {'.'.join(str(p) for p in exc.path)}: {exc.message}")
        except kubernetes_validate.SchemaNotFoundError:
            errors.append(f"{where}: no schema for {doc['apiVersion']}; add it to NO_SCHEMA only if it is a "
                          "custom resource")
    assert not errors, "\n".join(errors)


def test_example_secret_is_valid_and_holds_only_placeholders():
    import kubernetes_validate

    path = K8S / "base" / "kafka-sasl-secret.example.yaml"
    doc = yaml.safe_load(path.read_text())
    kubernetes_validate.validate(doc, K8S_VERSION, strict=True)
    assert set(doc["stringData"]) == {"username", "password"}
    assert set(doc["stringData"].values()) == {"REPLACE-ME"}
    assert path.name not in (K8S / "base" / "kustomization.yaml").read_text().split("#")[0]


@pytest.mark.parametrize("target", list(TARGETS))
def test_service_monitors_select_existing_service_ports(target):
    docs = render(target)
    for sm in objects(docs, "ServiceMonitor"):
        selector = sm["spec"]["selector"]["matchLabels"]
        services = [s for s in objects(docs, "Service")
                    if selector.items() <= s["metadata"].get("labels", {}).items()]
        assert len(services) == 1, f"ServiceMonitor {sm['metadata']['name']} selects {len(services)} Services"
        ports = {p["name"] for p in services[0]["spec"]["ports"]}
        for endpoint in sm["spec"]["endpoints"]:
            assert endpoint["port"] in ports
        # The alert rules match on job = Service name.
        assert services[0]["metadata"]["name"] in ("modpipe-worker", "triton")


def test_prod_uses_prometheus_operator_component():
    assert {sm["metadata"]["name"] for sm in objects(render("prod"), "ServiceMonitor")} == {"modpipe-worker", "triton"}


# -- settings -----------------------------------------------------------------------------------------

@pytest.mark.parametrize("target", list(TARGETS))
def test_every_env_var_is_a_setting_or_a_justified_k8s_var(target):
    docs = render(target)
    for name, data in config_maps(docs).items():
        if name.startswith("modpipe-config"):
            unknown = set(data) - SETTING_ENVS
            assert not unknown, f"{target}: ConfigMap {name} sets unknown settings {sorted(unknown)}"
    for kind in WORKLOAD_KINDS:
        for wl in objects(docs, kind):
            for c in all_containers(wl):
                for var in c.get("env", []):
                    assert var["name"] in SETTING_ENVS or var["name"] in K8S_ONLY_ENV, (
                        f"{target}: {kind}/{wl['metadata']['name']} container {c['name']} sets {var['name']}, "
                        "which is neither in modpipe.settings.SETTINGS_SPEC nor justified in K8S_ONLY_ENV")


@pytest.mark.parametrize("target", list(TARGETS))
def test_settings_parse_and_fit_the_cluster(target):
    docs = render(target)
    for _, c in modpipe_containers(docs):
        env = container_env(docs, c)
        # Empty = "start the embedded broker/Triton on 127.0.0.1", which does not exist in a pod.
        assert env.get("KAFKA_BOOTSTRAP_SERVERS"), f"{target}/{c['name']}: KAFKA_BOOTSTRAP_SERVERS empty"
        assert env.get("TRITON_URL"), f"{target}/{c['name']}: TRITON_URL empty"
        assert not any("PASSWORD" in k and v for k, v in env.items()), "passwords come from the Secret only"
    settings = worker_settings(docs)  # raises SettingsError on a value modpipe cannot use
    assert settings.metrics_host == "0.0.0.0"
    # a stable name is the static member id and the transactional id: membership on, names from the pod
    assert settings.static_membership == "on" and settings.commit_interval_ms > 0
    if settings.security_protocol.startswith("SASL"):
        assert settings.sasl_mechanism, f"{target}: SASL without KAFKA_SASL_MECHANISM"
    # TRITON_URL: an in-cluster short name must be a Service of this render exposing that port.
    host, port = settings.triton_url.rsplit(":", 1)
    if "." not in host:
        service = one(docs, "Service", host)
        assert int(port) in {p["port"] for p in service["spec"]["ports"] if p["name"] == "grpc"}


@pytest.mark.parametrize("target", list(TARGETS))
def test_worker_replicas_at_most_partitions(target):
    docs = render(target)
    partitions = worker_settings(docs).partitions
    if ("StatefulSet", "modpipe-worker") in keda_scaled(docs):
        so = one(docs, "ScaledObject", "modpipe-worker")["spec"]
        most = so["maxReplicaCount"]
    else:
        most = worker(docs)["spec"]["replicas"]
    assert 1 <= most <= partitions, f"{target}: up to {most} workers for {partitions} partitions"


@pytest.mark.parametrize("target", list(TARGETS))
def test_no_replicas_where_keda_scales(target):
    """A rendered `replicas` on a workload KEDA scales resets KEDA's count on every apply (and moves
    partitions: a rebalance of the group each time)."""
    docs = render(target)
    for kind, name in keda_scaled(docs):
        assert "replicas" not in one(docs, kind, name)["spec"], f"{target}: {kind}/{name} sets replicas under KEDA"


def test_overlay_sizes():
    dev = render("dev")
    assert worker(dev)["spec"]["replicas"] == 1 and not keda_scaled(dev)
    prod = render("prod")
    assert keda_scaled(prod) == {("StatefulSet", "modpipe-worker")}
    assert one(prod, "ScaledObject", "modpipe-worker")["spec"]["minReplicaCount"] == 4
    assert worker_settings(prod).security_protocol == "SASL_SSL"


# -- the worker StatefulSet ---------------------------------------------------------------------------

@pytest.mark.parametrize("target", list(TARGETS))
def test_worker_identity_state_and_probes(target):
    docs = render(target)
    sts = worker(docs)
    spec = pod_spec(sts)
    c = worker_container(docs)
    settings = worker_settings(docs)
    # Stable name -> MODPIPE_WORKER_NAME -> static group member id and the transactional ids of its
    # incarnations (each start fences the one before: streams/checkpointing/incarnations.py).
    name_var = next(v for v in c["env"] if v["name"] == "MODPIPE_WORKER_NAME")
    assert name_var["valueFrom"]["fieldRef"]["fieldPath"] == "metadata.name"
    from modpipe.streams.checkpointing.incarnations import transactional_id
    from modpipe.streams.moderation.app import consumer_config
    assert transactional_id(settings, "modpipe-worker-0", 3) == f"{settings.app_id}-modpipe-worker-0-3"
    assert consumer_config(settings, "kafka:9092", "modpipe-worker-0")["group.instance.id"] == \
        f"{settings.app_id}-modpipe-worker-0"
    headless = one(docs, "Service", sts["spec"]["serviceName"])
    assert headless["spec"]["clusterIP"] == "None"
    assert headless["spec"]["selector"].items() <= spec_labels(sts).items()
    # No volume claims: the changelog topics are the tables' durable copy; their RocksDB stores are on an emptyDir
    # at MODPIPE_STATE_DIR, which a container restart keeps.
    assert "volumeClaimTemplates" not in sts["spec"] and "persistentVolumeClaimRetentionPolicy" not in sts["spec"]
    mounts = {m["mountPath"]: m["name"] for m in c["volumeMounts"]}
    state_dir = next(v["value"] for v in c["env"] if v["name"] == "MODPIPE_STATE_DIR")
    assert "emptyDir" in next(v for v in spec["volumes"] if v["name"] == mounts[state_dir])
    # The model build copied by the init container, at MODPIPE_MODEL_DIR.
    assert settings.model_dir in mounts
    assert any(m["mountPath"] == settings.model_dir for init in spec["initContainers"] for m in init["volumeMounts"])
    # Metrics: container port, probes, scrape annotation and headless Service all on MODPIPE_METRICS_PORT.
    ports = {p["name"]: p["containerPort"] for p in c["ports"]}
    assert ports["metrics"] == settings.metrics_port
    # Probes are the worker's own (streams/runtime/health.py): alive, and ready only once the ban log is read.
    from modpipe.streams.runtime.health import LIVE_PATH, READY_PATH
    paths = {"startupProbe": LIVE_PATH, "readinessProbe": READY_PATH, "livenessProbe": LIVE_PATH}
    for probe, path in paths.items():
        assert c[probe]["httpGet"] == {"path": path, "port": "metrics"}
    annotations = sts["spec"]["template"]["metadata"]["annotations"]
    assert annotations["prometheus.io/port"] == str(settings.metrics_port)
    assert {p["port"] for p in headless["spec"]["ports"]} == {settings.metrics_port}
    # Long enough to let batches at Triton finish (MODPIPE_SHUTDOWN_GRACE_S), commit the last transaction
    # (streams/checkpointing/outbox.py: up to 60 s) and close the clients (10 s each).
    assert spec["terminationGracePeriodSeconds"] >= settings.shutdown_grace_s + 60 + 20
    assert spec["enableServiceLinks"] is False
    assert "memory" in c["resources"]["limits"] and "cpu" in c["resources"]["requests"]
    # The memory budget the caches and buffers share is the pod's limit itself, in MiB (modpipe/memory.py).
    budget = next(v for v in c["env"] if v["name"] == "MODPIPE_WORKER_MEMORY_MB")["valueFrom"]["resourceFieldRef"]
    assert budget == {"containerName": "worker", "resource": "limits.memory", "divisor": "1Mi"}


def spec_labels(workload: dict) -> dict:
    return workload["spec"]["template"]["metadata"]["labels"]


@pytest.mark.parametrize("target", list(TARGETS))
def test_pods_run_non_root_with_read_only_root(target):
    docs = render(target)
    for kind in WORKLOAD_KINDS:
        for wl in objects(docs, kind):
            spec = pod_spec(wl)
            assert spec["securityContext"]["runAsNonRoot"] is True
            assert spec["securityContext"]["runAsUser"] > 0
            assert spec["automountServiceAccountToken"] is False
            for c in all_containers(wl):
                sc = c["securityContext"]
                where = f"{target}: {kind}/{wl['metadata']['name']}/{c['name']}"
                assert sc["readOnlyRootFilesystem"] is True, where
                assert sc["allowPrivilegeEscalation"] is False, where
                assert sc["capabilities"]["drop"] == ["ALL"], where
                assert "limits" in c["resources"] and "requests" in c["resources"], where


@pytest.mark.parametrize("target", list(TARGETS))
def test_pdb_selects_the_workers(target):
    docs = render(target)
    pdb = one(docs, "PodDisruptionBudget", "modpipe-worker")
    assert pdb["spec"]["selector"]["matchLabels"].items() <= spec_labels(worker(docs)).items()
    assert pdb["spec"]["maxUnavailable"] == 1


@pytest.mark.parametrize("target", list(TARGETS))
def test_topics_job_uses_the_workers_configuration(target):
    docs = render(target)
    job = one(docs, "Job", "modpipe-topics")
    (c,) = pod_spec(job)["containers"]
    assert c["args"] == ["topics"]
    assert c["envFrom"] == worker_container(docs)["envFrom"]
    assert pod_spec(job)["restartPolicy"] in ("OnFailure", "Never")


@pytest.mark.parametrize("target", list(TARGETS))
def test_sasl_credentials_come_from_the_secret(target):
    docs = render(target)
    for _, c in modpipe_containers(docs):
        refs = {v["name"]: v["valueFrom"]["secretKeyRef"] for v in c["env"] if "secretKeyRef" in v.get("valueFrom", {})}
        assert set(refs) == {"KAFKA_SASL_USERNAME", "KAFKA_SASL_PASSWORD"}
        assert {r["name"] for r in refs.values()} == {"modpipe-kafka-sasl"}
        if worker_settings(docs).security_protocol.startswith("SASL"):
            assert all(r["optional"] is False for r in refs.values()), "SASL overlays must require the Secret"


@pytest.mark.parametrize("target", OVERLAYS)
def test_overlay_images_are_mapped_and_pinned(target):
    for kind in WORKLOAD_KINDS:
        for wl in objects(render(target), kind):
            for c in all_containers(wl):
                image = c["image"]
                assert image not in BARE_IMAGES, f"{target}: image {image} not mapped by the overlay's `images:`"
                assert "/" in image and (":" in image.rsplit("/", 1)[1] or "@sha256:" in image), image
                assert not image.endswith(":latest"), image


# -- Triton ---------------------------------------------------------------------------------------------

@pytest.mark.parametrize("target", ["base", "prod"])
def test_triton_matches_the_serving_code(target):
    docs = render(target)
    deployment = one(docs, "Deployment", "triton")
    spec = pod_spec(deployment)
    (server,) = spec["containers"]
    assert server["image"] == tensorrt.TRITON_IMAGE
    assert re.fullmatch(r"nvcr\.io/nvidia/tritonserver:\d\d\.\d\d-py3", server["image"])
    assert server["resources"]["limits"]["nvidia.com/gpu"] == 1
    ports = {p["name"]: p["containerPort"] for p in server["ports"]}
    assert ports == {"http": 8000, "grpc": 8001, "metrics": 8002}
    assert server["readinessProbe"]["httpGet"] == {"path": "/v2/health/ready", "port": "http"}
    # Loads exactly the model the workers ask for.
    assert f"--load-model={worker_settings(docs).triton_model}" in server["args"]
    assert "--model-repository=/models" in server["args"]
    # The engine is built in-pod with the same release's TensorRT and the project's trtexec shapes.
    engine = next(c for c in spec["initContainers"] if c["name"] == "build-engine")
    assert engine["image"] == tensorrt.TENSORRT_IMAGE
    model = worker_settings(docs).triton_model
    expected = tensorrt.trtexec_command(f"/models/{model}/1/model.onnx", f"/models/{model}/1/model.plan")[1:]
    assert engine["args"] == expected
    assert engine["resources"]["limits"]["nvidia.com/gpu"] == 1
    service = one(docs, "Service", "triton")
    assert {p["name"]: p["port"] for p in service["spec"]["ports"]} == ports
    assert service["spec"]["selector"].items() <= spec_labels(deployment).items()


def test_dev_points_at_an_external_triton():
    docs = render("dev")
    assert not objects(docs, "Deployment")
    host = worker_settings(docs).triton_url.rsplit(":", 1)[0]
    assert "." in host, "dev has no in-cluster Triton: TRITON_URL must name an external host"


# -- Dockerfile -----------------------------------------------------------------------------------------

def test_dockerfile_builds_the_serving_image_as_the_manifests_expect():
    text = (ROOT / "Dockerfile").read_text()
    code = "\n".join(line for line in text.splitlines() if not line.lstrip().startswith("#"))
    froms = re.findall(r"^FROM\s+(\S+)", text, re.M)
    assert froms and all(f == "python:3.11-slim" for f in froms)
    assert re.search(r"pip install --no-deps \.(\s|$)", text), "install the package, no extras"
    assert "[build" not in code and "torch" not in code, "the worker image has no build extra and no torch"
    assert re.search(r'^ENTRYPOINT \["modpipe"\]$', text, re.M)
    assert re.search(r'^CMD \["worker"\]$', text, re.M)
    user = re.findall(r"^USER\s+(\d+)", text, re.M)
    assert user, "the image must run as a numeric non-root user"
    uid = int(user[-1])
    assert uid > 0
    for target in TARGETS:
        assert pod_spec(worker(render(target)))["securityContext"]["runAsUser"] == uid
    # Every folder pyproject installs is copied into the build stage.
    for folder in PACKAGES:
        assert f"COPY {folder}/ {folder}/" in text, f"Dockerfile does not copy {folder}/"
    ignored = (ROOT / ".dockerignore").read_text().split()
    assert {".git", ".venv"} <= set(ignored)


def test_dockerfile_installs_the_dependencies_before_it_copies_the_code():
    """Docker reuses a layer only while everything copied before it is unchanged: the dependencies are installed
    from the worker's lock alone (hash-checked), so a code change rebuilds only the package's own layer."""
    text = (ROOT / "Dockerfile").read_text()
    build = text.split("\nFROM ", 2)[1]  # the build stage
    build = "\n".join(line for line in build.splitlines() if not line.lstrip().startswith("#"))
    steps = [s for s in re.split(r"\n(?=[A-Z]+ )", build) if not s.startswith("#")]
    deps = next(i for i, s in enumerate(steps) if s.startswith("RUN ") and "-r requirements/worker.lock" in s)
    copied_before = [path for s in steps[:deps] if s.startswith("COPY ") for path in s.split()[1:-1]]
    assert copied_before == ["requirements/worker.lock"], copied_before
    assert "--require-hashes" in steps[deps] and "--no-deps" in steps[deps]
    package = next(i for i, s in enumerate(steps) if re.search(r"pip install --no-deps \.", s))
    code = [i for i, s in enumerate(steps) if s.startswith("COPY ") and s.split()[1].rstrip("/") in PACKAGES]
    assert code and deps < min(code) and max(code) < package
    # what a worker never imports is removed after the install
    for gone in ("loadgen", "simulation", "console"):
        assert f'"$site/modpipe/{gone}"' in steps[package]


def test_the_worker_lock_holds_exactly_the_core_dependencies_at_the_pins():
    """requirements/worker.lock (the image) and ci.lock (`make setup`, CI) agree with pyproject.toml and
    constraints.txt: each core dependency at its pin, no extra's package in the worker's, every line hashed."""
    from packaging.requirements import Requirement
    from packaging.utils import canonicalize_name

    def locked(name: str) -> dict[str, str]:
        text = (ROOT / "requirements" / name).read_text()
        assert "--hash=sha256:" in text
        out = {}
        for m in re.finditer(r"^([A-Za-z0-9_.\-]+)==(\S+) \\\n((?:\s+--hash=sha256:[0-9a-f]{64}(?: \\)?\n?)+)", text, re.M):
            out[canonicalize_name(m.group(1))] = m.group(2)
        return out

    pins = {}
    for line in (ROOT / "constraints.txt").read_text().splitlines():
        line = line.split("#", 1)[0].strip()
        if line:
            name, version = line.split("==")
            pins[canonicalize_name(name)] = version
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    core = {canonicalize_name(Requirement(r).name) for r in project["dependencies"]}
    extras = {canonicalize_name(Requirement(r).name) for rs in project["optional-dependencies"].values() for r in rs}
    worker, ci = locked("worker.lock"), locked("ci.lock")
    assert core <= set(worker) and core | extras <= set(ci)
    for name in core:
        assert worker[name] == ci[name] == pins[name], name
    for name in extras - core:
        assert ci[name] == pins[name], name
    assert not {"torch", "nvidia-pytriton", "noida-db", "transformers", "onnxruntime", "uvicorn"} & set(worker)


# -- Prometheus ---------------------------------------------------------------------------------------

def known_metric_series() -> set[str]:
    """Every series name streams/metrics.py exposes (counter _total/_created, histogram _bucket/_sum/...)."""
    import modpipe.streams.metrics
    from prometheus_client.metrics import MetricWrapperBase

    suffixes = {"counter": ("_total", "_created"), "gauge": ("",), "histogram": ("_bucket", "_count", "_sum", "_created"),
                "summary": ("", "_count", "_sum", "_created"), "info": ("_info",), "enum": ("",)}
    names = set()
    for value in vars(modpipe.streams.metrics).values():
        if isinstance(value, MetricWrapperBase):
            for metric in value.describe():
                names.update(metric.name + s for s in suffixes[metric.type])
    assert names, "no collectors found in modpipe.streams.metrics"
    return names


_PROMQL_KEYWORDS = {"and", "or", "unless", "bool", "offset", "by", "without", "on", "ignoring", "group_left",
                    "group_right", "inf", "nan", "atan2"}


def promql_series(expr: str) -> set[str]:
    """Metric names an expression selects (a small lexer: enough for rules we write ourselves)."""
    expr = re.sub(r'"(?:[^"\\]|\\.)*"', '""', expr)                       # string literals
    expr = re.sub(r"\{[^}]*\}", "", expr)                                  # label matchers
    expr = re.sub(r"\[[^\]]*\]", "", expr)                                 # ranges / subqueries
    expr = re.sub(r"\b(by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)", " ", expr)  # label lists
    names = set()
    for m in re.finditer(r"(?<![\w.:])([a-zA-Z_:][a-zA-Z0-9_:]*)(\s*\()?", expr):
        word, call = m.group(1), m.group(2)
        if call or word.lower() in _PROMQL_KEYWORDS:
            continue  # function / aggregation / keyword
        names.add(word)
    return names


def alert_rules() -> list[dict]:
    doc = yaml.safe_load(ALERTS.read_text())
    return [rule for group in doc["groups"] for rule in group["rules"]]


def test_promql_lexer_finds_series():
    assert promql_series('histogram_quantile(0.99, sum by (le) (rate(a_bucket{job="x"}[5m]))) > 0.5') == {"a_bucket"}
    assert promql_series("sum by (reason) (rate(b[1m])) / ignoring (reason) group_left sum(c) > 1e6") == {"b", "c"}
    assert promql_series("deriv(sum by (topic) (d)[15m:1m]) > 0 and absent(up == 1)") == {"d", "up"}


def test_alert_rules_are_well_formed():
    doc = yaml.safe_load(ALERTS.read_text())
    names = []
    for group in doc["groups"]:
        assert group["name"] and group["rules"]
        for rule in group["rules"]:
            assert set(rule) <= {"alert", "expr", "for", "labels", "annotations", "keep_firing_for"}, rule
            names.append(rule["alert"])
            assert rule["labels"]["severity"] in ("warning", "critical")
            assert rule["annotations"]["summary"] and rule["annotations"]["description"]
            assert re.fullmatch(r"\d+[smh]", rule.get("for", "0s"))
            assert rule["expr"].count("(") == rule["expr"].count(")"), rule["alert"]
    assert len(names) == len(set(names)), "duplicate alert names"


def test_alert_rules_reference_only_exported_metrics():
    known = known_metric_series()
    for rule in alert_rules():
        for series in promql_series(rule["expr"]):
            assert series in known or series.startswith("nv_") or series in SYNTHETIC_SERIES, (
                f"alert {rule['alert']} uses {series}, which streams/metrics.py does not export")


def test_alerts_cover_the_failure_modes():
    by_series: dict[str, list[str]] = {}
    for rule in alert_rules():
        for series in promql_series(rule["expr"]):
            by_series.setdefault(series, []).append(rule["expr"])
    assert "modpipe_consumer_lag_messages" in by_series
    assert "modpipe_dead_letters_total" in by_series
    assert any("histogram_quantile(0.99" in e for e in by_series["modpipe_end_to_end_latency_seconds_bucket"])
    assert "modpipe_triton_errors_total" in by_series
    assert "modpipe_degraded_decisions_total" in by_series  # issue #14: decisions without the text model
    assert any(s.startswith("nv_inference_request_failure") for s in by_series)
    jobs = {m for e in by_series["up"] for m in re.findall(r'job="([^"]+)"', e)}
    assert jobs == {"modpipe-worker", "triton"}


def test_prometheus_example_config_matches_the_alerts():
    doc = yaml.safe_load(PROMETHEUS_YML.read_text())
    for rule_file in doc["rule_files"]:
        assert (PROMETHEUS_YML.parent / rule_file).exists()
    jobs = {job["job_name"] for job in doc["scrape_configs"]}
    assert {"modpipe-worker", "triton"} <= jobs


def _promtool() -> str:
    path = shutil.which("promtool")
    assert path, "promtool is not installed; `make setup` installs it (Debian package prometheus)"
    return path


def test_promtool_check_rules():
    proc = subprocess.run([_promtool(), "check", "rules", str(ALERTS)], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_promtool_unit_tests_cover_every_alert():
    """deploy/prometheus/alerts.test.yaml: every alert fires on its input (labels and rendered annotations as
    expected) and at least one case per alert group stays quiet; `promtool test rules` runs them."""
    tests = yaml.safe_load((ALERTS.parent / "alerts.test.yaml").read_text())
    fired = {case["alertname"] for t in tests["tests"] for case in t["alert_rule_test"] if case["exp_alerts"]}
    quiet = {case["alertname"] for t in tests["tests"] for case in t["alert_rule_test"] if not case["exp_alerts"]}
    assert fired == {rule["alert"] for rule in alert_rules()}
    assert len(quiet) >= 5
    proc = subprocess.run([_promtool(), "test", "rules", str(ALERTS.parent / "alerts.test.yaml")],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0 and "SUCCESS" in proc.stdout + proc.stderr, proc.stdout + proc.stderr


def test_promtool_check_config(tmp_path):
    proc = subprocess.run([_promtool(), "check", "config", "--syntax-only", str(PROMETHEUS_YML)],
                          capture_output=True, text=True, timeout=60)
    if proc.returncode != 0 and "field kubernetes_sd_configs not found" in proc.stdout + proc.stderr:
        # Debian builds Prometheus without Kubernetes discovery. Check everything else (relabelling,
        # rule files, the rules themselves) on a copy whose pods come from a static target instead.
        doc = yaml.safe_load(PROMETHEUS_YML.read_text())
        for job in doc["scrape_configs"]:
            assert job.pop("kubernetes_sd_configs") == [{"role": "pod"}]
            job["static_configs"] = [{"targets": ["127.0.0.1:9464"]}]
        (tmp_path / "prometheus.yml").write_text(yaml.safe_dump(doc))
        shutil.copy(PROMETHEUS_YML.parent / "alerts.yaml", tmp_path / "alerts.yaml")
        proc = subprocess.run([_promtool(), "check", "config", str(tmp_path / "prometheus.yml")],
                              capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stdout + proc.stderr


PROMETHEUS_RULE = K8S / "components" / "prometheus-operator" / "prometheusrule.yaml"


def _prometheusrule_script():
    import importlib.util

    spec = importlib.util.spec_from_file_location("prometheusrule", ROOT / "scripts" / "prometheusrule.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_prometheusrule_is_generated_from_the_alert_rules():
    text = PROMETHEUS_RULE.read_text()
    assert text == _prometheusrule_script().render(ALERTS.read_text()), \
        f"{PROMETHEUS_RULE.relative_to(ROOT)} is out of date: run `make rules`"
    assert yaml.safe_load(text)["spec"]["groups"] == yaml.safe_load(ALERTS.read_text())["groups"]


def test_the_generator_keeps_every_rule_and_comment():
    alerts = "# header\ngroups:\n  - name: g\n    rules:\n      # why\n      - alert: A\n        expr: >-\n" \
             "          up\n\n          == 0\n"
    rule = yaml.safe_load(_prometheusrule_script().render(alerts))
    assert rule["kind"] == "PrometheusRule"
    assert rule["spec"] == yaml.safe_load(alerts) == {"groups": [{"name": "g", "rules": [{"alert": "A", "expr": "up\n== 0"}]}]}
    assert "      # why" in _prometheusrule_script().render(alerts) and "# header" not in _prometheusrule_script().render(alerts)


def test_prod_ships_the_alert_rules_as_a_prometheusrule():
    (rule,) = objects(render("prod"), "PrometheusRule")
    assert rule["apiVersion"] == "monitoring.coreos.com/v1" and rule["metadata"]["namespace"] == "modpipe"
    assert set(rule["spec"]) == {"groups"}  # the CRD's spec: groups only
    assert rule["spec"]["groups"] == yaml.safe_load(ALERTS.read_text())["groups"]
    for group in rule["spec"]["groups"]:
        assert set(group) <= {"name", "interval", "rules", "limit"}, group["name"]


DASHBOARD = DEPLOY / "k8s" / "components" / "grafana" / "modpipe-dashboard.json"
# The dashboard's own variables; Grafana fills in $__rate_interval (at least four scrape intervals).
DASHBOARD_VARIABLES = {"datasource", "namespace", "job", "triton_job"}


def dashboard_queries(variables: dict[str, str] | None = None) -> list[tuple[str, str]]:
    """(panel title, PromQL) of every target of the Grafana dashboard; with `variables`, Grafana's $name and
    ${name} replaced by their values, as Grafana sends them to Prometheus."""
    doc = json.loads(DASHBOARD.read_text())
    out = [(panel["title"], target["expr"]) for panel in doc["panels"] for target in panel["targets"]]
    if variables is not None:
        def value(m: re.Match) -> str:
            return variables[m.group(1) or m.group(2)]
        out = [(title, re.sub(r"\$\{(\w+)\}|\$(\w+)", value, expr)) for title, expr in out]
    return out


def selectors(expr: str) -> list[tuple[str, str, str]]:
    """(series, label matchers, range) of every metric selector in a query we write ourselves."""
    expr = re.sub(r"\b(by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)", " ", expr)  # label lists
    found = []
    for m in re.finditer(r"(?<![\w.:$])([a-zA-Z_:][a-zA-Z0-9_:]*)\b(?!\s*\()\s*(\{[^}]*\})?\s*(\[[^\]]*\])?", expr):
        if m.group(1).lower() not in _PROMQL_KEYWORDS:
            found.append((m.group(1), m.group(2) or "", m.group(3) or ""))
    return found


def test_every_dashboard_query_is_scoped_to_one_deployment():
    """A shared Prometheus scrapes dev and prod under the same job names: every selector names the namespace
    and the job (the workers' or Triton's) through the dashboard's variables, and every range is Grafana's
    $__rate_interval, which follows the scrape interval and the zoom instead of a fixed window."""
    doc = json.loads(DASHBOARD.read_text())
    names = {v["name"] for v in doc["templating"]["list"]}
    assert names == DASHBOARD_VARIABLES
    count = 0
    for title, expr in dashboard_queries():
        assert not re.search(r"\[\d+[smhd]", expr), f"{title}: fixed range in {expr}"
        for series, matchers, window in selectors(expr):
            count += 1
            job = "$triton_job" if series.startswith("nv_") else "$job"
            assert f'job="{job}"' in matchers and 'namespace="$namespace"' in matchers, f"{title}: {series} in {expr}"
            assert window in ("", "[$__rate_interval]"), f"{title}: {series}{window}"
    assert count >= 19


def test_the_selector_reader_sees_unscoped_series():
    assert selectors('sum by (x) (rate(a_total{job="$job"}[5m])) / on (y) b') == [
        ("a_total", '{job="$job"}', "[5m]"), ("b", "", "")]
    assert selectors("histogram_quantile(0.9, sum by (le) (c_bucket[1m])) * 1000") == [("c_bucket", "", "[1m]")]


def test_dashboard_variables_come_from_the_workers_and_tritons_series():
    doc = json.loads(DASHBOARD.read_text())
    known = known_metric_series()
    for var in doc["templating"]["list"]:
        if var["type"] != "query":
            continue
        assert var["datasource"] == {"type": "prometheus", "uid": "${datasource}"}
        m = re.fullmatch(r"label_values\((\w+)(\{[^}]*\})?, (\w+)\)", var["query"]["query"])
        assert m and m.group(3) == var["name"].replace("triton_", ""), var["query"]
        assert m.group(1) in known or m.group(1).startswith("nv_")
        if var["name"] != "namespace":
            assert m.group(2) == '{namespace="$namespace"}', var["name"]  # the jobs of the chosen namespace


def test_dashboard_queries_parse_as_promql(tmp_path):
    """promtool parses every query, with the variables filled in as Grafana does, as a recording rule."""
    values = {"datasource": "prometheus", "namespace": "modpipe", "job": "modpipe-worker", "triton_job": "triton",
              "__rate_interval": "1m"}
    rules = [{"record": f"dashboard:query_{i}", "expr": expr} for i, (_, expr) in enumerate(dashboard_queries(values))]
    (tmp_path / "rules.yaml").write_text(yaml.safe_dump({"groups": [{"name": "dashboard", "rules": rules}]}))
    proc = subprocess.run([_promtool(), "check", "rules", str(tmp_path / "rules.yaml")], capture_output=True,
                          text=True, timeout=60)
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_the_provisioned_dashboard_is_read_only():
    # Edits in Grafana's UI would be lost at the next sync of the ConfigMap: change the JSON here instead.
    assert json.loads(DASHBOARD.read_text())["editable"] is False


def test_dashboard_covers_what_an_sre_looks_at_and_uses_only_exported_series():
    known = known_metric_series()
    used = set()
    for title, expr in dashboard_queries():
        assert expr.count("(") == expr.count(")"), title
        for series in promql_series(expr):
            assert series in known or series.startswith("nv_"), f"panel {title!r} uses unexported {series}"
            used.add(series)
    # issue #14: throughput, verdict mix, latency quantiles, batch sizes, Triton queue + compute time (nv_*),
    # consumer lag, dead letters by reason, degraded decisions
    assert {"modpipe_posts_consumed_total", "modpipe_decisions_total", "modpipe_end_to_end_latency_seconds_bucket",
            "modpipe_batch_size_posts_sum", "nv_inference_queue_duration_us", "nv_inference_compute_infer_duration_us",
            "modpipe_consumer_lag_messages", "modpipe_dead_letters_total",
            "modpipe_degraded_decisions_total", "modpipe_state_written_bytes_total"} <= used
    exprs = [e for _, e in dashboard_queries()]
    assert any("sum by (verdict)" in e for e in exprs) and any("sum by (reason)" in e for e in exprs)
    assert {q for q in ("0.5", "0.9", "0.99") if any(f"histogram_quantile({q}," in e for e in exprs)} == {"0.5", "0.9", "0.99"}


def test_prod_provisions_the_dashboard_for_grafanas_sidecar():
    maps = [d for d in render("prod") if d["kind"] == "ConfigMap" and d["metadata"]["name"] == "modpipe-grafana-dashboard"]
    assert len(maps) == 1 and maps[0]["metadata"]["labels"]["grafana_dashboard"] == "1"
    assert json.loads(maps[0]["data"]["modpipe-dashboard.json"]) == json.loads(DASHBOARD.read_text())


def test_keda_scales_the_workers_on_posts_lag_within_the_partition_count():
    docs = render("prod")
    settings = worker_settings(docs)
    so = one(docs, "ScaledObject", "modpipe-worker")["spec"]
    sts = worker(docs)
    assert so["scaleTargetRef"] == {"apiVersion": "apps/v1", "kind": "StatefulSet", "name": sts["metadata"]["name"]}
    assert 1 <= so["minReplicaCount"] <= so["maxReplicaCount"] <= settings.partitions  # never beyond the partitions
    assert "replicas" not in sts["spec"]  # KEDA's alone
    (trigger,) = so["triggers"]
    meta = trigger["metadata"]
    assert trigger["type"] == "kafka" and meta["allowIdleConsumers"] == "false"
    assert meta["topic"] == settings.topic("posts") and meta["consumerGroup"] == settings.app_id
    assert meta["bootstrapServers"] == settings.bootstrap_servers
    keda_sasl = {"PLAIN": "plaintext", "SCRAM-SHA-256": "scram_sha256", "SCRAM-SHA-512": "scram_sha512"}
    assert meta["sasl"] == keda_sasl[settings.sasl_mechanism]
    assert meta["tls"] == ("enable" if "SSL" in settings.security_protocol else "disable")
    auth = one(docs, "TriggerAuthentication", trigger["authenticationRef"]["name"])["spec"]
    refs = {(v["valueFrom"]["secretKeyRef"]["name"], v["valueFrom"]["secretKeyRef"]["key"])
            for v in worker_container(docs)["env"] if "secretKeyRef" in v.get("valueFrom", {})}
    assert {(r["name"], r["key"]) for r in auth["secretTargetRef"]} <= refs  # the workers' own credentials
    assert int(meta["lagThreshold"]) > 0


def _selects(policy: dict, labels: dict) -> bool:
    return all(labels.get(k) == v for k, v in policy["spec"]["podSelector"].get("matchLabels", {}).items())


def _allows_port(rules: list[dict], port: int) -> bool:
    return any(p["port"] <= port <= p.get("endPort", p["port"]) for rule in rules for p in rule.get("ports", []))


@pytest.mark.parametrize("target", list(TARGETS))
def test_network_policies_deny_by_default_and_let_only_what_must_talk_talk(target):
    docs = render(target)
    policies = objects(docs, "NetworkPolicy")
    deny = one(docs, "NetworkPolicy", "modpipe-default-deny")
    assert set(deny["spec"]["policyTypes"]) == {"Ingress", "Egress"} and "ingress" not in deny["spec"]
    settings = worker_settings(docs)
    kafka_ports = {int(server.rsplit(":", 1)[1]) for server in settings.bootstrap_servers.split(",")}
    for kind in WORKLOAD_KINDS:
        for wl in objects(docs, kind):
            labels = wl["spec"]["template"]["metadata"]["labels"]
            mine = [p for p in policies if _selects(p, labels)]
            assert deny in mine, f"{kind}/{wl['metadata']['name']} escapes the default deny"
            egress = [rule for p in mine for rule in p["spec"].get("egress", [])]
            assert _allows_port(egress, 53), "DNS"
            if labels["app.kubernetes.io/component"] in ("worker", "topics"):
                assert all(_allows_port(egress, port) for port in kafka_ports), f"{kind}: Kafka {kafka_ports}"
    w_labels = worker(docs)["spec"]["template"]["metadata"]["labels"]
    w_policy = next(p for p in policies if p["metadata"]["name"] == "modpipe-worker")
    metrics_port = next(p["containerPort"] for p in worker_container(docs)["ports"] if p["name"] == "metrics")
    assert _allows_port(w_policy["spec"]["ingress"], metrics_port) and len(w_policy["spec"]["ingress"]) == 1
    triton_port = int(settings.triton_url.rsplit(":", 1)[1])
    assert _allows_port(w_policy["spec"]["egress"], triton_port)
    if target != "dev":  # the in-cluster Triton takes gRPC from the workers only, metrics from Prometheus
        t_policy = next(p for p in policies if p["metadata"]["name"] == "modpipe-triton")
        grpc = next(r for r in t_policy["spec"]["ingress"] if _allows_port([r], triton_port))
        assert [peer["podSelector"]["matchLabels"] for peer in grpc["from"]] == [
            {k: w_labels[k] for k in ("app.kubernetes.io/name", "app.kubernetes.io/component")}]
        triton = one(docs, "Deployment", "triton")
        ports = {p["name"]: p["containerPort"] for c in pod_spec(triton)["containers"] for p in c.get("ports", [])}
        assert ports["grpc"] == triton_port and _allows_port(t_policy["spec"]["ingress"], ports["metrics"])
        assert not _allows_port(t_policy["spec"]["ingress"], ports["http"])  # nobody needs Triton's HTTP
