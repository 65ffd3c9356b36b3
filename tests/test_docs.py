"""The documentation site (mkdocs.yml, docs/): it builds in strict mode, and strict mode really fails on a
broken link or a reference to code that is gone; every spec field has a description for the generated
reference; every block marked runnable runs; and the built site's pages show their content in a real
headless Chromium."""

from __future__ import annotations

import functools
import html
import http.server
import os
import re
import shutil
import subprocess
import sys
import threading
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
BIN = Path(sys.executable).parent  # the venv's bin: mkdocs, tula, python
MKDOCS = BIN / "mkdocs"
CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser") or shutil.which("google-chrome")
#: =1 (CI, which installs Chromium): the site's browser test fails, rather than skips, without Chromium
REQUIRE_CHROMIUM_ENV = "TULA_REQUIRE_CHROMIUM"
#: the generated reference pages (docs/gen/reference.py writes them at build time; never files in docs/)
REFERENCE = ("spec", "cli", "python-api", "rest-api", "records")
#: the marker of a block the tests run, on the line right above its opening fence
RUNNABLE = "<!-- runnable -->"
BLOCK_TIMEOUT_S = 900  # generous: a block is meant to take under a minute, on a shared machine it may take more


def _env() -> dict[str, str]:
    """The environment of the commands the tests start: the venv's bin first on PATH, quiet mkdocs."""
    return {
        **os.environ,
        "PATH": f"{BIN}{os.pathsep}{os.environ.get('PATH', '')}",
        "NO_MKDOCS_2_WARNING": "1",
        "DISABLE_MKDOCS_2_WARNING": "true",
    }


def mkdocs_build(config: Path, site: Path, timeout: int = 600) -> subprocess.CompletedProcess:
    """``mkdocs build --strict`` of ``config`` into ``site`` (a subprocess, from the config's directory)."""
    return subprocess.run(
        [str(MKDOCS), "build", "--strict", "-f", str(config), "-d", str(site)],
        cwd=config.parent,
        env=_env(),
        capture_output=True,
        text=True,
        timeout=timeout,
    )


@pytest.fixture(scope="module")
def site(tmp_path_factory) -> Path:
    """The site, built once per module from the repository's mkdocs.yml into a temporary directory."""
    out = tmp_path_factory.mktemp("site") / "site"
    r = mkdocs_build(ROOT / "mkdocs.yml", out)
    if r.returncode != 0:
        pytest.fail(f"mkdocs build --strict failed (exit {r.returncode}):\n{(r.stdout + r.stderr)[-6000:]}")
    return out


# --------------------------------------------------------------------------- the build
def test_the_site_builds_strict_with_every_page_of_the_nav(site):
    for page in ("index.html", "install/index.html", "tutorials/demo/index.html", "benchmarks/index.html"):
        assert (site / page).is_file(), page
    for name in REFERENCE:
        html = (site / "reference" / name / "index.html").read_text()
        assert "Generated from" in html, name
    spec = (site / "reference" / "spec" / "index.html").read_text()
    for field in ("memory_budget_bytes", "cluster_sizes", "accumulation_steps", "price_per_node_hour"):
        assert f"<code>{field}</code>" in spec, field
    cli = (site / "reference" / "cli" / "index.html").read_text()
    for verb in ("run", "plan", "train", "simulate", "replan"):
        assert f"<code>tula {verb}</code>" in cli, verb
    rest = (site / "reference" / "rest-api" / "index.html").read_text()
    assert "POST /v1/jobs" in rest and "GET /v1/jobs/{job_id}/plan" in rest
    assert (site / "reference" / "openapi.json").read_text().startswith("{")
    api = (site / "reference" / "python-api" / "index.html").read_text()
    assert 'id="tula.job.Job"' in api and "TulaClassifier" in api and "SpecError" in api
    records = (site / "reference" / "records" / "index.html").read_text()
    assert (
        "ProfileRecord" in records
        and "CheckpointMeta" in records
        and "Example, as <code>tula run</code> writes it" in records
    )


def test_the_reference_is_generated_not_committed():
    assert not any((ROOT / "docs" / "reference").glob("*.md")), "docs/reference/ holds pages; they are generated"


def _broken_site(tmp_path: Path, page: str) -> subprocess.CompletedProcess:
    """A site of the repository's configuration (its strict mode and validation, by INHERIT) with a home page
    and ``page`` as broken.md: its build."""
    docs = tmp_path / "docs"
    docs.mkdir()
    (docs / "index.md").write_text("# Home\n\nSee [the broken page](broken.md).\n")
    (docs / "broken.md").write_text(page)
    config = tmp_path / "mkdocs.yml"
    config.write_text(
        f"INHERIT: {ROOT / 'mkdocs.yml'}\n"
        "docs_dir: docs\n"
        "nav:\n  - Home: index.md\n  - Broken: broken.md\n"
        "plugins:\n"
        "  - mkdocstrings:\n"
        "      default_handler: python\n"
        "      handlers:\n"
        "        python:\n"
        f"          paths: [{ROOT / 'src'}]\n"
    )
    return mkdocs_build(config, tmp_path / "site", timeout=300)


def test_the_same_site_with_a_sound_page_builds(tmp_path):
    """The control of the two below: what fails there is the broken reference, not the set-up."""
    r = _broken_site(tmp_path, "# Sound\n\nBack [home](index.md).\n\n::: tula.core.errors.TulaError\n")
    assert r.returncode == 0, r.stdout + r.stderr


def test_strict_mode_fails_on_a_broken_internal_link(tmp_path):
    r = _broken_site(tmp_path, "# Broken\n\nSee [a page that is gone](no-such-page.md).\n")
    assert r.returncode != 0, r.stdout + r.stderr
    assert "no-such-page.md" in r.stdout + r.stderr


def test_strict_mode_fails_on_a_reference_to_code_that_is_gone(tmp_path):
    r = _broken_site(tmp_path, "# Broken\n\n::: tula.no_such_function\n")
    assert r.returncode != 0, r.stdout + r.stderr
    assert "tula.no_such_function" in r.stdout + r.stderr


def test_every_spec_field_has_a_description():
    from tula.core.spec import JobSpec

    schema = JobSpec.model_json_schema()
    models = {"JobSpec": schema, **schema["$defs"]}
    missing = [
        f"{model}.{field}"
        for model, s in models.items()
        for field, prop in s.get("properties", {}).items()
        if not (prop.get("description") or "").strip()
    ]
    assert not missing, f"spec fields without a description (a docstring under the field): {missing}"
    assert len(models) > 10  # the nested sections are there to check


# --------------------------------------------------------------------------- runnable blocks
def runnable_blocks() -> list[tuple[str, int, str, str]]:
    """Every fenced block right after a ``<!-- runnable -->`` line in docs/**/*.md and README.md.

    Returns
    -------
    list[tuple[str, int, str, str]]
        ``(file relative to the repository, line of the opening fence, language, code)``.
    """
    files = sorted((ROOT / "docs").rglob("*.md")) + [ROOT / "README.md"]
    found = []
    for path in files:
        if not path.is_file():
            continue
        lines = path.read_text().splitlines()
        for i, line in enumerate(lines[:-1]):
            if line.strip() != RUNNABLE:
                continue
            fence = re.match(r"^(\s*)(`{3,}|~{3,})\s*([\w+-]*)", lines[i + 1])
            if fence is None:
                found.append((str(path.relative_to(ROOT)), i + 2, "", ""))  # the test says what is wrong
                continue
            indent, marks, lang = fence.groups()
            body = []
            for text in lines[i + 2 :]:
                if text.strip().startswith(marks) and text.strip().strip(marks[0]) == "":
                    break
                body.append(text[len(indent) :] if text.startswith(indent) else text)
            found.append((str(path.relative_to(ROOT)), i + 2, lang.lower(), "\n".join(body) + "\n"))
    return found


BLOCKS = runnable_blocks()


def test_the_docs_have_runnable_blocks():
    assert BLOCKS, f"no fenced block is marked {RUNNABLE} in docs/**/*.md or README.md"


@pytest.mark.slow
@pytest.mark.parametrize(("path", "line", "lang", "code"), BLOCKS, ids=[f"{p}:{n}" for p, n, _, _ in BLOCKS])
def test_a_runnable_block_runs(tmp_path, path, line, lang, code):
    where = f"the block at {path}:{line}"
    if lang in ("bash", "sh", "shell", "console"):
        script = tmp_path / "block.sh"
        script.write_text(code)
        cmd = ["bash", "-e", "-o", "pipefail", str(script)]
    elif lang in ("python", "py", "python3"):
        script = tmp_path / "block.py"
        script.write_text(code)
        cmd = [str(BIN / "python"), str(script)]
    else:
        pytest.fail(f"{where} is marked runnable but its fence says {lang!r}; use bash or python")
    work = tmp_path / "work"
    work.mkdir()
    r = subprocess.run(cmd, cwd=work, env=_env(), capture_output=True, text=True, timeout=BLOCK_TIMEOUT_S)
    assert r.returncode == 0, f"{where} failed (exit {r.returncode}):\n{r.stdout[-3000:]}\n{r.stderr[-3000:]}"


# --------------------------------------------------------------------------- in a browser
@pytest.fixture
def served(site):
    """The built site over HTTP on a free loopback port (a thread); its base URL."""
    handler = functools.partial(_QuietHandler, directory=str(site))
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()


class _QuietHandler(http.server.SimpleHTTPRequestHandler):
    def log_message(self, format, *args):  # noqa: A002 - the base class's signature
        pass


def _dom(url: str) -> str:
    if CHROMIUM is None:
        if os.environ.get(REQUIRE_CHROMIUM_ENV) == "1":
            pytest.fail(f"headless Chromium is not installed, and {REQUIRE_CHROMIUM_ENV}=1 requires it")
        pytest.skip("headless Chromium is not installed (apt-get install chromium)")
    r = subprocess.run(
        [CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage", "--dump-dom", url],
        capture_output=True,
        text=True,
        timeout=180,
    )
    assert r.returncode == 0, r.stderr[-2000:]
    return r.stdout


def test_the_home_page_and_the_spec_reference_show_their_content_in_chromium(served):
    home = _dom(f"{served}/")
    heading = next(
        (line[2:].strip() for line in (ROOT / "docs" / "index.md").read_text().splitlines() if line.startswith("# ")),
        None,
    )
    assert "<title>" in home and "Tula" in home.split("<title>")[1].split("</title>")[0], home[:2000]
    if heading:
        assert re.sub(r"[`*_]", "", heading) in html.unescape(re.sub(r"<[^>]+>", "", home)), heading
    spec = _dom(f"{served}/reference/spec/")
    assert "Job spec" in spec and "<code>memory_budget_bytes</code>" in spec, spec[:2000]
    assert "Reference" in spec  # the navigation, drawn around the page
