"""Mail: folders of messages owned by one user (`me`)."""

from __future__ import annotations

from .common import Item, Service, ToolError, contains, find, next_id


def _summary(m: Item) -> Item:
    body = m.get("body", "")
    return {
        "id": m["id"],
        "folder": m["folder"],
        "from": m["from"],
        "to": m.get("to", []),
        "subject": m.get("subject", ""),
        "date": m.get("date", ""),
        "read": m.get("read", False),
        "snippet": body[:80] + ("..." if len(body) > 80 else ""),
    }


class Mail(Service):
    name = "mail"

    def __init__(self, fixture: Item) -> None:
        super().__init__(fixture)
        self.data.setdefault("me", "me@acme.test")
        self.data.setdefault("messages", [])

    def _get(self, key: str) -> Item:
        return find(self.data["messages"], key, "message")

    def mail_list_messages(
        self,
        folder: str = "inbox",
        query: str | None = None,
        unread_only: bool = False,
        limit: int = 50,
    ) -> Item:
        found = [
            m
            for m in self.data["messages"]
            if m["folder"] == folder
            and not (unread_only and m.get("read"))
            and (
                not query
                or contains([m["from"], *m.get("to", []), m.get("subject"), m.get("body")], query)
            )
        ]
        found.sort(key=lambda m: (m.get("date", ""), m["id"]), reverse=True)
        return {"folder": folder, "messages": [_summary(m) for m in found[:limit]]}

    def mail_read_message(self, id: str) -> Item:
        message = self._get(id)
        message["read"] = True
        return dict(message)

    def mail_send_message(
        self,
        to: list[str],
        subject: str,
        body: str,
        cc: list[str] | None = None,
        reply_to_id: str | None = None,
    ) -> Item:
        for addr in [*to, *(cc or [])]:
            if "@" not in addr:
                raise ToolError(f"argument 'to'/'cc': {addr!r} is not an email address")
        if reply_to_id is not None:
            self._get(reply_to_id)
        message: Item = {
            "id": next_id("m", self.data["messages"]),
            "folder": "sent",
            "from": self.data["me"],
            "to": list(to),
            "cc": list(cc or []),
            "subject": subject,
            "body": body,
            "date": self.tick(),
            "read": True,
        }
        if reply_to_id is not None:
            message["reply_to_id"] = reply_to_id
        self.data["messages"].append(message)
        return {"id": message["id"], "folder": "sent", "date": message["date"]}

    def mail_move_message(self, id: str, folder: str) -> Item:
        message = self._get(id)
        message["folder"] = folder
        return _summary(message)

    def mail_delete_message(self, id: str) -> Item:
        message = self._get(id)
        if message["folder"] == "trash":
            self.data["messages"].remove(message)
            return {"id": id, "deleted": True}
        message["folder"] = "trash"
        return {"id": id, "folder": "trash"}

    def mail_mark_read(self, id: str, read: bool = True) -> Item:
        message = self._get(id)
        message["read"] = read
        return {"id": id, "read": read}
