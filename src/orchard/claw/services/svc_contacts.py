"""Contacts: the company address book."""

from __future__ import annotations

from typing import Any

from .common import Item, Service, contains, find, next_id

FIELDS = ("name", "email", "phone", "company", "title", "team", "notes")


class Contacts(Service):
    name = "contacts"

    def __init__(self, fixture: Item) -> None:
        super().__init__(fixture)
        self.data.setdefault("contacts", [])

    def _get(self, key: str) -> Item:
        return find(self.data["contacts"], key, "contact")

    def contacts_search(self, query: str) -> Item:
        found = [
            c
            for c in self.data["contacts"]
            if not query.strip()
            or contains([c.get(f) for f in ("name", "email", "company", "title", "team")], query)
        ]
        return {"contacts": [dict(c) for c in sorted(found, key=lambda c: c["id"])]}

    def contacts_get(self, id: str) -> Item:
        return dict(self._get(id))

    def contacts_create(self, name: str, **fields: Any) -> Item:
        contact = {"id": next_id("c", self.data["contacts"]), "name": name}
        contact.update({f: fields.get(f, "") for f in FIELDS if f != "name"})
        self.data["contacts"].append(contact)
        return dict(contact)

    def contacts_update(self, id: str, **changes: Any) -> Item:
        contact = self._get(id)
        contact.update(changes)
        return dict(contact)

    def contacts_delete(self, id: str) -> Item:
        self.data["contacts"].remove(self._get(id))
        return {"id": id, "deleted": True}
