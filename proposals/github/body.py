"""Issue bodies: the site's managed block, and reading Marin's sections into proposal fields.

The site writes only between ``<!-- marin-site:start -->`` and ``<!-- marin-site:end -->``;
every character outside stays as people wrote it. Reading goes the other way: the text
outside the block is split at its ``##``/``###`` headings, and the headings Marin's issue
templates use fill proposal fields.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field
from typing import Any

START = "<!-- marin-site:start -->"
END = "<!-- marin-site:end -->"
MARKER_PREFIX = "<!-- marin-site:"

EXPERIMENT_LABELS = frozenset({"experiment", "experiments", "community-experiment-submission"})

# Heading (lowercased; emphasis, numbering and a trailing colon dropped) -> proposal field.
# Where two headings fill one field, the first one in the issue wins.
SECTION_FIELDS = {
    "description": "description",
    "summary": "summary",
    "overview": "description",
    "motivation": "description",
    "background": "description",
    "tl;dr": "description",
    "tldr": "description",
    "hypothesis or goal": "hypothesis",
    "hypothesis or goals": "hypothesis",
    "hypothesis / goal": "hypothesis",
    "hypothesis/goal": "hypothesis",
    "hypothesis": "hypothesis",
    "hypotheses": "hypothesis",
    "goal": "hypothesis",
    "goals": "hypothesis",
    "results": "results",
    "result": "results",
    "findings": "results",
    "links": "links",
    "references": "links",
    "your name": "submitter_name",
    "affiliation": "submitter_affiliation",
    "link to your profile/site": "submitter_link",
    "one-sentence description of your experiment": "summary",
    "one-sentence description": "summary",
    "name of your branch": "branch",
    "branch": "branch",
    # The experiment form (.github/ISSUE_TEMPLATE/experiment.yml) and its plain-text twins.
    "success criteria": "success_criteria",
    "success criterion": "success_criteria",
    "baseline": "baseline",
    "baseline overrides": "baseline",
    "recipe": "recipe",
    "ablation spec": "ablation_spec",
    "ablation": "ablation_spec",
    "spec": "ablation_spec",
}
# Sections written as YAML (the form renders them in a ```yaml fence): kept as text, unfenced.
YAML_FIELDS = frozenset({"baseline", "ablation_spec"})
# A link line's label, read by the words it contains (first match wins).
LINK_LABELS = (
    (("wandb", "w&b", "weights & biases", "weights and biases"), "wandb_url"),
    (("data browser", "data-browser", "databrowser"), "data_browser_url"),
    (("experiment json", "experiment.json", "experiment file", "json"), "experiment_json_url"),
)
PLACEHOLDERS = {"_no response_", "*(to be updated)*", "*(pending)*", "tbd", "n/a", "none"}
# A template's prompt left as it was: a line that is only "(Describe ...)" or "[link]" (in
# emphasis or not, a list item or not, or a list item "Label: [link]"), never a real link.
PROMPT_LINE = re.compile(
    r"^\s*(?:(?:[*\-+]|\d+[.)])\s+(?:[^:\n\[\]()]{1,60}:\s*)?)?[*_]*"
    r"(?:\([^()\n]*\)|\[[^\[\]\n]*\])[*_]*[.:]?\s*$"
)
METRIC_TOKEN = r"`?(?P<metric>[A-Za-z0-9_.\-]+(?:/[A-Za-z0-9_.\-]+)*)`?"  # noqa: S105  (a pattern, not a secret)
NUMBER = r"(?P<threshold>[-+]?(?:\d+\.?\d*|\.\d+)(?:[eE][-+]?\d+)?)"
CRITERIA = re.compile(
    METRIC_TOKEN
    + r"\s*[,:]?\s*(?:is\s+|should\s+be\s+|goes\s+)?(?P<direction>lower|higher|down|up|"
    r"decreases?|increases?)\b[^\d\n+\-.]*" + NUMBER,
    re.IGNORECASE,
)
CRITERIA_KEY = re.compile(r"^\s*[*\-+]?\s*(metric|direction|threshold)\s*:\s*(.+?)\s*$", re.I)
DIRECTION_WORDS = {"lower": "lower", "down": "lower", "decrease": "lower", "decreases": "lower"}
DIRECTION_WORDS |= {"higher": "higher", "up": "higher", "increase": "higher", "increases": "higher"}
HEADING = re.compile(r"^(#{1,4})\s+(.+?)\s*#*\s*$")
FENCE = re.compile(r"^\s*(```|~~~)")
BULLET = re.compile(r"^\s*(?:[*\-+]|\d+[.)])\s+(.*)$")
MARKDOWN_LINK = re.compile(r"\[([^\]]*)\]\(\s*<?(https?://[^\s)>]+)>?(?:\s+\"[^\"]*\")?\s*\)")
BARE_URL = re.compile(r"<?(https?://[^\s<>]+)>?")


def normalise(text: str) -> str:
    return text.replace("\r\n", "\n").replace("\r", "\n")


def block_split(body: str | None) -> tuple[str, str | None, str]:
    """(text before the block, the block's inside or None, text after the block)."""
    body = body or ""
    start = body.find(START)
    end = body.find(END, start + len(START)) if start >= 0 else -1
    if start < 0 or end < 0:
        return body, None, ""
    return body[:start], body[start + len(START) : end], body[end + len(END) :]


def body_with_block(body: str | None, block: str) -> str:
    """The body with the managed block replaced (or appended); nothing outside changes."""
    before, inside, after = block_split(body)
    wrapped = f"{START}\n{block.strip()}\n{END}"
    if inside is None:
        return f"{before}\n\n{wrapped}" if before else wrapped
    return f"{before}{wrapped}{after}"


def human_text(body: str | None) -> str:
    """What people wrote: the body without the managed block."""
    before, inside, after = block_split(body)
    return before if inside is None else before + after


def sections(text: str) -> dict[str, str]:
    """Split markdown at ``##``/``###`` headings (outside code fences).

    Known headings (SECTION_FIELDS) start a section; an unknown heading and its text stay
    with the known section above it, as a reader would (Marin's "## Agent MoE catalogue"
    under "## Results" is part of the results). Text before the first known heading is
    kept under "".
    """
    found: dict[str, list[str]] = {"": []}
    current = ""
    in_fence = False
    for line in normalise(text).split("\n"):
        if FENCE.match(line):
            in_fence = not in_fence
        match = None if in_fence else HEADING.match(line)
        if match:
            name = heading_name(match.group(2))
            if name in SECTION_FIELDS:
                current = name
                found.setdefault(current, [])
                continue
        found[current].append(line)
    return {name: "\n".join(lines).strip() for name, lines in found.items()}


def heading_name(text: str) -> str:
    """``**2. Hypothesis / Goal:**`` -> ``hypothesis / goal``."""
    name = re.sub(r"[*_`]", "", text).strip()
    name = re.sub(r"^\d+[.)]\s*", "", name)
    return re.sub(r"\s+", " ", name.rstrip(":").strip().lower())


def _clean(value: str) -> str:
    """A section's text without the template's unedited prompts; "" when nothing else is left."""
    if value.strip().lower() in PLACEHOLDERS:
        return ""
    kept = []
    in_fence = False
    for line in value.split("\n"):
        if FENCE.match(line):
            in_fence = not in_fence
        elif not in_fence and (PROMPT_LINE.match(line) or line.strip().lower() in PLACEHOLDERS):
            continue
        kept.append(line)
    text = re.sub(r"\n{3,}", "\n\n", "\n".join(kept)).strip()
    return "" if text.lower() in PLACEHOLDERS else text


def unfenced(value: str) -> str:
    """The inside of a section that is one fenced block (the form's ``render: yaml``)."""
    lines = value.strip().split("\n")
    if (
        len(lines) >= 2
        and FENCE.match(lines[0])
        and FENCE.match(lines[-1])
        and lines[-1].strip() in {"```", "~~~"}
    ):
        return "\n".join(lines[1:-1]).strip()
    return value.strip()


def success_criteria(text: str) -> dict[str, Any]:
    """``eval/loss lower by 0.01`` (or ``metric:``/``direction:``/``threshold:`` lines) as
    the proposal's success_metric, success_direction and success_threshold; {} if unreadable."""
    found: dict[str, str] = {}
    for line in text.split("\n"):
        key = CRITERIA_KEY.match(line)
        if key:
            found[key.group(1).lower()] = key.group(2).strip("`* ")
    if {"metric", "direction", "threshold"} <= set(found):
        metric, direction, threshold = found["metric"], found["direction"], found["threshold"]
    else:
        match = CRITERIA.search(text)
        if match is None:
            return {}
        metric, direction, threshold = match.group("metric", "direction", "threshold")
    direction = DIRECTION_WORDS.get(direction.lower().strip(), "")
    try:
        value = float(threshold)
    except ValueError:
        return {}
    if not direction or not math.isfinite(value) or len(metric) > 200:
        return {}
    return {
        "success_metric": metric,
        "success_direction": direction,
        "success_threshold": abs(value),
    }


def _first_sentence(text: str) -> str:
    for raw in text.split("\n"):
        line = re.sub(r"^(tl;dr:?)\s*", "", raw.strip(), flags=re.IGNORECASE)
        if line:
            match = re.match(r"(.+?[.!?])(\s|$)", line)
            return (match.group(1) if match else line)[:300]
    return ""


def _link_field(label: str, url: str) -> str | None:
    label = label.lower()
    for words, link_field in LINK_LABELS:
        if any(word in label for word in words):
            return link_field
    if "wandb.ai/" in url:  # an unlabelled link still says where it goes
        return "wandb_url"
    if "data-browser" in url:
        return "data_browser_url"
    return None


def _links(value: str) -> dict[str, str]:
    """The bullets of a Links section, by proposal field. Each of these forms works:
    ``* WandB Report: https://...``, ``* WandB Report: [report](https://...)``,
    ``* [WandB Report](https://...)`` and ``- Data Browser: <https://...>``."""
    found: dict[str, str] = {}
    for line in value.split("\n"):
        bullet = BULLET.match(line)
        if not bullet:
            continue
        item = bullet.group(1).strip()
        link = MARKDOWN_LINK.search(item)
        if link:
            url = link.group(2)
            before = item[: link.start()].strip().rstrip(":").strip()
            label = before or link.group(1)
        else:
            bare = BARE_URL.search(item)
            if not bare:
                continue
            url = bare.group(1).rstrip(".,;")
            label = item[: bare.start()].strip().rstrip(":").strip()
        link_field = _link_field(label, url)
        if link_field and link_field not in found and len(url) <= 500:
            found[link_field] = url
    return found


@dataclass
class IssueFields:
    """Proposal fields read from an issue, and the sections that were missing."""

    data: dict[str, Any] = field(default_factory=dict)
    sections: dict[str, str] = field(default_factory=dict)
    missing: list[str] = field(default_factory=list)


def issue_fields(*, title: str, body: str | None) -> IssueFields:
    """Read the issue as a reader would: sections into fields, what is missing named."""
    parsed = sections(human_text(body))
    result = IssueFields(sections={k: v for k, v in parsed.items() if k})
    data: dict[str, Any] = {"title": title.strip()[:200]}
    for heading, text in parsed.items():
        target = SECTION_FIELDS.get(heading)
        if target is None:
            continue
        value = _clean(text)
        if target == "links":
            data.update(_links(value))
            continue
        if target in YAML_FIELDS:
            value = unfenced(value)
        if target == "success_criteria":
            if value and "success_metric" not in data:
                data.update(success_criteria(value))
            continue
        if target == "recipe":
            value = value.split("\n")[0].strip("`* ")
        if value and not data.get(target):
            data[target] = value
    one_liner = data.get("summary", "")
    if one_liner and not data.get("description"):
        data["description"] = one_liner
    data["summary"] = (
        _first_sentence(one_liner) or _first_sentence(data.get("description", "")) or data["title"]
    )[:300]
    if "branch" in data:
        data["branch"] = data["branch"].split("\n")[0][:255]
    for key in ("submitter_name", "submitter_affiliation"):
        if key in data:
            data[key] = data[key].split("\n")[0][:200]
    if not data.get("description"):
        result.missing.append("a `## Description` (or the form's one-sentence description)")
    if not data.get("hypothesis"):
        result.missing.append("a `## Hypothesis or Goal`")
    result.data = data
    return result


def is_experiment(label_names: list[str]) -> bool:
    return bool(EXPERIMENT_LABELS & {name.lower() for name in label_names})
