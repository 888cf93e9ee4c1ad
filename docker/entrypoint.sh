#!/bin/sh
# apexkit builder entrypoint: CA variables, a writable HOME, the tool venv on PATH; then the command.
set -e
for ca in /etc/ssl/certs/apexkit-ca-bundle.pem /usr/local/share/apexkit/ca/ca-bundle.pem; do
    if [ -s "$ca" ]; then
        for var in SSL_CERT_FILE REQUESTS_CA_BUNDLE PIP_CERT GIT_SSL_CAINFO CURL_CA_BUNDLE; do
            eval "[ -n \"\${$var:-}\" ] || export $var=$ca"
        done
        break
    fi
done
# run as another uid than the image's user (--user of the invoking host user): HOME must still be writable
if [ -z "${HOME:-}" ] || [ "$HOME" = / ] || ! [ -w "$HOME" ]; then
    HOME="/tmp/apexkit-home-$(id -u)"
    mkdir -p "$HOME"
    export HOME
fi
# torch >= 2.5 auto-loads torch_npu at `import torch`, which fails without CANN; building needs no CANN. A caller who
# has CANN in the container and wants the backend loaded passes -e TORCH_DEVICE_BACKEND_AUTOLOAD=1.
: "${TORCH_DEVICE_BACKEND_AUTOLOAD:=0}"
export TORCH_DEVICE_BACKEND_AUTOLOAD
# last: the base's own python3.X stay first, so builds use them and not the tool venv's interpreter
PATH="$PATH:/opt/apexkit/venv/bin"
export PATH
exec "$@"
