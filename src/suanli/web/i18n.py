"""Chinese and English. Templates and pages carry both words side by side (`t("Balance", "余额")`), so a page's
text is read where it is used and no catalogue drifts from the pages."""

from __future__ import annotations

LANGS = ("zh", "en")
LANG_COOKIE = "suanli_lang"


def pick(cookie: str | None, accept_language: str | None) -> str:
    """The language: the switch's cookie, else the first of Accept-Language's languages that we speak (by
    q-value), else Chinese, the seeds' users' language."""
    if cookie in LANGS:
        return cookie
    ranked: list[tuple[float, int, str]] = []
    for i, part in enumerate((accept_language or "")[:512].split(",")):
        tag, _, params = part.strip().partition(";")
        q = 1.0
        params = params.strip()
        if params.startswith("q="):
            try:
                q = float(params[2:])
            except ValueError:
                q = 0.0
        primary = tag.strip().lower().split("-")[0]
        if primary in LANGS and q > 0:
            ranked.append((-q, i, primary))
    return sorted(ranked)[0][2] if ranked else "zh"


def translate(lang: str, en: str, zh: str) -> str:
    return zh if lang == "zh" else en
