"""The webmail: folders, reading, reply/forward/compose, drafts, star, move and delete."""

from __future__ import annotations

import copy
import json
import re
from pathlib import Path
from typing import Any

from .sitekit import Request, Response, SiteBase, esc, options_html, redirect

ADDRESS = re.compile(r"^[^@\s<>,;]+@[^@\s<>,;]+\.[^@\s<>,;]+$")
VIRTUAL = ("Starred", "Sent", "Drafts")


def addresses(text: str) -> list[str]:
    """Bare, lower-case addresses from a To/Cc field: `A <a@x.y>, b@x.y` -> [a@x.y, b@x.y]."""
    out = []
    for part in re.split(r"[,;]", text):
        part = part.strip()
        m = re.search(r"<([^>]+)>", part)
        addr = (m.group(1) if m else part).strip().lower()
        if addr:
            out.append(addr)
    return out


class Mail(SiteBase):
    colour = "#1c5fb8"

    def __init__(self, data_dir: Path) -> None:
        self.data: dict[str, Any] = json.loads((data_dir / "mail.json").read_text())
        self.name = self.data["name"]
        self.reset()

    def reset(self) -> None:
        self.messages: list[dict[str, Any]] = copy.deepcopy(self.data["messages"])
        self.by_id = {m["id"]: m for m in self.messages}
        self.sent: list[dict[str, Any]] = []
        self.drafts: list[dict[str, Any]] = []

    def state(self) -> dict[str, Any]:
        keys = ("id", "folder", "read", "starred", "from", "subject")
        return copy.deepcopy(
            {
                "messages": [{k: m[k] for k in keys} for m in self.messages],
                "sent": self.sent,
                "drafts": self.drafts,
            }
        )

    def handle(self, req: Request) -> Response:
        path = req.path.rstrip("/") or "/"
        if path == "/":
            return self.folder(req, "Inbox")
        if path.startswith("/folder/"):
            return self.folder(req, path.removeprefix("/folder/"))
        if path == "/search":
            return self.folder(req, "", query=req.get("q"))
        if path == "/compose":
            return self.compose(req)
        if path == "/send":
            return self.send(req)
        parts = path.strip("/").split("/")
        if len(parts) == 2 and parts[0] == "sent" and parts[1].isdigit():
            return self.show_sent(req, int(parts[1]))
        if len(parts) in (2, 3) and parts[0] == "message":
            m = self.by_id.get(parts[1])
            if m is None:
                return self.error(req, 404, "That message does not exist.")
            if len(parts) == 2:
                return self.read(req, m)
            return self.act(req, m, parts[2])
        return self.error(req, 404, "Page not found.")

    def render(self, req: Request, title: str, body: str, query: str = "") -> Response:
        folders = [*self.data["folders"][:1], *VIRTUAL, *self.data["folders"][1:]]
        links = ""
        for f in folders:
            unread = sum(1 for m in self.messages if m["folder"] == f and not m["read"])
            count = f" <b>({unread})</b>" if unread else ""
            links += (
                f'<li><a href="{esc(req.url("/folder/" + f.lower()))}">{esc(f)}</a>{count}</li>'
            )
        side = (
            f'<nav class="panel side"><a class="button" href="{esc(req.url("/compose"))}">'
            f"&#9998; Compose</a><ul style='list-style:none;padding:0'>{links}</ul></nav>"
        )
        framed = f'<div class="layout">{side}<div class="grow">{body}</div></div>'
        return super().render(req, title, framed, query)

    def nav(self) -> list[tuple[str, str]]:
        return [("Inbox", "/"), ("Compose", "/compose")]

    def find_folder(self, name: str) -> str | None:
        folders: list[str] = [*self.data["folders"], *VIRTUAL]
        return next((f for f in folders if f.lower() == name.lower()), None)

    # ------------------------------------------------------------------ lists

    def folder(self, req: Request, name: str, query: str = "") -> Response:
        if query:
            words = query.lower().split()
            title = f"Search: {query}"
            rows = [
                m
                for m in self.messages
                if m["folder"] != "Trash"
                and all(w in f"{m['from']} {m['subject']} {m['body']}".lower() for w in words)
            ]
        else:
            folder = self.find_folder(name)
            if folder is None:
                return self.error(req, 404, f"There is no folder {name!r}.")
            if folder == "Sent":
                return self.sent_list(req)
            if folder == "Drafts":
                return self.draft_list(req)
            title = folder
            if folder == "Starred":
                rows = [m for m in self.messages if m["starred"] and m["folder"] != "Trash"]
            else:
                rows = [m for m in self.messages if m["folder"] == folder]
        notice = ""
        if req.get("done"):
            notice = f'<div class="notice">{esc(req.get("done"))}</div>'
        lines = "".join(
            f'<tr style="font-weight:{"normal" if m["read"] else "bold"}">'
            f"<td>{'&#9733;' if m['starred'] else '&#9734;'}</td>"
            f"<td>{esc(m['from'].split(' <')[0])}</td>"
            f'<td><a href="{esc(req.url("/message/" + m["id"]))}">{esc(m["subject"])}</a></td>'
            f"<td class=muted>{esc(m['date'])}</td></tr>"
            for m in rows
        )
        table = (
            f"<table><tr><th></th><th>From</th><th>Subject</th><th>Date</th></tr>{lines}</table>"
            if rows
            else "<p>No messages.</p>"
        )
        return self.render(
            req, title, f'{notice}<div class="panel"><h1>{esc(title)}</h1>{table}</div>', query
        )

    def sent_list(self, req: Request) -> Response:
        links = [req.url(f"/sent/{i}") for i in range(len(self.sent))]
        notice = "Your message was sent." if req.get("sent") else ""
        return self.outbox(req, "Sent", self.sent, links, notice)

    def draft_list(self, req: Request) -> Response:
        links = [req.url("/compose", draft=i) for i in range(len(self.drafts))]
        return self.outbox(
            req, "Drafts", self.drafts, links, "Draft saved." if req.get("saved") else ""
        )

    def outbox(
        self, req: Request, title: str, msgs: list[dict[str, Any]], links: list[str], notice: str
    ) -> Response:
        """Sent messages or drafts: recipients and subjects, each linking to `links[i]`."""
        rows = "".join(
            f'<tr><td>{esc(", ".join(m["to"]))}</td><td><a href="{esc(link)}">'
            f"{esc(m['subject'] or '(no subject)')}</a></td></tr>"
            for m, link in zip(msgs, links, strict=True)
        )
        body = (f'<div class="notice">{esc(notice)}</div>' if notice else "") + (
            f'<div class="panel"><h1>{esc(title)}</h1>'
            + (
                f"<table><tr><th>To</th><th>Subject</th></tr>{rows}</table>"
                if rows
                else "<p>Nothing here yet.</p>"
            )
            + "</div>"
        )
        return self.render(req, title, body)

    # ------------------------------------------------------------------ one message

    def read(self, req: Request, m: dict[str, Any]) -> Response:
        m["read"] = True
        star = "unstar" if m["starred"] else "star"
        label = "&#9733; Unstar" if m["starred"] else "&#9734; Star"
        moves = [(f, f) for f in self.data["folders"] if f != m["folder"]]

        def button(action: str, text: str, cls: str = "light") -> str:
            href = req.url(f"/message/{m['id']}/{action}")
            return f'<a class="button {cls}" href="{esc(href)}">{text}</a>'

        actions = (
            f'<a class="button" href="{esc(req.url("/compose", reply=m["id"]))}">Reply</a>'
            f'<a class="button" href="{esc(req.url("/compose", forward=m["id"]))}">Forward</a>'
            + button(star, label)
            + button("unread", "Mark as unread")
            + button("delete", "Delete", "danger")
            + f'<form style="display:inline-flex;gap:6px;align-items:center" method="get"'
            f' action="{esc(req.url("/message/" + m["id"] + "/move"))}">'
            '<label for="move" style="margin:0">Move to</label>'
            '<select id="move" aria-label="Move to" name="folder" style="width:auto">'
            f"{options_html(moves, '', 'Choose a folder')}"
            '</select><button type="submit" class="light">Move</button></form>'
        )
        cc = f"<br><b>Cc:</b> {esc(m['cc'])}" if m["cc"] else ""
        body = (
            f'<div class="panel"><p>{actions}</p><h1>{esc(m["subject"])}</h1>'
            f"<p><b>From:</b> {esc(m['from'])}<br><b>To:</b> {esc(m['to'])}{cc}"
            f"<br><b>Date:</b> {esc(m['date'])}<br><b>Folder:</b> {esc(m['folder'])}</p>"
            f'<div style="white-space:pre-wrap">{esc(m["body"])}</div></div>'
        )
        return self.render(req, m["subject"], body)

    def act(self, req: Request, m: dict[str, Any], action: str) -> Response:
        back = req.url("/folder/" + m["folder"].lower())
        if action == "star":
            m["starred"] = True
            return redirect(req.url("/message/" + m["id"]))
        if action == "unstar":
            m["starred"] = False
            return redirect(req.url("/message/" + m["id"]))
        if action == "unread":
            m["read"] = False
            return redirect(req.url("/folder/" + m["folder"].lower(), done="Marked as unread."))
        if action == "delete":
            m["folder"] = "Trash"
            return redirect(back + "?" + "done=Moved+to+Trash.")
        if action == "move":
            target = self.find_folder(req.get("folder"))
            if target is None or target in VIRTUAL:
                return self.error(req, 400, "Choose a folder to move the message to.")
            m["folder"] = target
            return redirect(req.url("/folder/" + target.lower(), done=f"Moved to {target}."))
        return self.error(req, 404, "Unknown action.")

    # ------------------------------------------------------------------ writing

    def compose(self, req: Request) -> Response:
        to = cc = subject = body = reply = forward = draft = ""
        if req.get("reply") in self.by_id:
            m = self.by_id[req.get("reply")]
            reply, to = m["id"], m["from"]
            subject = m["subject"] if m["subject"].startswith("Re:") else "Re: " + m["subject"]
            quoted = "\n".join("> " + line for line in m["body"].splitlines())
            body = f"\n\nOn {m['date']}, {m['from']} wrote:\n{quoted}"
        elif req.get("forward") in self.by_id:
            m = self.by_id[req.get("forward")]
            forward, subject = m["id"], "Fwd: " + m["subject"]
            body = (
                f"\n\n---------- Forwarded message ----------\nFrom: {m['from']}\n"
                f"Date: {m['date']}\nSubject: {m['subject']}\n\n{m['body']}"
            )
        elif req.get("draft").isdigit() and int(req.get("draft")) < len(self.drafts):
            d = self.drafts[int(req.get("draft"))]
            draft = req.get("draft")
            to, cc, subject, body = ", ".join(d["to"]), ", ".join(d["cc"]), d["subject"], d["body"]
            reply, forward = d["in_reply_to"] or "", d["forward_of"] or ""
        hidden = "".join(
            f'<input type="hidden" name="{k}" value="{esc(v)}">'
            for k, v in (("in_reply_to", reply), ("forward_of", forward), ("draft", draft))
            if v
        )
        form = (
            f'<form class="panel" action="{esc(req.url("/send"))}" method="get">'
            f"<h1>New message</h1>{hidden}"
            '<label for="to">To</label>'
            f'<input type="text" id="to" aria-label="To" name="to" value="{esc(to)}">'
            '<label for="cc">Cc</label>'
            f'<input type="text" id="cc" aria-label="Cc" name="cc" value="{esc(cc)}">'
            '<label for="subject">Subject</label>'
            '<input type="text" id="subject" aria-label="Subject"'
            f' name="subject" value="{esc(subject)}">'
            '<label for="body">Message</label>'
            f'<textarea id="body" aria-label="Message" name="body">{esc(body)}'
            "</textarea>"
            '<button type="submit" name="action" value="send">Send</button>'
            '<button type="submit" name="action" value="draft" class="light">Save draft'
            "</button></form>"
        )
        return self.render(req, "Compose", form)

    def send(self, req: Request) -> Response:
        to, cc = addresses(req.get("to")), addresses(req.get("cc"))
        msg: dict[str, Any] = {
            "to": to,
            "cc": cc,
            "subject": req.get("subject"),
            "body": req.params.get("body", [""])[0].replace("\r\n", "\n").strip(),
            "in_reply_to": req.get("in_reply_to") or None,
            "forward_of": req.get("forward_of") or None,
        }
        bad = [a for a in to + cc if not ADDRESS.match(a)]
        if bad:
            return self.error(req, 400, "Not a valid email address: " + ", ".join(bad))
        draft = req.get("draft")
        old = int(draft) if draft.isdigit() and int(draft) < len(self.drafts) else None
        if req.get("action") == "draft":
            if old is None:
                self.drafts.append(msg)
            else:
                self.drafts[old] = msg
            return redirect(req.url("/folder/drafts", saved=1))
        if not to:
            return self.error(req, 400, "Please enter at least one recipient in To.")
        if old is not None:
            del self.drafts[old]
        self.sent.append(msg)
        return redirect(req.url("/folder/sent", sent=1))

    def show_sent(self, req: Request, i: int) -> Response:
        if i >= len(self.sent):
            return self.error(req, 404, "No such sent message.")
        s = self.sent[i]
        body = (
            f'<div class="panel"><h1>{esc(s["subject"] or "(no subject)")}</h1>'
            f"<p><b>From:</b> {esc(self.data['me'])}<br><b>To:</b> {esc(', '.join(s['to']))}"
            f"<br><b>Cc:</b> {esc(', '.join(s['cc']))}</p>"
            f'<div style="white-space:pre-wrap">{esc(s["body"])}</div></div>'
        )
        return self.render(req, s["subject"], body)
