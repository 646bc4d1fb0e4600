"""Every file in cluster-configs/ is one a user can launch: cluster-launcher YAMLs pass Ray's
own validation (the path `ray up` takes: ``prepare_config`` then ``validate_config`` against
``ray-schema.json``), KubeRay manifests have what the KubeRay operator needs, the job
runtime_env is one Ray accepts, and the NCCL variables they set pass the doctor's rules.

Files are discovered by glob: a new YAML that is none of these, or does not validate, fails.
"""

from __future__ import annotations

import copy
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

CONFIG_DIR = Path(__file__).resolve().parents[2] / "cluster-configs"
ALL_YAML = sorted([*CONFIG_DIR.rglob("*.yaml"), *CONFIG_DIR.rglob("*.yml")])

# ---------------------------------------------------------------- discovery / classification


def kind_of(doc: Any, path: Path) -> str:
    """"launcher", "kuberay" or "runtime_env"; anything else is an error."""
    if isinstance(doc, dict) and "provider" in doc and "cluster_name" in doc:
        return "launcher"
    if isinstance(doc, dict) and str(doc.get("apiVersion", "")).startswith("ray.io/"):
        return "kuberay"
    if path.parent.name == "job" and path.name.startswith("runtime_env"):
        return "runtime_env"
    raise AssertionError(
        f"{path}: not a cluster-launcher config (needs cluster_name + provider), not a KubeRay "
        "manifest (apiVersion ray.io/v1) and not cluster-configs/job/runtime_env*.yaml"
    )


def load_docs(path: Path) -> list[Any]:
    with open(path) as f:
        docs = [d for d in yaml.safe_load_all(f) if d is not None]
    assert docs, f"{path}: empty YAML"
    return docs


# ---------------------------------------------------------------- cluster launcher


def validate_launcher(config: dict[str, Any]) -> dict[str, Any]:
    """What `ray up` does before it talks to a cloud; returns the prepared config."""
    from ray.autoscaler._private.util import prepare_config, validate_config

    prepared = prepare_config(copy.deepcopy(config))
    validate_config(prepared)
    return prepared


def _commands(config: dict[str, Any], key: str) -> str:
    return "\n".join(config.get(key) or [])


def object_store_bytes(command: str) -> int | None:
    m = re.search(r"--object-store-memory[= ](\d+)", command)
    return int(m.group(1)) if m else None


_UNITS = {"": 1, "b": 1, "k": 1024, "m": 1024**2, "g": 1024**3, "t": 1024**4}


def docker_shm_bytes(options: list[str]) -> int | None:
    for opt in options:
        m = re.search(r"--shm-size[= ]'?(\d+)([bkmgt]?)", opt, re.IGNORECASE)
        if m:
            return int(m.group(1)) * _UNITS[m.group(2).lower()]
    return None


def check_launcher_memory(config: dict[str, Any]) -> None:
    """Workers get an explicit object store; under Docker, /dev/shm is larger than it."""
    worker_store = object_store_bytes(_commands(config, "worker_start_ray_commands"))
    head_store = object_store_bytes(_commands(config, "head_start_ray_commands"))
    assert worker_store and head_store, "set --object-store-memory in head and worker start"
    docker = config.get("docker") or {}
    if docker.get("image") or docker.get("worker_image"):
        shared = list(docker.get("run_options") or [])
        for role, store in (("worker", worker_store), ("head", head_store)):
            shm = docker_shm_bytes(shared + list(docker.get(f"{role}_run_options") or []))
            assert shm is not None, f"docker {role}: set --shm-size in run_options"
            assert shm > store, f"docker {role}: --shm-size {shm} <= object store {store}"


# ---------------------------------------------------------------- KubeRay

_QUANTITY = re.compile(r"^(\d+(?:\.\d+)?)(Ki|Mi|Gi|Ti|K|M|G|T|k)?$")
_FACTORS = {None: 1, "k": 1e3, "K": 1e3, "M": 1e6, "G": 1e9, "T": 1e12,
            "Ki": 2**10, "Mi": 2**20, "Gi": 2**30, "Ti": 2**40}
_DNS1123 = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")


def k8s_bytes(quantity: str) -> float:
    m = _QUANTITY.match(str(quantity))
    assert m, f"not a Kubernetes quantity: {quantity!r}"
    return float(m.group(1)) * _FACTORS[m.group(2)]


def _get(obj: Any, dotted: str, where: str) -> Any:
    for part in dotted.split("."):
        assert isinstance(obj, dict) and part in obj, f"{where}: missing {dotted}"
        obj = obj[part]
    return obj


def check_group(group: dict[str, Any], where: str) -> None:
    """A head group or a worker group: rayStartParams of strings, a pod with an image, and
    for GPU pods: the GPU toleration and a RAM-backed /dev/shm bigger than the object store."""
    params = _get(group, "rayStartParams", where)
    assert isinstance(params, dict), f"{where}.rayStartParams must be a map"
    for k, v in params.items():
        assert isinstance(v, str), f"{where}.rayStartParams.{k}: KubeRay wants strings, got {v!r}"
    pod = _get(group, "template.spec", where)
    containers = _get(pod, "containers", where)
    assert isinstance(containers, list) and containers, f"{where}: no containers"
    ray_container = containers[0]
    assert ray_container.get("image"), f"{where}.template.spec.containers[0].image is missing"
    assert ray_container.get("name"), f"{where}.template.spec.containers[0].name is missing"
    volumes = {v["name"]: v for v in pod.get("volumes") or []}
    shm = [m for m in ray_container.get("volumeMounts") or [] if m.get("mountPath") == "/dev/shm"]
    assert shm, f"{where}: mount an emptyDir (medium: Memory) at /dev/shm"
    shm_volume = volumes.get(shm[0]["name"], {})
    assert shm_volume.get("emptyDir", {}).get("medium") == "Memory", (
        f"{where}: /dev/shm volume must be emptyDir with medium: Memory")
    store = params.get("object-store-memory")
    limit = shm_volume["emptyDir"].get("sizeLimit")
    if store is not None and limit is not None:
        assert k8s_bytes(limit) > int(store), f"{where}: /dev/shm {limit} <= object store {store}"
    gpus = (ray_container.get("resources", {}).get("limits") or {}).get("nvidia.com/gpu")
    if gpus is not None:
        assert int(gpus) >= 1, f"{where}: nvidia.com/gpu limit must be >= 1"
        keys = {t.get("key") for t in pod.get("tolerations") or []}
        assert "nvidia.com/gpu" in keys, f"{where}: GPU pods need the nvidia.com/gpu toleration"


def check_cluster_spec(spec: dict[str, Any], where: str) -> None:
    check_group(_get(spec, "headGroupSpec", where), f"{where}.headGroupSpec")
    groups = _get(spec, "workerGroupSpecs", where)
    assert isinstance(groups, list) and groups, f"{where}.workerGroupSpecs: at least one group"
    names = set()
    for i, g in enumerate(groups):
        w = f"{where}.workerGroupSpecs[{i}]"
        for key in ("groupName", "replicas", "minReplicas", "maxReplicas", "template"):
            _get(g, key, w)
        assert g["groupName"] not in names, f"{w}: duplicate groupName {g['groupName']}"
        names.add(g["groupName"])
        counts = [g["minReplicas"], g["replicas"], g["maxReplicas"]]
        assert all(isinstance(c, int) and c >= 0 for c in counts), f"{w}: replica counts"
        assert counts[0] <= counts[1] <= counts[2], f"{w}: need min <= replicas <= max"
        check_group(g, w)
    assert any(
        "nvidia.com/gpu" in (g["template"]["spec"]["containers"][0].get("resources", {})
                             .get("limits") or {}) for g in groups
    ), f"{where}: no worker group asks for nvidia.com/gpu"


def validate_kuberay(doc: dict[str, Any]) -> None:
    assert doc.get("apiVersion") == "ray.io/v1", f"apiVersion {doc.get('apiVersion')!r}"
    name = _get(doc, "metadata.name", "manifest")
    assert _DNS1123.match(name) and len(name) <= 63, f"metadata.name {name!r} is not DNS-1123"
    kind = doc.get("kind")
    if kind == "RayCluster":
        check_cluster_spec(_get(doc, "spec", kind), f"{kind}.spec")
    elif kind == "RayJob":
        spec = _get(doc, "spec", kind)
        assert isinstance(spec.get("entrypoint"), str) and spec["entrypoint"].strip(), (
            "RayJob.spec.entrypoint is missing")
        if "runtimeEnvYAML" in spec:
            validate_runtime_env(yaml.safe_load(spec["runtimeEnvYAML"]))
        check_cluster_spec(_get(spec, "rayClusterSpec", kind), "RayJob.spec.rayClusterSpec")
    else:
        raise AssertionError(f"kind {kind!r}: expected RayCluster or RayJob")


# ---------------------------------------------------------------- runtime_env


def validate_runtime_env(doc: dict[str, Any]) -> None:
    from ray.runtime_env import RuntimeEnv

    unknown = set(doc) - set(RuntimeEnv.known_fields)
    assert not unknown, f"runtime_env: unknown fields {sorted(unknown)}"
    RuntimeEnv(**doc)  # Ray's own type checks (env_vars must be str -> str, ...)


# ---------------------------------------------------------------- NCCL variables

_ASSIGN = re.compile(r"\b((?:TORCH_)?NCCL_[A-Z0-9_]+)=([^\s;'\"]+)")


def _strings(obj: Any) -> Iterator[str]:
    if isinstance(obj, str):
        yield obj
    elif isinstance(obj, dict):
        for v in obj.values():
            yield from _strings(v)
    elif isinstance(obj, list):
        for v in obj:
            yield from _strings(v)


def _env_lists(obj: Any) -> Iterator[tuple[str, str]]:
    if isinstance(obj, dict):
        env = obj.get("env")
        if isinstance(env, list):
            for e in env:
                if isinstance(e, dict) and "name" in e and "value" in e:
                    yield str(e["name"]), str(e["value"])
        for v in obj.values():
            yield from _env_lists(v)
    elif isinstance(obj, list):
        for v in obj:
            yield from _env_lists(v)


def nccl_env(doc: Any) -> dict[str, set[str]]:
    """Every NCCL variable a config sets (exports, docker --env, pod env), with its values."""
    found: dict[str, set[str]] = {}
    for s in _strings(doc):
        for name, value in _ASSIGN.findall(s):
            found.setdefault(name, set()).add(value)
    for name, value in _env_lists(doc):
        if "NCCL_" in name:
            found.setdefault(name, set()).add(value)
    return found


# The interfaces a node of each kind has (what NCCL_SOCKET_IFNAME must select on it): the
# Ubuntu DLAMI names ENA NICs ens5, ens6...; Deep Learning VM images on GCP ens4; a pod has
# eth0; the on-prem example assumes eth0 (a CHANGE-ME there).
TYPICAL_INTERFACES = {
    "aws": ["lo", "ens5", "docker0"],
    "gcp": ["lo", "ens4"],
    "local": ["lo", "eth0", "docker0"],
    "kuberay": ["lo", "eth0"],
}


def nccl_problems(env: dict[str, str], interfaces: list[str]) -> list[str]:
    """What `rayguard doctor` says about these variables on a node with ``interfaces`` and no
    InfiniBand: any error or warning, and NCCL_DEBUG left at INFO/TRACE."""
    from rayguard.doctor.nccl import check_nccl as doctor_check_nccl
    from rayguard.doctor.probe import NodeProbe

    findings = doctor_check_nccl(NodeProbe(node="config", env=env, interfaces=interfaces),
                                 num_nodes=4)
    return [f"{f.code}: {f.message} (fix: {f.fix})" for f in findings
            if f.severity in ("error", "warning") or f.code == "NCCL_DEBUG_ON"]


def check_nccl(doc: Any, interfaces: list[str] | None) -> None:
    """The file's NCCL variables pass the doctor; a GPU config must name the interface."""
    found = nccl_env(doc)
    for name, values in found.items():
        assert len(values) == 1, f"{name} is set to different values in one file: {values}"
    env = {name: next(iter(values)) for name, values in found.items()}
    if interfaces is not None:
        assert "NCCL_SOCKET_IFNAME" in env, "GPU config without NCCL_SOCKET_IFNAME"
    problems = nccl_problems(env, interfaces or ["lo", "eth0"])
    assert not problems, problems


# ---------------------------------------------------------------- one entry point per file


def validate_file(path: Path) -> str:
    """Validates one file of cluster-configs/; returns its kind. Raises on any problem."""
    docs = load_docs(path)
    kinds = {kind_of(d, path) for d in docs}
    assert len(kinds) == 1, f"{path}: mixes {kinds}"
    kind = kinds.pop()
    for doc in docs:
        if kind == "launcher":
            validate_launcher(doc)
            check_launcher_memory(doc)
            check_nccl(doc, TYPICAL_INTERFACES[doc["provider"]["type"]])
        elif kind == "kuberay":
            validate_kuberay(doc)
            check_nccl(doc, TYPICAL_INTERFACES["kuberay"])
        else:
            validate_runtime_env(doc)
            check_nccl(doc, None)
    return kind


@pytest.mark.parametrize("path", ALL_YAML, ids=lambda p: str(p.relative_to(CONFIG_DIR)))
def test_every_config_file_validates(path: Path) -> None:
    validate_file(path)


def test_the_configs_users_need_exist() -> None:
    kinds: dict[str, list[str]] = {}
    providers = set()
    for path in ALL_YAML:
        for doc in load_docs(path):
            kind = kind_of(doc, path)
            kinds.setdefault(kind, []).append(path.name)
            if kind == "launcher":
                providers.add(doc["provider"]["type"])
            if kind == "kuberay":
                kinds.setdefault(doc["kind"], []).append(path.name)
    assert {"local", "aws", "gcp"} <= providers
    assert "RayCluster" in kinds and "RayJob" in kinds and "runtime_env" in kinds


def test_every_config_directory_has_a_readme_and_marks_what_to_change() -> None:
    dirs = {p.parent for p in ALL_YAML}
    assert dirs
    for d in dirs:
        assert (d / "README.md").is_file(), f"{d} has no README.md"
    for path in ALL_YAML:
        assert "CHANGE-ME" in path.read_text(), f"{path}: mark the values to change"


# ---------------------------------------------------------------- the checks catch bad files


def _aws() -> dict[str, Any]:
    return load_docs(CONFIG_DIR / "aws" / "gpu-cluster.yaml")[0]


def _raycluster() -> dict[str, Any]:
    return load_docs(CONFIG_DIR / "kuberay" / "raycluster-gpu.yaml")[0]


def test_ray_schema_rejects_a_misspelled_launcher_key() -> None:
    import jsonschema

    bad = _aws()
    bad["max_worker"] = bad.pop("max_workers")
    with pytest.raises(jsonschema.ValidationError, match="max_worker"):
        validate_launcher(bad)


def test_ray_validation_rejects_min_workers_above_max_workers() -> None:
    bad = _aws()
    bad["max_workers"] = 0
    with pytest.raises(ValueError, match="max_workers"):
        validate_launcher(bad)


def test_object_store_larger_than_shm_is_rejected() -> None:
    bad = _aws()
    bad["docker"]["worker_run_options"] = ["--shm-size=8g"]
    with pytest.raises(AssertionError, match="shm-size"):
        check_launcher_memory(bad)


@pytest.mark.parametrize(
    "env, fragment",
    [({"NCCL_DEBUG": "INFO"}, "NCCL_DEBUG_ON"),
     ({"NCCL_SOCKET_NTHREADS": "8", "NCCL_NSOCKS_PERTHREAD": "16"}, "> 64"),
     ({"NCCL_SOCKET_IFNAME": "eth"}, "NCCL_IFNAME_NO_MATCH"),
     ({"NCCL_IB_DISABLE": "0"}, "NCCL_IB_NO_DEVICES"),
     ({"NCCL_ASYNC_ERROR_HANDLING": "1"}, "deprecated")],
)
def test_doctor_rules_flag_bad_nccl_values(env: dict[str, str], fragment: str) -> None:
    aws = TYPICAL_INTERFACES["aws"]
    assert any(fragment in p for p in nccl_problems(env, aws)), nccl_problems(env, aws)
    good = {"NCCL_SOCKET_IFNAME": "ens", "NCCL_IB_DISABLE": "1", "NCCL_SOCKET_NTHREADS": "4",
            "NCCL_NSOCKS_PERTHREAD": "16", "NCCL_DEBUG": "WARN"}
    assert nccl_problems(good, aws) == []


def test_nccl_values_are_found_in_docker_options_exports_and_pod_env() -> None:
    assert nccl_env(_aws())["NCCL_SOCKET_IFNAME"] == {"ens"}
    gcp = load_docs(CONFIG_DIR / "gcp" / "gpu-cluster.yaml")[0]
    assert nccl_env(gcp)["NCCL_SOCKET_IFNAME"] == {"ens4"}
    assert nccl_env(_raycluster())["NCCL_SOCKET_IFNAME"] == {"eth0"}


@pytest.mark.parametrize(
    "breakage, fragment",
    [(lambda d: d["spec"]["headGroupSpec"]["template"]["spec"]["containers"][0].pop("image"),
      "image"),
     (lambda d: d["spec"]["workerGroupSpecs"][0].pop("maxReplicas"), "maxReplicas"),
     (lambda d: d["spec"]["workerGroupSpecs"][0]["rayStartParams"].update({"num-gpus": 4}),
      "strings"),
     (lambda d: d["spec"]["workerGroupSpecs"][0]["template"]["spec"].pop("tolerations"),
      "toleration"),
     (lambda d: d["spec"]["workerGroupSpecs"][0]["template"]["spec"]["volumes"][0]
      ["emptyDir"].pop("medium"), "Memory"),
     (lambda d: d.update({"apiVersion": "ray.io/v1alpha1"}), "apiVersion")],
)
def test_kuberay_schema_rejects_broken_manifests(breakage: Any, fragment: str) -> None:
    doc = _raycluster()
    validate_kuberay(doc)
    breakage(doc)
    with pytest.raises(AssertionError, match=fragment):
        validate_kuberay(doc)


def test_a_new_file_that_is_not_a_known_config_fails(tmp_path: Path) -> None:
    bad = tmp_path / "job" / "oops.yaml"
    bad.parent.mkdir()
    bad.write_text("cluster: rayguard\nworkers: 2\n")
    with pytest.raises(AssertionError, match="not a cluster-launcher config"):
        validate_file(bad)
    env = tmp_path / "job" / "runtime_env.yaml"
    env.write_text("env_vars: {RAYGUARD_LOG_LEVEL: 1}\n")
    with pytest.raises(TypeError, match="env_vars"):
        validate_file(env)
