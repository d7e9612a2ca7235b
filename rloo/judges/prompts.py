"""The TL;DR comparison prompt (after the DPO paper's judge: which summary keeps the important points of the
post, precisely and concisely; one sentence of comparison, then the preferred letter), and its strict parser."""

from __future__ import annotations

import re

_POST_AND_SUMMARIES = """Here is a forum post and two candidate summaries of it. Decide which summary better captures \
the most important points of the post while leaving out unimportant or irrelevant details. A good summary is both \
precise and concise.

Post:
{post}

Summary A:
{summary_a}

Summary B:
{summary_b}

"""

TLDR_COMPARISON = (
    _POST_AND_SUMMARIES
    + """Answer in exactly two lines. On the first, compare the two summaries in one \
sentence, starting with "Comparison:". On the second, write "Preferred:" followed by only the letter of the better \
summary, A or B.
Comparison:"""
)

# for a local LM judged by its next-token probabilities of the two labels
TLDR_COMPARISON_NEXT_TOKEN = _POST_AND_SUMMARIES + "The better summary is Summary"

_PREFERRED = re.compile(r"^\s*\**\s*preferred\s*\**\s*:\s*\**\s*([AB])\s*\**\s*\.?\s*$", re.IGNORECASE | re.MULTILINE)


def render_comparison(template: str, post: str, summary_a: str, summary_b: str) -> str:
    return template.format(post=post.strip(), summary_a=summary_a.strip(), summary_b=summary_b.strip())


def parse_preference(answer: str | None) -> str | None:
    """'A' or 'B' when the answer has exactly one "Preferred: A|B" line, else None (invalid, never a win).

    A bare single letter (the answer of a judge asked for one character) is accepted too.
    """
    if answer is None:
        return None
    text = answer.strip()
    if text.upper() in ("A", "B"):
        return text.upper()
    found = {m.upper() for m in _PREFERRED.findall(text)}
    return found.pop() if len(found) == 1 and len(_PREFERRED.findall(text)) == 1 else None
