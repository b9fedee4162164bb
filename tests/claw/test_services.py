"""Every mock service through its HTTP API in a real sandbox: tools, validation, state,
reset, audit, admin auth and injected faults."""

from __future__ import annotations

import time
from typing import Any

import pytest

from orchard import Orchard
from orchard.claw.world import PORT, TOKEN_HEADER, World, WorldError


def ok(world: World, tool: str, **args: Any) -> Any:
    r = world.call(tool, args)
    assert r.ok and r.status == 200, (tool, r.error)
    return r.result


def err(world: World, tool: str, code: int = 400, **args: Any) -> str:
    r = world.call(tool, args)
    assert not r.ok and r.status == code, (tool, r)
    assert r.error
    return r.error


def ids(items: list[dict[str, Any]]) -> list[str]:
    return [i["id"] for i in items]


def test_mail(claw_world: World) -> None:
    w = claw_world
    inbox = ok(w, "mail_list_messages")["messages"]
    assert len(inbox) == 13 and inbox[0]["id"] == "m-013"  # newest first
    assert ids(ok(w, "mail_list_messages", query="globex")["messages"]) == ["m-010", "m-004"]
    unread = ok(w, "mail_list_messages", unread_only=True, limit=100)["messages"]
    assert "m-004" in ids(unread) and "m-002" not in ids(unread)
    assert ids(ok(w, "mail_list_messages", folder="sent")["messages"]) == ["m-014"]

    assert ok(w, "mail_read_message", id="m-004")["subject"] == "Renewal quote request"
    sent = ok(
        w,
        "mail_send_message",
        to=["jordan.blake@globex.test"],
        cc=["sam.patel@acme.test"],
        subject="Re: Renewal quote request",
        body="50 seats at $34/seat/month: $20,400 per year.",
        reply_to_id="m-004",
    )
    assert sent["id"] == "m-016" and sent["folder"] == "sent"
    ok(w, "mail_move_message", id="m-006", folder="archive")
    ok(w, "mail_delete_message", id="m-011")
    ok(w, "mail_mark_read", id="m-002", read=False)
    assert ok(w, "mail_delete_message", id="m-015") == {"id": "m-015", "folder": "trash"}
    assert ok(w, "mail_delete_message", id="m-015") == {"id": "m-015", "deleted": True}

    msgs = {m["id"]: m for m in w.state()["mail"]["messages"]}
    assert msgs["m-004"]["read"] is True
    assert msgs["m-016"]["to"] == ["jordan.blake@globex.test"]
    assert msgs["m-016"]["from"] == "alex.kim@acme.test"
    assert msgs["m-016"]["reply_to_id"] == "m-004"
    assert (msgs["m-006"]["folder"], msgs["m-011"]["folder"]) == ("archive", "trash")
    assert msgs["m-002"]["read"] is False and "m-015" not in msgs

    assert "'to'" in err(w, "mail_send_message", to=[], subject="s", body="b")
    assert "'to'" in err(w, "mail_send_message", to="a@b.test", subject="s", body="b")
    assert "'to'" in err(w, "mail_send_message", to=["not-an-address"], subject="s", body="b")
    assert "'id'" in err(w, "mail_read_message")
    assert "'limit'" in err(w, "mail_list_messages", limit=0)
    assert "'colour'" in err(w, "mail_mark_read", id="m-001", colour="red")
    assert "m-999" in err(w, "mail_read_message", 404, id="m-999")


def test_calendar(claw_world: World) -> None:
    w = claw_world
    thursday = ok(w, "calendar_list_events", start="2026-03-05", end="2026-03-06")["events"]
    assert ids(thursday) == ["e-007", "e-008"]
    assert len(ok(w, "calendar_list_events")["events"]) == 10
    assert ok(w, "calendar_get_event", id="e-009")["title"] == "Globex renewal call"

    slots = ok(
        w,
        "calendar_find_free_slots",
        date="2026-03-04",
        duration_minutes=30,
        attendees=["dana.lee@acme.test", "priya.shah@acme.test"],
    )["slots"]
    assert slots == [
        {"start": "2026-03-04T09:30", "end": "2026-03-04T10:00"},
        {"start": "2026-03-04T13:00", "end": "2026-03-04T14:00"},
        {"start": "2026-03-04T15:30", "end": "2026-03-04T17:00"},
    ]
    long = ok(w, "calendar_find_free_slots", date="2026-03-04", duration_minutes=90)["slots"]
    assert long == [
        {"start": "2026-03-04T09:30", "end": "2026-03-04T12:00"},
        {"start": "2026-03-04T13:00", "end": "2026-03-04T17:00"},
    ]

    made = ok(
        w,
        "calendar_create_event",
        title="Offsite planning",
        start="2026-03-04T13:00",
        end="2026-03-04T13:30",
        attendees=["dana.lee@acme.test", "priya.shah@acme.test"],
    )
    assert made["id"] == "e-011"
    moved = ok(
        w, "calendar_update_event", id="e-002", start="2026-03-02T15:00", end="2026-03-02T15:30"
    )
    assert moved["title"] == "1:1 with Grace"
    ok(w, "calendar_delete_event", id="e-010")
    events = {e["id"]: e for e in w.state()["calendar"]["events"]}
    assert events["e-011"]["attendees"] == ["dana.lee@acme.test", "priya.shah@acme.test"]
    assert events["e-002"]["start"] == "2026-03-02T15:00" and "e-010" not in events

    assert "'end'" in err(
        w, "calendar_create_event", title="x", start="2026-03-04T10:00", end="2026-03-04T09:00"
    )
    assert "'start'" in err(
        w, "calendar_create_event", title="x", start="tomorrow", end="2026-03-04T09:00"
    )
    assert "'duration_minutes'" in err(
        w, "calendar_find_free_slots", date="2026-03-04", duration_minutes="30"
    )
    assert "e-404" in err(w, "calendar_get_event", 404, id="e-404")


def test_contacts(claw_world: World) -> None:
    w = claw_world
    eng = ok(w, "contacts_search", query="engineering")["contacts"]
    assert ids(eng) == ["c-001", "c-003", "c-008"]
    assert len(ok(w, "contacts_search", query="")["contacts"]) == 12
    assert ok(w, "contacts_get", id="c-011")["company"] == "Globex"
    made = ok(
        w, "contacts_create", name="Kai Muller", email="kai.muller@acme.test", team="Engineering"
    )
    assert made["id"] == "c-013"
    ok(w, "contacts_update", id="c-005", phone="+1 555 0999")
    ok(w, "contacts_delete", id="c-012")
    contacts = {c["id"]: c for c in w.state()["contacts"]["contacts"]}
    assert (
        contacts["c-013"]["team"] == "Engineering" and contacts["c-005"]["phone"] == "+1 555 0999"
    )
    assert "c-012" not in contacts
    assert "'name'" in err(w, "contacts_create", email="x@acme.test")
    assert "c-012" in err(w, "contacts_get", 404, id="c-012")


def test_files(claw_world: World) -> None:
    w = claw_world
    root = ok(w, "files_list", path="/")["entries"]
    assert [e["name"] for e in root] == ["docs", "finance", "hr", "it", "meeting-notes", "sales"]
    docs = {e["name"]: e["type"] for e in ok(w, "files_list", path="/docs")["entries"]}
    assert docs["offsite"] == "dir" and docs["roadmap-2026.md"] == "file"
    assert "Lakeside Lodge" in ok(w, "files_read", path="/docs/offsite/venues.md")["content"]
    assert ok(w, "files_write", path="/docs/offsite/choice.md", content="Lakeside Lodge")["created"]
    ok(w, "files_move", src="/docs/offsite", dst="/archive/offsite-2026")
    ok(w, "files_delete", path="/hr")
    found = ok(w, "files_search", query="globex")["results"]
    assert [f["path"] for f in found] == ["/sales/globex-pricing.md"]
    files = w.state()["files"]["files"]
    assert files["/archive/offsite-2026/choice.md"] == "Lakeside Lodge"
    assert not any(p.startswith(("/docs/offsite/", "/hr/")) for p in files)

    assert "'path'" in err(w, "files_read", path="docs/roadmap-2026.md")
    assert "folder" in err(w, "files_read", 404, path="/docs")
    assert "'dst'" in err(
        w, "files_move", 409, src="/it/vpn-setup.md", dst="/sales/globex-pricing.md"
    )
    assert "'query'" in err(w, "files_search", query="")


def test_notes_and_todos(claw_world: World) -> None:
    w = claw_world
    assert ids(ok(w, "notes_list", tag="globex")["notes"]) == ["n-002"]
    assert "15%" in ok(w, "notes_get", id="n-002")["body"]
    note = ok(w, "notes_create", title="Quote sent", body="Sent on 2026-03-04", tags=["globex"])
    assert note["id"] == "n-005" and note["updated"] == "2026-03-04T10:00"
    ok(w, "notes_update", id="n-001", body="Lakeside Lodge it is.")
    ok(w, "notes_delete", id="n-004")

    assert ids(ok(w, "todo_list", status="open")["todos"]) == [
        "t-002",
        "t-004",
        "t-006",
        "t-001",
        "t-003",
    ]
    todo = ok(w, "todo_add", title="Send offsite invite", due="2026-03-09", priority="high")
    assert todo == {
        "id": "t-007",
        "title": "Send offsite invite",
        "due": "2026-03-09",
        "priority": "high",
        "status": "open",
    }
    ok(w, "todo_complete", id="t-002")
    ok(w, "todo_delete", id="t-005")
    state = w.state()["notes"]
    notes = {n["id"]: n for n in state["notes"]}
    todos = {t["id"]: t for t in state["todos"]}
    assert notes["n-001"]["body"] == "Lakeside Lodge it is." and "n-004" not in notes
    assert todos["t-002"]["status"] == "done" and "t-005" not in todos and "t-007" in todos

    assert "'priority'" in err(w, "todo_add", title="x", priority="urgent")
    assert "'due'" in err(w, "todo_add", title="x", due="next week")
    assert "'status'" in err(w, "todo_list", status="pending")
    assert "n-404" in err(w, "notes_get", 404, id="n-404")


def test_chat(claw_world: World) -> None:
    w = claw_world
    channels = ok(w, "chat_list_channels")["channels"]
    assert [c["name"] for c in channels] == ["general", "engineering", "random"]
    last = ok(w, "chat_read_channel", channel="#engineering", limit=2)["messages"]
    assert [m["user"] for m in last] == ["lena", "marco"]
    posted = ok(w, "chat_post_message", channel="general", text="Offsite venue booked!")
    assert posted["id"] == "general-006" and posted["user"] == "alex"
    dm = ok(w, "chat_send_dm", user="@dana", text="Sure, Thursday 13:00?")
    assert dm["to"] == "dana" and dm["id"] == "dm-dana-002"
    assert [m["user"] for m in ok(w, "chat_read_dm", user="dana")["messages"]] == ["dana", "alex"]
    assert len(ok(w, "chat_list_users")["users"]) == 11
    state = w.state()["chat"]
    assert state["channels"][0]["messages"][-1]["text"] == "Offsite venue booked!"
    assert state["dms"]["dana"][-1]["text"] == "Sure, Thursday 13:00?"

    assert "general" in err(w, "chat_read_channel", 404, channel="marketing")  # lists channels
    assert "'text'" in err(w, "chat_post_message", channel="general", text="")
    assert "zed" in err(w, "chat_send_dm", 404, user="zed", text="hi")


def test_search(claw_world: World) -> None:
    w = claw_world
    hits = ok(w, "search_web", query="phishing email password")["results"]
    assert [h["url"] for h in hits] == [
        "https://security.test/phishing",
        "https://security.test/passwords",
    ]
    assert hits[0]["score"] > hits[1]["score"] > 0
    assert len(ok(w, "search_web", query="offsite catering", k=3)["results"]) == 3
    assert (
        ok(w, "search_web", query="best pizza")["results"][0]["title"] == "Best pizza in Metro City"
    )
    assert ok(w, "search_web", query="zzzz qqqq")["results"] == []
    page = ok(w, "search_fetch_page", url=hits[0]["url"])
    assert "never ask for your password" in page["text"]
    assert "'k'" in err(w, "search_web", query="pizza", k=0)
    assert "not found" in err(w, "search_fetch_page", 404, url="https://nowhere.test/")


def test_reset_restores_defaults_and_takes_a_seed(claw_world: World) -> None:
    w = claw_world
    before = w.state()
    ok(w, "mail_send_message", to=["a@acme.test"], subject="s", body="b")
    ok(w, "files_delete", path="/docs")
    ok(w, "todo_complete", id="t-001")
    assert w.state() != before
    w.reset()
    assert w.state() == before and w.audit() == []

    seed = {"contacts": {"contacts": [{"id": "c-001", "name": "Only One", "email": "o@x.test"}]}}
    w.reset(seed)
    state = w.state()
    assert state["contacts"]["contacts"] == seed["contacts"]["contacts"]
    assert state["mail"] == before["mail"]  # services not named keep their default fixture
    assert ok(w, "contacts_create", name="Second")["id"] == "c-002"
    with pytest.raises(WorldError, match="bogus"):
        w.reset({"bogus": {}})


def test_audit_lists_calls_in_order(claw_world: World) -> None:
    w = claw_world
    ok(w, "contacts_get", id="c-001")
    err(w, "contacts_get", 404, id="c-999")
    err(w, "todo_add", title="")
    entries = w.audit()
    assert [e["seq"] for e in entries] == [1, 2, 3]
    assert [
        (e["service"], e["op"], e["args"], e["status"], e["ok"], e["fault"]) for e in entries
    ] == [
        ("contacts", "contacts_get", {"id": "c-001"}, 200, True, None),
        ("contacts", "contacts_get", {"id": "c-999"}, 404, False, None),
        ("notes", "todo_add", {"title": ""}, 400, False, None),
    ]
    assert entries[0]["result"]["name"] == "Dana Lee" and entries[1]["result"] is None
    assert entries[0]["ts"] <= entries[1]["ts"] <= entries[2]["ts"]


def test_admin_routes_need_the_token(claw_world: World, claw_client: Orchard) -> None:
    http, sb = claw_client.http, claw_world.sandbox
    for headers in ({}, {TOKEN_HEADER: "wrong"}):
        assert http.get(sb.port_url(PORT, "admin/audit"), headers=headers).status_code == 404
        assert http.get(sb.port_url(PORT, "admin/state"), headers=headers).status_code == 404
        r = http.post(sb.port_url(PORT, "admin/reset"), json={}, headers=headers)
        assert r.status_code == 404
        faults = [{"service": "mail", "op": "mail_read_message"}]
        r = http.post(sb.port_url(PORT, "admin/faults"), json=faults, headers=headers)
        assert r.status_code == 404
    assert w_calls_still_work(claw_world)
    assert claw_world.audit()[-1]["op"] == "mail_list_messages"


def w_calls_still_work(world: World) -> bool:
    """No admin request above took effect: a normal call answers normally."""
    return world.call("mail_list_messages", {"limit": 1}).ok


def test_unknown_tool_and_bad_json(claw_world: World, claw_client: Orchard) -> None:
    r = claw_world.call("mail_launch_rockets", {})
    assert (r.ok, r.status) == (False, 404) and "unknown tool 'mail_launch_rockets'" in (
        r.error or ""
    )
    url = claw_world.sandbox.port_url(PORT, "tools/mail_read_message")
    bad = claw_client.http.post(
        url, content=b"{not json", headers={"Content-Type": "application/json"}
    )
    assert bad.status_code == 400 and bad.json()["ok"] is False and "JSON" in bad.json()["error"]
    not_object = claw_client.http.post(url, json=["m-001"])
    assert not_object.status_code == 400 and "object" in not_object.json()["error"]
    assert [(e["op"], e["args"], e["status"]) for e in claw_world.audit()] == [
        ("mail_read_message", None, 400),
        ("mail_read_message", ["m-001"], 400),
    ]


def test_error_faults_fail_count_calls_then_recover(claw_world: World) -> None:
    w = claw_world
    w.inject_faults([{"service": "calendar", "op": "calendar_list_events", "count": 2}])
    for _ in range(2):
        r = w.call("calendar_list_events", {})
        assert (r.ok, r.status, r.error) == (False, 503, "service temporarily unavailable")
    assert ok(w, "calendar_get_event", id="e-001")  # other ops are not affected
    assert len(ok(w, "calendar_list_events")["events"]) == 10
    assert [(e["op"], e["status"], e["fault"]) for e in w.audit()] == [
        ("calendar_list_events", 503, "error"),
        ("calendar_list_events", 503, "error"),
        ("calendar_get_event", 200, None),
        ("calendar_list_events", 200, None),
    ]
    with pytest.raises(WorldError, match="mail_send_message"):
        w.inject_faults([{"service": "calendar", "op": "mail_send_message"}])


def test_timeout_fault_holds_the_call_then_504(claw_world: World) -> None:
    w = claw_world
    w.inject_faults([{"service": "search", "op": "search_web", "kind": "timeout"}])
    started = time.monotonic()
    r = w.call("search_web", {"query": "pizza"})
    held = time.monotonic() - started
    assert (r.ok, r.status) == (False, 504) and "timed out" in (r.error or "")
    assert held >= 0.5  # the world's delay (conftest)
    assert ok(w, "search_web", query="pizza")["results"]
    assert [e["fault"] for e in w.audit()] == ["timeout", None]
