"""reference/rest-api.md and reference/openapi.json: the service's OpenAPI document, exported from the
application ``tula serve`` runs (:func:`tula.service.app.create_app`, built without a server), and
rendered: every path and method with its summary, parameters, request body and responses."""

from __future__ import annotations

import json
import tempfile

from schema_md import anchor, model_table, paragraphs, text, type_of

METHODS = ("get", "post", "put", "patch", "delete")


def openapi() -> dict:
    """The OpenAPI document of the service's application (no server started, no job dispatched).

    Returns
    -------
    dict
        The document, as ``GET /openapi.json`` serves it.
    """
    from tula.service.app import create_app
    from tula.service.settings import ServiceSettings

    with tempfile.TemporaryDirectory(prefix="tula-docs-") as home:
        return create_app(ServiceSettings(home=home), dispatch=False).openapi()


def _schema_name(s: dict) -> str:
    if "$ref" in s:
        return type_of({"$ref": s["$ref"].replace("#/components/schemas/", "#/$defs/")})
    if s.get("title") and s.get("properties"):
        return f"`{s['title']}`"
    return type_of(s) if s else "any"


def _body(content: dict) -> list[str]:
    lines = []
    for media, item in content.items():
        s = item.get("schema", {})
        lines.append(
            f"- `{media}`: {_schema_name(s)}" + (f" -- {text(s.get('description'))}" if "$ref" not in s else "")
        )
        if s.get("properties"):
            lines += ["", *model_table(s), ""]
    return lines


def _operation(path: str, method: str, op: dict) -> list[str]:
    title = f"{method.upper()} {path}"
    lines = [f"### `{title}` {{#{anchor(op.get('operationId', title))}}}", ""]
    if op.get("summary"):
        lines += [f"**{text(op['summary'])}.** {text(op.get('description'))}", ""]
    params = op.get("parameters", [])
    if params:
        lines += ["| Parameter | In | Type | Required | Description |", "| --- | --- | --- | --- | --- |"]
        for p in params:
            s = p.get("schema", {})
            default = f" (default `{json.dumps(s['default'])}`)" if "default" in s else ""
            lines.append(
                f"| `{p['name']}` | {p['in']} | {type_of(s)}{default} | {'yes' if p.get('required') else 'no'} | "
                f"{text(p.get('description') or s.get('description'))} |"
            )
        lines.append("")
    body = op.get("requestBody")
    if body:
        lines += [f"Request body{' (required)' if body.get('required') else ''}:", "", *_body(body["content"]), ""]
    lines += ["Responses:", ""]
    for code, resp in op.get("responses", {}).items():
        media = ", ".join(
            f"`{m}` {_schema_name(item.get('schema', {}))}" for m, item in resp.get("content", {}).items()
        )
        lines.append(f"- **{code}** {text(resp.get('description'))}" + (f": {media}" if media else ""))
    return [*lines, ""]


def page(doc: dict) -> str:
    """The page's Markdown.

    Parameters
    ----------
    doc : dict
        The OpenAPI document (:func:`openapi`).

    Returns
    -------
    str
        reference/rest-api.md.
    """
    info = doc.get("info", {})
    lines = [
        "# REST API",
        "",
        "!!! note",
        "    Generated from the OpenAPI document of the service's application (`tula.service.app.create_app`) "
        "when the site is built. The document itself: [openapi.json](openapi.json); a running `tula serve` "
        "serves it at `/openapi.json`.",
        "",
        f"**{text(info.get('title'))}** {text(info.get('version'))} (OpenAPI {doc.get('openapi')}): "
        f"{text(info.get('description'))}",
        "",
        "## Operations",
        "",
    ]
    for path, item in doc.get("paths", {}).items():
        for method in METHODS:
            if method in item:
                lines += _operation(path, method, item[method])
    schemas = doc.get("components", {}).get("schemas", {})
    if schemas:
        lines += ["## Schemas", ""]
        for name, s in schemas.items():
            lines += [f"### {name} {{#{anchor(name)}}}", "", paragraphs(s.get("description")), ""]
            if s.get("properties"):
                lines += [*model_table(_local_refs(s)), ""]
    return "\n".join(lines)


def _local_refs(s: dict) -> dict:
    """A component's schema with its references made local (``#/$defs/NAME``), as :func:`type_of` links them."""
    return json.loads(json.dumps(s).replace("#/components/schemas/", "#/$defs/"))
