"""``{% live_slot NAME %}...{% endlive_slot %}``: a panel of a page that follows its runs.

On the page it is ``<div data-live-slot=NAME data-version=V>``; in the answer to the page's
poll (``proposals.live``, ``live_templates`` in the context) the same panel comes as
``<template data-live-panel=NAME data-version=V>``, and the page's script (static/js/results.js)
swaps it in when its version differs, unless the reader is typing in it. The version is a
digest of the panel's HTML without the request's CSRF token, so a panel that says the same
is left alone.
"""

from __future__ import annotations

import hashlib
import re

from django import template
from django.utils.html import escape
from django.utils.safestring import SafeString, mark_safe

register = template.Library()

_CSRF_VALUE = re.compile(r'(name="csrfmiddlewaretoken" value=")[^"]*(")')


def live_version(html: str) -> str:
    """What a panel says, as a short digest: the same words give the same version."""
    return hashlib.sha1(_CSRF_VALUE.sub(r"\1\2", html).encode(), usedforsecurity=False).hexdigest()[
        :16
    ]


class LiveSlotNode(template.Node):
    def __init__(self, name: template.base.FilterExpression, nodelist: template.NodeList) -> None:
        self.name = name
        self.nodelist = nodelist

    def render(self, context: template.Context) -> SafeString:
        html = self.nodelist.render(context)
        name = escape(str(self.name.resolve(context)))
        version = live_version(html)
        if context.get("live_templates"):
            return mark_safe(  # noqa: S308  (html is the rendered, escaped template)
                f'<template data-live-panel="{name}" data-version="{version}">{html}</template>'
            )
        return mark_safe(  # noqa: S308
            f'<div class="live-slot" data-live-slot="{name}" data-version="{version}">{html}</div>'
        )


@register.tag
def live_slot(parser: template.base.Parser, token: template.base.Token) -> LiveSlotNode:
    bits = token.split_contents()
    if len(bits) != 2:
        raise template.TemplateSyntaxError("{% live_slot NAME %} takes a name")
    nodelist = parser.parse(("endlive_slot",))
    parser.delete_first_token()
    return LiveSlotNode(parser.compile_filter(bits[1]), nodelist)
