"""Every XSS vector of the foundation issue, typed into the proposal form, never runs.

Each vector goes into the title, the description and the hypothesis, through the Preview
and the submit, and is then read on the proposal page and in the list. In the browser:
no dialog opens (the payloads call ``alert``), no dangerous element or attribute exists in
what the user wrote, and no link anywhere points at ``javascript:``.
"""

from __future__ import annotations

import re
from typing import Any

import pytest
from playwright.sync_api import Page, expect

from tests.browser.conftest import BrowserSession, sign_in
from tests.proposals.test_markdown import XSS_VECTORS

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]

# Lists what a browser would act on, in the user's text (``roots``) and anywhere on the page.
LIVE_HTML = r"""(roots) => {
  const problems = [];
  const DANGEROUS = new Set(['script', 'iframe', 'frame', 'frameset', 'svg', 'object', 'embed',
    'style', 'form', 'math', 'input', 'button', 'textarea', 'select', 'base', 'link', 'meta',
    'video', 'audio', 'source', 'template', 'noscript']);
  const URL_ATTRIBUTES = ['href', 'src', 'action', 'formaction', 'xlink:href', 'data', 'poster'];
  const scheme = (value) => {
    const match = value.replace(/[\s\u0000-\u001f]/g, '').toLowerCase().match(/^([a-z][a-z0-9+.-]*):/);
    return match ? match[1] : '';
  };
  let rootCount = 0;
  for (const selector of roots) {
    for (const root of document.querySelectorAll(selector)) {
      rootCount += 1;
      for (const el of [root, ...root.querySelectorAll('*')]) {
        const tag = el.tagName.toLowerCase();
        if (el !== root && DANGEROUS.has(tag)) problems.push(`${selector}: <${tag}>`);
        for (const attr of el.attributes) {
          const name = attr.name.toLowerCase();
          if (name.startsWith('on') || ['style', 'srcdoc', 'formaction'].includes(name)) {
            problems.push(`${selector}: <${tag} ${name}="${attr.value}">`);
          }
          const s = URL_ATTRIBUTES.includes(name) ? scheme(attr.value) : '';
          if (s && !['http', 'https', 'mailto'].includes(s)) {
            problems.push(`${selector}: <${tag} ${name}="${attr.value}">`);
          }
        }
      }
    }
  }
  for (const el of document.querySelectorAll('iframe, frame, object, embed')) {
    problems.push(`page: <${el.tagName.toLowerCase()}>`);
  }
  for (const el of document.querySelectorAll('*')) {
    for (const attr of el.attributes) {
      const name = attr.name.toLowerCase();
      if (name.startsWith('on') && /alert/i.test(attr.value)) {
        problems.push(`page: <${el.tagName.toLowerCase()} ${name}="${attr.value}">`);
      }
      if (URL_ATTRIBUTES.includes(name) && scheme(attr.value) === 'javascript') {
        problems.push(`page: <${el.tagName.toLowerCase()} ${name}="${attr.value}">`);
      }
    }
  }
  for (const script of document.querySelectorAll('script')) {
    if (/alert\s*\(/.test(script.textContent)) problems.push('page: a script calling alert');
  }
  return {problems, rootCount};
}"""


def live_html(page: Page, roots: list[str], expected_roots: int) -> list[str]:
    found = page.evaluate(LIVE_HTML, roots)
    assert found["rootCount"] >= expected_roots, f"missing {roots} on {page.url}"
    return list(found["problems"])


def fill_form(page: Page, *, title: str, text: str) -> None:
    page.fill("#id_title", title)
    page.fill("#id_summary", "Harmless, whatever it says.")
    page.select_option("#id_recipe", label="tiny-moe v1")
    page.fill("#id_description", text)
    page.fill("#id_hypothesis", text)
    page.fill("#id_success_metric", "eval/loss")
    page.fill("#id_success_threshold", "0.01")


def test_xss_vectors_typed_into_the_form_never_run(
    browser_session: BrowserSession, page: Page, recipe: Any, contributor: Any
) -> None:
    sign_in(page, "carla")
    problems: dict[str, list[str]] = {}
    titles = []
    for number, vector in enumerate(XSS_VECTORS):
        title = f"XSS {number}: {vector}"[:200]
        titles.append(title)
        text = f"Intro {number}\n\n{vector}\n\nOutro {number}"
        page.goto("/proposals/new/")
        fill_form(page, title=title, text=text)

        page.get_by_role("button", name="Preview").click()
        expect(page.locator("#preview")).to_be_visible()
        expect(page.locator("#preview .prose").first).to_contain_text(f"Intro {number}")
        found = live_html(page, ["#preview .prose"], expected_roots=2)

        page.get_by_role("button", name="Submit for review").click()
        expect(page).to_have_url(re.compile(r"/proposals/\d+/$"))
        expect(page.locator("h1")).to_have_text(title)  # shown as the text typed, escaped
        expect(page.locator(".prose").first).to_contain_text(f"Intro {number}")
        found += live_html(page, ["h1", ".prose"], expected_roots=3)
        found += list(browser_session.problems.dialogs)
        if found:
            problems[vector] = found

    page.goto("/")
    for title in titles:
        expect(page.locator("main h2", has_text=title)).to_have_count(1)
    listed = live_html(page, ["main h2"], expected_roots=len(titles))
    if listed:
        problems["the list page"] = listed
    assert browser_session.problems.dialogs == [], browser_session.problems.dialogs
    assert problems == {}, "\n".join(f"{v!r}: {p}" for v, p in problems.items())
