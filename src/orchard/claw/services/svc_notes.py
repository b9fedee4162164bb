"""Notes and a to-do list (the `notes` service serves both notes_* and todo_* tools)."""

from __future__ import annotations

from typing import Any

from .common import Item, Service, find, next_id, parse_time

PRIORITY = {"high": 0, "medium": 1, "low": 2}


class Notes(Service):
    name = "notes"

    def __init__(self, fixture: Item) -> None:
        super().__init__(fixture)
        self.data.setdefault("notes", [])
        self.data.setdefault("todos", [])

    def notes_list(self, tag: str | None = None) -> Item:
        found = [n for n in self.data["notes"] if tag is None or tag in n.get("tags", [])]
        return {
            "notes": [
                {k: n.get(k) for k in ("id", "title", "tags", "updated")}
                for n in sorted(found, key=lambda n: n["id"])
            ]
        }

    def notes_get(self, id: str) -> Item:
        return dict(find(self.data["notes"], id, "note"))

    def notes_create(self, title: str, body: str, tags: list[str] | None = None) -> Item:
        note = {
            "id": next_id("n", self.data["notes"]),
            "title": title,
            "body": body,
            "tags": list(tags or []),
            "updated": self.tick(),
        }
        self.data["notes"].append(note)
        return dict(note)

    def notes_update(self, id: str, **changes: Any) -> Item:
        note = find(self.data["notes"], id, "note")
        note.update(changes)
        note["updated"] = self.tick()
        return dict(note)

    def notes_delete(self, id: str) -> Item:
        self.data["notes"].remove(find(self.data["notes"], id, "note"))
        return {"id": id, "deleted": True}

    def todo_list(self, status: str = "all") -> Item:
        found = [t for t in self.data["todos"] if status in ("all", t["status"])]
        found.sort(key=lambda t: (t.get("due") or "9999", PRIORITY.get(t["priority"], 1), t["id"]))
        return {"todos": [dict(t) for t in found]}

    def todo_add(self, title: str, due: str | None = None, priority: str = "medium") -> Item:
        if due is not None:
            due = parse_time(due, "due").date().isoformat()
        todo = {
            "id": next_id("t", self.data["todos"]),
            "title": title,
            "due": due,
            "priority": priority,
            "status": "open",
        }
        self.data["todos"].append(todo)
        return dict(todo)

    def todo_complete(self, id: str) -> Item:
        todo = find(self.data["todos"], id, "to-do")
        todo["status"] = "done"
        return dict(todo)

    def todo_delete(self, id: str) -> Item:
        self.data["todos"].remove(find(self.data["todos"], id, "to-do"))
        return {"id": id, "deleted": True}
