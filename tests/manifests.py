#!/usr/bin/python3
"""The deployment files agree with the programs (ctest deploy_manifests).

docker/entrypoint.sh, docker/compose.yml and docker/k8s/fedmoe.yaml must use
only flags that fedmoe-server and fedmoe-client really have (their --help),
only settings (FEDMOE_*) that the entrypoint reads, only entrypoint roles that
exist, one image, and the same number of clients everywhere; docker/README.md
documents every setting the entrypoint reads.
  tests/manifests.py SOURCE_DIR BUILD_DIR
"""
import re
import subprocess
import sys

import yaml

src, build = sys.argv[1], sys.argv[2]
errors = []


def check(cond, what):
    if not cond:
        errors.append(what)


def help_flags(program):
    out = subprocess.run([program, "--help"], capture_output=True, text=True).stdout
    return set(re.findall(r"--[a-z][a-z0-9-]*", out))


server = help_flags(f"{build}/server/fedmoe-server")
client = help_flags(f"{build}/client/fedmoe-client")
history = help_flags(f"{build}/server/fedmoe-history")
check(len(server) > 20 and len(client) > 10, "could not read the programs' --help")

entry = open(f"{src}/docker/entrypoint.sh").read()
# the flags each role passes: the `set --` lines and `exec` lines of its function
for fn, known, prog in (("run_coordinator", server, "fedmoe-server"), ("run_client", client, "fedmoe-client"),
                        ("run_view", history, "fedmoe-history")):
    body = re.search(r"^%s\(\) \{\n(.*?)^\}" % fn, entry, re.S | re.M)
    check(body is not None, f"entrypoint: no function {fn}")
    if body:
        used = set(re.findall(r"(?<![\w-])--[a-z][a-z0-9-]*", body.group(1)))
        check(used, f"entrypoint: {fn} passes no flags")
        for flag in sorted(used - known):
            errors.append(f"entrypoint: {fn} passes {flag}, which {prog} --help does not list")

reads = set(re.findall(r"\$\{?(FEDMOE_[A-Z_]+|JOB_COMPLETION_INDEX)", entry))
roles = set(re.findall(r"^  ([a-z]+)\)", entry, re.M))
check({"keys", "coordinator", "client", "view", "token", "health"} <= roles, f"entrypoint roles: {sorted(roles)}")
readme = open(f"{src}/docker/README.md").read()
for var in sorted(reads - {"JOB_COMPLETION_INDEX", "FEDMOE_CLIENT_SLOT", "FEDMOE_VERSION", "FEDMOE_COMMIT"}):
    check(f"`{var}`" in readme, f"docker/README.md does not document {var}")

# compose (also the swarm stack)
compose = yaml.safe_load(open(f"{src}/docker/compose.yml"))
images = set()
for name, svc in compose["services"].items():
    images.add(svc.get("image"))
    for var in (svc.get("environment") or {}):
        check(var in reads, f"compose: service {name} sets {var}, which the entrypoint does not read")
    cmd = svc.get("command") or []
    if "entrypoint" not in svc:
        check(cmd and cmd[0] in roles, f"compose: service {name} runs '{cmd}', not an entrypoint role")
for name in ("coordinator", "view"):
    svc = compose["services"][name]
    check(svc["deploy"].get("endpoint_mode") == "dnsrr", f"compose: {name} not dnsrr")
    check(all(p.get("mode") == "host" for p in svc["ports"]), f"compose: {name}'s ports not host mode")
check(compose["services"]["view"]["volumes"] and any(v.startswith("data:") for v in compose["services"]["view"]["volumes"]),
      "compose: the view does not read the coordinator's data volume")
check(len(images) == 1, f"compose: more than one image: {images}")
image = re.sub(r"^\$\{[A-Z_]+:-(.*)\}$", r"\1", next(iter(images)))  # its default

# kubernetes
docs = [d for d in yaml.safe_load_all(open(f"{src}/docker/k8s/fedmoe.yaml")) if d]
kinds = {d["kind"]: d for d in docs}
check({"ConfigMap", "Service", "StatefulSet", "Job"} <= set(kinds), f"k8s: kinds {sorted(kinds)}")
settings = kinds["ConfigMap"]["data"]
for var in settings:
    check(var in reads, f"k8s: ConfigMap sets {var}, which the entrypoint does not read")
job = kinds["Job"]["spec"]
n = int(settings["FEDMOE_CLIENTS"])
check(job.get("completionMode") == "Indexed", "k8s: clients are not an Indexed Job")
check(job["completions"] == n and job["parallelism"] == n, "k8s: Job completions/parallelism != FEDMOE_CLIENTS")
check(kinds["Service"]["metadata"]["name"] == "coordinator", "k8s: the Service is not named coordinator")
check(kinds["StatefulSet"]["spec"].get("volumeClaimTemplates"), "k8s: the coordinator has no persistent volume claim")
for kind in ("StatefulSet", "Job"):
    pod = kinds[kind]["spec"]["template"]["spec"]
    check(pod.get("securityContext", {}).get("runAsNonRoot") is True, f"k8s: {kind} may run as root")
    for c in pod["containers"]:
        check(c["image"].split(":")[0] == image.split(":")[0], f"k8s: {kind} runs {c['image']}, not {image}")
        check(c["args"][0] in roles, f"k8s: {kind} runs '{c['args']}', not an entrypoint role")
        for e in c.get("env", []):
            check(e["name"] in reads, f"k8s: {kind} sets {e['name']}, which the entrypoint does not read")
        mounts = [m["mountPath"] for m in c.get("volumeMounts", [])]
        check(any(m.startswith("/secrets/") for m in mounts), f"k8s: {kind} mounts no key secret")

if errors:
    print("deploy_manifests: FAILED\n  " + "\n  ".join(errors))
    sys.exit(1)
print(f"deploy_manifests: OK ({len(server)} server and {len(client)} client flags known; "
      f"{len(reads)} settings; compose and {len(docs)} Kubernetes objects checked)")
