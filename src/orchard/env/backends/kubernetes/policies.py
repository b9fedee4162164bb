"""The network policies of Orchard's sandboxes: the baseline each namespace gets (ingress
from the service on the agent port only, no egress), and each sandbox's own egress, as a
NetworkPolicy or a CiliumNetworkPolicy; pure builders, as objects.py's."""

from __future__ import annotations

import ipaddress
from collections.abc import Sequence
from ipaddress import IPv4Network
from typing import Any

from orchard.env.backends.kubernetes.objects import (
    L_INSTANCE,
    L_SANDBOX,
    METADATA_CIDRS,
    KubernetesOptions,
    pod_name,
    policy_name,
    selector,
)
from orchard.env.backends.network import ResolvedAllow
from orchard.env.models import NetworkPolicy


def _owner_ref(pod_uid: str | None, sandbox_id: str) -> list[dict[str, Any]]:
    """The pod owns its policy, so the garbage collector removes it with the pod."""
    if not pod_uid:
        return []
    return [{"apiVersion": "v1", "kind": "Pod", "name": pod_name(sandbox_id), "uid": pod_uid}]


def _meta(sandbox_id: str, opts: KubernetesOptions, pod_uid: str | None) -> dict[str, Any]:
    meta: dict[str, Any] = {
        "name": policy_name(sandbox_id),
        "namespace": opts.namespace,
        "labels": {**opts.extra_labels, **selector(opts), L_SANDBOX: sandbox_id},
    }
    if refs := _owner_ref(pod_uid, sandbox_id):
        meta["ownerReferences"] = refs
    return meta


def _dns_peer(opts: KubernetesOptions) -> dict[str, Any]:
    return {
        "namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": opts.dns_namespace}},
        "podSelector": {"matchLabels": dict(opts.dns_selector)},
    }


_DNS_PORTS = [{"protocol": "UDP", "port": 53}, {"protocol": "TCP", "port": 53}]


def build_baseline_policy(opts: KubernetesOptions) -> dict[str, Any]:
    """Default deny for every sandbox of this instance: ingress only from the service's pods
    on the agent port, no egress. Per-sandbox policies add egress on top (policies union)."""
    return {
        "apiVersion": "networking.k8s.io/v1",
        "kind": "NetworkPolicy",
        "metadata": {
            "name": f"orchard-baseline-{opts.instance}",
            "namespace": opts.namespace,
            "labels": {**opts.extra_labels, L_INSTANCE: opts.instance},
        },
        "spec": {
            "podSelector": {"matchLabels": selector(opts)},
            "policyTypes": ["Ingress", "Egress"],
            "ingress": [
                {
                    "from": [
                        {
                            "namespaceSelector": {
                                "matchLabels": {
                                    "kubernetes.io/metadata.name": opts.service_namespace
                                }
                            },
                            "podSelector": {"matchLabels": dict(opts.service_selector)},
                        },
                        *({"ipBlock": {"cidr": c}} for c in opts.agent_ingress_cidrs),
                    ],
                    "ports": [{"protocol": "TCP", "port": opts.agent_port}],
                }
            ],
            "egress": [],
        },
    }


def build_network_policy(
    sandbox_id: str,
    policy: NetworkPolicy,
    allow: ResolvedAllow,
    opts: KubernetesOptions,
    pod_uid: str | None = None,
) -> dict[str, Any] | None:
    """The sandbox's egress as a standard NetworkPolicy (None for `none`: the baseline
    already denies everything). Host names were resolved by the caller, now."""
    if policy.egress == "none":
        return None
    if policy.egress == "all":
        egress: list[dict[str, Any]] = [{"to": ip_blocks(["0.0.0.0/0"], opts)}]
    else:
        egress = []
        blocks = ip_blocks(allow.cidrs, opts)
        if blocks:
            egress.append({"to": blocks})
        if allow.names:
            egress.append({"to": [_dns_peer(opts)], "ports": _DNS_PORTS})
    return {
        "apiVersion": "networking.k8s.io/v1",
        "kind": "NetworkPolicy",
        "metadata": _meta(sandbox_id, opts, pod_uid),
        "spec": {
            "podSelector": {"matchLabels": {L_SANDBOX: sandbox_id, **selector(opts)}},
            "policyTypes": ["Egress"],
            "egress": egress,
        },
    }


def never_reached(opts: KubernetesOptions) -> list[IPv4Network]:
    """The blocked and metadata ranges, merged."""
    nets = [ipaddress.ip_network(c, strict=False) for c in (*METADATA_CIDRS, *opts.blocked_cidrs)]
    return list(ipaddress.collapse_addresses(n for n in nets if isinstance(n, IPv4Network)))


def ip_blocks(cidrs: Sequence[str], opts: KubernetesOptions) -> list[dict[str, Any]]:
    """Allowed IPv4 CIDRs as ipBlocks with the never-reached ranges cut out: an entry inside
    one of them is dropped, one that contains some lists them under `except` (so `allow
    0.0.0.0/0` is never looser than `all`, and `all` never reaches the cluster)."""
    blocked = never_reached(opts)
    out: list[dict[str, Any]] = []
    for c in cidrs:
        net = ipaddress.ip_network(c.strip(), strict=False)
        if not isinstance(net, IPv4Network) or any(net.subnet_of(b) for b in blocked):
            continue
        inside = [str(b) for b in blocked if b.subnet_of(net) and b != net]
        out.append({"ipBlock": {"cidr": str(net), **({"except": inside} if inside else {})}})
    return out


def build_cilium_policy(
    sandbox_id: str,
    policy: NetworkPolicy,
    opts: KubernetesOptions,
    pod_uid: str | None = None,
) -> dict[str, Any] | None:
    """The same egress for Cilium: host names become toFQDNs, matched against the DNS
    answers Cilium's proxy sees, so names that change address keep working."""
    if policy.egress == "none":
        return None
    if policy.egress == "all":
        egress: list[dict[str, Any]] = [
            {"toCIDRSet": [b["ipBlock"] for b in ip_blocks(["0.0.0.0/0"], opts)]}
        ]
    else:
        cidrs: list[str] = []
        names: list[str] = []
        for entry in policy.allow:
            (cidrs if _is_cidr(entry) else names).append(entry.strip())
        egress = []
        if cidrs and (sets := [b["ipBlock"] for b in ip_blocks(cidrs, opts)]):
            egress.append({"toCIDRSet": sets})
        if names:
            egress.append({"toFQDNs": [{"matchName": n} for n in names]})
            egress.append(
                {
                    "toEndpoints": [
                        {
                            "matchLabels": {
                                "k8s:io.kubernetes.pod.namespace": opts.dns_namespace,
                                **{f"k8s:{k}": v for k, v in opts.dns_selector.items()},
                            }
                        }
                    ],
                    "toPorts": [
                        {
                            "ports": [
                                {"port": "53", "protocol": "UDP"},
                                {"port": "53", "protocol": "TCP"},
                            ],
                            "rules": {"dns": [{"matchPattern": "*"}]},
                        }
                    ],
                }
            )
    return {
        "apiVersion": "cilium.io/v2",
        "kind": "CiliumNetworkPolicy",
        "metadata": _meta(sandbox_id, opts, pod_uid),
        "spec": {
            "endpointSelector": {"matchLabels": {L_SANDBOX: sandbox_id, **selector(opts)}},
            "egress": egress,
        },
    }


def _is_cidr(entry: str) -> bool:
    try:
        ipaddress.ip_network(entry.strip(), strict=False)
    except ValueError:
        return False
    return True
