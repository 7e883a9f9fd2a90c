#!/usr/bin/env bash
# Run an aarch64 wheel on Debian arm64 under qemu-user: `make test-cross`.
#
#   tests/cross_arm64.sh WHEEL AGENT_JSON
#
# Installs what it needs when missing (Debian's qemu-user-static and debootstrap),
# registers qemu for aarch64 binaries with the kernel, builds a minimal Debian
# arm64 root once (kept in $CROSS/arm64-root: reruns take seconds to build it),
# then, inside that root, installs the wheel with pip into a venv of its own
# and runs tests/smoke_wheel.py, and installs it with its dependencies
# (aarch64 wheels fetched on this machine) and runs the example agent.
# Needs root (chroot, mount, binfmt_misc).
set -euo pipefail

wheel=$(realpath "$1")
example=$2
here=$(cd "$(dirname "$0")/.." && pwd)
CROSS=${CROSS:-.cross}
PY=${PY:-.venv/bin/python}
SUITE=${SUITE:-bookworm}
MIRROR=${DEBIAN_MIRROR:-http://deb.debian.org/debian}
root=$(realpath -m "$CROSS/arm64-root")
binfmt=/proc/sys/fs/binfmt_misc

if [ "$(id -u)" != 0 ]; then
    echo "test-cross needs root: chroot, mount and binfmt_misc" >&2
    exit 1
fi

missing=()
[ -e /usr/lib/binfmt.d/qemu-aarch64.conf ] || missing+=(qemu-user-static)
command -v debootstrap >/dev/null || missing+=(debootstrap)
if [ ${#missing[@]} -gt 0 ]; then
    echo "installing ${missing[*]}"
    apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${missing[@]}" >/dev/null
fi

# Let the kernel hand aarch64 binaries to qemu (the F flag opens qemu now, so
# it need not exist inside the root). Nothing to do on an aarch64 machine.
if [ "$(uname -m)" != aarch64 ]; then
    [ -e $binfmt/register ] || mount -t binfmt_misc binfmt_misc $binfmt
    [ -e $binfmt/qemu-aarch64 ] || cat /usr/lib/binfmt.d/qemu-aarch64.conf > $binfmt/register
fi

packages=python3,python3-venv
stamp=$root/.openstarry-root
# A run that was killed may have left the root's /proc mounted.
if mountpoint -q "$root/proc" 2>/dev/null; then umount "$root/proc"; fi
if [ "$(cat "$stamp" 2>/dev/null)" != "$SUITE $packages" ]; then
    echo "building a Debian $SUITE arm64 root in $root (once; a few minutes)"
    rm -rf "$root"
    debootstrap --arch=arm64 --variant=minbase --include=$packages "$SUITE" "$root" "$MIRROR" \
        > "$CROSS/debootstrap.log" 2>&1 || { tail -n 20 "$CROSS/debootstrap.log"; exit 1; }
    echo "$SUITE $packages" > "$stamp"
fi

work=$root/openstarry
rm -rf "$work"
mkdir -p "$work/wheel" "$work/wheelhouse"
cp "$wheel" "$work/wheel/"
cp "$here/tests/smoke_wheel.py" "$work/"
cp -r "$here/examples" "$work/"

# The wheel's dependencies, as aarch64 wheels for the root's CPython.
pyver=$(chroot "$root" python3 -c 'import sys; print("%d.%d" % sys.version_info[:2])')
"$PY" -m pip download --quiet --only-binary=:all: --implementation cp --python-version "$pyver" \
    --platform manylinux_2_28_aarch64 --platform manylinux2014_aarch64 \
    --dest "$work/wheelhouse" "$wheel"

mount -t proc proc "$root/proc"
trap 'umount "$root/proc"' EXIT
chroot "$root" env -i PATH=/usr/sbin:/usr/bin:/sbin:/bin HOME=/root LANG=C.UTF-8 \
    EXAMPLE="$example" /bin/bash -euo pipefail -c '
cd /openstarry
echo "in the root: $(uname -m), $(python3 --version), glibc $(ldd --version | head -n 1 | grep -o "[0-9.]*$")"
python3 -m venv venv-smoke
venv-smoke/bin/python -m pip install --quiet --no-index --no-deps wheel/*.whl
venv-smoke/bin/python -c "import platform, openstarry._core as c; print(\"openstarry._core on\", platform.machine(), \"from\", c.__file__)"
venv-smoke/bin/python smoke_wheel.py
python3 -m venv venv-agent
venv-agent/bin/python -m pip install --quiet --no-index --find-links wheelhouse wheel/*.whl
venv-agent/bin/openstarry run "$EXAMPLE" --input "Query weather in Taipei" | tee run.txt
grep -q "The weather in Taipei is 25°C, Sunny." run.txt
echo "cross: the aarch64 wheel passed the smoke test and ran the example agent"
'
