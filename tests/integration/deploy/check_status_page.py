#!/usr/bin/env python3
"""Checks kvtierd's status page against the daemon's own figures.

Usage: check_status_page.py PAGE.html STATUS.json URL ARTIFACT_DIR

PAGE.html is the page as served, STATUS.json the operator's GetStatus (kvtierctl --json) taken
after the workers went idle. The page must be well-formed HTML with no script and no external
asset, and its table must show every worker and sequence with the daemon's figures (ids, length,
T0-T3 tokens). Then, where Chromium is installed, headless Chromium loads URL: its DOM must
show the same figures, and its screenshot (kept in ARTIFACT_DIR) must be a real picture of the
page: the right size, with the pool bar's and the tier bars' colours in it. Without Chromium the
HTML checks alone run, and the script says so. Exit 0 when everything that ran passed.
"""

import html.parser
import json
import os
import shutil
import struct
import subprocess
import sys
import zlib

VOID = {"meta", "br", "hr", "img", "input", "link", "col", "area", "base", "source", "wbr"}
SVG_LEAVES = {"rect"}  # written <rect .../> by the page, <rect></rect> by a DOM dump
WIDTH, HEIGHT = 1600, 1000


class Page(html.parser.HTMLParser):
    """Well-formedness (every element closed in order), forbidden content, and the table rows."""

    def __init__(self):
        super().__init__(convert_charrefs=True)
        self.stack, self.errors = [], []
        self.rows, self.row, self.cell = [], None, None
        self.table = None
        self.text = []

    def handle_starttag(self, tag, attrs):
        attrs = dict(attrs)
        if tag == "script":
            self.errors.append("a <script> element")
        for name in ("src", "href"):
            value = attrs.get(name)
            if value is not None and (":" in value or value.startswith("//")):
                self.errors.append(f"an external asset: {tag} {name}={value}")
        if tag == "table":
            self.table = attrs.get("id")
        if tag == "tr" and self.table == "rows":
            self.row = []
        if tag in ("td", "th") and self.row is not None:
            self.cell = []
        if tag not in VOID:
            self.stack.append(tag)

    def handle_startendtag(self, tag, attrs):
        self.handle_starttag(tag, attrs)
        if tag not in VOID:
            self.handle_endtag(tag)

    def handle_endtag(self, tag):
        if tag in VOID:
            return
        if not self.stack or self.stack[-1] != tag:
            self.errors.append(f"</{tag}> closes <{self.stack[-1] if self.stack else 'nothing'}>")
            return
        self.stack.pop()
        if tag in ("td", "th") and self.cell is not None and self.row is not None:
            self.row.append("".join(self.cell).strip())
            self.cell = None
        if tag == "tr" and self.row is not None:
            self.rows.append(self.row)
            self.row = None
        if tag == "table":
            self.table = None

    def handle_data(self, data):
        self.text.append(data)
        if self.cell is not None:
            self.cell.append(data)


def parse(text, source):
    p = Page()
    p.feed(text)
    p.close()
    if p.stack:
        p.errors.append(f"unclosed elements: {p.stack}")
    if p.errors:
        sys.exit(f"{source}: {'; '.join(p.errors[:5])}")
    return p


def check_figures(page, status, source):
    """Every worker and sequence row shows the daemon's figures."""
    if not page.rows:
        sys.exit(f"{source}: no workers-and-sequences table")
    header = page.rows[0]
    col = {name: i for i, name in enumerate(header)}
    for name in ("ID", "TOKENS", "T0", "T1", "T2", "T3", "LOST MASS"):
        if name not in col:
            sys.exit(f"{source}: the table has no {name} column (header {header})")
    by_id = {row[0].strip(): row for row in page.rows[1:] if row}
    checked = 0
    for s in status.get("sequence_list", []):
        key = f"s{s['sequence_id']}"
        row = by_id.get(key)
        if row is None:
            sys.exit(f"{source}: sequence {key} is not shown (rows {sorted(by_id)})")
        r = s["report"]
        want = {"TOKENS": s["length"], "T0": r["tokens_t0"], "T1": r["tokens_t1"],
                "T2": r["tokens_t2"], "T3": r["tokens_t3"]}
        for name, value in want.items():
            if row[col[name]] != str(value):
                sys.exit(f"{source}: {key} shows {name} {row[col[name]]!r}, the daemon says {value}")
        lost = s.get("lost_mass")
        want_lost = "\u2014" if lost is None else (
            f"{100 * lost['total']:.2f}% (peak {100 * lost['peak_total']:.2f}%)")
        if row[col["LOST MASS"]] != want_lost:
            sys.exit(f"{source}: {key}'s LOST MASS is {row[col['LOST MASS']]!r}, "
                     f"the daemon says {want_lost!r}")
        checked += 1
    for w in status.get("worker_list", []):
        key = f"w{w['worker_id']}"
        if key not in by_id:
            sys.exit(f"{source}: worker {key} is not shown")
        if w["worker_name"] and w["worker_name"] in "".join(page.text):
            sys.exit(f"{source}: the worker's name {w['worker_name']!r} is on the page")
        checked += 1
    if checked == 0:
        sys.exit(f"{source}: the daemon listed nothing to check")
    return checked


def png_pixels(path):
    """Width, height and the set of RGB colours of an 8-bit RGB or RGBA PNG."""
    data = open(path, "rb").read()
    if data[:8] != b"\x89PNG\r\n\x1a\n":
        sys.exit(f"{path}: not a PNG")
    pos, idat, width = 8, b"", 0
    while pos < len(data):
        length, kind = struct.unpack(">I4s", data[pos:pos + 8])
        body = data[pos + 8:pos + 8 + length]
        if kind == b"IHDR":
            width, height, depth, ctype = struct.unpack(">IIBB", body[:10])
            if depth != 8 or ctype not in (2, 6):
                sys.exit(f"{path}: colour type {ctype}, depth {depth}: not 8-bit RGB(A)")
            bpp = 3 if ctype == 2 else 4
        elif kind == b"IDAT":
            idat += body
        pos += 12 + length
    raw = zlib.decompress(idat)
    stride = width * bpp
    prev = bytearray(stride)
    colours = set()
    for y in range(height):
        f = raw[y * (stride + 1)]
        line = bytearray(raw[y * (stride + 1) + 1:(y + 1) * (stride + 1)])
        for i in range(stride):
            a = line[i - bpp] if i >= bpp else 0
            b = prev[i]
            c = prev[i - bpp] if i >= bpp else 0
            if f == 1:
                line[i] = (line[i] + a) & 255
            elif f == 2:
                line[i] = (line[i] + b) & 255
            elif f == 3:
                line[i] = (line[i] + (a + b) // 2) & 255
            elif f == 4:
                p = a + b - c
                pa, pb, pc = abs(p - a), abs(p - b), abs(p - c)
                line[i] = (line[i] + (a if pa <= pb and pa <= pc else b if pb <= pc else c)) & 255
        for x in range(0, stride, bpp):
            colours.add(bytes(line[x:x + 3]))
        prev = line
    return width, height, colours


def chromium():
    for name in ("chromium", "chromium-browser", "google-chrome"):
        path = shutil.which(name)
        if path:
            return path
    return None


def run_chromium(binary, args, url):
    cmd = [binary, "--headless", "--no-sandbox", "--disable-gpu", "--no-first-run",
           "--hide-scrollbars", f"--window-size={WIDTH},{HEIGHT}", *args, url]
    env = dict(os.environ, HOME=os.environ.get("TMPDIR", "/tmp"))
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=90, env=env)
    if out.returncode != 0:
        sys.exit(f"chromium {' '.join(args)} failed ({out.returncode}): {out.stderr[-2000:]}")
    return out.stdout


def main():
    page_path, status_path, url, artifacts = sys.argv[1:5]
    status = json.load(open(status_path))
    served = parse(open(page_path, encoding="utf-8").read(), page_path)
    n = check_figures(served, status, page_path)
    print(f"served HTML: well-formed, no script or external asset, {n} rows match the daemon")
    binary = chromium()
    if binary is None:
        print("chromium: not installed, so no browser check ran (scripts/install-deps installs it)")
        return
    dom = run_chromium(binary, ["--dump-dom"], url)
    open(os.path.join(artifacts, "status_page.dom.html"), "w").write(dom)
    n = check_figures(parse(dom, "chromium's DOM"), status, "chromium's DOM")
    print(f"chromium DOM: {n} rows match the daemon")
    shot = os.path.join(artifacts, "status_page.png")
    if os.path.exists(shot):
        os.remove(shot)
    run_chromium(binary, [f"--screenshot={shot}"], url)
    width, height, colours = png_pixels(shot)
    if (width, height) != (WIDTH, HEIGHT):
        sys.exit(f"{shot}: {width}x{height}, asked for {WIDTH}x{HEIGHT}")
    # The pool bar's "used" blue and the tier bar's T0 green must be painted.
    for name, rgb in (("pool used blue #1565c0", b"\x15\x65\xc0"),
                      ("T0 green #2e7d32", b"\x2e\x7d\x32")):
        if rgb not in colours:
            sys.exit(f"{shot}: no {name} pixel ({len(colours)} colours in all)")
    if len(colours) < 20:
        sys.exit(f"{shot}: only {len(colours)} colours: a blank or broken page?")
    print(f"chromium screenshot: {shot} ({os.path.getsize(shot)} bytes, {width}x{height}, "
          f"{len(colours)} colours, the bars' colours present)")


if __name__ == "__main__":
    main()
