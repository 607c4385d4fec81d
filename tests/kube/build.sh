#!/usr/bin/env bash
# Builds the pinned Kubernetes control plane the tests run against (issue 51) into
# target/kube-bin: etcd, kube-apiserver, kube-controller-manager, kube-scheduler and kubectl,
# each a small main over its Go module (tests/kube/cmd/*), at the versions go.mod pins. Nothing
# is downloaded but Go modules through the Go module proxy.
#
# Reuses the binaries while go.mod, go.sum and the mains are unchanged (a stamp of their hash);
# a cold build takes about 11 minutes on 2 cores (16 beside other builds; most of it kube-apiserver and the controller
# manager), a warm Go cache about one. Prints a progress line per program; exits 3 when Go is
# not installed (the caller says so and skips), non-zero with Go's output on a failure.
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
root="$(cd "$here/../.." && pwd)"
out="${ICHOR_KUBE_BIN:-$root/target/kube-bin}"
if ! command -v go >/dev/null 2>&1; then
  echo "tests/kube/build.sh: go is not installed: the real control plane cannot be built" >&2
  exit 3
fi
programs=(etcd kube-apiserver kube-controller-manager kube-scheduler kubectl monitoring-check)
stamp="$( (cat "$here/go.mod" "$here/go.sum"; for p in "${programs[@]}"; do cat "$here/cmd/$p/main.go"; done; go version) | sha256sum | cut -d' ' -f1)"
if [[ -f "$out/.stamp" && "$(cat "$out/.stamp")" == "$stamp" ]]; then
  missing=0
  for p in "${programs[@]}"; do [[ -x "$out/$p" ]] || missing=1; done
  if [[ $missing == 0 ]]; then
    echo "kube control plane: up to date in $out"
    exit 0
  fi
fi
mkdir -p "$out"
# The version the programs report (/version, kubectl version): the pinned release, not
# v0.0.0-master, which is what `go build` stamps without the Kubernetes build's ldflags.
kver="v1.37.2"
ldflags="-s -w"
for pkg in k8s.io/component-base/version k8s.io/client-go/pkg/version; do
  ldflags+=" -X $pkg.gitVersion=$kver -X $pkg.gitMajor=1 -X $pkg.gitMinor=37 -X $pkg.gitTreeState=clean"
done
cd "$here"
start=$SECONDS
for p in "${programs[@]}"; do
  echo "kube control plane: building $p ($((SECONDS - start)) s so far; a cold build takes about 11 minutes)"
  go build -trimpath -ldflags "$ldflags" -o "$out/$p.tmp" "./cmd/$p"
  mv "$out/$p.tmp" "$out/$p"
done
echo "$stamp" > "$out/.stamp"
echo "kube control plane: built in $((SECONDS - start)) s into $out"
