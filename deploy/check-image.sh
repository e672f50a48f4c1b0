#!/usr/bin/env bash
# Build the qmd image with podman, run it, index a mounted folder, check the
# HEALTHCHECK, /health from outside and a search, then stop it.
#
#   deploy/check-image.sh            # what tests/test_image.py runs when QMD_TEST_IMAGE=1
#
# Where Docker Hub cannot be reached, the base image is built locally from Debian's own
# packages (debootstrap, ~3 min) and passed as the Dockerfile's BASE; set QMD_IMAGE_BASE
# to use another. ../shared/ops.md says why podman needs runc and an empty ulimit list here.
set -euo pipefail

root="$(cd "$(dirname "$0")/.." && pwd)"
port="${QMD_IMAGE_PORT:-18181}"
name="qmd-image-check-$$"
image="localhost/qmd:check"
work="$(mktemp -d)"
trap 'podman --runtime runc rm -f "$name" >/dev/null 2>&1 || true; rm -rf "$work"' EXIT

say() { printf '== %s\n' "$*"; }

if ! command -v podman >/dev/null || ! command -v runc >/dev/null || ! command -v debootstrap >/dev/null; then
    say "installing podman, runc, debootstrap"
    DEBIAN_FRONTEND=noninteractive apt-get install -y -q podman runc debootstrap >/dev/null
fi
printf '[containers]\ndefault_ulimits = []\n' > "$work/containers.conf"
export CONTAINERS_CONF="$work/containers.conf"
pod() { podman --runtime runc "$@"; }

base="${QMD_IMAGE_BASE:-localhost/debian-py311:bookworm}"
if [ -z "${QMD_IMAGE_BASE:-}" ] && ! podman image exists "$base"; then
    mirror="$(sed -n 's/^URIs: *//p' /etc/apt/sources.list.d/debian.sources 2>/dev/null | head -1)"
    say "building the base image $base from ${mirror:-http://deb.debian.org/debian}"
    debootstrap --variant=minbase --include=python3,python3-venv bookworm "$work/rootfs" \
        "${mirror:-http://deb.debian.org/debian}" >/dev/null
    tar -C "$work/rootfs" -c . | podman import - "$base" >/dev/null
fi

say "building $image on $base"
t0=$SECONDS
# docker format: OCI images have no HEALTHCHECK, podman would drop it.
pod build -q --format docker --build-arg "BASE=$base" -v /etc/ssl/certs:/etc/ssl/certs:ro -t "$image" "$root" >/dev/null
say "built in $((SECONDS - t0)) s"

mkdir -p "$work/notes"
printf '# Sourdough\n\nFeed the starter flour and water every day.\n' > "$work/notes/bread.md"
printf -- '---\nqmd:\n  metadata:\n    status: published\n---\n# Investors\n\nAngels fund seed rounds.\n' \
    > "$work/notes/money.md"

say "running $name on 127.0.0.1:$port"
pod run -d --name "$name" -p "127.0.0.1:$port:8181" -v "$work/notes:/notes:ro" \
    -e QMD_ALLOWED_HOSTS="localhost:$port,127.0.0.1:$port" "$image" >/dev/null
for _ in $(seq 1 60); do
    if curl -fsS "http://127.0.0.1:$port/health" >/dev/null 2>&1; then break; fi
    sleep 1
done
curl -fsS "http://127.0.0.1:$port/health"; echo

say "indexing /notes inside the container"
pod exec "$name" qmd collection add /notes --name notes
out="$(pod exec "$name" qmd search sourdough starter)"
printf '%s\n' "$out"
grep -q "bread.md" <<<"$out" || { echo "FAIL: the search did not find bread.md"; exit 1; }

say "HEALTHCHECK"
pod healthcheck run "$name" || { echo "FAIL: the image's HEALTHCHECK did not pass"; exit 1; }
echo "healthy"

say "a filtered query from outside"
answer="$(curl -fsS -X POST "http://127.0.0.1:$port/query" -H 'content-type: application/json' \
    -d '{"searches":[{"type":"lex","query":"angels"}],"filter":{"field":"status","operator":"eq","value":"published"}}')"
printf '%s\n' "$answer" | head -c 400; echo
grep -q 'qmd://notes/money.md' <<<"$answer" || { echo "FAIL: /query from outside did not find money.md"; exit 1; }

say "stopping"
pod stop -t 10 "$name" >/dev/null
say "OK: image built, ran, indexed, searched, healthy, stopped"
