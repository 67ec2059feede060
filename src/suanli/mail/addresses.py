"""Which addresses reach one inbox: the mailbox behind an address, as far as the address itself tells.

Plus-addressing (`me+1@…` reaches `me@…`) is what Gmail, Outlook, iCloud, Fastmail and Proton deliver; at Gmail
dots in the local part do not count; Fastmail also delivers `anything@me.fastmail.com` to `me@fastmail.com`; and
some providers give one account several domains (`googlemail.com`, Proton's four, Apple's three). A trailing dot on
the domain (a fully qualified name, which relays strip) and an internationalised domain's two spellings are one
domain. What cannot be told from an address (a catch-all domain, a forwarding rule) is not known here. Pure.
"""

from __future__ import annotations

SAME_ACCOUNT = {  # domains whose addresses of one local part are one account's
    "googlemail.com": "gmail.com",
    "protonmail.com": "proton.me",
    "protonmail.ch": "proton.me",
    "pm.me": "proton.me",
    "me.com": "icloud.com",
    "mac.com": "icloud.com",
}
DOTS_IGNORED = frozenset({"gmail.com"})
SUBDOMAIN_ADDRESSING = ("fastmail.com", "fastmail.fm")  # anything@USER.fastmail.com reaches USER@fastmail.com


def domain_of(domain: str) -> str:
    """One spelling of a domain: lower case, no trailing dot, an internationalised name in its ASCII form."""
    domain = domain.strip().lower().rstrip(".")
    try:
        return domain.encode("idna").decode("ascii")
    except UnicodeError:  # not a name IDNA can spell: compared as written
        return domain


def mailbox(email: str) -> str:
    """The mailbox an address delivers to (lower case), by the rules above. An address with nothing before its
    `+` tag, or only dots at Gmail, is its own mailbox."""
    local, at, domain = email.strip().lower().rpartition("@")
    if not at:
        return email.strip().lower()
    domain = domain_of(domain)
    domain = SAME_ACCOUNT.get(domain, domain)
    for parent in SUBDOMAIN_ADDRESSING:
        user = domain.removesuffix("." + parent)
        if user != domain and user and "." not in user:
            local, domain = user, parent
    base = local.split("+", 1)[0] or local
    if domain in DOTS_IGNORED:
        base = base.replace(".", "") or base
    return f"{base}@{domain}"
