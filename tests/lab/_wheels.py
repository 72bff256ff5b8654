"""Build tiny real wheels and serve them as a PEP 503 simple index on loopback."""

from __future__ import annotations

import base64
import contextlib
import hashlib
import http.server
import re
import threading
import zipfile
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path


def _record_hash(data: bytes) -> str:
    digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
    return f"sha256={digest}"


def build_wheel(
    out_dir: Path,
    name: str,
    version: str,
    *,
    requires: Sequence[str] = (),
    files: Mapping[str, bytes | str] | None = None,
    tag: str = "py3-none-any",
) -> Path:
    """Write ``name-version-tag.whl`` with METADATA, WHEEL and RECORD, like a build backend would."""
    dist = re.sub(r"[-_.]+", "_", name)
    out_dir.mkdir(parents=True, exist_ok=True)
    path = out_dir / f"{dist}-{version}-{tag}.whl"
    info = f"{dist}-{version}.dist-info"
    module = name.replace("-", "_")
    content: dict[str, bytes] = {f"{module}/__init__.py": f"__version__ = {version!r}\n".encode()}
    for fname, data in (files or {}).items():
        content[fname] = data.encode() if isinstance(data, str) else data
    meta = ["Metadata-Version: 2.1", f"Name: {name}", f"Version: {version}"]
    meta += [f"Requires-Dist: {r}" for r in requires]
    content[f"{info}/METADATA"] = ("\n".join(meta) + "\n").encode()
    content[f"{info}/WHEEL"] = (
        f"Wheel-Version: 1.0\nGenerator: compatlab-tests\nRoot-Is-Purelib: true\nTag: {tag}\n"
    ).encode()
    content[f"{info}/top_level.txt"] = f"{module}\n".encode()
    record = [f"{f},{_record_hash(d)},{len(d)}" for f, d in content.items()]
    record.append(f"{info}/RECORD,,")
    content[f"{info}/RECORD"] = ("\n".join(record) + "\n").encode()
    with zipfile.ZipFile(path, "w", zipfile.ZIP_DEFLATED) as zf:
        for fname, data in content.items():
            zf.writestr(fname, data)
    return path


def write_simple_index(root: Path, wheels: Sequence[Path]) -> Path:
    """Lay out ``root/simple/<project>/index.html`` for the given wheels (PEP 503)."""
    simple = root / "simple"
    by_project: dict[str, list[Path]] = {}
    for whl in wheels:
        project = re.sub(r"[-_.]+", "-", whl.name.split("-")[0]).lower()
        by_project.setdefault(project, []).append(whl)
    for project, files in by_project.items():
        pdir = simple / project
        pdir.mkdir(parents=True, exist_ok=True)
        links = []
        for whl in files:
            target = pdir / whl.name
            if not target.exists():
                target.write_bytes(whl.read_bytes())
            sha = hashlib.sha256(target.read_bytes()).hexdigest()
            links.append(f'<a href="{whl.name}#sha256={sha}">{whl.name}</a><br/>')
        (pdir / "index.html").write_text("<html><body>\n" + "\n".join(links) + "\n</body></html>\n")
    names = "".join(f'<a href="{p}/">{p}</a><br/>' for p in sorted(by_project))
    (simple / "index.html").write_text(f"<html><body>{names}</body></html>\n")
    return simple


class _QuietHandler(http.server.SimpleHTTPRequestHandler):
    def log_message(self, format: str, *args: object) -> None:
        pass


@contextlib.contextmanager
def serve(root: Path) -> Iterator[str]:
    """Serve *root* over HTTP on 127.0.0.1; yields the base URL."""
    handler = lambda *a, **k: _QuietHandler(*a, directory=str(root), **k)  # noqa: E731
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()
        thread.join(timeout=5)
