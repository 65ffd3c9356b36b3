"""The generated reference (mkdocs-gen-files runs this when the site is built; nothing here is committed).

reference/spec.md, cli.md, python-api.md, rest-api.md (with openapi.json) and records.md, each made
from the code by the module beside this one.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import mkdocs_gen_files

sys.path.insert(0, str(Path(__file__).resolve().parent))

import api_page  # noqa: E402
import cli_page  # noqa: E402
import records_page  # noqa: E402
import rest_page  # noqa: E402
import spec_page  # noqa: E402

PAGES = {
    "reference/spec.md": spec_page.page,
    "reference/cli.md": cli_page.page,
    "reference/python-api.md": api_page.page,
    "reference/records.md": records_page.page,
}

for path, make in PAGES.items():
    with mkdocs_gen_files.open(path, "w") as f:
        f.write(make())
    mkdocs_gen_files.set_edit_path(path, "gen/reference.py")

doc = rest_page.openapi()
with mkdocs_gen_files.open("reference/openapi.json", "w") as f:
    json.dump(doc, f, indent=2)
with mkdocs_gen_files.open("reference/rest-api.md", "w") as f:
    f.write(rest_page.page(doc))
