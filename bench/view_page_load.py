#!/usr/bin/env python3
"""The browser view's load time in Debian's headless Chromium: URL (a run
page) opened afresh 7 times; for each, the milliseconds from the navigation's
start until the page had drawn its charts (the page records it as
window.fedmoeDrawn) and until DOMContentLoaded; their medians.
    bench/view_page_load.py URL"""
import os
import statistics
import subprocess
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests"))
from view_page import CHROMEDRIVER, Driver, free_port, listening, wait_for  # noqa: E402


def main():
    url = sys.argv[1]
    port = free_port()
    drv = subprocess.Popen([CHROMEDRIVER, "--port=%d" % port], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    d = None
    try:
        wait_for("chromedriver", lambda: listening(port), timeout=30)
        d = Driver(port)
        drawn, dcl = [], []
        for i in range(7):
            d.go("about:blank")
            d.go(url)
            drawn.append(wait_for("the charts", lambda: d.js("return window.fedmoeDrawn || 0"), timeout=120, every=0.02))
            dcl.append(d.js("return performance.getEntriesByType('navigation')[0].domContentLoadedEventEnd"))
            time.sleep(0.2)
        print("page %s: charts drawn after %.0f ms (median of 7; %s), DOMContentLoaded %.0f ms" %
              (url, statistics.median(drawn), ", ".join("%.0f" % v for v in drawn), statistics.median(dcl)))
    finally:
        if d:
            d.quit()
        drv.terminate()


if __name__ == "__main__":
    main()
