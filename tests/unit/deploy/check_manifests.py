#!/usr/bin/env python3
"""Schema-free checks of the deployment files: every YAML parses, and the Kubernetes manifests
keep the properties kvtierd needs (shared IPC, the socket on a hostPath, memlock, a liveness
probe through kvtierctl, resources). The ConfigMap's kvtierd.toml goes through
`kvtierd --check-config` when a built kvtierd is given, and deploy/prometheus.yml through
`promtool check config` when promtool is installed.

usage: check_manifests.py REPO_ROOT [KVTIERD]
"""
import pathlib
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


def check_daemonset(ds, path):
    spec = ds["spec"]["template"]["spec"]
    check(spec.get("hostIPC") is True, f"{path}: DaemonSet needs hostIPC: true (pools in /dev/shm)")
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
    caps = sc.get("capabilities", {}).get("add", [])
    check("IPC_LOCK" in caps or sc.get("privileged") is True,
          f"{path}: kvtierd needs IPC_LOCK (or privileged) for memlock")
    # Kubernetes sets no ambient capabilities: an added one is effective only for uid 0.
    uid = sc.get("runAsUser", spec.get("securityContext", {}).get("runAsUser"))
    check(sc.get("privileged") is True or uid == 0,
          f"{path}: IPC_LOCK is effective only for runAsUser: 0 (got {uid})")
    check(sc.get("allowPrivilegeEscalation") is False, f"{path}: allowPrivilegeEscalation: false")
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
