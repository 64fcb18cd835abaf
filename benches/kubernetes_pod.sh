#!/bin/sh
# codebox in the conditions of a Kubernetes pod, without Kubernetes: what the pod must
# allow (docs/DEPLOY-KUBERNETES.md, "What the pod must allow") and what a replica costs
# ("Resources").
#
# usage (as root): benches/kubernetes_pod.sh CODEBOX_BINARY ROOTFS [PYDEPS]
#   PYDEPS: the official Python MCP SDK (target/mcp-pydeps); without it, the cost
#   measurement is skipped.
#
# Each case runs in a private mount namespace (nothing is visible outside), as uid 65532
# with no capabilities at all (empty bounding set) and no_new_privs, like a container with
# runAsUser 65532, drop ALL and allowPrivilegeEscalation false:
#   1. /proc masked as container runtimes do by default, cgroups read-only: doctor, serve
#   2. /proc masked, a cgroup delegated to 65532 (what a writable, chowned cgroup gives)
#   3. /proc unmasked (procMount: Unmasked), delegated cgroup, read-only root with tmpfs at
#      /tmp and the state directory: doctor, then `codebox serve --http` on loopback with
#      deploy/kubernetes/base/codebox.toml, measured by benches/kubernetes_costs.py, then
#      SIGTERM and the time to exit.
# The delegated cgroups are removed at the end.
set -eu
BIN=$(realpath "$1"); ROOTFS=$(realpath "$2"); PYDEPS=${3:+$(realpath "$3")}
HERE=$(cd "$(dirname "$0")/.." && pwd)
[ "$(id -u)" = 0 ] || { echo "run as root: it sets up mount namespaces and cgroups" >&2; exit 2; }
# Not under /tmp: the pod gets a tmpfs there.
WORK=$(mktemp -d /var/tmp/codebox-kube-pod.XXXXXX)
chmod 755 "$WORK"
SERVE=
trap '[ -z "$SERVE" ] || kill -KILL "$SERVE" 2>/dev/null || true; sleep 0.5
  for d in $(find /sys/fs/cgroup -maxdepth 5 -type d -name "codebox-kube-pod-*" 2>/dev/null); do find "$d" -depth -type d -exec rmdir {} \; 2>/dev/null; done; rm -rf "$WORK"' EXIT

# The pod's side, run by `unshare -m` as root: MASK CGROUPS(ro|delegated) READONLY_ROOT -- CMD
cat > "$WORK/pod.sh" <<'EOF'
#!/bin/sh
set -eu
MASK=$1; CGROUPS=$2; RO=$3; WORK=$4; shift 5
mount --make-rprivate /
if [ "$CGROUPS" = delegated ]; then
  for c in memory pids cpu cpuacct freezer unified; do
    [ -d /sys/fs/cgroup/$c ] || continue
    own=$(awk -F: -v c=$c '($2==c)||(c=="unified"&&$1=="0"){print $3}' /proc/self/cgroup)
    d=/sys/fs/cgroup/$c$own/codebox-kube-pod-$$
    mkdir -p "$d"; chown -R 65532:65532 "$d"
    echo $$ > "$d/cgroup.procs" 2>/dev/null || echo $$ > "$d/tasks"
  done
  # A pure cgroup v2 host: the unified hierarchy is /sys/fs/cgroup itself.
  if [ ! -d /sys/fs/cgroup/unified ] && [ -f /sys/fs/cgroup/cgroup.controllers ]; then
    d=/sys/fs/cgroup$(awk -F: '$1=="0"{print $3}' /proc/self/cgroup)/codebox-kube-pod-$$
    mkdir -p "$d"; chown -R 65532:65532 "$d"; echo $$ > "$d/cgroup.procs"
  fi
else
  for d in /sys/fs/cgroup /sys/fs/cgroup/*; do
    mountpoint -q "$d" && mount -o remount,bind,ro "$d"
  done
fi
if [ "$MASK" = masked ]; then
  # The default masked and read-only paths of runc/containerd/CRI-O.
  for p in /proc/asound /proc/acpi /proc/kcore /proc/keys /proc/latency_stats /proc/timer_list /proc/timer_stats /proc/sched_debug /proc/scsi /sys/firmware; do
    [ -e $p ] || continue
    if [ -d $p ]; then mount -t tmpfs -o ro tmpfs $p; else mount --bind /dev/null $p; fi
  done
  for p in /proc/bus /proc/fs /proc/irq /proc/sys /proc/sysrq-trigger; do
    [ -e $p ] && mount --bind $p $p && mount -o remount,bind,ro $p
  done
fi
if [ "$RO" = ro ]; then
  # readOnlyRootFilesystem, with emptyDirs at /tmp and /var/lib/codebox (here $WORK/lib,
  # which the tmpfs keeps writable; the config is copied in first).
  mount -o remount,bind,ro /
  for m in $(findmnt -rno TARGET | grep -v '^/$' | grep -Ev '^/(proc|sys|dev)'); do
    mount -o remount,bind,ro "$m" 2>/dev/null || true
  done
  mount -t tmpfs -o mode=1777 tmpfs /tmp
  mount -t tmpfs -o mode=0755 tmpfs "$WORK/lib"
  mkdir -p "$WORK/lib/state" "$WORK/lib/skills" "$WORK/lib/cache" "$WORK/lib/etc"
  cp "$WORK/etc/"* "$WORK/lib/etc/"
  chown -R 65532:65532 "$WORK/lib"
  if touch /codebox-kube-pod-probe 2>/dev/null; then echo "the root filesystem is writable" >&2; exit 1; fi
fi
exec setpriv --reuid 65532 --regid 65532 --clear-groups --no-new-privs --inh-caps=-all --bounding-set=-all \
  env -i HOME="$WORK/lib" XDG_CACHE_HOME="$WORK/lib/cache" TMPDIR=/tmp PATH=/usr/bin:/bin "$@"
EOF
chmod 755 "$WORK/pod.sh"
mkdir -p "$WORK/lib" "$WORK/etc"
sed "s|/etc/codebox/|$WORK/lib/etc/|; s|/var/lib/codebox/|$WORK/lib/|" \
  "$HERE/deploy/kubernetes/base/codebox.toml" > "$WORK/etc/codebox.toml"
cp "$HERE/deploy/kubernetes/base/mcp.json" "$WORK/etc/mcp.json"
chmod -R a+rX "$WORK"
# The binary and the rootfs must be reachable by uid 65532 where they are.
cp "$BIN" "$WORK/codebox"; chmod 755 "$WORK/codebox"

pod() { unshare -m "$WORK/pod.sh" "$@"; }

echo "=== 1. /proc masked, cgroups read-only"
pod masked ro rw "$WORK" -- env CODEBOX_ROOTFS="$ROOTFS" "$WORK/codebox" doctor 2>&1 | grep -E "cgroups|in sandbox|READY|ready" || true
pod masked ro rw "$WORK" -- env CODEBOX_ROOTFS="$ROOTFS" CODEBOX_HTTP_TOKEN=x "$WORK/codebox" serve --http 127.0.0.1:0 2>&1 | cut -c1-160 || true

echo "=== 2. /proc masked, cgroup delegated"
pod masked delegated rw "$WORK" -- env CODEBOX_ROOTFS="$ROOTFS" "$WORK/codebox" doctor 2>&1 | grep -E "cgroups|in sandbox|READY|ready" || true

echo "=== 3. /proc unmasked, cgroup delegated, read-only root"
pod unmasked delegated ro "$WORK" -- sh -c "
  grep -E '^(Uid|CapEff|CapBnd|NoNewPrivs)' /proc/self/status
  CODEBOX_ROOTFS=$ROOTFS $WORK/codebox doctor 2>&1 | grep -E 'in sandbox|READY|ready'"
[ -n "$PYDEPS" ] || { echo "(no PYDEPS: costs not measured)"; exit 0; }
PORT=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')
# Not through pod(): $! must be the process that becomes codebox (unshare, pod.sh,
# setpriv and env each exec the next).
unshare -m "$WORK/pod.sh" unmasked delegated ro "$WORK" -- env CODEBOX_ROOTFS="$ROOTFS" \
  CODEBOX_CONFIG="$WORK/lib/etc/codebox.toml" CODEBOX_HTTP_TOKEN=kube-pod-token \
  CODEBOX_HTTP_ADDR=127.0.0.1:$PORT "$WORK/codebox" serve --http > "$WORK/serve.log" 2>&1 &
SERVE=$!
PYTHONPATH="$PYDEPS" /usr/bin/python3 "$HERE/benches/kubernetes_costs.py" "http://127.0.0.1:$PORT/mcp" kube-pod-token "$SERVE" || {
  cat "$WORK/serve.log" >&2; exit 1; }
START=$(date +%s%N); kill -TERM $SERVE; wait $SERVE || true; END=$(date +%s%N); SERVE=
echo "SIGTERM with nothing running: exited after $(( (END - START) / 1000000 )) ms"
