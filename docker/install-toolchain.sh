#!/bin/sh
# apexkit builder: runs as root inside `docker build`, in four steps.
#   toolchain      install what a build needs and the base lacks, with the base's package manager (apt-get, dnf, yum)
#   tools          the tool venv /opt/apexkit/venv (nox, virtualenv, rich, packaging) on the newest python3.X >= 3.8
#   pythons        the Pythons of APEXKIT_PYTHONS (e.g. "3.8 3.10") the base lacks, with uv (APEXKIT_UV_VERSION)
#   user UID GID   the non-root build user, then /usr/local/share/apexkit/builder.json (what the image offers)
# A failure prints one line "apexkit-error: <cause> | <next step>" (read by `invoke image.build`) and exits != 0.
set -eu
SHARE=/usr/local/share/apexkit
CA="$SHARE/ca/ca-bundle.pem"
UV_PYTHONS=/opt/apexkit/python  # where `uv python install` puts the Pythons of --pythons
# torch >= 2.5 loads torch_npu at `import torch`, which fails without CANN (libhccl.so): no probe here needs it
TORCH_DEVICE_BACKEND_AUTOLOAD=0
export TORCH_DEVICE_BACKEND_AUTOLOAD

die() {  # die CODE CAUSE HINT
    echo "apexkit-error: $2 | $3" >&2
    exit "$1"
}
have() { command -v "$1" >/dev/null 2>&1; }
has_ca() { [ -s "$CA" ]; }

# python3.X executables that run and have their C headers (Python.h), newest first
pythons_with_headers() {
    for v in 13 12 11 10 9 8 7; do
        p=$(command -v "python3.$v" 2>/dev/null) || continue
        "$p" -c 'import os, sysconfig, sys; sys.exit(not os.path.isfile(os.path.join(sysconfig.get_paths()["include"], "Python.h")))' \
            >/dev/null 2>&1 && echo "$p"
    done
    return 0
}

# the newest python3.X >= 3.8 whose standard library can make a venv with pip (Debian splits that into python3-venv);
# requirements/runtime.in pins each tool per Python range, so the venv installs on any of them
tool_python() {
    for v in 13 12 11 10 9 8; do
        p=$(command -v "python3.$v" 2>/dev/null) || continue
        "$p" -c 'import ensurepip, venv' >/dev/null 2>&1 && { echo "$p"; return 0; }
    done
    return 0
}

package_manager() {
    for pm in apt-get dnf yum; do
        if have "$pm"; then echo "$pm"; return 0; fi
    done
    echo none
}

# manylinux-style bases keep CPython under /opt/python/cp3X-cp3X: expose python3.X and pip3.X on PATH, as the
# official Ascend builder image does.
link_manylinux_pythons() {
    for bin in /opt/python/cp3*-cp3*/bin; do
        [ -d "$bin" ] || continue
        for exe in "$bin"/python3.* "$bin"/pip3.*; do
            [ -x "$exe" ] || continue
            name=$(basename "$exe")
            case "$name" in *-config) continue ;; esac
            [ -e "/usr/local/bin/$name" ] || ln -s "$exe" "/usr/local/bin/$name"
        done
    done
}

step_toolchain() {
    machine=$(uname -m)
    if [ -n "${APEXKIT_ARCH:-}" ] && [ "$machine" != "$APEXKIT_ARCH" ]; then
        die 4 "the base image runs as $machine, not $APEXKIT_ARCH" \
            "pass a base image for $APEXKIT_ARCH (or --arch $machine)"
    fi
    link_manylinux_pythons
    pm=$(package_manager)
    missing=""
    for tool in gcc g++ make git patch readelf tar; do
        have "$tool" || missing="$missing $tool"
    done
    [ -n "$(pythons_with_headers)" ] || missing="$missing python3-headers"
    [ -n "$(tool_python)" ] || missing="$missing python3-venv"
    # shellcheck source=/dev/null  # the base image's file, not this checkout's
    echo "apexkit: base $(. /etc/os-release 2>/dev/null && echo "${PRETTY_NAME:-?}"), $machine, package manager: $pm"
    if [ -z "$missing" ] && [ -z "${APEXKIT_EXTRA_PACKAGES:-}" ]; then
        echo "apexkit: the base already has the toolchain and python3 headers: nothing to install"
        echo "$pm" > "$SHARE/package-manager"
        : > "$SHARE/installed-packages"
        return 0
    fi
    echo "apexkit: to install:${missing:- (none)}${APEXKIT_EXTRA_PACKAGES:+ + $APEXKIT_EXTRA_PACKAGES}"
    packages=""
    for item in $missing; do
        case "$pm:$item" in
            apt-get:readelf) packages="$packages binutils" ;;
            apt-get:python3-headers) packages="$packages python3 python3-dev" ;;
            apt-get:python3-venv) packages="$packages python3-venv" ;;
            dnf:g++|yum:g++) packages="$packages gcc-c++" ;;
            dnf:readelf|yum:readelf) packages="$packages binutils" ;;
            dnf:python3-headers|yum:python3-headers) packages="$packages python3 python3-devel" ;;
            dnf:python3-venv|yum:python3-venv) packages="$packages python3" ;;
            none:*) ;;
            *) packages="$packages $item" ;;
        esac
    done
    case "$pm" in
        apt-get)
            opts=""
            has_ca && opts="-o Acquire::https::CAInfo=$CA"
            # shellcheck disable=SC2086
            DEBIAN_FRONTEND=noninteractive apt-get $opts update -qq
            # shellcheck disable=SC2086
            DEBIAN_FRONTEND=noninteractive apt-get $opts install -y -qq --no-install-recommends \
                ca-certificates $packages ${APEXKIT_EXTRA_PACKAGES:-}
            rm -rf /var/lib/apt/lists/*
            ;;
        dnf|yum)
            opts=""
            has_ca && opts="--setopt=sslcacert=$CA"
            # shellcheck disable=SC2086
            "$pm" $opts install -y ca-certificates $packages ${APEXKIT_EXTRA_PACKAGES:-}
            "$pm" clean all >/dev/null 2>&1 || true
            ;;
        none)
            die 3 "the base image has no known package manager (apt-get, dnf, yum) and lacks:$missing" \
                "use a Debian/Ubuntu/openEuler/CentOS base, or one that already has these tools"
            ;;
    esac
    link_manylinux_pythons
    [ -n "$(pythons_with_headers)" ] || die 5 "no python3.X with C headers after installing$packages" \
        "add the right -dev/-devel package to --extra-packages"
    echo "$pm" > "$SHARE/package-manager"
    # shellcheck disable=SC2086  # split on purpose: the names, one space apart
    echo $packages ${APEXKIT_EXTRA_PACKAGES:-} > "$SHARE/installed-packages"
}

step_tools() {
    py=$(tool_python)
    [ -n "$py" ] || die 5 "no python3.8 or newer that can make a venv in the image" \
        "add python3 (>= 3.8) and its venv package to --extra-packages"
    "$py" -m venv /opt/apexkit/venv
    if has_ca; then PIP_CERT="$CA"; export PIP_CERT; fi
    set -- --no-cache-dir --disable-pip-version-check --progress-bar off -q
    [ -n "${APEXKIT_PIP_INDEX_URL:-}" ] && set -- "$@" --index-url "$APEXKIT_PIP_INDEX_URL"
    /opt/apexkit/venv/bin/python -m pip install "$@" -r "$SHARE/requirements-tools.txt" || \
        die 6 "pip could not install the apexkit tools into /opt/apexkit/venv" \
            "check the proxy (invoke proxy.check) and the CA (invoke proxy.setup --ca-cert)"
    echo "apexkit: tool venv on $py: $(/opt/apexkit/venv/bin/python -m nox --version 2>&1 | tail -n 1) (nox)"
}

# the python3.X (X = $1 minus "3.") that runs and has its C headers, if any
python_with_headers() {
    p=$(command -v "python$1" 2>/dev/null) || return 0
    "$p" -c 'import os, sysconfig, sys; sys.exit(not os.path.isfile(os.path.join(sysconfig.get_paths()["include"], "Python.h")))' \
        >/dev/null 2>&1 && echo "$p"
    return 0
}

step_pythons() {
    wanted=$(echo "${APEXKIT_PYTHONS:-}" | tr ',' ' ')
    [ -n "$wanted" ] || return 0
    missing=""
    for v in $wanted; do
        case "$v" in 3.[0-9]|3.[0-9][0-9]) ;; *) die 2 "--pythons: '$v' is not a Python version" "e.g. --pythons 3.8,3.10" ;; esac
        p=$(python_with_headers "$v")
        if [ -n "$p" ]; then
            echo "apexkit: Python $v is in the base already ($p): uv not needed for it"
        else
            missing="$missing $v"
        fi
    done
    [ -n "$missing" ] || return 0
    if has_ca; then PIP_CERT="$CA"; SSL_CERT_FILE="$CA"; export PIP_CERT SSL_CERT_FILE; fi
    set -- --no-cache-dir --disable-pip-version-check --progress-bar off -q
    [ -n "${APEXKIT_PIP_INDEX_URL:-}" ] && set -- "$@" --index-url "$APEXKIT_PIP_INDEX_URL"
    /opt/apexkit/venv/bin/python -m pip install "$@" "uv==${APEXKIT_UV_VERSION:?}" || \
        die 6 "pip could not install uv ${APEXKIT_UV_VERSION} (for --pythons$missing)" \
            "check the proxy (invoke proxy.check) and the CA (invoke proxy.setup --ca-cert)"
    echo "apexkit: uv python install$missing (python-build-standalone, downloaded from GitHub)"
    # uv reads the proxy from HTTPS_PROXY/https_proxy (Docker's predefined build args) and the CA from SSL_CERT_FILE
    # shellcheck disable=SC2086
    if ! UV_PYTHON_INSTALL_DIR="$UV_PYTHONS" UV_NO_CACHE=1 /opt/apexkit/venv/bin/uv python install $missing \
            >/tmp/apexkit-uv.log 2>&1; then
        cat /tmp/apexkit-uv.log >&2
        why=$(grep "cause:" /tmp/apexkit-uv.log | tail -n 1 | sed 's/^ *cause: *//' | cut -c1-120)
        die 7 "uv could not download Python$missing from github.com (python-build-standalone): ${why:-see the log}" \
            "let the build reach GitHub's python-build-standalone releases through the proxy, or use a base that has it (a manylinux image: /opt/python/cp3X-cp3X; Debian: bullseye 3.9, bookworm 3.11, trixie 3.13)"
    fi
    for v in $missing; do
        # shellcheck disable=SC2012  # uv's own names (cpython-3.X.Y-<platform>): the last in sort order
        exe=$(ls -d "$UV_PYTHONS"/cpython-"$v".*/bin/"python$v" 2>/dev/null | tail -n 1)
        [ -n "$exe" ] || die 7 "uv reported success but $UV_PYTHONS has no python$v" "rebuild with --no-cache"
        ln -sf "$exe" "/usr/local/bin/python$v"
        echo "apexkit: python$v -> $exe"
    done
}

step_user() {
    uid=$1 gid=$2
    if ! getent group "$gid" >/dev/null 2>&1; then
        groupadd -g "$gid" builder 2>/dev/null || addgroup -g "$gid" builder 2>/dev/null || \
            die 6 "cannot create group $gid" "use a base with groupadd (shadow-utils/passwd)"
    fi
    if getent passwd "$uid" >/dev/null 2>&1; then
        name=$(getent passwd "$uid" | cut -d: -f1)
        echo "apexkit: uid $uid exists in the base ($name): it is the build user"
    else
        name=builder
        useradd -m -u "$uid" -g "$gid" -s /bin/sh "$name" 2>/dev/null || \
            adduser -D -u "$uid" -G "$(getent group "$gid" | cut -d: -f1)" "$name" 2>/dev/null || \
            die 6 "cannot create the build user (uid $uid)" "use a base with useradd (shadow-utils/passwd)"
    fi
    mkdir -p /workspace
    chown "$uid:$gid" /workspace
    # repositories are bind-mounted from the host and belong to another uid than the build user: let git read them
    # (git honours safe.directory only in system or global configuration)
    git config --system --add safe.directory '*'
    # what the image offers, for `invoke image.build`'s summary and `invoke image.list`
    /opt/apexkit/venv/bin/python - "$name" "$uid" "$gid" "$(cat "$SHARE/package-manager")" \
        "$(cat "$SHARE/installed-packages")" <<'PY'
import glob, json, os, platform, subprocess, sys
probe = ("import json, platform, sysconfig; p = sysconfig.get_paths(); "
         "print(json.dumps({'version': platform.python_version(), 'purelib': p['purelib'], 'platlib': p['platlib']}))")


def source(exe):
    """Where a python3.X came from: the base's package manager, a manylinux /opt/python tree, or uv (--pythons).
    Every link on the way counts (manylinux: /usr/local/bin -> /opt/python/cp3X-cp3X -> /opt/_internal/...)."""
    chain, path = [exe], exe
    for _ in range(10):
        if not os.path.islink(path):
            break
        path = os.path.join(os.path.dirname(path), os.readlink(path))
        chain.append(path)
    chain.append(os.path.realpath(exe))
    if any(p.startswith("/opt/apexkit/python/") for p in chain):
        return "uv"
    if any(p.startswith(("/opt/python/", "/opt/_internal/")) for p in chain):
        return "manylinux"
    return "distro"


found = {}
for directory in os.environ.get("PATH", "/usr/local/bin:/usr/bin").split(":") + ["/usr/bin", "/usr/local/bin"]:
    for exe in sorted(glob.glob(os.path.join(directory, "python3.[0-9]*"))):
        name = os.path.basename(exe)
        if name in found or not name.replace("python3.", "").isdigit():
            continue
        try:
            out = subprocess.run([exe, "-c", probe], capture_output=True, text=True, timeout=60)
            if out.returncode == 0:
                found[name] = dict(json.loads(out.stdout), path=exe, source=source(exe))
        except Exception:
            pass
info = {"arch": platform.machine(), "user": sys.argv[1], "uid": int(sys.argv[2]), "gid": int(sys.argv[3]),
        "package_manager": sys.argv[4], "installed": sys.argv[5].split(), "tool_python": platform.python_version(),
        "pythons": [found[k] for k in sorted(found, key=lambda n: int(n.split(".")[1]))]}
with open("/usr/local/share/apexkit/builder.json", "w") as fh:
    json.dump(info, fh, indent=1)
print("apexkit: builder.json " + json.dumps(info))
PY
}

case "${1:-}" in
    toolchain) step_toolchain ;;
    tools) step_tools ;;
    pythons) step_pythons ;;
    user) step_user "$2" "$3" ;;
    *) echo "usage: install-toolchain.sh toolchain | tools | pythons | user UID GID" >&2; exit 2 ;;
esac
