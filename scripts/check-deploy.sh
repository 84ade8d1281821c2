#!/usr/bin/env bash
# The deployment files, checked offline in seconds (run by `make lint`; docs/deployment.md):
#   deploy/Dockerfile            hadolint
#   deploy/k8s/*.yaml            kubernetes-validate --strict (schemas bundled with the package)
#   deploy/docker-compose.yml    check-jsonschema against the vendored Compose Specification
set -euo pipefail
cd "$(dirname "$0")/.."
bin=.venv/bin
# The Kubernetes version the manifests target: hostUsers and procMount (the skills worker) are
# on by default from 1.33.
K8S_VERSION="${K8S_VERSION:-1.33.0}"
failed=()

echo "==> hadolint deploy/Dockerfile"
"$bin/hadolint" deploy/Dockerfile || failed+=("hadolint")

echo "==> kubernetes-validate (Kubernetes $K8S_VERSION, strict) deploy/k8s"
manifests=()
for f in deploy/k8s/*.yaml; do
  [ "$(basename "$f")" = kustomization.yaml ] || manifests+=("$f")
done
"$bin/kubernetes-validate" -k "$K8S_VERSION" --strict --quiet "${manifests[@]}" \
  || failed+=("kubernetes-validate")
# Every manifest but the example Secret is in the Kustomize base, and everything it lists exists.
listed=$(sed -n 's/^  - \([a-z0-9.-]*\.yaml\)$/\1/p' deploy/k8s/kustomization.yaml | sort)
present=$(cd deploy/k8s && ls -- *.yaml | grep -v -e '^kustomization.yaml$' -e '^secret.example.yaml$' | sort)
if [ "$listed" != "$present" ]; then
  echo "deploy/k8s/kustomization.yaml resources differ from the files:" >&2
  diff <(echo "$listed") <(echo "$present") >&2 || true
  failed+=("kustomization resources")
fi

echo "==> check-jsonschema (Compose Specification) deploy/docker-compose.yml"
"$bin/check-jsonschema" --schemafile deploy/compose-spec.schema.json deploy/docker-compose.yml \
  || failed+=("compose schema")

if [ ${#failed[@]} -gt 0 ]; then
  for f in "${failed[@]}"; do echo "FAILED: $f" >&2; done
  exit 1
fi
echo "deploy files OK"
