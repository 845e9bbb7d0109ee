#!/usr/bin/env python3
"""The browser view's page in a real browser: Debian's headless Chromium,
driven through chromedriver's WebDriver protocol (plain HTTP and JSON, so no
client library), against fedmoe-history serve on a run being written.

Checks: the runs list shows the live run; the run page's chart has one point
per committed round; a round committed later appears without a reload; a
round's clients table sorts by a clicked column (both ways); two runs overlay
on one page; on a phone's width (390 px) the run page and a round's clients fit
the screen. Screenshots go to ARTIFACTS (default BIN/test-artifacts).

    tests/view_page.py BIN [ARTIFACTS]      (exit 77: no chromium here)
"""
import base64
import json
import os
import shutil
import socket
import sqlite3
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request

BIN = os.path.abspath(sys.argv[1])
ART = os.path.abspath(sys.argv[2] if len(sys.argv) > 2 else os.path.join(BIN, "test-artifacts"))
CHROMEDRIVER = shutil.which("chromedriver") or "/usr/bin/chromedriver"
CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"


def free_port():
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return port


def wait_for(what, cond, timeout=60.0, every=0.2):
    end = time.time() + timeout
    while time.time() < end:
        try:
            v = cond()
        except OSError:  # (not listening yet)
            v = None
        if v:
            return v
        time.sleep(every)
    raise AssertionError("timed out waiting for " + what)


def listening(port):
    socket.create_connection(("127.0.0.1", port), 1).close()
    return True


def committed(db):
    try:
        with sqlite3.connect("file:%s?mode=ro" % db, uri=True) as c:
            return c.execute("SELECT COUNT(*) FROM rounds").fetchone()[0]
    except sqlite3.Error:
        return 0


class Driver:
    """The few WebDriver commands the test needs."""

    def __init__(self, port):
        self.base = "http://127.0.0.1:%d" % port
        caps = {"capabilities": {"alwaysMatch": {"browserName": "chrome", "goog:chromeOptions": {
            "binary": CHROMIUM,
            "args": ["--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
                     "--window-size=1280,1000"]}}}}
        self.sid = self.call("POST", "/session", caps)["sessionId"]

    def call(self, method, path, body=None):
        data = json.dumps(body).encode() if body is not None else None
        req = urllib.request.Request(self.base + path, data=data, method=method,
                                     headers={"Content-Type": "application/json"})
        try:
            with urllib.request.urlopen(req, timeout=60) as r:
                return json.loads(r.read())["value"]
        except urllib.error.HTTPError as e:
            raise AssertionError("webdriver %s %s: %s" % (method, path, e.read()[:600])) from None

    def s(self, method, path, body=None):
        return self.call(method, "/session/%s%s" % (self.sid, path), body)

    def go(self, url):
        self.s("POST", "/url", {"url": url})

    def js(self, script, *args):
        return self.s("POST", "/execute/sync", {"script": script, "args": list(args)})

    def shot(self, name):
        os.makedirs(ART, exist_ok=True)
        with open(os.path.join(ART, name), "wb") as f:
            f.write(base64.b64decode(self.s("GET", "/screenshot")))

    def quit(self):
        try:
            self.call("DELETE", "/session/" + self.sid)
        except OSError:
            pass


# the number of points of the first chart's first line (one a committed round)
POINTS = """const l = document.querySelector('#charts .chart polyline');
return l ? l.getAttribute('points').trim().split(' ').length : 0;"""
# the text of column k of the clients table, row by row
COLUMN = """return [...document.querySelectorAll('#clients-table tr')].slice(1).map(r => r.children[arguments[0]].textContent);"""


def main():
    if not os.access(CHROMIUM, os.X_OK) or not os.access(CHROMEDRIVER, os.X_OK):
        print("view_page: no chromium / chromedriver here (apt-get install chromium chromium-driver)")
        return 77
    work = tempfile.mkdtemp(prefix="fedmoe-view-page-")
    db = os.path.join(work, "view.db")
    procs = []
    driver = None
    try:
        # a finished run to compare with, then a live one (slow enough to watch)
        subprocess.run([BIN + "/client/fedmoe-sim", "--clients", "3", "--rounds", "3", "--strategy", "fedavg",
                        "--db", db, "--workdir", work + "/a"], check=True, stdout=subprocess.DEVNULL)
        live = subprocess.Popen([BIN + "/client/fedmoe-sim", "--clients", "4", "--rounds", "12", "--strategy",
                                 "comigs", "--db", db, "--workdir", work + "/b"], stdout=subprocess.DEVNULL)
        procs.append(live)
        port, dport = free_port(), free_port()
        procs.append(subprocess.Popen([BIN + "/server/fedmoe-history", "--db", db, "serve", "--listen",
                                       "127.0.0.1:%d" % port], stderr=subprocess.DEVNULL))
        procs.append(subprocess.Popen([CHROMEDRIVER, "--port=%d" % dport], stdout=subprocess.DEVNULL,
                                      stderr=subprocess.DEVNULL))
        with sqlite3.connect(db) as c:
            first = c.execute("SELECT id FROM runs ORDER BY started_at, rowid").fetchone()[0]
        runs = wait_for("the live run", lambda: (lambda r: r if len(r) == 2 else None)(
            sqlite3.connect(db).execute("SELECT id FROM runs ORDER BY started_at, rowid").fetchall()))
        second = runs[1][0]
        wait_for("a committed round", lambda: committed(db) >= 4)
        wait_for("chromedriver", lambda: listening(dport), timeout=30)
        driver = Driver(dport)
        base = "http://127.0.0.1:%d/" % port

        # the runs list
        driver.go(base)
        wait_for("the runs table", lambda: driver.js("return document.querySelectorAll('#runs tr').length") == 3)
        assert "running" in driver.js("return document.getElementById('runs').textContent")
        driver.shot("runs.png")

        # the live run: a point per committed round, and a new one without reloading
        driver.go(base + "#/run/" + second)
        now = wait_for("the chart", lambda: driver.js(POINTS))
        shown = committed(db) - 3  # (the finished run's 3 rounds)
        assert abs(now - shown) <= 1, (now, shown)
        driver.js("window.fedmoeMark = 1")  # (gone if the page reloads)
        wait_for("a later round on the chart", lambda: driver.js(POINTS) > now, timeout=120)
        assert driver.js("return window.fedmoeMark") == 1, "the page reloaded"
        driver.shot("run-live.png")

        # a round's clients, sorted by test accuracy both ways
        driver.go(base + "#/run/" + second + "/round/2")
        wait_for("the clients table", lambda: len(driver.js(COLUMN, 0)) == 4)
        head = lambda label: ("const th = [...document.querySelectorAll('#clients-table th')]"
                              ".find(t => t.textContent.startsWith('%s')); th.click();" % label)
        for order in ("asc", "desc"):
            driver.js(head("test acc"))
            wait_for("sorted " + order, lambda: ("\u25b2" if order == "asc" else "\u25bc") in
                     driver.js("return document.getElementById('clients-table').rows[0].textContent"))
            vals = [float(v.rstrip("%")) for v in driver.js(COLUMN, 2)]
            assert vals == sorted(vals, reverse=(order == "desc")), (order, vals)
        driver.shot("round-clients.png")

        # two runs overlaid
        assert live.wait(timeout=300) == 0
        driver.go(base + "#/run/%s,%s" % (first, second))
        wait_for("two runs' lines", lambda: driver.js(
            "const c = document.querySelector('#charts .chart'); return c ? c.querySelectorAll('polyline').length : 0") == 4)
        driver.shot("runs-overlaid.png")

        # a phone's screen (390 x 844 CSS pixels): the run page and a round's
        # clients fit its width (a wide table scrolls in its own box), the charts
        # are drawn at the screen's width
        driver.s("POST", "/window/rect", {"width": 390, "height": 844})
        fits = "return document.documentElement.scrollWidth <= window.innerWidth + 1"
        driver.go(base + "#/run/" + second)
        wait_for("the chart on a phone", lambda: driver.js(POINTS))
        assert driver.js(fits), ("run page wider than the phone", driver.js(
            "return [document.documentElement.scrollWidth, window.innerWidth]"))
        width = driver.js("return document.querySelector('#charts .chart').getBoundingClientRect().width")
        assert 250 <= width <= driver.js("return window.innerWidth"), width
        driver.shot("run-phone.png")
        driver.go(base + "#/run/" + second + "/round/2")
        wait_for("the clients table on a phone", lambda: len(driver.js(COLUMN, 0)) == 4)
        assert driver.js(fits), "a round's clients wider than the phone"
        driver.shot("round-clients-phone.png")
        print("view_page: ok; screenshots in " + ART)
        return 0
    finally:
        if driver:
            driver.quit()
        for p in procs:
            if p.poll() is None:
                p.terminate()
                try:
                    p.wait(timeout=10)
                except subprocess.TimeoutExpired:
                    p.kill()
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
