#!/usr/bin/env python3
"""Schema-free checks of the deployment files: every YAML parses, and the Kubernetes manifests
keep the properties kvtierd needs (the socket on a hostPath, a liveness probe through kvtierctl,
resources) and the trust boundary (docs/security.md): no hostIPC, hostPID or privileged
container anywhere; the daemon runs as a non-root uid that owns the socket directory; worker pods
mount it read-only, run as neither root nor the daemon's uid, and name the daemon's uid in
KVTIER_DAEMON_UID. The ConfigMap's kvtierd.toml goes through
`kvtierd --check-config` when a built kvtierd is given, and deploy/prometheus.yml through
`promtool check config` when promtool is installed.

usage: check_manifests.py REPO_ROOT [KVTIERD]
"""
import pathlib
import re
import shutil
import subprocess
import sys
import tempfile
import tomllib

import yaml

failures = []


def check(ok, what):
    if not ok:
        failures.append(what)


def load_all(path):
    try:
        return [d for d in yaml.safe_load_all(path.read_text()) if d is not None]
    except yaml.YAMLError as e:
        failures.append(f"{path}: not valid YAML: {e}")
        return []


def containers(pod_spec):
    return pod_spec.get("containers", [])


def pod_spec(doc):
    """The pod spec of a Pod or of a workload's template; None for other kinds."""
    if doc.get("kind") == "Pod":
        return doc.get("spec", {})
    return doc.get("spec", {}).get("template", {}).get("spec")


def run_as(pod, c, key):
    return c.get("securityContext", {}).get(key, pod.get("securityContext", {}).get(key))


def check_no_host_namespaces(doc, path):
    """No pod shares the host's IPC or pid namespace, and no container is privileged: the pools
    are memfds passed over the memory channel, nothing needs them."""
    pod = pod_spec(doc)
    if pod is None:
        return
    name = doc.get("metadata", {}).get("name")
    for key in ("hostIPC", "hostPID"):
        check(not pod.get(key), f"{path}: {name} sets {key}: true")
    for c in pod.get("initContainers", []) + containers(pod):
        sc = c.get("securityContext", {})
        check(sc.get("privileged") is not True, f"{path}: {name}/{c['name']} is privileged")
        check(sc.get("allowPrivilegeEscalation") is False,
              f"{path}: {name}/{c['name']} needs allowPrivilegeEscalation: false")


def socket_volumes(pod):
    return [v["name"] for v in pod.get("volumes", [])
            if v.get("hostPath", {}).get("path") == "/run/kvtier"]


def daemon_uid(ds):
    spec = ds["spec"]["template"]["spec"]
    daemon = [c for c in containers(spec) if c["name"] == "kvtierd"]
    return run_as(spec, daemon[0], "runAsUser") if daemon else None


def check_worker(doc, path, uid_of_daemon):
    """A pod that mounts the socket directory and is not the daemon's: a worker."""
    pod = pod_spec(doc)
    name = doc.get("metadata", {}).get("name")
    vols = socket_volumes(pod)
    for c in containers(pod):
        mounts = [m for m in c.get("volumeMounts", []) if m["name"] in vols]
        if not mounts:
            continue
        for m in mounts:
            check(m.get("readOnly") is True,
                  f"{path}: {name}/{c['name']} must mount the socket directory readOnly: true")
        uid = run_as(pod, c, "runAsUser")
        check(run_as(pod, c, "runAsNonRoot") is True and uid not in (None, 0),
              f"{path}: {name}/{c['name']} must run as a non-root uid (runAsNonRoot, runAsUser)")
        check(uid != uid_of_daemon,
              f"{path}: {name}/{c['name']} must not run as the daemon's uid {uid_of_daemon}")
        env = {e["name"]: e.get("value") for e in c.get("env", [])}
        check(env.get("KVTIER_DAEMON_UID") == str(uid_of_daemon),
              f"{path}: {name}/{c['name']} needs KVTIER_DAEMON_UID={uid_of_daemon}, "
              f"has {env.get('KVTIER_DAEMON_UID')}")


def check_daemonset(ds, path):
    spec = ds["spec"]["template"]["spec"]
    host_paths = {v["name"]: v["hostPath"]["path"] for v in spec.get("volumes", [])
                  if "hostPath" in v}
    check("/run/kvtier" in host_paths.values(), f"{path}: /run/kvtier must be a hostPath volume")
    daemon = [c for c in containers(spec) if c["name"] == "kvtierd"]
    check(len(daemon) == 1, f"{path}: one container named kvtierd")
    if not daemon:
        return
    c = daemon[0]
    mounts = {m["name"]: m["mountPath"] for m in c.get("volumeMounts", [])}
    socket_vol = [n for n, p in host_paths.items() if p == "/run/kvtier"]
    check(socket_vol and mounts.get(socket_vol[0]) == "/run/kvtier",
          f"{path}: kvtierd must mount the socket hostPath at /run/kvtier")
    sc = c.get("securityContext", {})
    uid = run_as(spec, c, "runAsUser")
    check(run_as(spec, c, "runAsNonRoot") is True and uid not in (None, 0),
          f"{path}: kvtierd must run as a dedicated non-root uid (runAsNonRoot, runAsUser: {uid})")
    check(sc.get("capabilities", {}).get("drop") == ["ALL"] and
          not sc.get("capabilities", {}).get("add"),
          f"{path}: kvtierd needs no capability: drop ALL, add none")
    # The socket directory must be the daemon's, writable by nobody else.
    init = [i for i in spec.get("initContainers", [])
            if any(m["name"] in socket_vol for m in i.get("volumeMounts", []))]
    check(any("install" in i.get("command", []) and "-o" in i["command"] and
              i["command"][i["command"].index("-o") + 1] == str(uid) and
              i["command"][i["command"].index("-m") + 1] == "0750" for i in init),
          f"{path}: an init container must give /run/kvtier to uid {uid}, mode 0750")
    for i in init:
        caps = set(i.get("securityContext", {}).get("capabilities", {}).get("add", []))
        check(caps <= {"CHOWN", "FOWNER"}, f"{path}: {i['name']} may add CHOWN, FOWNER only")
    limits = c.get("resources", {}).get("limits", {})
    requests = c.get("resources", {}).get("requests", {})
    check("memory" in limits and "memory" in requests, f"{path}: memory requests and limits")
    # The probes see what workers see: `kvtierctl health` (the channel and gRPC), not `status`
    # (gRPC alone), with a deadline per check that fits the probe's own timeout.
    for kind in ("startupProbe", "livenessProbe", "readinessProbe"):
        p = c.get(kind, {})
        probe = p.get("exec", {}).get("command", [])
        check(any(a.endswith("kvtierctl") for a in probe) and "health" in probe,
              f"{path}: {kind} must run kvtierctl health, got {probe}")
        check("--socket" in probe and "/run/kvtier/kvtierd.sock" in probe,
              f"{path}: the {kind} must name the socket")
        timeout = float(probe[probe.index("--timeout") + 1]) if "--timeout" in probe else 2.0
        check(p.get("timeoutSeconds", 1) >= 3 * timeout,
              f"{path}: {kind}.timeoutSeconds {p.get('timeoutSeconds', 1)} must cover three "
              f"checks of --timeout {timeout} s")


def check_configmap(cm, path, kvtierd):
    text = cm.get("data", {}).get("kvtierd.toml")
    check(text is not None, f"{path}: ConfigMap needs data.kvtierd.toml")
    if text is None:
        return
    config = tomllib.loads(text)
    check(config.get("server", {}).get("socket", "").startswith("/run/kvtier/"),
          f"{path}: server.socket must be under the /run/kvtier hostPath")
    if kvtierd:
        with tempfile.NamedTemporaryFile("w", suffix=".toml") as f:
            f.write(text)
            f.flush()
            r = subprocess.run([kvtierd, "--check-config", "--config", f.name],
                               capture_output=True, text=True, timeout=30)
        check(r.returncode == 0, f"{path}: kvtierd --check-config: {r.stdout}{r.stderr}")


def check_prometheus(root):
    path = root / "deploy/prometheus.yml"
    docs = load_all(path)
    check(len(docs) == 1, f"{path}: one YAML document")
    if not docs:
        return
    default_metrics = tomllib.loads((root / "deploy/kvtierd.toml").read_text())["server"]["metrics"]
    if default_metrics == "auto":
        # The host's daemon serves the address daemon/config/config.h names.
        m = re.search(r'kHostMetricsAddress\[\] = "([^"]+)"',
                      (root / "daemon/config/config.h").read_text())
        check(m is not None, "daemon/config/config.h: kHostMetricsAddress not found")
        default_metrics = m.group(1) if m else default_metrics
    targets = [t for job in docs[0].get("scrape_configs", [])
               for sc in job.get("static_configs", []) for t in sc.get("targets", [])]
    check(default_metrics in targets,
          f"{path}: must scrape the default metrics address {default_metrics}, has {targets}")
    promtool = shutil.which("promtool")
    if promtool:
        r = subprocess.run([promtool, "check", "config", str(path)], capture_output=True,
                           text=True, timeout=30)
        check(r.returncode == 0, f"promtool check config: {r.stdout}{r.stderr}")
    else:
        print("promtool not installed: deploy/prometheus.yml checked as YAML only")


def main():
    root = pathlib.Path(sys.argv[1])
    kvtierd = sys.argv[2] if len(sys.argv) > 2 and pathlib.Path(sys.argv[2]).exists() else None
    kinds = {}
    manifests = sorted((root / "deploy/k8s").glob("*.yaml"))
    check(manifests, "deploy/k8s has no *.yaml")
    for path in manifests:
        for doc in load_all(path):
            check(isinstance(doc, dict) and "apiVersion" in doc and "kind" in doc,
                  f"{path}: every document needs apiVersion and kind")
            kinds.setdefault(doc.get("kind"), []).append((doc, path))
    for kind in ("DaemonSet", "ConfigMap"):
        check(kind in kinds, f"deploy/k8s: no {kind}")
    for doc, path in kinds.get("DaemonSet", []):
        check_daemonset(doc, path)
    uids = {daemon_uid(ds) for ds, _ in kinds.get("DaemonSet", [])}
    workers = 0
    for docs in kinds.values():
        for doc, path in docs:
            check_no_host_namespaces(doc, path)
            pod = pod_spec(doc)
            if doc.get("kind") != "DaemonSet" and pod is not None and socket_volumes(pod):
                workers += 1
                for uid in uids:
                    check_worker(doc, path, uid)
    check(workers > 0, "deploy/k8s: no example worker pod that mounts /run/kvtier")
    for doc, path in kinds.get("ConfigMap", []):
        check_configmap(doc, path, kvtierd)
    if not kvtierd:
        print("kvtierd not built: the ConfigMap's config was not run through --check-config")
    check_prometheus(root)
    for f in failures:
        print("FAIL:", f)
    print(f"checked {len(manifests)} manifests: {len(failures)} failure(s)")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
