#!/usr/bin/python3
"""Reads a running view (fedmoe-history serve in the Docker stack) as a browser
and a script would, for tests/docker.sh and tests/swarm.sh: with the token,
/api/runs holds one run of PLANNED rounds, its rounds endpoint at least
MIN_ROUNDS committed rounds with CLIENTS completed in round 1, and the page
loads; without the token /api/ is 401. Waits up to 120 s for the view to
answer (it may still wait for the coordinator's database) and for MIN_ROUNDS
rounds. Exit 1 naming what is wrong.
  tests/view_probe.py PORT TOKEN PLANNED MIN_ROUNDS CLIENTS
"""
import json
import sys
import time
import urllib.error
import urllib.request

port, token = int(sys.argv[1]), sys.argv[2]
planned, min_rounds, clients = (int(a) for a in sys.argv[3:6])
base = f"http://127.0.0.1:{port}"


def get(path, auth=True):
    headers = {"Authorization": f"Bearer {token}"} if auth else {}
    try:
        with urllib.request.urlopen(urllib.request.Request(base + path, headers=headers), timeout=10) as r:
            return r.status, r.read()
    except urllib.error.HTTPError as e:
        return e.code, e.read()


def runs_and_rounds():
    """(code, body, runs, rounds of the first run) as the view answers now."""
    code, body = get("/api/runs")
    runs = json.loads(body)["runs"] if code == 200 else []
    if not runs:
        return code, body, runs, []
    rcode, rbody = get(f"/api/runs/{runs[0]['id']}/rounds")
    return rcode, rbody, runs, json.loads(rbody)["rounds"] if rcode == 200 else []


def main():
    code, body, runs, rounds = None, b"", [], []
    for _ in range(120):
        try:
            code, body, runs, rounds = runs_and_rounds()
            if code != 200 or len(rounds) >= min_rounds:
                break
        except OSError as e:
            code, body = None, str(e).encode()
        time.sleep(1)
    assert code == 200, f"the view with the token: {code} {body[:200]!r}"
    assert len(runs) == 1 and runs[0]["rounds_planned"] == planned, f"runs: {runs}"
    assert len(rounds) >= min_rounds and rounds[0]["round"] == 1 and rounds[0]["completed"] == clients, \
        f"rounds ({code}): {rounds}"
    code, body = get("/api/runs", auth=False)
    assert code == 401 and b"token" in body, f"without the token: {code} {body[:200]!r}"
    code, body = get("/?token=" + token, auth=False)
    assert code == 200 and b"<html" in body.lower(), f"the page: {code}"
    print(f"view on port {port}: run {runs[0]['id']} ({runs[0]['status']}), {len(rounds)} round(s), "
          f"{clients} clients in round 1; 401 without the token")


try:
    main()
except AssertionError as e:
    print(f"view_probe: {e}", file=sys.stderr)
    sys.exit(1)
