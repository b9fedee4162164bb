"""Calendar: the user's events, other people's busy times, and free-slot search."""

from __future__ import annotations

import datetime as dt
from typing import Any

from .common import Item, Service, ToolError, find, fmt_time, next_id, parse_time


class Calendar(Service):
    name = "calendar"

    def __init__(self, fixture: Item) -> None:
        super().__init__(fixture)
        self.data.setdefault("owner", "me@acme.test")
        self.data.setdefault("working_hours", ["09:00", "17:00"])
        self.data.setdefault("events", [])
        self.data.setdefault("busy", {})  # email -> [{"start", "end"}]: others' calendars

    def _get(self, key: str) -> Item:
        return find(self.data["events"], key, "event")

    def _check_span(self, start: str, end: str) -> tuple[str, str]:
        s, e = parse_time(start, "start"), parse_time(end, "end")
        if e <= s:
            raise ToolError(f"argument 'end': {end!r} must be after start {start!r}")
        return fmt_time(s), fmt_time(e)

    def calendar_list_events(self, start: str | None = None, end: str | None = None) -> Item:
        lo = parse_time(start, "start") if start else dt.datetime.min
        hi = parse_time(end, "end") if end else dt.datetime.max
        found = [
            ev
            for ev in self.data["events"]
            if parse_time(ev["start"], "start") < hi and parse_time(ev["end"], "end") > lo
        ]
        found.sort(key=lambda ev: (ev["start"], ev["id"]))
        return {"events": [dict(ev) for ev in found]}

    def calendar_get_event(self, id: str) -> Item:
        return dict(self._get(id))

    def calendar_create_event(
        self,
        title: str,
        start: str,
        end: str,
        attendees: list[str] | None = None,
        location: str = "",
        description: str = "",
    ) -> Item:
        start, end = self._check_span(start, end)
        event = {
            "id": next_id("e", self.data["events"]),
            "title": title,
            "start": start,
            "end": end,
            "attendees": list(attendees or []),
            "location": location,
            "description": description,
        }
        self.data["events"].append(event)
        return dict(event)

    def calendar_update_event(self, id: str, **changes: Any) -> Item:
        event = self._get(id)
        merged = {**event, **changes}
        start, end = self._check_span(merged["start"], merged["end"])
        event.update(changes)
        event["start"], event["end"] = start, end
        return dict(event)

    def calendar_delete_event(self, id: str) -> Item:
        self.data["events"].remove(self._get(id))
        return {"id": id, "deleted": True}

    def calendar_find_free_slots(
        self, date: str, duration_minutes: int, attendees: list[str] | None = None
    ) -> Item:
        day = parse_time(date, "date").date()
        opens, closes = (dt.time.fromisoformat(t) for t in self.data["working_hours"])
        lo, hi = dt.datetime.combine(day, opens), dt.datetime.combine(day, closes)
        spans = [(ev["start"], ev["end"]) for ev in self.data["events"]]
        for person in set(attendees or []):
            spans += [(b["start"], b["end"]) for b in self.data["busy"].get(person, [])]
        clipped = [
            (max(lo, parse_time(s, "start")), min(hi, parse_time(e, "end"))) for s, e in spans
        ]
        busy = sorted((s, e) for s, e in clipped if s < e)  # only what falls inside the day
        free, cursor = [], lo
        for s, e in busy:
            if s > cursor:
                free.append((cursor, s))
            cursor = max(cursor, e)
        if cursor < hi:
            free.append((cursor, hi))
        need = dt.timedelta(minutes=duration_minutes)
        return {
            "date": day.isoformat(),
            "slots": [{"start": fmt_time(s), "end": fmt_time(e)} for s, e in free if e - s >= need],
        }
