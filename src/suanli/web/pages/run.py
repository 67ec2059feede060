"""Submit a job or an instance: a simple form, or the YAML editor posting the same spec text `suanli run` posts.

The API checks the spec (`POST /workloads`); its 422 names the field (`resources.gpus: …`, or a validation
error's location), and the page shows that message next to the form's input. Any text pasted into the editor
is the API's to refuse: the console never parses the YAML itself.
"""

from __future__ import annotations

import re
from typing import Annotated, Any

from fastapi import APIRouter, Depends, Request
from fastapi.responses import RedirectResponse, Response

from suanli.web import session
from suanli.web.apicall import ApiError
from suanli.web.forms import as_int
from suanli.web.session import Page

router = APIRouter()
Tenant = Annotated[Page, Depends(session.tenant)]
PATH = re.compile(r"[A-Za-z_][A-Za-z0-9_.\[\]-]{0,120}")
# The spec's locations and the form's inputs they are shown at.
FIELDS = {"name": "name", "kind": "kind", "command": "command", "resources.gpu": "gpu", "resources.gpus": "gpus",
          "resources": "gpus", "image": "image", "env": "env", "billing": "billing", "duration": "duration",
          "jupyter": "jupyter"}  # fmt: skip
MAX_ENV_LINES = 256
EXAMPLE = """name: train-demo
kind: job            # or: instance
command: python train.py
resources:
  gpu: RTX-4090
  gpus: 1
billing: on-demand   # or: spot
env:
  EPOCHS: "3"
"""


def spec_errors(e: ApiError) -> dict[str, str]:
    """Where each message belongs: the validation errors' locations, or the `path: message` the spec checker
    writes (`resources.gpus: must be …`); the whole message under `_` when it names no field."""
    out = {k.removeprefix("spec."): v for k, v in e.fields().items()}
    head, sep, msg = e.detail.partition(": ")
    if sep and PATH.fullmatch(head) and head not in ("spec", "spec_yaml", "settings"):
        out.setdefault(head, msg)
    return out or {"_": e.detail}


def form_errors(errors: dict[str, str]) -> dict[str, str]:
    """The spec's locations mapped onto the form's inputs (`resources.gpus.min` → `gpus`, `env.X` → `env`)."""
    out: dict[str, str] = {}
    for loc, msg in errors.items():
        parts = loc.split(".")
        for n in range(len(parts), 0, -1):
            key = ".".join(parts[:n])
            if key in FIELDS:
                out.setdefault(FIELDS[key], f"{loc}: {msg}" if key != loc else msg)
                break
        else:
            out.setdefault("_", f"{loc}: {msg}" if loc != "_" else msg)
    return out


def spec_of_form(page: Page, data: dict[str, str]) -> tuple[dict[str, Any], dict[str, str]]:
    """The spec the simple form describes, and the form's own errors (an env line that is not KEY=VALUE)."""
    errors: dict[str, str] = {}
    kind = data.get("kind", "job")
    spec: dict[str, Any] = {"name": data.get("name", "").strip(), "kind": kind}
    if data.get("command", "").strip():
        spec["command"] = data["command"].strip()
    gpus_text = data.get("gpus", "").strip()
    resources: dict[str, Any] = {"gpus": as_int(gpus_text) if gpus_text else 0}
    if data.get("gpu") and resources["gpus"] != 0:
        resources["gpu"] = data["gpu"]
    spec["resources"] = resources
    for key in ("billing", "image", "duration"):
        if data.get(key, "").strip():
            spec[key] = data[key].strip()
    if kind == "instance" and data.get("jupyter"):
        spec["jupyter"] = True
    env: dict[str, str] = {}
    lines = [x for x in data.get("env", "").splitlines() if x.strip()]
    if len(lines) > MAX_ENV_LINES:
        errors["env"] = page.t(f"at most {MAX_ENV_LINES} variables", f"最多 {MAX_ENV_LINES} 个变量")
    for n, line in enumerate(lines[:MAX_ENV_LINES], 1):
        k, eq, v = line.partition("=")
        if not eq or not k.strip():
            errors.setdefault("env", page.t(f"line {n}: write KEY=VALUE", f"第 {n} 行：请写成 KEY=VALUE"))
        else:
            env[k.strip()] = v.strip()
    if env:
        spec["env"] = env
    return spec, errors


async def _choices(page: Page) -> dict[str, Any]:
    offers = await page.get("/offers")
    envs = await page.get("/environments")
    return {"gpus_on_offer": [o["gpu"] for o in offers], "environments": [e["name"] for e in envs]}


async def _render(page: Page, status: int = 200, **ctx: Any) -> Response:
    ctx.setdefault("form", {"kind": "job", "gpus": "1", "billing": "on-demand"})
    ctx.setdefault("errors", {})
    ctx.setdefault("yaml", EXAMPLE)
    ctx.setdefault("yaml_error", None)
    ctx.setdefault("mode", "form")
    return page.render("work/run.html", status=status, **ctx, **await _choices(page))


@router.get("/run")
async def run_form(page: Tenant) -> Response:
    return await _render(page)


async def _submit(page: Page, body: dict[str, Any]) -> str:
    org = page.org["id"]
    r = await page.api("POST", "/workloads", json={**body, **({"org": org} if org else {})})
    return str(r.json()["id"])


@router.post("/run")
async def run_submit(request: Request, page: Tenant) -> Response:
    """The simple form: its spec as JSON. Errors come back next to their inputs, the form as it was typed."""
    data = await session.form(request, page)
    spec, errors = spec_of_form(page, data)
    if errors:
        return await _render(page, status=422, form=data, errors=errors)
    try:
        wid = await _submit(page, {"spec": spec})
    except ApiError as e:
        if e.status >= 500:
            raise
        return await _render(page, status=e.status, form=data, errors=form_errors(spec_errors(e)))
    return RedirectResponse(f"/workloads/{wid}", status_code=303)


@router.post("/run/yaml")
async def run_yaml(request: Request, page: Tenant) -> Response:
    """The YAML editor: the text as `suanli run FILE.yaml` posts it (`spec_yaml`); the API's message at the editor."""
    data = await session.form(request, page)
    text = data.get("spec_yaml", "")
    try:
        wid = await _submit(page, {"spec_yaml": text})
    except ApiError as e:
        if e.status >= 500:
            raise
        errors = spec_errors(e)
        shown = "; ".join(v if k in ("_", "spec_yaml") else f"{k}: {v}" for k, v in errors.items())
        return await _render(page, status=e.status, mode="yaml", yaml=text[:300_000], yaml_error=shown)
    return RedirectResponse(f"/workloads/{wid}", status_code=303)
