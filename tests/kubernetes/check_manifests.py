"""Checks deploy/kubernetes: schemas, security properties, consistency.

1. `kubectl kustomize` renders both installations (with sessions: deploy/kubernetes;
   without: deploy/kubernetes/stateless) offline, and every document, rendered or
   standalone (examples/, monitoring/), is validated by kubernetes-validate against the
   Kubernetes OpenAPI schemas of each version in VERSIONS, strict (unknown fields fail).
   Custom resources (ServiceMonitor) have no schema there: the checks below cover them.
2. The security properties the docs promise, asserted on the rendered objects: see
   `problems`. A change that weakens one fails here.
3. `--self-test` proves the checks bite: each hostile change to the rendered objects
   (privileged, a capability added, a token written in, ...) must be reported, and
   kubernetes-validate must refuse an unknown field and a wrong type.

usage: check_manifests.py DEPLOY_DIR [--self-test]
       (kubernetes_validate and yaml importable, kubectl on PATH; exit 0 when all held)
"""

import copy
import glob
import os
import re
import subprocess
import sys
import tomllib

import kubernetes_validate
import yaml

# The oldest version the manifests need (hostUsers on by default, procMount Unmasked,
# preStop sleep, appArmorProfile) and the newest the validator knows.
VERSIONS = ["1.33.0", kubernetes_validate.utils.latest_version()]
CODEBOX = "codebox"
BALANCER = "codebox-balancer"
# Seconds codebox may take after SIGTERM besides the drain: killed executions answered
# (5), answers written out (5), sandboxes reaped and cgroups removed (3).
AFTER_DRAIN = 13
SECRETISH = re.compile(r"TOKEN|SECRET|PASSWORD|PASSWD|CREDENTIAL|API_?KEY", re.I)
# The balancers whose PROXY protocol v2 headers the replicas read (and require).
TRUST = "CODEBOX_HTTP_TRUSTED_PROXIES"


def render(path):
    out = subprocess.run(
        ["kubectl", "kustomize", path], check=True, capture_output=True, text=True
    ).stdout
    return [d for d in yaml.safe_load_all(out) if d]


def load(path):
    with open(path, encoding="utf-8") as f:
        return [d for d in yaml.safe_load_all(f) if d]


def find(docs, kind, name):
    hits = [d for d in docs if d["kind"] == kind and d["metadata"]["name"] == name]
    return hits[0] if len(hits) == 1 else None


def duration_s(text):
    m = re.fullmatch(r"(\d+)(ms|s|m)", text)
    if not m:
        raise ValueError(f"not a duration: {text}")
    n, unit = int(m.group(1)), m.group(2)
    return {"ms": n / 1000, "s": n, "m": n * 60}[unit]


def container_problems(where, c, secrets_ok):
    p = []
    sc = c.get("securityContext") or {}
    if sc.get("privileged"):
        p.append(f"{where}: privileged")
    if sc.get("allowPrivilegeEscalation") is not False:
        p.append(f"{where}: allowPrivilegeEscalation is not false")
    if sc.get("readOnlyRootFilesystem") is not True:
        p.append(f"{where}: readOnlyRootFilesystem is not true")
    caps = sc.get("capabilities") or {}
    if "ALL" not in (caps.get("drop") or []):
        p.append(f"{where}: capabilities do not drop ALL")
    if caps.get("add"):
        p.append(f"{where}: capabilities added: {caps['add']}")
    if sc.get("runAsNonRoot") is False or sc.get("runAsUser") == 0:
        p.append(f"{where}: may run as root")
    for e in c.get("env") or []:
        if SECRETISH.search(e["name"]):
            ref = (e.get("valueFrom") or {}).get("secretKeyRef")
            if "value" in e or not ref:
                p.append(f"{where}: {e['name']} is not taken from a Secret")
            elif not secrets_ok:
                p.append(f"{where}: {e['name']} needs no secret here")
    for e in c.get("envFrom") or []:
        if "configMapRef" in e:
            p.append(f"{where}: environment from a ConfigMap (tokens belong in Secrets)")
    return p


def pod_problems(where, pod, secrets_ok, userns):
    p = []
    spec = pod["spec"]
    for key in ("hostNetwork", "hostPID", "hostIPC"):
        if spec.get(key):
            p.append(f"{where}: {key}")
    if userns and spec.get("hostUsers") is not False:
        p.append(f"{where}: hostUsers is not false (no user namespace for the pod)")
    if spec.get("automountServiceAccountToken") is not False:
        p.append(f"{where}: a service account token is mounted")
    psc = spec.get("securityContext") or {}
    if psc.get("runAsNonRoot") is not True:
        p.append(f"{where}: runAsNonRoot is not true")
    if not psc.get("runAsUser"):
        p.append(f"{where}: runAsUser is root or unset")
    for v in spec.get("volumes") or []:
        if "hostPath" in v:
            p.append(f"{where}: hostPath volume {v['name']}")
    for c in spec.get("initContainers", []) + spec["containers"]:
        p += container_problems(f"{where}/{c['name']}", c, secrets_ok)
        res = (c.get("resources") or {}).get("limits") or {}
        if "memory" not in res:
            p.append(f"{where}/{c['name']}: no memory limit")
    return p


def codebox_pod_problems(where, pod, config_maps):
    """What codebox's own pod needs, beyond the general rules."""
    p = pod_problems(where, pod, secrets_ok=True, userns=True)
    spec = pod["spec"]
    c = [c for c in spec["containers"] if c["name"] == CODEBOX][0]
    sc = c["securityContext"]
    if sc.get("procMount") != "Unmasked":
        p.append(f"{where}: procMount is not Unmasked (sandboxes cannot mount /proc)")
    probe = (c.get("readinessProbe") or {}).get("httpGet") or {}
    if probe.get("path") != "/readyz":
        p.append(f"{where}: readiness is not /readyz")
    env = {e["name"]: e for e in c.get("env") or []}
    replica = (env.get("CODEBOX_REPLICA", {}).get("valueFrom") or {}).get("fieldRef")
    if not replica or replica.get("fieldPath") != "metadata.name":
        p.append(f"{where}: CODEBOX_REPLICA is not the pod's name")
    # Grace: the preStop sleep, the drain bound, then what follows it.
    args = c.get("args") or []
    drain = duration_s(args[args.index("--drain-timeout") + 1]) if "--drain-timeout" in args else 10
    sleep = (((c.get("lifecycle") or {}).get("preStop") or {}).get("sleep") or {}).get("seconds", 0)
    grace = spec.get("terminationGracePeriodSeconds", 30)
    if grace < sleep + drain + AFTER_DRAIN:
        p.append(f"{where}: grace {grace}s < preStop {sleep}s + drain {drain}s + {AFTER_DRAIN}s")
    # codebox.toml: where it is, what it names, and that it holds no secret.
    mounts = {m["mountPath"]: m for m in c.get("volumeMounts") or []}
    volumes = {v["name"]: v for v in spec.get("volumes") or []}
    cfg_path = env.get("CODEBOX_CONFIG", {}).get("value", "")
    cfg_dir, cfg_file = os.path.split(cfg_path)
    m = mounts.get(cfg_dir)
    cm_name = m and (volumes[m["name"]].get("configMap") or {}).get("name")
    cm = config_maps.get(cm_name)
    if not cm or cfg_file not in cm.get("data", {}):
        p.append(f"{where}: CODEBOX_CONFIG {cfg_path!r} is not a file of a mounted ConfigMap")
        return p
    toml = tomllib.loads(cm["data"][cfg_file])
    http = toml.get("http", {})
    for key, value in [("http.token", http.get("token"))] + [
        (f"http.clients.{k}", v) for k, v in http.get("clients", {}).items()
    ]:
        if value is not None and not str(value).startswith("env:"):
            p.append(f"{where}: {key} is written in the ConfigMap (use env: and a Secret)")
        if value is not None and str(value).startswith("env:") and str(value)[4:] not in env:
            p.append(f"{where}: {key} names {value}, which the pod does not set")
    writable = [
        path for path, mnt in mounts.items()
        if not mnt.get("readOnly") and ("emptyDir" in volumes[mnt["name"]] or "persistentVolumeClaim" in volumes[mnt["name"]])
    ]
    for key in ("state_dir", "skills_dir"):
        value = toml.get(key)
        if not value or not any(value == w or value.startswith(w + "/") for w in writable):
            p.append(f"{where}: {key} {value!r} is not on a writable volume")
    skills = toml.get("skills_dir", "")
    if not any(
        "persistentVolumeClaim" in volumes[mnt["name"]] and (skills == path or skills.startswith(path + "/"))
        for path, mnt in mounts.items()
    ):
        p.append(f"{where}: skills_dir is not on the shared volume")
    # Paused sessions: on a shared volume, sealed with a key from a Secret, the same in
    # every pod (a key in the ConfigMap would be in every backup of it).
    sessions = toml.get("sessions", {})
    key = sessions.get("snapshot_key")
    if key is not None:
        if not str(key).startswith("env:"):
            p.append(f"{where}: sessions.snapshot_key is written in the ConfigMap (use env: and a Secret)")
        elif "secretKeyRef" not in (env.get(str(key)[4:], {}).get("valueFrom") or {}):
            p.append(f"{where}: sessions.snapshot_key names {key}, which the pod does not take from a Secret")
        d = sessions.get("dir", "")
        if not any(
            "persistentVolumeClaim" in volumes[mnt["name"]] and not mnt.get("readOnly")
            and (d == path or d.startswith(path + "/"))
            for path, mnt in mounts.items()
        ):
            p.append(f"{where}: sessions.dir {d!r} is not on a shared writable volume")
    for key in ("HOME", "TMPDIR", "XDG_CACHE_HOME"):
        value = env.get(key, {}).get("value")
        if not value or not any(value == w or value.startswith(w + "/") for w in writable):
            p.append(f"{where}: {key} {value!r} is not on a writable volume")
    mcp = toml.get("mcp_config", "")
    if os.path.dirname(mcp) != cfg_dir or os.path.basename(mcp) not in cm["data"]:
        p.append(f"{where}: mcp_config {mcp!r} is not a file of the mounted ConfigMap")
    return p


def wiring_problems(docs):
    """Selectors, targets and named ports that point at nothing: every Service, PDB and
    NetworkPolicy selects pods of a workload here, every named port exists in them, the
    HPA scales a workload here, and every probe names a port of its container."""
    p = []
    pods = [d["spec"]["template"] for d in docs if d["kind"] in ("Deployment", "StatefulSet")]

    def selected(selector):
        return [t for t in pods if selector and selector.items() <= (t["metadata"].get("labels") or {}).items()]

    def port_names(templates):
        return {cp["name"] for t in templates for c in t["spec"]["containers"] for cp in c.get("ports", [])}

    for d in docs:
        kind, name = d["kind"], d["metadata"]["name"]
        if kind == "Service":
            chosen = selected(d["spec"].get("selector"))
            if not chosen:
                p.append(f"Service/{name} selects no pods")
            for port in d["spec"]["ports"]:
                if isinstance(port.get("targetPort"), str) and port["targetPort"] not in port_names(chosen):
                    p.append(f"Service/{name}: no container port named {port['targetPort']}")
        elif kind == "PodDisruptionBudget" and not selected(d["spec"]["selector"].get("matchLabels")):
            p.append(f"PodDisruptionBudget/{name} selects no pods")
        elif kind == "NetworkPolicy":
            chosen = selected(d["spec"]["podSelector"].get("matchLabels"))
            if not chosen:
                p.append(f"NetworkPolicy/{name} selects no pods")
            for rule in d["spec"].get("ingress", []):
                for port in rule.get("ports", []):
                    if isinstance(port.get("port"), str) and port["port"] not in port_names(chosen):
                        p.append(f"NetworkPolicy/{name}: no container port named {port['port']}")
        elif kind == "HorizontalPodAutoscaler":
            ref = d["spec"]["scaleTargetRef"]
            if not find(docs, ref["kind"], ref["name"]):
                p.append(f"HorizontalPodAutoscaler/{name} scales {ref['kind']}/{ref['name']}, which is not here")
    for t in pods:
        for c in t["spec"]["containers"]:
            names = {cp["name"] for cp in c.get("ports", [])}
            for probe in ("readinessProbe", "livenessProbe", "startupProbe"):
                port = ((c.get(probe) or {}).get("httpGet") or {}).get("port")
                if isinstance(port, str) and port not in names:
                    p.append(f"{c['name']}: {probe} names the port {port}, which it does not have")
    return p


def env_of(container):
    return {e["name"]: e.get("value") for e in container.get("env") or []}


def codebox_container(workload):
    return [c for c in workload["spec"]["template"]["spec"]["containers"] if c["name"] == CODEBOX][0]


def proxy_protocol_problems(workload, bal, haproxy_cfg):
    """The balancer sends PROXY v2 headers on every connection to a replica, the replicas
    trust exactly the balancer's pod network for them, and the kubelet's probes (which
    send none) do not use the MCP port."""
    p = []
    c = codebox_container(workload)
    trusted = env_of(c).get(TRUST)
    pod_cidr = bal and env_of(bal["spec"]["template"]["spec"]["containers"][0]).get("POD_CIDR")
    if not trusted or trusted != pod_cidr:
        p.append(f"StatefulSet/{CODEBOX}: {TRUST} is {trusted!r}, not the balancer's POD_CIDR {pod_cidr!r}")
    servers = [line.strip() for line in haproxy_cfg.splitlines() if line.strip().startswith("server ")]
    if not servers or any(" send-proxy-v2" not in line for line in servers):
        p.append("haproxy.cfg: a server line without send-proxy-v2 (the replicas require the header)")
    mcp_port = {cp["containerPort"] for cp in c.get("ports", []) if cp["name"] == "mcp"} | {"mcp"}
    for probe in ("readinessProbe", "livenessProbe", "startupProbe"):
        port = ((c.get(probe) or {}).get("httpGet") or {}).get("port")
        if port in mcp_port:
            p.append(f"StatefulSet/{CODEBOX}: the {probe} uses the MCP port, which refuses connections without a PROXY header from the pod network")
    return p


def problems(docs, stateless, haproxy_cfg):
    """Every broken promise in one rendered installation (empty: all held)."""
    p = wiring_problems(docs)
    config_maps = {d["metadata"]["name"]: d for d in docs if d["kind"] == "ConfigMap"}
    workload = find(docs, "Deployment" if stateless else "StatefulSet", CODEBOX)
    if not workload:
        return [f"no {'Deployment' if stateless else 'StatefulSet'} {CODEBOX}"]
    p += codebox_pod_problems(f"{workload['kind']}/{CODEBOX}", workload["spec"]["template"], config_maps)
    for d in docs:
        if d["kind"] == "Secret":
            p.append(f"Secret/{d['metadata']['name']} is part of the installation (create it by hand)")
    if stateless:
        # No balancer: its clients (an Ingress controller, other pods) send no PROXY header.
        if TRUST in env_of(codebox_container(workload)):
            p.append(f"Deployment/{CODEBOX} (stateless): {TRUST} is set, but no balancer sends PROXY headers there")
        return p
    bal = find(docs, "Deployment", BALANCER)
    if not bal:
        return p + [f"no Deployment {BALANCER}"]
    p += pod_problems(f"Deployment/{BALANCER}", bal["spec"]["template"], secrets_ok=False, userns=False)
    p += proxy_protocol_problems(workload, bal, haproxy_cfg)
    seccomp = ((bal["spec"]["template"]["spec"].get("securityContext") or {}).get("seccompProfile") or {}).get("type")
    if seccomp != "RuntimeDefault":
        p.append(f"Deployment/{BALANCER}: seccomp is not RuntimeDefault")
    # The balancer's rule names what the StatefulSet and its headless Service create.
    sts = workload
    headless = find(docs, "Service", sts["spec"]["serviceName"])
    if not headless or headless["spec"].get("clusterIP") != "None":
        p.append(f"StatefulSet/{CODEBOX}: serviceName is not a headless Service")
    if f"^{sts['metadata']['name']}-[0-9]{{1,4}}$" not in haproxy_cfg:
        p.append("haproxy.cfg: the replica-name regex does not match the StatefulSet's pod names")
    if f".{sts['spec']['serviceName']}.${{POD_NAMESPACE}}" not in haproxy_cfg:
        p.append("haproxy.cfg: replicas are not resolved through the StatefulSet's headless Service")
    if f"\"{CODEBOX}.${{POD_NAMESPACE}}" not in haproxy_cfg or not find(docs, "Service", CODEBOX):
        p.append("haproxy.cfg: the fallback is not the Service codebox")
    # The MCP port only from the balancer; the metrics port only from monitoring.
    np = find(docs, "NetworkPolicy", CODEBOX)
    if not np:
        p.append("no NetworkPolicy for codebox")
    else:
        for rule in np["spec"].get("ingress", []):
            ports = {x.get("port") for x in rule.get("ports", [])}
            peers = rule.get("from", [])
            if not ports or not peers:
                p.append("NetworkPolicy codebox: a rule open to every port or every peer")
            if ports & {"mcp", 8080} and any(
                (x.get("podSelector") or {}).get("matchLabels") != {"app.kubernetes.io/name": BALANCER}
                or "namespaceSelector" in x
                for x in peers
            ):
                p.append("NetworkPolicy codebox: the MCP port is open to more than the balancer")
    return p


def same_pod_template(sts, dep):
    """Field for field, but for the StatefulSet's trust of its balancer."""
    template = copy.deepcopy(sts["spec"]["template"])
    for c in template["spec"]["containers"]:
        if c.get("env"):
            c["env"] = [e for e in c["env"] if e["name"] != TRUST]
    return template == dep["spec"]["template"]


def validate(docs, label):
    """kubernetes-validate, strict, every version; returns (problems, kinds skipped)."""
    p, skipped = [], set()
    for d in docs:
        name = f"{label}: {d.get('kind')}/{(d.get('metadata') or {}).get('name')}"
        for version in VERSIONS:
            try:
                kubernetes_validate.validate(d, version, strict=True)
            except kubernetes_validate.SchemaNotFoundError:
                skipped.add(f"{d['apiVersion']} {d['kind']}")
            except kubernetes_validate.ValidationError as e:
                p.append(f"{name} (Kubernetes {version}): {e.message} at {'.'.join(map(str, e.path))}")
    return p, skipped


def servicemonitor_problems(sm, rendered):
    """What can be checked of a ServiceMonitor without its CRD: it selects the headless
    Service and names one of its ports."""
    sel = sm["spec"]["selector"]["matchLabels"]
    svcs = [
        d for d in rendered
        if d["kind"] == "Service" and sel.items() <= (d["metadata"].get("labels") or {}).items()
    ]
    if len(svcs) != 1:
        return [f"ServiceMonitor selects {len(svcs)} Services, not 1"]
    ports = {x["name"] for x in svcs[0]["spec"]["ports"]}
    return [f"ServiceMonitor port {e['port']} not in {ports}" for e in sm["spec"]["endpoints"] if e["port"] not in ports]


def self_test(full, stateless, haproxy_cfg):
    """Every hostile change must be caught."""
    sts = find(full, "StatefulSet", CODEBOX)
    base_ok = problems(full, False, haproxy_cfg)
    if base_ok:
        return [f"self-test needs a clean installation: {base_ok}"]

    def pod(docs):
        return find(docs, "StatefulSet", CODEBOX)["spec"]["template"]["spec"]

    def ctr(docs):
        return pod(docs)["containers"][0]

    def cm(docs):
        return [d for d in docs if d["kind"] == "ConfigMap" and "codebox.toml" in d.get("data", {})][0]["data"]

    def bal(docs):
        return find(docs, "Deployment", BALANCER)["spec"]["template"]["spec"]["containers"][0]

    mutations = {
        "privileged": lambda d: ctr(d)["securityContext"].update(privileged=True),
        "SYS_ADMIN added": lambda d: ctr(d)["securityContext"]["capabilities"].update(add=["SYS_ADMIN"]),
        "drop ALL removed": lambda d: ctr(d)["securityContext"]["capabilities"].update(drop=["NET_RAW"]),
        "privilege escalation": lambda d: ctr(d)["securityContext"].update(allowPrivilegeEscalation=True),
        "writable root": lambda d: ctr(d)["securityContext"].pop("readOnlyRootFilesystem"),
        "runAsUser 0": lambda d: ctr(d)["securityContext"].update(runAsUser=0),
        "pod runAsNonRoot off": lambda d: pod(d)["securityContext"].update(runAsNonRoot=False),
        "host users": lambda d: pod(d).pop("hostUsers"),
        "hostNetwork": lambda d: pod(d).update(hostNetwork=True),
        "hostPath": lambda d: pod(d)["volumes"].append({"name": "h", "hostPath": {"path": "/"}}),
        "service account token": lambda d: pod(d).update(automountServiceAccountToken=True),
        "token as a value": lambda d: [
            e.update(value="s3cret") or e.pop("valueFrom") for e in ctr(d)["env"] if e["name"] == "CODEBOX_HTTP_TOKEN"
        ],
        "token from a ConfigMap": lambda d: ctr(d).update(envFrom=[{"configMapRef": {"name": "codebox-config"}}]),
        "token in codebox.toml": lambda d: cm(d).update(
            {"codebox.toml": cm(d)["codebox.toml"].replace('token = "env:CODEBOX_HTTP_TOKEN"', 'token = "s3cret"')}
        ),
        "client token in codebox.toml": lambda d: cm(d).update(
            {"codebox.toml": cm(d)["codebox.toml"] + '\n[http.clients]\nalice = "hunter2"\n'}
        ),
        "a Secret in the installation": lambda d: d.append(
            {"apiVersion": "v1", "kind": "Secret", "metadata": {"name": "x"}, "stringData": {"T": "v"}}
        ),
        "masked proc": lambda d: ctr(d)["securityContext"].pop("procMount"),
        "grace too short": lambda d: pod(d).update(terminationGracePeriodSeconds=20),
        "no memory limit": lambda d: ctr(d)["resources"]["limits"].pop("memory"),
        "readiness on healthz": lambda d: ctr(d)["readinessProbe"]["httpGet"].update(path="/healthz"),
        "state on the root filesystem": lambda d: cm(d).update(
            {"codebox.toml": cm(d)["codebox.toml"].replace('state_dir = "/var/lib/codebox/state"', 'state_dir = "/opt/state"')}
        ),
        "skills not shared": lambda d: [
            v.pop("persistentVolumeClaim") and v.update(emptyDir={}) for v in pod(d)["volumes"] if v["name"] == "skills"
        ],
        "paused sessions not shared": lambda d: [
            v.pop("persistentVolumeClaim") and v.update(emptyDir={}) for v in pod(d)["volumes"] if v["name"] == "sessions"
        ],
        "snapshot key in codebox.toml": lambda d: cm(d).update(
            {"codebox.toml": cm(d)["codebox.toml"].replace(
                'snapshot_key = "env:CODEBOX_SNAPSHOT_KEY"', 'snapshot_key = "' + "ab" * 32 + '"')}
        ),
        "snapshot key as a value": lambda d: [
            e.update(value="ab" * 32) or e.pop("valueFrom") for e in ctr(d)["env"] if e["name"] == "CODEBOX_SNAPSHOT_KEY"
        ],
        "replica id not the pod name": lambda d: [
            e["valueFrom"]["fieldRef"].update(fieldPath="metadata.uid") for e in ctr(d)["env"] if e["name"] == "CODEBOX_REPLICA"
        ],
        "balancer privileged": lambda d: bal(d)["securityContext"].update(privileged=True),
        "balancer with a token": lambda d: bal(d)["env"].append({"name": "CODEBOX_HTTP_TOKEN", "value": "x"}),
        "Service selecting nothing": lambda d: find(d, "Service", CODEBOX)["spec"]["selector"].update(
            {"app.kubernetes.io/name": "codebx"}
        ),
        "HPA on a Deployment that is not there": lambda d: find(d, "HorizontalPodAutoscaler", CODEBOX)["spec"][
            "scaleTargetRef"
        ].update(kind="Deployment"),
        "probe on a port that does not exist": lambda d: ctr(d)["readinessProbe"]["httpGet"].update(port="metric"),
        "headless Service on a wrong port name": lambda d: find(d, "Service", "codebox-replicas")["spec"]["ports"][1].update(
            targetPort="metrics-port"
        ),
        "MCP port open to all": lambda d: find(d, "NetworkPolicy", CODEBOX)["spec"]["ingress"][0]["from"].append(
            {"namespaceSelector": {}}
        ),
        "replicas not trusting the balancer": lambda d: ctr(d).update(
            env=[e for e in ctr(d)["env"] if e["name"] != TRUST]
        ),
        "replicas trusting more than the pod network": lambda d: [
            e.update(value="0.0.0.0/0") for e in ctr(d)["env"] if e["name"] == TRUST
        ],
        "readiness on the MCP port": lambda d: ctr(d)["readinessProbe"]["httpGet"].update(port="mcp"),
        "liveness on port 8080": lambda d: ctr(d)["livenessProbe"]["httpGet"].update(port=8080),
    }
    failures = []
    for what, mutate in mutations.items():
        docs = copy.deepcopy(full)
        mutate(docs)
        if not problems(docs, False, haproxy_cfg):
            failures.append(f"self-test: {what!r} was not caught")
    if problems(full, False, haproxy_cfg.replace("[0-9]{1,4}", "[0-9a-z.]+")):
        pass
    else:
        failures.append("self-test: a looser replica regex in haproxy.cfg was not caught")
    if not problems(full, False, haproxy_cfg.replace(" send-proxy-v2", "", 1)):
        failures.append("self-test: a server line without send-proxy-v2 was not caught")
    dep_docs = copy.deepcopy(stateless)
    codebox_container(find(dep_docs, "Deployment", CODEBOX))["env"].append({"name": TRUST, "value": "10.0.0.0/8"})
    if not problems(dep_docs, True, haproxy_cfg):
        failures.append("self-test: the stateless Deployment trusting PROXY headers was not caught")
    dep = copy.deepcopy(find(stateless, "Deployment", CODEBOX))
    dep["spec"]["template"]["spec"]["containers"][0]["securityContext"]["procMount"] = "Default"
    if same_pod_template(sts, dep):
        failures.append("self-test: a Deployment pod template differing from the StatefulSet's was not caught")
    # The validator itself: strict refuses an unknown field; a wrong type fails.
    bad = copy.deepcopy(sts)
    bad["spec"]["template"]["spec"]["containers"][0]["securityContext"]["procMounts"] = "Unmasked"
    if not validate([bad], "self-test")[0]:
        failures.append("self-test: kubernetes-validate took an unknown field")
    bad = copy.deepcopy(sts)
    bad["spec"]["replicas"] = "three"
    if not validate([bad], "self-test")[0]:
        failures.append("self-test: kubernetes-validate took a string for replicas")
    print(f"self-test: {len(mutations) + 6} hostile changes, {len(failures)} missed")
    return failures


def main():
    root = sys.argv[1]
    haproxy_cfg = open(os.path.join(root, "balancer/haproxy.cfg"), encoding="utf-8").read()
    full = render(root)
    stateless = render(os.path.join(root, "stateless"))
    standalone = {}
    for path in sorted(glob.glob(os.path.join(root, "examples/*.yaml")) + glob.glob(os.path.join(root, "monitoring/*.yaml"))):
        docs = load(path)
        if all("apiVersion" in d and "kind" in d for d in docs):
            standalone[path] = docs
        else:
            print(f"not a Kubernetes object (Helm values): {os.path.relpath(path, root)}")
    # Every YAML file is rendered, standalone, a kustomization or Helm values.
    covered = set(standalone)
    for path in glob.glob(os.path.join(root, "**/*.yaml"), recursive=True):
        if path in covered or os.path.basename(path) == "kustomization.yaml":
            continue
        if path.endswith("values.yaml") or path.startswith(os.path.join(root, "examples")) or path.startswith(
            os.path.join(root, "monitoring")
        ):
            continue
        kustomization = os.path.join(os.path.dirname(path), "kustomization.yaml")
        listed = os.path.exists(kustomization) and os.path.basename(path) in load(kustomization)[0].get("resources", [])
        if not listed:
            print(f"FAIL {os.path.relpath(path, root)}: in no kustomization, never validated")
            return 1

    failures, skipped = [], set()
    for label, docs in [("deploy/kubernetes", full), ("deploy/kubernetes/stateless", stateless)] + [
        (os.path.relpath(p, root), d) for p, d in standalone.items()
    ]:
        p, s = validate(docs, label)
        failures += p
        skipped |= s
        unknown = [d for d in docs if f"{d['apiVersion']} {d['kind']}" in s]
        print(
            f"{'ok  ' if not p else 'FAIL'} schemas {label}: {len(docs) - len(unknown)} objects, "
            f"Kubernetes {', '.join(VERSIONS)}, strict" + (f"; {len(unknown)} without a schema" if unknown else "")
        )
    sm = [d for docs in standalone.values() for d in docs if d["kind"] == "ServiceMonitor"]
    for d in sm:
        failures += servicemonitor_problems(d, full)
    print(f"no schema for {sorted(skipped)}: checked by this script instead ({len(sm)} ServiceMonitor)")
    for label, docs, is_stateless in [("with sessions", full, False), ("stateless", stateless, True)]:
        p = problems(docs, is_stateless, haproxy_cfg)
        failures += p
        print(f"{'ok  ' if not p else 'FAIL'} security and consistency, {label}: {len(p)} problems")
    if not same_pod_template(find(full, "StatefulSet", CODEBOX), find(stateless, "Deployment", CODEBOX)):
        failures.append("the stateless Deployment's pod template differs from the StatefulSet's")
    if "--self-test" in sys.argv:
        failures += self_test(full, stateless, haproxy_cfg)
    for f in failures:
        print(f"FAIL {f}")
    print(f"{'manifests: every check held' if not failures else f'{len(failures)} problems'}")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
