"""Quotas exact across service replicas, and replicas that share nothing else by accident.

Orchard deployed in the cluster (the `local` overlay: tenant `capped` is held to 5
sandboxes), each replica reached directly at its pod IP (routable from this machine, as
the cluster runs here) so a burst is spread over them on purpose. While creates run, a
thread lists the tenant's pods from the API server as fast as it answers: the tenant
never holds more than its quota at any sample. A replica killed mid-burst leaves nothing
behind, and a sandbox kept busy through one replica is not reaped as idle by another.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

import httpx
import pytest
from lightkube import Client, KubeConfig
from lightkube.core.client import LabelSelector
from lightkube.resources.core_v1 import Pod

from orchard import Orchard
from orchard.env.errors import NotFound
from tests.live.conftest import KUBECONFIG, Deployed, ctr_on, kget, kubectl, tenant_ns

OWNER, CAP, BURST = "capped", 5, 50
CREATING = "orchard.dev/creating-by"


def replica_urls(dep: Deployed) -> dict[str, str]:
    """Pod name -> base URL of each ready replica, straight to its pod IP."""
    out = {}
    for pod in dep.service_pods():
        conds = (pod.get("status") or {}).get("conditions") or []
        ready = any(c["type"] == "Ready" and c["status"] == "True" for c in conds)
        if ready and not pod["metadata"].get("deletionTimestamp"):
            out[pod["metadata"]["name"]] = f"http://{pod['status']['podIP']}:8080"
    return out


def rest(dep: Deployed, url: str, owner: str = OWNER) -> httpx.Client:
    return httpx.Client(base_url=url, headers={"X-API-Key": dep.keys[owner]}, timeout=180)


@dataclass
class Sampler:
    """Lists the tenant's pods from the API server until stopped, as fast as it answers:
    how many it held at each sample (terminating ones too: they hold their slot until
    gone). A watch beside it sees every change in order: `watched` is the most the tenant
    held at any version of the API server's state, not only at the samples."""

    namespace: str
    samples: int = 0
    most: int = 0
    watched: int = 0
    events: int = 0
    marked: dict[str, str] = field(default_factory=dict)  # pod -> creating replica
    # Called from the watch for each pod a replica is creating: (pod, replica).
    on_marked: Callable[[str, str], None] | None = None
    _stop: threading.Event = field(default_factory=threading.Event)
    _threads: list[threading.Thread] = field(default_factory=list)

    def __enter__(self) -> Sampler:
        self._client = Client(KubeConfig.from_file(KUBECONFIG))
        self._watcher = Client(KubeConfig.from_file(KUBECONFIG))
        ready = threading.Event()
        for target, args in ((self._run, ()), (self._watch, (ready,))):
            self._threads.append(threading.Thread(target=target, args=args, daemon=True))
            self._threads[-1].start()
        assert ready.wait(30), "the watch did not start"
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._threads[0].join(30)
        self._client.close()
        self._watcher.close()  # ends the watch (its thread is a daemon either way)

    def _watch(self, ready: threading.Event) -> None:
        labels: LabelSelector = {"orchard.dev/managed": "true"}
        it = self._watcher.list(Pod, namespace=self.namespace, labels=labels)
        held = {p.metadata.name for p in it if p.metadata}
        self.watched = len(held)
        ready.set()
        version = it.resourceVersion
        with contextlib.suppress(Exception):
            for kind, pod in self._watcher.watch(
                Pod, namespace=self.namespace, labels=labels, resource_version=version
            ):
                if self._stop.is_set():
                    return
                self.events += 1
                name = pod.metadata.name if pod.metadata else None
                by = ((pod.metadata.annotations if pod.metadata else None) or {}).get(CREATING)
                if by and name and kind != "DELETED":
                    self.marked[name] = by
                    if self.on_marked is not None:
                        self.on_marked(name, by)
                if kind == "DELETED":
                    held.discard(name)
                else:
                    held.add(name)
                self.watched = max(self.watched, len(held))

    def _run(self) -> None:
        labels: LabelSelector = {"orchard.dev/managed": "true"}
        while not self._stop.is_set():
            with contextlib.suppress(Exception):
                pods = list(self._client.list(Pod, namespace=self.namespace, labels=labels))
                self.samples += 1
                self.most = max(self.most, len(pods))
                for p in pods:
                    if p.metadata is None:
                        continue
                    by = (p.metadata.annotations or {}).get(CREATING)
                    if by and p.metadata.name:
                        self.marked[p.metadata.name] = by


def service_pid(pod: dict[str, Any]) -> int:
    """The host pid of a service replica's process (its container's task in containerd)."""
    cid = pod["status"]["containerStatuses"][0]["containerID"].split("//")[1]
    ls = [*ctr_on(pod["spec"]["nodeName"]), "tasks", "ls"]
    out = subprocess.run(ls, check=True, capture_output=True, text=True)
    return next(int(line.split()[1]) for line in out.stdout.splitlines() if line.startswith(cid))


def pods_of(namespace: str) -> set[str]:
    items = kget("pods", "-n", namespace, "-l", "orchard.dev/managed=true")["items"]
    return {p["metadata"]["name"] for p in items}


def delete_all(dep: Deployed) -> None:
    with dep.client(OWNER) as c:
        for s in c.sandboxes.list():
            c.sandboxes.delete(s.id)


def wait_empty(namespace: str, timeout_s: float = 60) -> None:
    deadline = time.monotonic() + timeout_s
    while left := pods_of(namespace):
        assert time.monotonic() < deadline, f"left behind: {sorted(left)}"
        time.sleep(0.5)


def create(url: str, key: str, image: str) -> tuple[int, dict[str, Any]]:
    try:
        with httpx.Client(base_url=url, headers={"X-API-Key": key}, timeout=180) as h:
            r = h.post("/v1/sandboxes", json={"image": image, "timeout_s": 300})
            return r.status_code, r.json()
    except httpx.HTTPError as e:  # the replica was killed under the request
        return 0, {"error": type(e).__name__}


def burst(dep: Deployed, urls: list[str], image: str, n: int = BURST) -> list[tuple[int, Any]]:
    key = dep.keys[OWNER]
    with ThreadPoolExecutor(n) as pool:
        jobs = [pool.submit(create, urls[i % len(urls)], key, image) for i in range(n)]
        return [j.result() for j in jobs]


@pytest.fixture
def capped(deployed: Deployed) -> Iterator[str]:
    """The capped tenant's namespace, empty before and after."""
    ns = tenant_ns(OWNER)
    delete_all(deployed)
    try:
        yield ns
    finally:
        with contextlib.suppress(Exception):
            delete_all(deployed)
        with contextlib.suppress(Exception):
            wait_empty(ns)


def usage(dep: Deployed, url: str) -> dict[str, Any]:
    with rest(dep, url) as h:
        body = h.get("/v1/usage").json()
    assert isinstance(body, dict)
    return body


def test_fifty_creates_over_two_replicas_never_hold_more_than_the_quota(
    deployed: Deployed, capped: str, sandbox_image: str
) -> None:
    urls = list(replica_urls(deployed).values())
    assert len(urls) == 2, urls
    t0 = time.monotonic()
    with Sampler(capped) as sampler:
        results = burst(deployed, urls, sandbox_image)
    took = time.monotonic() - t0
    made = [b["id"] for s, b in results if s == 201]
    refused = [b["error"] for s, b in results if s == 429]
    by_cluster = sum("ResourceQuota" in e["message"] for e in refused)
    print(f"\nburst: {len(made)} made, {len(refused)} refused ({by_cluster} by the API "
          f"server's quota, the rest by a replica's own check) in {took:.1f} s; "
          f"{sampler.samples} samples, at most {sampler.most} pods held; {sampler.events} "
          f"watch events, at most {sampler.watched} held")  # fmt: skip
    assert sampler.samples > 5 and sampler.events >= CAP, "the sampler saw too little"
    assert sampler.most <= CAP, f"held {sampler.most} pods at once, quota {CAP}"
    assert sampler.watched <= CAP, f"held {sampler.watched} pods at once, quota {CAP}"
    assert len(made) == CAP and len(refused) == BURST - CAP, results
    assert {e["code"] for e in refused} == {"quota_exceeded"}
    assert all(e["details"]["limit"] == "max_sandboxes" for e in refused)
    # Both replicas made sandboxes and refused others: the cluster counted, not a replica.
    by_replica = [[s for j, (s, _) in enumerate(results) if j % 2 == i] for i in (0, 1)]
    assert all(201 in codes or 429 in codes for codes in by_replica)
    # /v1/usage is read from the cluster: the same on both replicas, at once.
    deadline = time.monotonic() + 30
    while True:
        seen = [usage(deployed, u) for u in urls]
        if seen[0] == seen[1] and seen[0]["creating"] == 0:
            break
        assert time.monotonic() < deadline, seen
        time.sleep(0.3)
    assert seen[0]["sandboxes"] == CAP and seen[0]["limits"]["max_sandboxes"] == CAP
    # Room again once they are gone, on either replica.
    delete_all(deployed)
    wait_empty(capped)
    assert [usage(deployed, u)["sandboxes"] for u in urls] == [0, 0]


def test_tenant_namespace_quota_policies_and_guard(
    deployed: Deployed, capped: str, sandbox_image: str
) -> None:
    """The namespace the service made: Pod Security, the quota from the limits, the default
    deny and the agent's ingress; and the service's own rights stop at such namespaces."""
    with deployed.client(OWNER) as c, c.sandboxes.create(sandbox_image, timeout_s=120) as sb:
        assert sb.exec("echo ok").stdout == "ok\n"
        pod = kget("pod", "-n", capped, f"orchard-{sb.id}")
    ns = kget("namespace", capped)["metadata"]
    assert ns["labels"]["pod-security.kubernetes.io/enforce"] == "baseline"
    assert ns["labels"]["orchard.dev/sandboxes"] == "true"
    assert ns["annotations"]["orchard.dev/owner"] == OWNER
    quota = kget("resourcequota", "-n", capped, "orchard-quota")
    assert quota["spec"]["hard"]["count/pods"] == str(CAP)
    assert "requests.cpu" in quota["spec"]["hard"] and "requests.memory" in quota["spec"]["hard"]
    names = {p["metadata"]["name"] for p in kget("networkpolicies", "-n", capped)["items"]}
    assert {"orchard-default-deny", "orchard-baseline-default"} <= names
    sa = ["--as=system:serviceaccount:orchard-system:orchard"]
    probe = '{"apiVersion":"v1","kind":"ResourceQuota","metadata":{"name":"probe"},"spec":{}}'
    ok = kubectl(*sa, "-n", capped, "create", "--dry-run=server", "-f", "-", input_text=probe)
    assert ok.returncode == 0
    denied = kubectl(*sa, "-n", "default", "create", "--dry-run=server", "-f", "-",
                     input_text=probe, check=False)  # fmt: skip
    assert denied.returncode != 0 and "orchard.dev/sandboxes=true" in denied.stderr
    plain = '{"apiVersion":"v1","kind":"Namespace","metadata":{"name":"orchard-probe"}}'
    denied = kubectl(*sa, "create", "--dry-run=server", "-f", "-", input_text=plain, check=False)
    assert denied.returncode != 0 and "Pod Security" in denied.stderr
    # The agent came as the injector image, mounted read-only (the overlay's `image`
    # delivery: no ConfigMaps of the agent's), and the service's pods may mount images and
    # the agent's ConfigMaps, and no other ConfigMap (an image volume may be any image: a
    # pod may run any image anyway).
    injector = kget("configmap", "-n", "orchard-system", "orchard")["data"][
        "ORCHARD_K8S_INJECTOR_IMAGE"
    ]
    assert {"name": "orchard-agent-image", "image": {
        "reference": injector, "pullPolicy": "IfNotPresent"}} in pod["spec"]["volumes"]  # fmt: skip
    assert not kget("configmaps", "-n", capped, "-l", "orchard.dev/agent")["items"]
    small = {"cpu": "10m", "memory": "16Mi"}  # the quota wants both named
    box = {"name": "c", "image": sandbox_image, "resources": {"requests": small, "limits": small}}
    projected = {"projected": {"sources": [{"configMap": {"name": "orchard-agent-x-0"}}]}}
    for volume, allowed in (
        (projected, True),
        ({"projected": {"sources": [{"configMap": {"name": "other"}}]}}, False),
        ({"image": {"reference": injector}}, True),
        ({"image": {"reference": sandbox_image}}, True),
    ):
        probe = json.dumps({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "probe"},
                            "spec": {"containers": [box],  # no token volume either
                                     "automountServiceAccountToken": False,
                                     "volumes": [{"name": "v", **volume}]}})  # fmt: skip
        out = kubectl(*sa, "-n", capped, "create", "--dry-run=server", "-f", "-",
                      input_text=probe, check=False)  # fmt: skip
        assert (out.returncode == 0) == allowed, out.stderr
        assert allowed or "orchard-sandbox-storage" in out.stderr


def test_a_replica_killed_mid_burst_leaks_nothing(
    deployed: Deployed, capped: str, sandbox_image: str
) -> None:
    """Three replicas; one is killed (SIGKILL) as soon as a pod it is creating exists. The
    quota holds throughout, and every pod nobody was answered for is reaped."""
    kubectl("-n", "orchard-system", "scale", "deployment/orchard", "--replicas=3")
    try:
        deployed.wait_ready(replicas=3)
        names = replica_urls(deployed)
        assert len(names) == 3, names
        victim = sorted(names)[0]
        pod = next(p for p in deployed.service_pods() if p["metadata"]["name"] == victim)
        pid = service_pid(pod)
        killed: list[str] = []

        def kill_when_creating(name: str, by: str) -> None:
            # From the watch, the moment the victim's first pod exists: its create is
            # under way (the pod has yet to start), and SIGKILL lands within microseconds.
            if by.startswith(victim) and not killed:
                os.kill(pid, signal.SIGKILL)
                killed.append(name)

        with Sampler(capped, on_marked=kill_when_creating) as sampler:
            for _ in range(3):  # on a loaded host the others may fill the quota first
                results = burst(deployed, list(names.values()), sandbox_image)
                if killed:
                    break
                delete_all(deployed)
                wait_empty(capped)
            assert killed, "the victim never had a create under way in 3 bursts"
            handed = {f"orchard-{b['id']}" for s, b in results if s == 201}
            orphans = {p for p, by in sampler.marked.items() if by.startswith(victim)} - handed
            # Reaped by a surviving replica once the victim's lease lapses (20 s) and a
            # reconcile runs (5 s); the quota holds while they wait.
            deadline = time.monotonic() + 90
            while (left := pods_of(capped) - handed) and time.monotonic() < deadline:
                time.sleep(0.5)
        lost = [b for s, b in results if s == 0]
        print(f"\nkill: {len(handed)} made, {len(lost)} cut off, {len(orphans)} abandoned "
              f"pods reaped; {sampler.samples} samples, at most {sampler.most} held; "
              f"{sampler.events} watch events, at most {sampler.watched} held")  # fmt: skip
        assert not left, f"leaked: {sorted(left)}"
        assert sampler.most <= CAP, f"held {sampler.most} pods at once, quota {CAP}"
        assert sampler.watched <= CAP, f"held {sampler.watched} pods at once, quota {CAP}"
        assert orphans, "no create of the victim was cut off mid-way (nothing was tested)"
        assert pods_of(capped) == handed
    finally:
        kubectl("-n", "orchard-system", "scale", "deployment/orchard", "--replicas=2")
        deployed.wait_ready()


def test_a_sandbox_busy_on_one_replica_is_not_idle_on_another(
    deployed: Deployed, sandbox_image: str
) -> None:
    """Each replica keeps its own record of activity; the one that serves the sandbox writes
    it to the pod now and then, so the other's idle clock does not run out."""
    urls = list(replica_urls(deployed).values())
    with Orchard(base_url=urls[0], api_key=deployed.keys["alice"]) as a:
        sb = a.sandboxes.create(sandbox_image, timeout_s=600, idle_timeout_s=15)
        try:
            stop = time.monotonic() + 40  # well past the idle timeout, busy all along
            while time.monotonic() < stop:
                assert sb.exec("true").exit_code == 0
                time.sleep(1)
            with Orchard(base_url=urls[1], api_key=deployed.keys["alice"]) as b:
                assert b.sandboxes.get(sb.id).refresh().status == "ready"
                # Left alone now: reaped once idle, by whichever replica looks first.
                deadline = time.monotonic() + 60
                while True:
                    try:
                        b.sandboxes.get(sb.id)
                    except NotFound:
                        break
                    assert time.monotonic() < deadline, "an idle sandbox was never reaped"
                    time.sleep(1)
        finally:
            sb.delete(missing_ok=True)
