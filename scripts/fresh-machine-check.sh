#!/usr/bin/env bash
# The README's test command on a machine that really is fresh: a Debian 12 root made with
# debootstrap, with the systemd package installed but not running (as in a container: a minbase
# root without it would hide pcp's postinst calling systemctl), entered with chroot; a clean clone
# of this repository's HEAD inside it; ./scripts/test.sh there. Needs root, and apt's registry.
#
#   sudo scripts/fresh-machine-check.sh [ROOT_DIR]     (default /var/tmp/gpumon-fresh; removed first)
#
# pip inside the root is configured as on this machine (its pip.conf, its PIP_* variables, and the
# wheel folders they name, bound read-only), so the check installs what CI installs; where none
# are set, pip uses PyPI. The root's own python3 (3.11 on Debian 12) runs everything.
set -euo pipefail
top=$(cd "$(dirname "$0")/.." && pwd)
root=${1:-/var/tmp/gpumon-fresh}
mirror=${DEBIAN_MIRROR:-http://deb.debian.org/debian}
[ "$(id -u)" -eq 0 ] || { echo "fresh-machine-check: needs root (debootstrap, chroot)" >&2; exit 1; }
command -v debootstrap >/dev/null || apt-get install -y -qq debootstrap >/dev/null
# the root shares this machine's network and processes: a pmcd already running here would answer
# in its place (and PCP's scripts in the root would refuse to start their own)
if pgrep -x pmcd >/dev/null; then
  echo "fresh-machine-check: pmcd runs on this machine (pid $(pgrep -x pmcd | head -1)): stop it first" \
    "(systemctl stop pmcd, or /etc/init.d/pmcd stop): the root would meet it on port 44321" >&2
  exit 1
fi

mounted=()
cleanup() {
  for ((i = ${#mounted[@]} - 1; i >= 0; i--)); do umount -R -l "${mounted[$i]}" 2>/dev/null || true; done
}
trap cleanup EXIT
bind() {  # bind SRC (and what is mounted below it) at the same path inside the root; ro: read-only
  mkdir -p "$root$1"
  mount --rbind "$1" "$root$1"
  mounted+=("$root$1")
  [ "${2:-}" != ro ] || mount -o remount,bind,ro "$root$1"
}

if [ -d "$root" ]; then
  for m in $(awk -v r="$root" '$2 ~ "^"r {print $2}' /proc/mounts | sort -r); do umount -l "$m"; done
  rm -rf --one-file-system "$root"
fi
echo "== debootstrap bookworm into $root" >&2
start=$(date +%s)
debootstrap --include=systemd,ca-certificates bookworm "$root" "$mirror" >"$root.debootstrap.log" 2>&1 \
  || { tail -n 20 "$root.debootstrap.log" >&2; exit 1; }
cp /etc/resolv.conf "$root/etc/resolv.conf" 2>/dev/null || true
# what an installer (or a container runtime) writes and debootstrap does not: the host's own name
printf '127.0.1.1\t%s\n' "$(hostname)" >>"$root/etc/hosts"
[ -d /etc/apt/apt.conf.d ] && cp /etc/apt/apt.conf.d/99* "$root/etc/apt/apt.conf.d/" 2>/dev/null || true
bind /proc; bind /sys; bind /dev  # /sys with /sys/fs/cgroup: slurmd needs it
for conf in /etc/pip.conf /etc/xdg/pip /root/.config/pip; do
  [ -e "$conf" ] && { mkdir -p "$root$(dirname "$conf")"; cp -r "$conf" "$root$conf"; }
done
cert=""
if [ -n "${PIP_CERT:-}" ] && [ -f "$PIP_CERT" ]; then
  # this machine reaches its package index through a CA of its own: pip in the root trusts it too
  cert=/etc/gpumon-check-pip-ca.pem
  cp "$PIP_CERT" "$root$cert"
fi
for dir in ${PIP_FIND_LINKS:-} /opt/wheels /opt/pypi /opt/pypi-more; do
  [ -d "$dir" ] && bind "$dir" ro
done
echo "== a clean clone of $(git -C "$top" rev-parse --short HEAD) inside it" >&2
git clone -q "$top" "$root/root/gpumon"
echo "== ./scripts/test.sh in the chroot (no systemd running there)" >&2
status=0
chroot "$root" /usr/bin/env -i HOME=/root TERM=dumb LANG=C.UTF-8 \
  PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin \
  ${PIP_FIND_LINKS:+PIP_FIND_LINKS=$PIP_FIND_LINKS} ${cert:+PIP_CERT=$cert} \
  ${PIP_DEFAULT_TIMEOUT:+PIP_DEFAULT_TIMEOUT=$PIP_DEFAULT_TIMEOUT} \
  bash -c 'cd /root/gpumon && ./scripts/test.sh' || status=$?
echo "== fresh-machine-check: ./scripts/test.sh exited $status after $(( $(date +%s) - start )) s in all" >&2
exit "$status"
