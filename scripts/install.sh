#!/usr/bin/env bash
# Installs cuslice on a GPU host: the library, the command, a CDI spec and
# OCI hooks for podman / CRI-O, and the host directory shared by tenants.
# Run after `bash scripts/setup.sh` (which builds target/release/).
#   sudo bash scripts/install.sh            # into /
#   DESTDIR=/tmp/pkg bash scripts/install.sh   # staged (packaging, tests)
# LIB= and BIN= name other builds of the library and the command.
# Idempotent. Uninstall: remove the files listed at the end.
set -euo pipefail
cd "$(dirname "$0")/.."
D=${DESTDIR:-}
LIB=${LIB:-target/release/libcuslice.so}
BIN=${BIN:-target/release/cuslice}
for f in "$LIB" "$BIN"; do
    [ -f "$f" ] || { echo "install: $f missing: run scripts/setup.sh first" >&2; exit 1; }
done

install -D -m 0755 "$BIN" "$D/usr/bin/cuslice"
install -D -m 0644 "$LIB" "$D/usr/lib/cuslice/libcuslice.so"
# Containers get it through /etc/ld.so.preload (mounted by the hook).
# Root's alone (the hook sets these modes again at every container): the
# segments below are reached only through the containers' own mounts.
install -d -m 0700 "$D/run/cuslice"
install -d -m 0755 "$D/run/cuslice/gpu"

# CDI (Docker >= 25 with CDI enabled, podman, containerd): the device
# cuslice.io/gpu=all runs the hooks.
install -d -m 0755 "$D/etc/cdi"
"$D/usr/bin/cuslice" cdi generate --cuslice /usr/bin/cuslice --output "$D/etc/cdi/cuslice.json"

# podman / CRI-O hooks.d: run for any container with a cuslice.io/ annotation.
HOOKS="$D/usr/share/containers/oci/hooks.d"
install -d -m 0755 "$HOOKS"
for stage in create poststop; do
    oci_stage=prestart
    [ "$stage" = poststop ] && oci_stage=poststop
    cat >"$HOOKS/cuslice-$stage.json" <<JSON
{
  "version": "1.0.0",
  "hook": { "path": "/usr/bin/cuslice", "args": ["cuslice", "oci-hook", "$stage"] },
  "when": { "annotations": { "^cuslice\\\\.io/": ".*" } },
  "stages": ["$oci_stage"]
}
JSON
done

# The host watchdog (cuslice watch), one per host: its unit, enabled where
# systemd runs (not when staging into DESTDIR). Its policy:
# /etc/cuslice/watch.toml (absent: report only, every default).
install -D -m 0644 scripts/cuslice-watch.service "$D/etc/systemd/system/cuslice-watch.service"
if [ -z "$D" ] && command -v systemctl >/dev/null 2>&1 && [ -d /run/systemd/system ]; then
    systemctl daemon-reload
    systemctl enable cuslice-watch.service
    # restart, not start: a reinstall runs the new command.
    systemctl restart cuslice-watch.service
    echo "install: cuslice-watch.service enabled and (re)started"
else
    echo "install: systemd is not running here (or DESTDIR is set): cuslice-watch.service installed, not enabled; run: systemctl enable --now cuslice-watch"
fi

echo "install: done"
echo "  $D/usr/bin/cuslice"
echo "  $D/usr/lib/cuslice/libcuslice.so"
echo "  $D/etc/cdi/cuslice.json"
echo "  $HOOKS/cuslice-create.json, cuslice-poststop.json"
echo "  $D/run/cuslice/gpu (the per-GPU segments, made by the hook, shared by all containers)"
echo "  $D/etc/systemd/system/cuslice-watch.service"
