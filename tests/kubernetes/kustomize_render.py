"""A small offline renderer for the subset of kustomize that deploy/kubernetes uses.

kubectl is not installed on the test machines, so the tests render the manifests with
this and validate the result. It supports `resources` (files and folders with their own
kustomization), `labels` (with `includeSelectors: false`), `images` and `patches` given by
`path` (strategic merge: maps merge, lists of named items merge by `name`, other lists are
replaced). Any other kustomization field is an error, so the manifests cannot silently
outgrow what is tested.
"""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import yaml

Obj = dict[str, Any]
SUPPORTED = {"apiVersion", "kind", "resources", "labels", "images", "patches"}


class RenderError(ValueError):
    pass


def load_docs(path: Path) -> list[Obj]:
    return [d for d in yaml.safe_load_all(path.read_text()) if d]


def _merge(base: Any, patch: Any) -> Any:
    if isinstance(base, dict) and isinstance(patch, dict):
        out = dict(base)
        for k, v in patch.items():
            out[k] = _merge(base.get(k), v) if k in base else copy.deepcopy(v)
        return out
    if (
        isinstance(base, list)
        and isinstance(patch, list)
        and all(isinstance(x, dict) and "name" in x for x in [*base, *patch])
    ):
        out_list = [copy.deepcopy(x) for x in base]
        for item in patch:
            for i, existing in enumerate(out_list):
                if existing["name"] == item["name"]:
                    out_list[i] = _merge(existing, item)
                    break
            else:
                out_list.append(copy.deepcopy(item))
        return out_list
    return copy.deepcopy(patch)


def _key(obj: Obj) -> tuple[str, str, str]:
    meta = obj.get("metadata") or {}
    return obj["kind"], meta.get("namespace", ""), meta["name"]


def _containers(obj: Obj) -> list[Obj]:
    spec = obj.get("spec") or {}
    pod = (spec.get("template") or {}).get("spec") or spec
    return [*(pod.get("containers") or []), *(pod.get("initContainers") or [])]


def render(folder: Path) -> list[Obj]:
    """The objects `kubectl kustomize folder` would print (for the supported subset)."""
    kfile = folder / "kustomization.yaml"
    if not kfile.is_file():
        raise RenderError(f"{folder} has no kustomization.yaml")
    kust = yaml.safe_load(kfile.read_text())
    unknown = set(kust) - SUPPORTED
    if unknown:
        raise RenderError(f"{kfile}: unsupported fields {sorted(unknown)}")
    objects: list[Obj] = []
    for entry in kust.get("resources") or []:
        target = (folder / entry).resolve()
        objects.extend(render(target) if target.is_dir() else load_docs(target))
    keys = [_key(o) for o in objects]
    if len(keys) != len(set(keys)):
        raise RenderError(f"{folder}: duplicate objects")
    for patch_entry in kust.get("patches") or []:
        if set(patch_entry) != {"path"}:
            raise RenderError(f"{kfile}: only `path` patches are supported")
        for patch in load_docs(folder / patch_entry["path"]):
            idx = [i for i, o in enumerate(objects) if _key(o) == _key(patch)]
            if len(idx) != 1:
                raise RenderError(f"{kfile}: patch target {_key(patch)} not found")
            objects[idx[0]] = _merge(objects[idx[0]], patch)
    for image in kust.get("images") or []:
        for obj in objects:
            for c in _containers(obj):
                name, _, tag = c["image"].partition(":")
                if name == image["name"]:
                    c["image"] = f"{image.get('newName', name)}:{image.get('newTag', tag)}"
    for label in kust.get("labels") or []:
        if label.get("includeSelectors", False) or label.get("includeTemplates", False):
            raise RenderError(f"{kfile}: only labels without selectors/templates are supported")
        for obj in objects:
            obj.setdefault("metadata", {}).setdefault("labels", {}).update(label["pairs"])
    return objects
