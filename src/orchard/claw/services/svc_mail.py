"""Mail: folders of messages owned by one user (`me`)."""

from common import Service, ToolError, contains, find, next_id


def _summary(m):
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

    def __init__(self, fixture):
        super().__init__(fixture)
        self.data.setdefault("me", "me@acme.test")
        self.data.setdefault("messages", [])

    def _get(self, key):
        return find(self.data["messages"], key, "message")

    def mail_list_messages(self, folder="inbox", query=None, unread_only=False, limit=50):
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

    def mail_read_message(self, id):
        message = self._get(id)
        message["read"] = True
        return dict(message)

    def mail_send_message(self, to, subject, body, cc=None, reply_to_id=None):
        for addr in [*to, *(cc or [])]:
            if "@" not in addr:
                raise ToolError(f"argument 'to'/'cc': {addr!r} is not an email address")
        if reply_to_id is not None:
            self._get(reply_to_id)
        message = {
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

    def mail_move_message(self, id, folder):
        message = self._get(id)
        message["folder"] = folder
        return _summary(message)

    def mail_delete_message(self, id):
        message = self._get(id)
        if message["folder"] == "trash":
            self.data["messages"].remove(message)
            return {"id": id, "deleted": True}
        message["folder"] = "trash"
        return {"id": id, "folder": "trash"}

    def mail_mark_read(self, id, read=True):
        message = self._get(id)
        message["read"] = read
        return {"id": id, "read": read}
