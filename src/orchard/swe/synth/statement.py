"""Problem statements for synthesized tasks: by a model when one is configured, else a template.

The model gets SWE-smith's issue-writing brief (describe the symptom as a user would report
it: what was called, what came back, what was expected; never the fix or the code change)
with the failing tests' names, their assertion messages and the bug's diff for context.
Its answer is kept only when it shares no changed line with the patch and holds no diff;
otherwise, or when the model fails, the template is used.
"""

from __future__ import annotations

import os
from collections.abc import Sequence

from orchard.llm.client import ChatModel, ModelError, OpenAIModel
from orchard.swe.synth.rows import leaks, messages, statement

PROMPT = """You are writing a GitHub issue for the Python project {name} {version}.
A change broke it; these tests of its own suite now fail:

{failures}

For your understanding only, this is the change that introduced the bug (do NOT quote it,
do NOT name the lines it changes, do NOT say how to fix it):

```diff
{bug}
```

Write the issue as a user who hit the problem would: a short title line, then what they
called, what happened and what they expected, with a minimal example if you can. Describe
the symptom only. No diff, no patch, no suggested fix. Answer with the issue text only."""


def model_from_env() -> ChatModel | None:
    """The model at $ORCHARD_MODEL_URL ($ORCHARD_MODEL_NAME), or None."""
    url = os.environ.get("ORCHARD_MODEL_URL")
    if not url:
        return None
    return OpenAIModel(url, name=os.environ.get("ORCHARD_MODEL_NAME", "default"), max_tokens=800)


def write(
    name: str,
    version: str,
    fail_to_pass: Sequence[str],
    log: str,
    gold_patch: str,
    bug_patch: str,
    model: ChatModel | None,
) -> tuple[str, str]:
    """(statement, how it was written: `model` or `template`)."""
    template = statement(name, version, fail_to_pass, log, gold_patch)
    if model is None:
        return template, "template"
    msgs = messages(log, fail_to_pass)
    failures = "\n".join(f"- {t}" + (f": {msgs[t]}" if t in msgs else "") for t in fail_to_pass[:8])
    prompt = PROMPT.format(name=name, version=version, failures=failures, bug=bug_patch)
    try:
        reply = model.query([{"role": "user", "content": prompt}])
    except ModelError:
        return template, "template"
    text = str(reply.message.get("content") or "").strip()
    if not text or "diff --git" in text or "@@ " in text or leaks(text, gold_patch):
        return template, "template"
    return text + "\n", "model"
