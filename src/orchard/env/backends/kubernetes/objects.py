"""Pure builders for the Kubernetes objects the kubernetes backend creates, and the reverse
mapping from a pod back to a SandboxRecord.

Everything here is plain JSON (the API server's wire format) and does no I/O, so each
object can be validated offline against the official OpenAPI schemas (tests/kubernetes).
Labels select; annotations carry what labels cannot hold (owner names, JSON, floats), and
both are mutable, so expiry and the network policy are patched in place on the pod.
"""

from __future__ import annotations

import ipaddress
import json
import os
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Literal, Protocol, get_args

from orchard.env.backends.base import AgentEndpoint, BackendState, SandboxRecord, SandboxSpec
from orchard.env.backends.kubernetes.pool_objects import pool_pod_annotations, pool_pod_labels
from orchard.env.backends.volume_base import decode_mounts
from orchard.env.errors import InvalidRequest
from orchard.env.models import NetworkPolicy

GROUP = "orchard.dev"
L_MANAGED = f"{GROUP}/managed"
L_SANDBOX = f"{GROUP}/sandbox"
L_INSTANCE = f"{GROUP}/instance"
L_COMPONENT = "app.kubernetes.io/component"
A_OWNER = f"{GROUP}/owner"
A_IMAGE = f"{GROUP}/image"
A_CREATED = f"{GROUP}/created-at"
A_EXPIRES = f"{GROUP}/expires-at"
A_IDLE = f"{GROUP}/idle-timeout-s"
A_NETWORK = f"{GROUP}/network"
A_CPU = f"{GROUP}/cpu"  # what the pod requests (quotas count it); the default if not asked
A_CPU_ASKED = f"{GROUP}/cpu-asked"  # what the create named, "" for the default
A_MEMORY = f"{GROUP}/memory"
A_DISK = f"{GROUP}/disk"
A_PIDS = f"{GROUP}/pids"
A_USER = f"{GROUP}/default-user"
A_LABELS = f"{GROUP}/labels"
A_PAUSED = f"{GROUP}/paused"  # "true" while the node helper has it frozen
A_NODE_LOST = f"{GROUP}/node-lost"  # why its node was given up on (nodes.py)
A_VOLUMES = f"{GROUP}/volumes"  # its mounts, JSON (kubernetes/volumes.py puts them in)
# Replicas sharing one cluster (replicas.py): the replica still creating the pod, and the
# last activity a replica wrote (for idle timeouts every replica reads).
A_CREATING = f"{GROUP}/creating-by"
A_ACTIVE = f"{GROUP}/active-at"
# Deleted, its processes killed, its pod left for a quiet moment (retire.py): no sandbox.
A_RETIRED = f"{GROUP}/retired-at"
A_DEFAULTS = f"{GROUP}/agent-defaults"  # a claim's env, cwd, user (SandboxRecord)

AGENT_DIR = "/.orchard"
AGENT_PATH = f"{AGENT_DIR}/orchard-agent"
AGENT_BIN_DIR = f"{AGENT_DIR}/bin"  # the agent's ConfigMaps or image, read-only
AGENT_IMAGE_VOLUME = "orchard-agent-image"
INJECTOR_BINARY = "/orchard-inject"
INJECTOR_AGENT = "/orchard-agent"
MAIN_CONTAINER = "sandbox"
INIT_CONTAINER = "orchard-agent"
# Cloud metadata endpoints: link-local (AWS, GCP, Azure, OpenStack) and Alibaba's.
METADATA_CIDRS = ("169.254.0.0/16", "100.100.100.200/32")
# What egress `all` and allow-lists never reach unless told otherwise: private ranges, where
# a cluster's pods, services, nodes and API server live (and other tenants' sandboxes).
# Policies are evaluated after a Service's DNAT, so blocking pod and node addresses blocks
# the Services in front of them too. A cluster on public or documentation addresses names
# its own ranges in ORCHARD_K8S_BLOCKED_CIDRS.
DEFAULT_BLOCKED_CIDRS = ("10.0.0.0/8", "172.16.0.0/12", "192.168.0.0/16", "100.64.0.0/10")
# Pod reasons that mean the image will never start; reported instead of waiting.
IMAGE_MISSING = ("ErrImageNeverPull", "InvalidImageName")
IMAGE_PULL = ("ErrImagePull", "ImagePullBackOff", "RegistryUnavailable")
CONTAINER_BROKEN = ("CreateContainerConfigError", "CreateContainerError", "RunContainerError")
_ID_RE = re.compile(r"^[a-z0-9]([a-z0-9-]{0,50}[a-z0-9])?$")
_QUANTITY_RE = re.compile(r"^[0-9]+(\.[0-9]+)?(m|k|Ki|Mi|Gi|Ti|M|G|T)?$")

CiliumMode = Literal["auto", "on", "off"]
AgentDelivery = Literal["configmap", "image", "init"]


def _env_json(env: Mapping[str, str], name: str, default: Any) -> Any:
    raw = env.get(name)
    if not raw:
        return default
    try:
        return json.loads(raw)
    except ValueError as e:
        raise ValueError(f"{name} is not valid JSON: {e}") from None


@dataclass
class KubernetesOptions:
    """The kubernetes backend's settings; `from_env` reads ORCHARD_K8S_* (docs/kubernetes.md)."""

    namespace: str = "orchard-sandboxes"
    # How the agent reaches a pod: `configmap`, ConfigMaps the service writes once per
    # namespace from its own copy (agent_parts.py; the service must run on Linux with the
    # nodes' architecture); `image`, `injector_image` mounted read-only as an image volume
    # (one copy per node, the lightest on memory; needs Kubernetes' ImageVolume and
    # containerd 2.1+ or CRI-O 1.31+); or `init`, an init container of `injector_image`
    # per pod (dearer: one more container per sandbox).
    agent_delivery: AgentDelivery = "configmap"
    injector_image: str = "orchard/agent-injector:latest"
    instance: str = "default"
    kubeconfig: str | None = None
    agent_port: int = 9090
    # Which pods may reach the agents: the service's own (namespace + pod labels).
    service_namespace: str = "orchard-system"
    service_selector: dict[str, str] = field(
        default_factory=lambda: {"app.kubernetes.io/name": "orchard"}
    )
    # Extra peers allowed to reach the agents, for a service running outside the cluster.
    agent_ingress_cidrs: list[str] = field(default_factory=list)
    # An address every sandbox's policy denies: the agent starts nothing while it answers
    # (the network plugin programs a pod's policy only after the pod starts). `auto`: the
    # API server, where it is inside the never-reached ranges (backend.py); `off`: no wait.
    egress_canary: str = "auto"
    # Never reachable by a sandbox's egress (with the metadata addresses), whatever it allows.
    blocked_cidrs: list[str] = field(default_factory=lambda: list(DEFAULT_BLOCKED_CIDRS))
    runtime_class: str | None = None
    node_selector: dict[str, str] = field(default_factory=dict)
    tolerations: list[dict[str, Any]] = field(default_factory=list)
    image_pull_secrets: list[str] = field(default_factory=list)
    priority_class: str | None = None
    service_account: str | None = None
    # Requests equal limits (Guaranteed QoS), so a sandbox's size is what it gets.
    default_cpu: float = 1.0
    # A sandbox that asks for no cpu may burst to this (its request stays default_cpu), so
    # many small sandboxes can share a node without each being throttled to a sliver.
    # None: the limit is the request (Guaranteed QoS), as for a sandbox that names its cpu.
    default_cpu_limit: float | None = None
    default_memory_bytes: int = 2 << 30
    ephemeral_storage: str = "10Gi"
    image_pull_policy: Literal["Always", "IfNotPresent", "Never"] = "IfNotPresent"
    cilium: CiliumMode = "auto"
    # Where cluster DNS runs, opened for allow-lists that name hosts.
    dns_namespace: str = "kube-system"
    dns_selector: dict[str, str] = field(default_factory=lambda: {"k8s-app": "kube-dns"})
    api_concurrency: int = 32
    pending_timeout_s: float = 300.0
    # How long the scheduler may say "no node fits" before the create fails (503
    # `unschedulable`); raise it when a cluster autoscaler adds nodes on demand.
    unschedulable_timeout_s: float = 30.0
    retries: int = 5
    extra_labels: dict[str, str] = field(default_factory=dict)
    # A namespace per tenant with a ResourceQuota from the service's limits, so the API
    # server holds each owner to its quota across replicas (tenants.py).
    tenant_namespaces: bool = False
    # A Lease per replica, creates marked until handed over, activity written to the pod:
    # what lets 2 or more replicas reconcile the same pods safely (replicas.py).
    replica_leases: bool = False
    # A deleted sandbox's processes are killed at once and its pod removed once the node
    # is quiet, or after reap_after_s (retire.py): a pod's teardown costs its node about
    # as much as its start, and a burst of deletes should not slow the creates beside it.
    defer_deletes: bool = True
    reap_after_s: float = 30.0

    def __post_init__(self) -> None:
        if not _QUANTITY_RE.match(self.ephemeral_storage):
            raise ValueError(f"ephemeral storage {self.ephemeral_storage!r} is not a quantity")
        if not 0 < self.agent_port < 65536:
            raise ValueError(f"agent port {self.agent_port} is out of range")
        for cidr in self.blocked_cidrs:
            try:
                ipaddress.ip_network(cidr, strict=False)
            except ValueError:
                raise ValueError(f"blocked CIDR {cidr!r} is not a network") from None
        if self.api_concurrency < 1 or self.retries < 0 or self.pending_timeout_s <= 0:
            raise ValueError("api concurrency, retries and pending timeout must be positive")
        if self.reap_after_s < 0:
            raise ValueError("the reap delay must not be negative")
        if self.unschedulable_timeout_s < 0:
            raise ValueError("the unschedulable timeout must not be negative")
        if self.agent_delivery not in get_args(AgentDelivery):
            raise ValueError(
                f"agent delivery {self.agent_delivery!r} is not configmap, image or init"
            )

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> KubernetesOptions:
        env = os.environ if env is None else env
        kw: dict[str, Any] = {}
        for var, name in (
            ("ORCHARD_K8S_NAMESPACE", "namespace"),
            ("ORCHARD_K8S_AGENT_DELIVERY", "agent_delivery"),
            ("ORCHARD_K8S_EGRESS_CANARY", "egress_canary"),
            ("ORCHARD_K8S_INJECTOR_IMAGE", "injector_image"),
            ("ORCHARD_K8S_INSTANCE", "instance"),
            ("ORCHARD_K8S_KUBECONFIG", "kubeconfig"),
            ("ORCHARD_K8S_SERVICE_NAMESPACE", "service_namespace"),
            ("ORCHARD_K8S_RUNTIME_CLASS", "runtime_class"),
            ("ORCHARD_K8S_PRIORITY_CLASS", "priority_class"),
            ("ORCHARD_K8S_SERVICE_ACCOUNT", "service_account"),
            ("ORCHARD_K8S_EPHEMERAL_STORAGE", "ephemeral_storage"),
            ("ORCHARD_K8S_IMAGE_PULL_POLICY", "image_pull_policy"),
            ("ORCHARD_K8S_CILIUM", "cilium"),
            ("ORCHARD_K8S_DNS_NAMESPACE", "dns_namespace"),
        ):
            if env.get(var):
                kw[name] = env[var]
        for var, name, conv in (
            ("ORCHARD_K8S_AGENT_PORT", "agent_port", int),
            ("ORCHARD_K8S_DEFAULT_CPU", "default_cpu", float),
            ("ORCHARD_K8S_DEFAULT_CPU_LIMIT", "default_cpu_limit", float),
            ("ORCHARD_K8S_DEFAULT_MEMORY_BYTES", "default_memory_bytes", int),
            ("ORCHARD_K8S_API_CONCURRENCY", "api_concurrency", int),
            ("ORCHARD_K8S_PENDING_TIMEOUT_S", "pending_timeout_s", float),
            ("ORCHARD_K8S_UNSCHEDULABLE_TIMEOUT_S", "unschedulable_timeout_s", float),
            ("ORCHARD_K8S_RETRIES", "retries", int),
            ("ORCHARD_K8S_REAP_AFTER_S", "reap_after_s", float),
        ):
            if env.get(var):
                kw[name] = conv(env[var])
        for var, name in (
            ("ORCHARD_K8S_SERVICE_SELECTOR", "service_selector"),
            ("ORCHARD_K8S_NODE_SELECTOR", "node_selector"),
            ("ORCHARD_K8S_TOLERATIONS", "tolerations"),
            ("ORCHARD_K8S_DNS_SELECTOR", "dns_selector"),
        ):
            value = _env_json(env, var, None)
            if value is not None:
                kw[name] = value
        for var, name in (
            ("ORCHARD_K8S_TENANT_NAMESPACES", "tenant_namespaces"),
            ("ORCHARD_K8S_REPLICA_LEASES", "replica_leases"),
            ("ORCHARD_K8S_DEFER_DELETES", "defer_deletes"),
        ):
            if env.get(var):
                kw[name] = env[var].strip().lower() in ("1", "true", "yes", "on")
        if env.get("ORCHARD_K8S_AGENT_INGRESS_CIDRS"):
            kw["agent_ingress_cidrs"] = [
                s.strip() for s in env["ORCHARD_K8S_AGENT_INGRESS_CIDRS"].split(",") if s.strip()
            ]
        if env.get("ORCHARD_K8S_BLOCKED_CIDRS"):
            kw["blocked_cidrs"] = [
                s.strip() for s in env["ORCHARD_K8S_BLOCKED_CIDRS"].split(",") if s.strip()
            ]
        if env.get("ORCHARD_K8S_IMAGE_PULL_SECRETS"):
            kw["image_pull_secrets"] = [
                s.strip() for s in env["ORCHARD_K8S_IMAGE_PULL_SECRETS"].split(",") if s.strip()
            ]
        return cls(**kw)


def pod_name(sandbox_id: str) -> str:
    return f"orchard-{sandbox_id}"


def policy_name(sandbox_id: str) -> str:
    return f"orchard-{sandbox_id}"


def check_id(sandbox_id: str) -> str:
    """Ids become object names and label values: DNS-1123 labels, short enough for both."""
    if not _ID_RE.match(sandbox_id):
        raise InvalidRequest(f"sandbox id {sandbox_id!r} is not a valid Kubernetes name")
    return sandbox_id


def _cpu(cores: float) -> str:
    return f"{max(1, round(cores * 1000))}m"


def selector(opts: KubernetesOptions) -> dict[str, str]:
    """The labels every pod of this backend instance carries; list and watch select on them."""
    return {L_MANAGED: "true", L_INSTANCE: opts.instance}


def _annotations(spec: SandboxSpec, created_at: float, memory: int, cpu: float) -> dict[str, str]:
    return {
        A_OWNER: spec.owner,
        A_IMAGE: spec.image,
        A_CREATED: repr(created_at),
        A_EXPIRES: repr(float(spec.expires_at)),
        A_IDLE: repr(spec.idle_timeout_s) if spec.idle_timeout_s else "",
        A_NETWORK: spec.network.model_dump_json(),
        A_CPU: repr(cpu),
        A_CPU_ASKED: repr(spec.cpu) if spec.cpu else "",
        A_MEMORY: str(memory),
        A_DISK: str(spec.disk_bytes or ""),
        A_PIDS: str(spec.pids_limit or ""),
        A_USER: spec.user or "",
        A_LABELS: json.dumps(spec.labels, sort_keys=True),
    }


class AgentVolume(Protocol):
    """How the agent reaches a pod without an init container (agent_parts.AgentParts)."""

    def command(self, bin_dir: str, own_dir: str) -> list[str]: ...

    def volume(self) -> dict[str, Any]: ...


def _injector(
    opts: KubernetesOptions, cpu: float, cpu_limit: float, mount: list[dict[str, Any]]
) -> dict[str, Any]:
    """The init container that copies the agent in, for pods without the agent's ConfigMaps."""
    return {
        "name": INIT_CONTAINER,
        "image": opts.injector_image,
        "imagePullPolicy": opts.image_pull_policy,
        "command": [INJECTOR_BINARY, INJECTOR_AGENT, AGENT_PATH],
        # No more than the sandbox itself asks for: a pod's request is the larger of its
        # init and main containers', and small sandboxes must stay small.
        "resources": {
            "requests": {"cpu": _cpu(min(cpu, 0.05)), "memory": "32Mi"},
            "limits": {"cpu": _cpu(min(cpu_limit, 0.5)), "memory": "32Mi"},
        },
        "volumeMounts": mount,
        # Root with no capabilities at all: enough to own the emptyDir the kubelet made
        # (root, 0777) and close it to 0755, so no sandbox user can replace the agent.
        "securityContext": {
            "runAsUser": 0,
            "allowPrivilegeEscalation": False,
            "readOnlyRootFilesystem": True,
            "capabilities": {"drop": ["ALL"]},
        },
    }


def build_pod(
    spec: SandboxSpec, opts: KubernetesOptions, created_at: float, agent: AgentVolume | None = None
) -> dict[str, Any]:
    """The sandbox's pod. The agent replaces the image's command and starts `spec.cmd` as
    its child; it comes from the namespace's ConfigMaps (`agent`, agent_parts.py) or, without
    them, from an init container that copies it in (the injector image).

    The token travels in the pod spec as an env var: only the service's RBAC can read pod
    specs in the sandbox namespace, and the agent strips ORCHARD_AGENT_* from every process
    it starts. It is the HMAC of this id only, so it opens this sandbox's agent and nothing
    else.
    """
    check_id(spec.id)
    if spec.cmd == []:
        raise InvalidRequest(
            "cmd=[] (the image's own entrypoint) needs the image config, which the kubernetes "
            "backend does not read: give the command explicitly"
        )
    if any(k.startswith("ORCHARD_AGENT_") for k in spec.env):
        raise InvalidRequest("env names starting with ORCHARD_AGENT_ are reserved")
    cpu = spec.cpu or opts.default_cpu
    memory = spec.memory_bytes or opts.default_memory_bytes
    args = ["--listen", f":{opts.agent_port}", "--spill-dir", f"{AGENT_DIR}/spill"]
    in_place = opts.agent_delivery == "image"
    if in_place:  # run from the read-only image: the agent itself closes the emptyDir
        args += ["--own-dir", AGENT_DIR]
    if spec.user:  # the default user of execs and of `cmd`, as the other backends have
        args += ["--user", spec.user]
    if opts.egress_canary not in ("auto", "off"):  # nothing runs before the policy holds
        args += ["--wait-closed", opts.egress_canary]
    if spec.cmd:
        args += ["--", *spec.cmd]
    cpu_limit = spec.cpu or max(cpu, opts.default_cpu_limit or cpu)
    # A sandbox's `disk` is its ephemeral-storage limit (writable layer + emptyDirs): the
    # kubelet evicts a pod that writes past it.
    disk = str(spec.disk_bytes) if spec.disk_bytes else opts.ephemeral_storage
    limits = {"cpu": _cpu(cpu), "memory": str(memory), "ephemeral-storage": disk}
    requests = dict(limits)
    limits["cpu"] = _cpu(cpu_limit)
    env = [{"name": k, "value": v} for k, v in spec.env.items()]
    env.append({"name": "ORCHARD_AGENT_TOKEN", "value": spec.agent_token})
    mount: list[dict[str, Any]] = [{"name": "orchard-agent", "mountPath": AGENT_DIR}]
    main: dict[str, Any] = {
        "name": MAIN_CONTAINER,
        "image": spec.image,
        "imagePullPolicy": opts.image_pull_policy,
        "command": [AGENT_PATH],
        "args": args,
        "env": env,
        "ports": [{"name": "agent", "containerPort": opts.agent_port, "protocol": "TCP"}],
        "resources": {"requests": requests, "limits": limits},
        "volumeMounts": mount,
        # Root, so the agent can run execs as any user; no escalation beyond that.
        "securityContext": {
            "runAsUser": 0,
            "allowPrivilegeEscalation": False,
            "capabilities": {"drop": ["NET_RAW", "MKNOD", "AUDIT_WRITE", "SETFCAP"]},
        },
    }
    if spec.workdir:
        main["workingDir"] = spec.workdir
    pod_spec: dict[str, Any] = {
        "restartPolicy": "Never",
        "automountServiceAccountToken": False,
        "enableServiceLinks": False,
        "terminationGracePeriodSeconds": 10,  # the agent gives its children 5 s
        "containers": [main],
        "volumes": [{"name": "orchard-agent", "emptyDir": {"sizeLimit": "64Mi"}}],
    }
    if in_place:
        main["command"] = [AGENT_BIN_DIR + INJECTOR_AGENT]
        mount.append({"name": AGENT_IMAGE_VOLUME, "mountPath": AGENT_BIN_DIR, "readOnly": True})
        image = {"reference": opts.injector_image, "pullPolicy": opts.image_pull_policy}
        pod_spec["volumes"].append({"name": AGENT_IMAGE_VOLUME, "image": image})
    elif agent is not None:  # the loader closes the emptyDir to 0755 and execs the agent
        main["command"] = agent.command(AGENT_BIN_DIR, AGENT_DIR)
        vol = agent.volume()
        mount.append({"name": vol["name"], "mountPath": AGENT_BIN_DIR, "readOnly": True})
        pod_spec["volumes"].append(vol)
    else:
        pod_spec["initContainers"] = [_injector(opts, cpu, cpu_limit, mount)]
    if opts.runtime_class:
        pod_spec["runtimeClassName"] = opts.runtime_class
    if opts.node_selector:
        pod_spec["nodeSelector"] = dict(opts.node_selector)
    if opts.tolerations:
        pod_spec["tolerations"] = [dict(t) for t in opts.tolerations]
    if opts.image_pull_secrets:
        pod_spec["imagePullSecrets"] = [{"name": n} for n in opts.image_pull_secrets]
    if opts.priority_class:
        pod_spec["priorityClassName"] = opts.priority_class
    if opts.service_account:
        pod_spec["serviceAccountName"] = opts.service_account
    labels = {**opts.extra_labels, **selector(opts), L_SANDBOX: spec.id, L_COMPONENT: "sandbox"}
    labels.update(pool_pod_labels(spec.owner))  # a warm pool's: found by it (pools.py)
    annotations = _annotations(spec, created_at, memory, cpu) | pool_pod_annotations(spec.owner)
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": pod_name(spec.id),
            "namespace": opts.namespace,
            "labels": labels,
            "annotations": annotations,
        },
        "spec": pod_spec,
    }


# ---------------------------------------------------------------- pod -> record


def _float(value: str | None) -> float | None:
    return float(value) if value else None


def _int(value: str | None) -> int | None:
    return int(value) if value else None


def pod_problem(pod: Mapping[str, Any]) -> tuple[str, str] | None:
    """Why a pod is not starting, as (kind, message): kind is `image_missing`, `image_pull`,
    `config` or `unschedulable`; None while it is merely on its way."""
    status = pod.get("status") or {}
    for cs in [
        *(status.get("initContainerStatuses") or []),
        *(status.get("containerStatuses") or []),
    ]:
        waiting = (cs.get("state") or {}).get("waiting") or {}
        reason = str(waiting.get("reason") or "")
        message = str(waiting.get("message") or reason)
        if reason in IMAGE_MISSING:
            return "image_missing", f"{reason}: {message}"
        if reason in IMAGE_PULL:
            return "image_pull", f"{reason}: {message}"
        if reason in CONTAINER_BROKEN:
            return "config", f"{reason}: {message}"
    for cond in status.get("conditions") or []:
        if cond.get("type") == "PodScheduled" and cond.get("status") == "False":
            reason = cond.get("reason") or "Unschedulable"
            return "unschedulable", f"{reason}: {cond.get('message') or 'not scheduled yet'}"
    return None


def _terminated(pod: Mapping[str, Any]) -> dict[str, Any] | None:
    status = pod.get("status") or {}
    for cs in [
        *(status.get("containerStatuses") or []),
        *(status.get("initContainerStatuses") or []),
    ]:
        term = (cs.get("state") or {}).get("terminated")
        if term and (cs.get("name") == MAIN_CONTAINER or term.get("exitCode")):
            return dict(term)
    return None


def pod_state(pod: Mapping[str, Any]) -> tuple[BackendState, int | None, str | None]:
    """(state, exit code, error) from the pod's phase and container statuses."""
    status = pod.get("status") or {}
    phase = status.get("phase") or "Pending"
    term = _terminated(pod)
    exit_code = int(term["exitCode"]) if term and "exitCode" in term else None
    if phase == "Running":
        return "running", None, None
    if phase == "Succeeded":
        return "exited", exit_code if exit_code is not None else 0, None
    if phase == "Failed":
        reason = (term or {}).get("reason") or status.get("reason") or "Failed"
        message = (term or {}).get("message") or status.get("message") or ""
        if exit_code is not None and reason not in ("OOMKilled",) and not message:
            return "exited", exit_code, None
        error = "out of memory" if reason == "OOMKilled" else f"{reason}: {message}".strip(": ")
        return "failed", exit_code, error
    if phase == "Unknown":
        return "failed", None, "pod state unknown (node lost?)"
    problem = pod_problem(pod)
    return "pending", None, problem[1] if problem else None


def activity_interval(idle_timeout_s: float) -> float:
    """How often a replica writes a sandbox's activity to its pod (replicas.py): often
    enough for the idle clock, rarely enough to cost little."""
    return min(30.0, max(1.0, idle_timeout_s / 10))


def _active_at(ann: Mapping[str, str]) -> float | None:
    """The latest a replica may have seen the sandbox active: what it wrote, plus the
    interval it writes at (activity since then is not written yet)."""
    at, idle = _float(ann.get(A_ACTIVE)), _float(ann.get(A_IDLE))
    return at + activity_interval(idle) if at and idle else None


def record_from_pod(pod: Mapping[str, Any], opts: KubernetesOptions) -> SandboxRecord | None:
    """Rebuild a sandbox record from its pod alone (any replica, any time); None if not ours."""
    meta = pod.get("metadata") or {}
    labels = meta.get("labels") or {}
    ann = meta.get("annotations") or {}
    if any(labels.get(k) != v for k, v in selector(opts).items()) or L_SANDBOX not in labels:
        return None
    if ann.get(A_RETIRED):  # deleted: its pod only waits for a quiet node (retire.py)
        return None
    state, exit_code, error = pod_state(pod)
    if state == "running" and ann.get(A_PAUSED) == "true":
        state = "paused"
    if ann.get(A_NODE_LOST) and state in ("pending", "running", "paused"):
        state, error = "failed", str(ann[A_NODE_LOST])
    ip = (pod.get("status") or {}).get("podIP")
    endpoint = AgentEndpoint(base_url=f"http://{_host(ip)}:{opts.agent_port}" if ip else None)
    try:
        user_labels = json.loads(ann.get(A_LABELS) or "{}")
    except ValueError:
        user_labels = {}
    return SandboxRecord(
        id=labels[L_SANDBOX],
        owner=ann.get(A_OWNER, ""),
        image=ann.get(A_IMAGE, ""),
        state=state,
        created_at=float(ann.get(A_CREATED) or 0),
        expires_at=float(ann.get(A_EXPIRES) or 0),
        endpoint=endpoint,
        idle_timeout_s=_float(ann.get(A_IDLE)),
        network=NetworkPolicy.model_validate_json(ann.get(A_NETWORK) or "{}"),
        labels={str(k): str(v) for k, v in dict(user_labels).items()},
        # The asked cpu, as the other backends report it: a snapshot keeps it, and a copy
        # given the node's default as an explicit cpu would be capped at that small request.
        cpu=_float(ann[A_CPU_ASKED] if A_CPU_ASKED in ann else ann.get(A_CPU)),
        memory_bytes=_int(ann.get(A_MEMORY)),
        disk_bytes=_int(ann.get(A_DISK)),
        pids_limit=_int(ann.get(A_PIDS)),
        exit_code=exit_code,
        error=error,
        default_user=ann.get(A_USER) or None,
        active_at=_active_at(ann),
        volumes=decode_mounts(ann.get(A_VOLUMES)),
        agent_defaults=ann.get(A_DEFAULTS) or None,
    )


def _host(ip: str) -> str:
    return f"[{ip}]" if ":" in ip else ip
