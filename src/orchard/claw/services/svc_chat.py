"""Team chat: channels with history, direct messages, users."""

from __future__ import annotations

from .common import Item, Service, ToolError


class Chat(Service):
    name = "chat"

    def __init__(self, fixture: Item) -> None:
        super().__init__(fixture)
        self.data.setdefault("me", "me")
        self.data.setdefault("users", [])
        self.data.setdefault("channels", [])
        self.data.setdefault("dms", {})  # handle -> [message]

    def _channel(self, name: str) -> Item:
        key = name.lstrip("#").lower()
        for channel in self.data["channels"]:
            if channel["name"] == key:
                found: Item = channel
                return found
        known = ", ".join(c["name"] for c in self.data["channels"])
        raise ToolError(f"no channel '{name}' (channels: {known})", 404)

    def _user(self, handle: str) -> str:
        key = handle.lstrip("@").lower()
        if any(u["handle"] == key for u in self.data["users"]):
            return key
        raise ToolError(f"no user '{handle}' (see chat_list_users)", 404)

    def _message(self, thread: list[Item], prefix: str, text: str) -> Item:
        return {
            "id": f"{prefix}-{len(thread) + 1:03d}",
            "user": self.data["me"],
            "text": text,
            "ts": self.tick(),
        }

    def chat_list_channels(self) -> Item:
        return {
            "channels": [
                {
                    "name": c["name"],
                    "topic": c.get("topic", ""),
                    "members": len(c.get("members", [])),
                    "messages": len(c.get("messages", [])),
                }
                for c in self.data["channels"]
            ]
        }

    def chat_read_channel(self, channel: str, limit: int = 20) -> Item:
        c = self._channel(channel)
        return {"channel": c["name"], "messages": [dict(m) for m in c["messages"][-limit:]]}

    def chat_post_message(self, channel: str, text: str) -> Item:
        c = self._channel(channel)
        message = self._message(c["messages"], c["name"], text)
        c["messages"].append(message)
        return {"channel": c["name"], **message}

    def chat_send_dm(self, user: str, text: str) -> Item:
        handle = self._user(user)
        thread: list[Item] = self.data["dms"].setdefault(handle, [])
        message = self._message(thread, "dm-" + handle, text)
        thread.append(message)
        return {"to": handle, **message}

    def chat_read_dm(self, user: str, limit: int = 20) -> Item:
        handle = self._user(user)
        return {
            "user": handle,
            "messages": [dict(m) for m in self.data["dms"].get(handle, [])[-limit:]],
        }

    def chat_list_users(self) -> Item:
        return {"users": [dict(u) for u in self.data["users"]]}
